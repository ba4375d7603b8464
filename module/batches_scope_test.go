package module

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/mulligan-gw/mulligan/examples/modelserver"
)

// uploadID uploads content as a batch file and returns its id.
func (g *gateway) uploadID(t *testing.T, content string, headers ...string) string {
	t.Helper()
	up := g.uploadFile(t, content, "batch", headers...)
	var f struct{ ID string }
	if up.StatusCode != 200 || json.Unmarshal(up.body, &f) != nil || f.ID == "" {
		t.Fatalf("upload: %v %s", up.Response, up.body)
	}
	return f.ID
}

func (g *gateway) deleteFile(id string, headers ...string) result {
	req, _ := http.NewRequest("DELETE", g.base+"/v1/files/"+id, nil)
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	return g.do(req)
}

// Callers without credentials share no scope, in the Files and Batches API as in the
// operations API: they list nothing, reach what they were given the id of, and another scope
// reaches none of it.
func TestCallersWithoutCredentialsListNoFilesOrBatchesAsNoOperations(t *testing.T) {
	g := startGateway(t, modelserver.Config{}, batchesBlock)
	alice := []string{"Authorization", "Bearer alice"}
	_, op := g.submit(t, "anon-key")
	fileID := g.uploadID(t, batchInput(3, func(i int) string { return fmt.Sprint("anonymous prompt ", i) }))
	body := fmt.Sprintf(`{"input_file_id":%q,"endpoint":"/v1/chat/completions","completion_window":"24h"}`, fileID)
	b := decodeBatch(t, g.post("/v1/batches", "", body))
	b = g.awaitBatch(t, b.ID)
	if b.Status != "completed" || b.OutputFileID == nil {
		t.Fatalf("the anonymous batch ended %s, output %v", b.Status, b.OutputFileID)
	}
	g.await(t, op.OperationID)

	for name, who := range map[string][]string{"another anonymous caller": nil, "alice": alice} {
		for _, path := range []string{"/v1/operations", "/v1/files", "/v1/batches"} {
			list := g.get(path, who...)
			if list.StatusCode != 200 {
				t.Fatalf("%s lists %s: %v %s", name, path, list.Status, list.body)
			}
			for _, id := range []string{op.OperationID, fileID, b.ID, *b.OutputFileID} {
				if strings.Contains(string(list.body), id) {
					t.Fatalf("%s lists %s of a caller without credentials: %s", name, id, list.body)
				}
			}
		}
	}
	// The ids it was given reach them, as an operation's does.
	for _, path := range []string{"/v1/operations/" + op.OperationID, "/v1/files/" + fileID, "/v1/files/" + fileID + "/content",
		"/v1/batches/" + b.ID, "/v1/files/" + *b.OutputFileID, "/v1/files/" + *b.OutputFileID + "/content"} {
		if r := g.get(path); r.StatusCode != 200 {
			t.Fatalf("GET %s by its id without credentials: %v %s", path, r.Status, r.body)
		}
	}
	if c := g.get("/v1/files/" + *b.OutputFileID + "/content"); !strings.Contains(string(c.body), `"custom_id":"req-3"`) {
		t.Fatalf("the anonymous batch's output: %s", c.body)
	}
	expectError(t, g.post("/v1/operations/"+op.OperationID+"/cancel", "", ""), 409, CodeAlreadyFinal, false)
	expectOpenAIError(t, g.post("/v1/batches/"+b.ID+"/cancel", "", ""), http.StatusConflict, CodeBatchAlreadyFinal, "completed")
	// Another scope reaches none of them, as for an operation.
	expectError(t, g.get("/v1/operations/"+op.OperationID, alice...), 404, CodeOperationNotFound, false)
	expectOpenAIError(t, g.get("/v1/files/"+fileID, alice...), http.StatusNotFound, CodeFileNotFound, fileID)
	expectOpenAIError(t, g.get("/v1/files/"+*b.OutputFileID+"/content", alice...), http.StatusNotFound, CodeFileNotFound, *b.OutputFileID)
	expectOpenAIError(t, g.get("/v1/batches/"+b.ID, alice...), http.StatusNotFound, CodeBatchNotFound, b.ID)
	expectOpenAIError(t, g.deleteFile(fileID, alice...), http.StatusNotFound, CodeFileNotFound, fileID)
	if r := g.deleteFile(fileID); r.StatusCode != 200 || !strings.Contains(string(r.body), `"deleted":true`) {
		t.Fatalf("DELETE of its own file by id without credentials: %v %s", r.Status, r.body)
	}
	// A caller with credentials still lists its own.
	mine := g.uploadID(t, "{}\n", alice...)
	if list := g.get("/v1/files", alice...); !strings.Contains(string(list.body), mine) {
		t.Fatalf("alice does not list her own file: %s", list.body)
	}
}

// A scope's stored files are bounded in bytes and in count: an upload over either is refused
// 400 FILE_QUOTA_EXCEEDED and stores nothing; each scope has its own room, and a deleted file
// gives its room back.
func TestAScopesStoredFilesAreBoundedInBytesAndCount(t *testing.T) {
	g := startGateway(t, modelserver.Config{}, "batches /v1 {\n max_scope_bytes 2KiB\n max_scope_files 2\n}\n")
	alice, bob := []string{"Authorization", "Bearer alice"}, []string{"Authorization", "Bearer bob"}
	first := g.uploadID(t, strings.Repeat("a", 1500), alice...)
	over := g.uploadFile(t, strings.Repeat("b", 1000), "batch", alice...)
	expectOpenAIError(t, over, http.StatusBadRequest, CodeFileQuota, "over its quota (2 files, 2048 bytes together)")
	if list := g.get("/v1/files", alice...); strings.Count(string(list.body), `"object":"file"`) != 1 {
		t.Fatalf("alice's files after a refused upload: %s", list.body)
	}
	g.uploadID(t, strings.Repeat("c", 1500), bob...)
	g.uploadID(t, strings.Repeat("d", 548), alice...) // exactly the bytes left: the refused upload kept none
	expectOpenAIError(t, g.uploadFile(t, "", "batch", alice...), http.StatusBadRequest, CodeFileQuota, "delete files")
	if r := g.deleteFile(first, alice...); r.StatusCode != 200 {
		t.Fatalf("delete: %v %s", r.Status, r.body)
	}
	g.uploadID(t, strings.Repeat("e", 1500), alice...)
}
