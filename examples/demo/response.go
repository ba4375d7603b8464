package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"
)

// responseTour runs one background response of the Responses API (docs/responses.md): created
// at once as queued with the gateway's id, polled to completed, its stream then replayed from
// a position, as a client that dropped would resume it.
func responseTour(gateway, run string) error {
	fmt.Printf("\n== 9. A background response: stored before the answer, polled, its stream resumed\n")
	create := fmt.Sprintf(`{"model":"demo","input":"Write a haiku about %s","background":true,"stream":false}`, run)
	fmt.Printf("$ curl -s %s/v1/responses -d '%s'\n", gateway, create)
	_, body, err := do("POST", gateway+"/v1/responses", create)
	if err != nil {
		return err
	}
	var r struct {
		ID     string `json:"id"`
		Status string `json:"status"`
		Output []struct {
			Content []struct{ Text string } `json:"content"`
		} `json:"output"`
	}
	if err := json.Unmarshal(body, &r); err != nil || r.ID == "" {
		return fmt.Errorf("creating the response: %s", body)
	}
	fmt.Printf("   %s\n", abbreviate(strings.TrimSpace(string(body))))
	for i := 0; i < 100 && (r.Status == "queued" || r.Status == "in_progress"); i++ {
		time.Sleep(200 * time.Millisecond)
		if _, body, err = do("GET", gateway+"/v1/responses/"+r.ID, ""); err != nil {
			return err
		}
		_ = json.Unmarshal(body, &r)
	}
	fmt.Printf("$ curl -s %s/v1/responses/%s\n   %s\n", gateway, r.ID, abbreviate(strings.TrimSpace(string(body))))
	if len(r.Output) > 0 && len(r.Output[0].Content) > 0 {
		fmt.Printf("   output_text: %q\n", r.Output[0].Content[0].Text)
	}
	fmt.Printf("$ curl -sN '%s/v1/responses/%s?stream=true&starting_after=8'\n", gateway, r.ID)
	_, body, err = do("GET", gateway+"/v1/responses/"+r.ID+"?stream=true&starting_after=8", "")
	for line := range strings.Lines(string(body)) {
		if strings.HasPrefix(line, "event: ") {
			fmt.Printf("   %s", line)
		}
	}
	return err
}
