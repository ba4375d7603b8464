package module

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// sdkBatchRun is what testdata/openai_batch.cjs prints.
type sdkBatchRun struct {
	Run struct {
		File     struct{ ID, Object, Purpose string }
		Created  batchObject
		Batch    batchObject
		Statuses []string
		Output   []map[string]any
		Errors   []map[string]any
		Listed   []string
		Fetched  struct{ ID string }
	}
	Scope struct {
		Batch, File, Content, Cancel any
		List                         int
	}
	Invalid batchObject
	Cancel  struct {
		Cancelling batchObject
		Batch      batchObject
		Output     []map[string]any
		Errors     []map[string]any
	}
}

func TestOpenAINodeSDKRunsABatch(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	node, script := installSDKScript(t, ctx, "openai_batch.cjs")
	up := newBatchUpstream()
	up.slow = 200 * time.Millisecond // the cancel's lines: 30 at 4 at once take 1.5 s, the cancel comes after 2
	g := startHandlerWith(t, gatewaySetup{wrap: up.wrap, mulligan: batchesBlock})
	out, err := exec.CommandContext(ctx, node, script, g.base+"/v1", t.TempDir()).Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("the SDK script failed: %v\n%s\n%s", err, out, stderr)
	}
	var got sdkBatchRun
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("the script printed %q: %v", out, err)
	}
	checkSDKRun(t, &got, up)
	checkSDKScope(t, &got)
	checkSDKInvalid(t, got.Invalid)
	checkSDKCancel(t, &got, up)
}

func checkSDKRun(t *testing.T, got *sdkBatchRun, up *batchUpstream) {
	t.Helper()
	r := got.Run
	if r.File.Object != "file" || r.File.Purpose != "batch" || !strings.HasPrefix(r.File.ID, "file-") || r.Fetched.ID != r.File.ID {
		t.Fatalf("file object %+v (retrieved %+v)", r.File, r.Fetched)
	}
	if r.Batch.Status != "completed" || r.Batch.RequestCounts.Total != 12 || r.Batch.RequestCounts.Completed != 9 || r.Batch.RequestCounts.Failed != 3 {
		t.Fatalf("batch ended %s %+v, want completed with 9 of 12, 3 failed", r.Batch.Status, r.Batch.RequestCounts)
	}
	if len(r.Output) != 9 || len(r.Errors) != 3 || len(r.Listed) == 0 || r.Listed[0] != r.Batch.ID {
		t.Fatalf("output %d lines, errors %d lines, listed %v", len(r.Output), len(r.Errors), r.Listed)
	}
	for _, l := range r.Output {
		resp := l["response"].(map[string]any)
		body := resp["body"].(map[string]any)
		if resp["status_code"].(float64) != 200 || body["object"] != "chat.completion" || !strings.HasPrefix(l["id"].(string), "batch_req_") {
			t.Fatalf("output line %v", l)
		}
	}
	for _, l := range r.Errors {
		if l["response"].(map[string]any)["status_code"].(float64) != 400 {
			t.Fatalf("error line %v, want the upstream's 400", l)
		}
	}
	for i := 1; i <= 12; i++ {
		prompt := fmt.Sprintf("sdk %d", i)
		if i%4 == 0 {
			prompt = fmt.Sprintf("reject %d", i)
		}
		if n := up.count(prompt); n != 1 {
			t.Fatalf("line %d ran %d times upstream, want once", i, n)
		}
	}
	t.Logf("statuses seen while polling: %v", r.Statuses)
}

func checkSDKScope(t *testing.T, got *sdkBatchRun) {
	t.Helper()
	s := got.Scope
	for name, st := range map[string]any{"batch": s.Batch, "file": s.File, "content": s.Content, "cancel": s.Cancel} {
		if st != float64(404) {
			t.Fatalf("another scope's %s answered %v, want 404", name, st)
		}
	}
	if s.List != 0 {
		t.Fatalf("another scope lists %d batches, want none", s.List)
	}
}

func checkSDKInvalid(t *testing.T, b batchObject) {
	t.Helper()
	want := map[int]string{2: "invalid_json_line", 3: "missing_required_parameter", 4: "duplicate_custom_id", 5: "invalid_url"}
	if b.Status != "failed" || b.Errors == nil || len(b.Errors.Data) != len(want) {
		t.Fatalf("a file with bad lines ended %s with errors %+v, want failed naming lines 2-5", b.Status, b.Errors)
	}
	for _, e := range b.Errors.Data {
		if want[e.Line] != e.Code || e.Message == "" {
			t.Fatalf("line %d: %s %q, want %s", e.Line, e.Code, e.Message, want[e.Line])
		}
	}
	if b.RequestCounts.Completed+b.RequestCounts.Failed != 0 || b.OutputFileID != nil {
		t.Fatalf("a batch that failed validation ran lines: %+v", b)
	}
}

func checkSDKCancel(t *testing.T, got *sdkBatchRun, up *batchUpstream) {
	t.Helper()
	c := got.Cancel
	if c.Cancelling.Status != "cancelling" && c.Cancelling.Status != "cancelled" {
		t.Fatalf("cancel answered %s", c.Cancelling.Status)
	}
	b := c.Batch
	if b.Status != "cancelled" || b.RequestCounts.Total != 30 || b.RequestCounts.Completed < 2 || b.RequestCounts.Completed >= 30 {
		t.Fatalf("cancelled batch %s %+v", b.Status, b.RequestCounts)
	}
	if len(c.Output) != b.RequestCounts.Completed || len(c.Output)+len(c.Errors) != 30 {
		t.Fatalf("output %d + errors %d lines, want %d completed and 30 in all", len(c.Output), len(c.Errors), b.RequestCounts.Completed)
	}
	ran := 0
	for i := 1; i <= 30; i++ {
		n := up.count(fmt.Sprintf("slow %d", i))
		if n > 1 {
			t.Fatalf("slow line %d ran %d times", i, n)
		}
		ran += n
	}
	if ran >= 30 {
		t.Fatalf("every line reached the upstream (%d): the cancel stopped nothing", ran)
	}
	t.Logf("cancelled after %d completed; %d lines reached the upstream", b.RequestCounts.Completed, ran)
}
