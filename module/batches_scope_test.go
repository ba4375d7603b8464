package module

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"go.uber.org/zap"

	"github.com/mulligan-gw/mulligan/examples/modelserver"
	"github.com/mulligan-gw/mulligan/internal/apierr"
	"github.com/mulligan-gw/mulligan/internal/batches"
	"github.com/mulligan-gw/mulligan/internal/idemkey"
	"github.com/mulligan-gw/mulligan/store"
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
	t.Parallel()
	g := startHandler(t, modelserver.Config{}, batchesBlock)
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
	expectError(t, g.post("/v1/operations/"+op.OperationID+"/cancel", "", ""), 409, apierr.CodeAlreadyFinal, false)
	expectOpenAIError(t, g.post("/v1/batches/"+b.ID+"/cancel", "", ""), http.StatusConflict, apierr.CodeBatchAlreadyFinal, "completed")
	// Another scope reaches none of them, as for an operation.
	expectError(t, g.get("/v1/operations/"+op.OperationID, alice...), 404, apierr.CodeOperationNotFound, false)
	expectOpenAIError(t, g.get("/v1/files/"+fileID, alice...), http.StatusNotFound, apierr.CodeFileNotFound, fileID)
	expectOpenAIError(t, g.get("/v1/files/"+*b.OutputFileID+"/content", alice...), http.StatusNotFound, apierr.CodeFileNotFound, *b.OutputFileID)
	expectOpenAIError(t, g.get("/v1/batches/"+b.ID, alice...), http.StatusNotFound, apierr.CodeBatchNotFound, b.ID)
	expectOpenAIError(t, g.deleteFile(fileID, alice...), http.StatusNotFound, apierr.CodeFileNotFound, fileID)
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
	t.Parallel()
	g := startHandler(t, modelserver.Config{}, "batches /v1 {\n max_scope_bytes 2KiB\n max_scope_files 2\n}\n")
	alice, bob := []string{"Authorization", "Bearer alice"}, []string{"Authorization", "Bearer bob"}
	first := g.uploadID(t, strings.Repeat("a", 1500), alice...)
	over := g.uploadFile(t, strings.Repeat("b", 1000), "batch", alice...)
	expectOpenAIError(t, over, http.StatusBadRequest, apierr.CodeFileQuota, "over its quota (2 files, 2048 bytes together)")
	if list := g.get("/v1/files", alice...); strings.Count(string(list.body), `"object":"file"`) != 1 {
		t.Fatalf("alice's files after a refused upload: %s", list.body)
	}
	g.uploadID(t, strings.Repeat("c", 1500), bob...)
	g.uploadID(t, strings.Repeat("d", 548), alice...) // exactly the bytes left: the refused upload kept none
	expectOpenAIError(t, g.uploadFile(t, "", "batch", alice...), http.StatusBadRequest, apierr.CodeFileQuota, "delete files")
	if r := g.deleteFile(first, alice...); r.StatusCode != 200 {
		t.Fatalf("delete: %v %s", r.Status, r.body)
	}
	g.uploadID(t, strings.Repeat("e", 1500), alice...)
}

// countedReads is a storage whose reads of operations and results are counted: what
// assembling a batch's file costs, a read or two per line.
type countedReads struct {
	store.Backend
	reads atomic.Int64
}

func (c *countedReads) GetOperation(id string) (*store.Operation, error) {
	c.reads.Add(1)
	return c.Backend.GetOperation(id)
}

func (c *countedReads) LoadResult(id string) (*store.Response, error) {
	c.reads.Add(1)
	return c.Backend.LoadResult(id)
}

// openBackend is the backend of the one storage the test's gateway opened.
func openBackend(t *testing.T, g *gateway) store.Backend {
	t.Helper()
	var be store.Backend
	g.registry().eachStorage(func(_ string, s *storage) bool {
		be = s.be
		return false
	})
	if be == nil {
		t.Fatal("no open storage")
	}
	return be
}

// A batch's output and error file objects carry the files' sizes, counted as the lines
// settled: reading one reads no line, and the sizes are the bytes the downloads send. A batch
// whose lines were not all sized (settled by a previous release) is sized by assembling it.
func TestABatchFileObjectIsReadWithoutAssemblingTheFile(t *testing.T) {
	g := startHandlerWith(t, gatewaySetup{wrap: newBatchUpstream().wrap, mulligan: batchesBlock})
	who := []string{"Authorization", "Bearer a"}
	const n = 30
	b := g.createBatch(t, batchInput(n, func(i int) string {
		if i%5 == 0 {
			return fmt.Sprintf("reject <%d> & \u00e9", i) // escaped by the encoder: sized as written
		}
		return fmt.Sprint("line ", i)
	}), "24h", who...)
	b = g.awaitBatch(t, b.ID, who...)
	if b.Status != "completed" || b.OutputFileID == nil || b.ErrorFileID == nil {
		t.Fatalf("batch ended %s with output %v and errors %v", b.Status, b.OutputFileID, b.ErrorFileID)
	}
	counted := &countedReads{Backend: openBackend(t, g)}
	for _, id := range []string{*b.OutputFileID, *b.ErrorFileID} {
		content := g.get("/v1/files/"+id+"/content", who...)
		if content.StatusCode != 200 || len(content.body) == 0 {
			t.Fatalf("content of %s: %v", id, content.Status)
		}
		rec := httptest.NewRecorder()
		api := &batches.API{Store: counted, Clock: realClock, Config: batches.Config{Prefix: "/v1"}, Log: zap.NewNop()}
		api.Call(rec, httptest.NewRequest("GET", "/v1/files/"+id, nil), batches.Caller{Scope: idemkey.Scope("Bearer a")}).GetFile(id)
		var f struct{ Bytes int64 }
		if rec.Code != 200 || json.Unmarshal(rec.Body.Bytes(), &f) != nil || f.Bytes != int64(len(content.body)) {
			t.Fatalf("file object of %s: %d %s, want %d bytes", id, rec.Code, rec.Body, len(content.body))
		}
		if reads := counted.reads.Swap(0); reads != 0 {
			t.Fatalf("reading the file object of %s read %d lines' operations and results, want none", id, reads)
		}
	}
	stored, err := counted.GetBatch(b.ID)
	if err != nil || stored.FileBytes == nil {
		t.Fatalf("the stored batch: %+v %v", stored, err)
	}
	sized := *stored.FileBytes
	stored.FileBytes = nil // as a batch settled by a previous release
	for output, want := range map[bool]int64{true: sized.Output, false: sized.Errors} {
		if got, err := batches.FileBytes(counted, stored, output); err != nil || got != want {
			t.Fatalf("an unsized batch's file (output %v): %d bytes (%v), want %d", output, got, err, want)
		}
	}
	if counted.reads.Load() < n {
		t.Fatalf("an unsized batch's files were sized with %d reads: not assembled", counted.reads.Load())
	}
}
