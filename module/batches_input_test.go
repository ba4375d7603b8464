package module

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/mulligan-gw/mulligan/internal/apierr"
	"github.com/mulligan-gw/mulligan/internal/batches"
	"github.com/mulligan-gw/mulligan/internal/testkit"
	"github.com/mulligan-gw/mulligan/store/badger"
)

// TestBatchWhoseInputFileWentAwayStillEndsWhenCancelled: an input file is pinned while its batch
// runs; one gone all the same (expired) leaves the lines not yet created failed, each named, and
// a cancel still ends the batch with every line accounted for.
func TestBatchWhoseInputFileWentAwayStillEndsWhenCancelled(t *testing.T) {
	t.Parallel()
	up := newBatchUpstream()
	up.block = make(chan struct{})
	defer close(up.block)
	g := startHandlerWith(t, gatewaySetup{wrap: up.wrap, mulligan: batchesBlock + "async {\n concurrency 1\n}\n"})
	const n, missing = batches.LineWindow + 3, 3 // the line window leaves the last lines to create later
	var f struct{ ID string }
	if up := g.uploadFile(t, batchInput(n, func(i int) string { return fmt.Sprint("slow ", i) }), "batch"); json.Unmarshal(up.body, &f) != nil {
		t.Fatalf("upload: %s", up.body)
	}
	b := decodeBatch(t, g.post("/v1/batches", "", fmt.Sprintf(`{"input_file_id":%q,"endpoint":"/v1/chat/completions","completion_window":"24h"}`, f.ID)))
	testkit.WaitFor(t, 5*time.Second, `up.count("slow 1") == 1`, func() bool { return up.count("slow 1") == 1 })

	del, _ := http.NewRequest("DELETE", g.base+"/v1/files/"+f.ID, nil)
	expectOpenAIError(t, g.do(del), http.StatusBadRequest, apierr.CodeInvalidRequest, "is the input of batch "+b.ID)
	st, err := badger.Open(badger.Options{Dir: g.dir + "/badger"}) // the gateway's own database, shared
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	testkit.WaitFor(t, 5*time.Second, "err == nil && sb.Created == batches.LineWindow", func() bool { sb, err := st.GetBatch(b.ID); return err == nil && sb.Created == batches.LineWindow })
	if err := st.DeleteFile(f.ID); err != nil { // as its expiry would
		t.Fatal(err)
	}
	if r := g.get("/v1/files/" + f.ID); r.StatusCode != http.StatusNotFound {
		t.Fatalf("the input file after its deletion: %v %s", r.Response, r.body)
	}
	if r := g.post("/v1/batches/"+b.ID+"/cancel", "", ""); r.StatusCode != http.StatusOK {
		t.Fatalf("cancel: %v %s", r.Response, r.body)
	}
	b = g.awaitBatch(t, b.ID)
	if b.Status != "cancelled" || b.RequestCounts.Total != n || b.RequestCounts.Failed != n {
		t.Fatalf("batch ended %s %+v, want cancelled with all %d lines failed", b.Status, b.RequestCounts, n)
	}
	errs := g.get("/v1/files/" + *b.ErrorFileID + "/content")
	lines := strings.Split(strings.TrimSpace(string(errs.body)), "\n")
	gone := strings.Count(string(errs.body), `"code":"input_file_gone"`)
	if len(lines) != n || gone != missing || !strings.Contains(string(errs.body), fmt.Sprintf("Line %d of the input file was never sent", n)) {
		t.Fatalf("error file: %d lines, %d input_file_gone, want %d and %d; last: %s", len(lines), gone, n, missing, lines[len(lines)-1])
	}
	for i := 1; i <= n-missing; i++ {
		if !strings.Contains(string(errs.body), fmt.Sprintf(`"custom_id":"req-%d"`, i)) {
			t.Fatalf("req-%d missing from the error file", i)
		}
	}
}
