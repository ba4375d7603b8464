package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"mime/multipart"
	"net/http"
	"strings"
	"time"
)

// batchTour uploads a three-line JSONL file, runs it as a batch (docs/batches.md) and prints
// its output file.
func batchTour(gateway, run string) error {
	fmt.Printf("\n== 8. A small batch: upload a JSONL file, create a batch, poll, download the output\n")
	var file strings.Builder
	for i, q := range []string{"Say hello", "Say goodbye", "Count to three"} {
		fmt.Fprintf(&file, `{"custom_id":"%s-%d","method":"POST","url":"/v1/chat/completions","body":{"model":"demo","messages":[{"role":"user","content":%q}]}}`+"\n", run, i+1, q)
	}
	fmt.Printf("$ curl -s %s/v1/files -F purpose=batch -F file=@input.jsonl\n", gateway)
	fileID, err := uploadBatchFile(gateway, file.String())
	if err != nil {
		return err
	}
	create := fmt.Sprintf(`{"input_file_id":%q,"endpoint":"/v1/chat/completions","completion_window":"24h"}`, fileID)
	fmt.Printf("$ curl -s %s/v1/batches -d '%s'\n", gateway, create)
	_, body, err := do("POST", gateway+"/v1/batches", create)
	if err != nil {
		return err
	}
	var b struct {
		ID           string  `json:"id"`
		Status       string  `json:"status"`
		OutputFileID *string `json:"output_file_id"`
	}
	if err := json.Unmarshal(body, &b); err != nil {
		return fmt.Errorf("creating the batch: %s", body)
	}
	fmt.Printf("   %s\n", abbreviate(strings.TrimSpace(string(body))))
	for i := 0; i < 100 && b.Status != "completed" && b.Status != "failed"; i++ {
		time.Sleep(200 * time.Millisecond)
		if _, body, err = do("GET", gateway+"/v1/batches/"+b.ID, ""); err != nil {
			return err
		}
		_ = json.Unmarshal(body, &b)
	}
	fmt.Printf("$ curl -s %s/v1/batches/%s\n   %s\n", gateway, b.ID, abbreviate(strings.TrimSpace(string(body))))
	if b.OutputFileID == nil {
		return nil
	}
	fmt.Printf("$ curl -s %s/v1/files/%s/content\n", gateway, *b.OutputFileID)
	_, body, err = do("GET", gateway+"/v1/files/"+*b.OutputFileID+"/content", "")
	for _, line := range strings.Split(strings.TrimSpace(string(body)), "\n") {
		fmt.Printf("   %s\n", abbreviate(line))
	}
	return err
}

// uploadBatchFile posts content to the Files API and returns the file's id.
func uploadBatchFile(gateway, content string) (string, error) {
	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	fw, err := mw.CreateFormFile("file", "input.jsonl")
	if err != nil {
		return "", err
	}
	_, _ = fw.Write([]byte(content))
	_ = mw.WriteField("purpose", "batch")
	_ = mw.Close()
	resp, err := http.Post(gateway+"/v1/files", mw.FormDataContentType(), &body)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var f struct{ ID string }
	if err := json.NewDecoder(resp.Body).Decode(&f); err != nil || f.ID == "" {
		return "", fmt.Errorf("uploading the batch file: %d", resp.StatusCode)
	}
	fmt.Printf("   {\"id\":%q,\"object\":\"file\",\"purpose\":\"batch\",...}\n", f.ID)
	return f.ID, nil
}
