package module

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/mulligan-gw/mulligan/examples/modelserver"
	"github.com/mulligan-gw/mulligan/internal/apierr"
)

// bodies records the priority field of every body that reached the model server.
type bodies struct {
	mu   sync.Mutex
	seen []string // the raw priority member, "" when absent
	raw  [][]byte
}

func (b *bodies) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if r.ContentLength >= 0 && r.ContentLength != int64(len(body)) {
			http.Error(w, "content length "+strconv.FormatInt(r.ContentLength, 10)+" for "+strconv.Itoa(len(body)), 400)
			return
		}
		var m map[string]json.RawMessage
		_ = json.Unmarshal(body, &m)
		b.mu.Lock()
		b.seen = append(b.seen, string(m["priority"]))
		b.raw = append(b.raw, body)
		b.mu.Unlock()
		r.Body = io.NopCloser(bytes.NewReader(body))
		next.ServeHTTP(w, r)
	})
}

func (b *bodies) last() (string, []byte) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.seen) == 0 {
		return "<none>", nil
	}
	return b.seen[len(b.seen)-1], b.raw[len(b.raw)-1]
}

func startPriority(t *testing.T, mode string) (*gateway, *bodies) {
	b := &bodies{}
	g := startGatewayWith(t, gatewaySetup{model: modelserver.Config{}, globals: quietGlobals,
		mulligan: "capacity {\n limit 2\n pass_priority " + mode + "\n class ops {\n header X-Trusted-Tier ops\n urgency 0\n }\n}", wrap: b.wrap})
	return g, b
}

func TestCapacityPassPriorityMapsTheTrustedUrgency(t *testing.T) {
	for _, tc := range []struct {
		mode    string
		headers []string
		want    string
	}{
		{"vllm", nil, "0"},
		{"vllm", []string{"Priority", "u=7"}, "4"},
		{"vllm", []string{"Priority", "u=0"}, "0"}, // forged by a caller nobody trusts: the default
		{"vllm", []string{"X-Trusted-Tier", "ops"}, "-3"},
		{"sglang", []string{"Priority", "u=7"}, "-4"},
		{"sglang", []string{"Priority", "u=0"}, "0"},
		{"sglang", []string{"X-Trusted-Tier", "ops"}, "3"},
	} {
		g, b := startPriority(t, tc.mode)
		body := `{"priority":-100,"model":"demo","n":123456789012345678901234567890,"messages":[{"role":"user","content":"héllo 日本"}]}`
		r := g.post(chatPath, "", body, tc.headers...)
		if r.err != nil || r.StatusCode != http.StatusOK {
			t.Fatalf("%s %v: %v %s", tc.mode, tc.headers, r.err, r.body)
		}
		got, raw := b.last()
		if got != tc.want {
			t.Errorf("%s %v: priority %s upstream, want %s", tc.mode, tc.headers, got, tc.want)
		}
		if want := `{"priority":` + tc.want + `,"model":"demo","n":123456789012345678901234567890,"messages":[{"role":"user","content":"héllo 日本"}]}`; string(raw) != want {
			t.Errorf("upstream body %s, want %s", raw, want)
		}
	}
}

func TestCapacityPassPriorityRefusesAJSONBodyThatIsNotAnObject(t *testing.T) {
	g, b := startPriority(t, "vllm")
	r := g.post(chatPath, "", `[1,2`)
	expectError(t, r, http.StatusBadRequest, apierr.CodeInvalidRequest, false)
	if got, _ := b.last(); got != "<none>" {
		t.Fatalf("the model server got a call: %s", got)
	}
}

func TestCapacityPassPriorityKeepsTheFingerprintAndReachesOperations(t *testing.T) {
	g, b := startPriority(t, "vllm")
	body := `{"model":"demo","priority":1,"messages":[]}`
	first := g.post(chatPath, "k1", body, "Priority", "u=6")
	again := g.post(chatPath, "k1", body, "Priority", "u=6")
	if first.StatusCode != 200 || again.StatusCode != 200 || !bytes.Equal(first.body, again.body) {
		t.Fatalf("replay: %d %s / %d %s", first.StatusCode, first.body, again.StatusCode, again.body)
	}
	if n := len(b.seen); n != 1 {
		t.Fatalf("the model server got %d calls for one key; want 1", n)
	}
	if got, _ := b.last(); got != "3" {
		t.Fatalf("keyed call: priority %s upstream, want 3", got)
	}
	other := g.post(chatPath, "k1", `{"model":"demo","priority":2,"messages":[]}`, "Priority", "u=6")
	if other.StatusCode == 200 {
		t.Fatalf("a different client priority under the same key was answered 200: %s", other.body)
	}
	_, op := g.submit(t, "async-1", "Priority", "u=7")
	g.await(t, op.OperationID)
	if got, _ := b.last(); got != "4" {
		t.Fatalf("operation: priority %s upstream, want 4", got)
	}
}

// A background response waits, and reaches the model server, at the trusted urgency: a forged
// u=0 from a caller nobody trusts counts as the default.
func TestCapacityPassPriorityOnABackgroundResponseUsesTheTrustedUrgency(t *testing.T) {
	up, b := &respUpstream{}, &bodies{}
	g := startGatewayWith(t, gatewaySetup{wrap: func(h http.Handler) http.Handler { return b.wrap(up.wrap(h)) },
		mulligan: responsesBlock + "\ncapacity {\n limit 2\n pass_priority vllm\n}"})
	o := g.createResponse(t, `{"model":"m1","input":"hi","background":true}`, append([]string{"Priority", "u=0"}, alice...)...)
	g.awaitResponse(t, o.ID, alice...)
	if got, _ := b.last(); got != "0" {
		t.Fatalf("priority %s upstream for a forged u=0; want 0 (the default)", got)
	}
}

// A batch's lines wait at the gateway's own urgency, u=7, and reach the model server with it.
func TestCapacityPassPriorityOnBatchLines(t *testing.T) {
	t.Parallel()
	b := &bodies{}
	g := startHandlerWith(t, gatewaySetup{wrap: b.wrap, mulligan: batchesBlock + "capacity {\n limit 2\n pass_priority sglang\n}"})
	batch := g.createBatch(t, batchInput(3, func(i int) string { return "line " + strconv.Itoa(i) }), "24h", "Authorization", "Bearer a")
	if batch = g.awaitBatch(t, batch.ID, "Authorization", "Bearer a"); batch.Status != "completed" {
		t.Fatalf("batch ended %s", batch.Status)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.seen) != 3 {
		t.Fatalf("the model server got %d lines, want 3", len(b.seen))
	}
	for _, p := range b.seen {
		if p != "-4" {
			t.Fatalf("a batch line reached the model server with priority %s, want -4 (u=7)", p)
		}
	}
}

// A Content-Type a model server reads as JSON though mime.ParseMediaType refuses it (vLLM and
// FastAPI read the media type before any ';'), or none at all, still gets the gateway's
// priority: the client's own never reaches the model server.
func TestPassPriorityReadsTheMediaTypeAsModelServersDo(t *testing.T) {
	g, b := startPriority(t, "vllm")
	for _, ct := range []string{"application/json; charset", "application/json; a=1; a=1", "Application/JSON"} {
		r := g.post(chatPath, "", `{"priority":-100,"model":"demo","messages":[]}`, "Content-Type", ct)
		if r.err != nil || r.StatusCode != http.StatusOK {
			t.Fatalf("%q: %v %d %s", ct, r.err, r.StatusCode, r.body)
		}
		if got, _ := b.last(); got != "0" {
			t.Errorf("Content-Type %q: priority %s upstream, want 0", ct, got)
		}
	}
}

// A body encoding/json refuses but a model server's parser may take (a UTF-8 BOM, NaN) is
// refused 400 when it would become an operation, as on the live path: it never goes upstream
// with the client's own priority.
func TestPassPriorityRefusesAnOperationsBodyItCannotSet(t *testing.T) {
	g, b := startPriority(t, "vllm")
	for i, body := range []string{"\xef\xbb\xbf{\"priority\":-100,\"model\":\"demo\",\"messages\":[]}",
		`{"priority":-100,"model":"demo","messages":[],"temperature":NaN}`} {
		r := g.post(chatPath, "bom"+string(rune('a'+i)), body, "Prefer", "respond-async")
		if r.err != nil || r.StatusCode != http.StatusBadRequest {
			t.Fatalf("body %d: %v %d %s; want 400", i, r.err, r.StatusCode, r.body)
		}
		expectError(t, r, http.StatusBadRequest, apierr.CodeInvalidRequest, false)
	}
	if got, raw := b.last(); raw != nil {
		t.Fatalf("a refused body reached the model server (priority %s)", got)
	}
}

// A keyed call's body, which the gate holds already, is not counted a second time against
// max_buffered: with max_buffered = max_body, a body over half of it goes through.
func TestPassPriorityCountsAKeyedBodyOnce(t *testing.T) {
	b := &bodies{}
	g := startGatewayWith(t, gatewaySetup{wrap: b.wrap, globals: quietGlobals,
		mulligan: "idempotency {\n max_body 1KiB\n max_buffered 1KiB\n}\ncapacity {\n limit 2\n pass_priority vllm\n}"})
	body := `{"model":"demo","messages":[],"pad":"` + strings.Repeat("x", 700) + `"}`
	if r := g.post(chatPath, "", body); r.StatusCode != http.StatusOK {
		t.Fatalf("unkeyed: %d %s", r.StatusCode, r.body)
	}
	if r := g.post(chatPath, "k-once", body); r.StatusCode != http.StatusOK {
		t.Fatalf("keyed, on an idle gateway: %d %s", r.StatusCode, r.body)
	}
}

// The operator puts background responses at u=5; an untrusted caller's forged Priority: u=0
// does not lift its own response past the operator's choice, so the model server is told u=5.
func TestUntrustedPriorityDoesNotRaiseTheOperatorsResponseUrgency(t *testing.T) {
	up, b := &respUpstream{}, &bodies{}
	g := startGatewayWith(t, gatewaySetup{wrap: func(h http.Handler) http.Handler { return b.wrap(up.wrap(h)) },
		mulligan: "responses /v1 {\n urgency 5\n}\ncapacity {\n limit 2\n pass_priority vllm\n}"})
	o := g.createResponse(t, `{"model":"m1","input":"hi","background":true}`, append([]string{"Priority", "u=0"}, alice...)...)
	g.awaitResponse(t, o.ID, alice...)
	if got, _ := b.last(); got != "2" {
		t.Fatalf("priority %s upstream for an untrusted u=0 under the operator's urgency 5; want 2", got)
	}
}
