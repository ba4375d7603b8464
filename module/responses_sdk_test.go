package module

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mulligan-gw/mulligan/examples/modelserver"
	"github.com/mulligan-gw/mulligan/internal/testkit"
)

// sdkResponsesRun is what testdata/openai_responses.cjs prints in run mode.
type sdkResponsesRun struct {
	Background struct {
		Created struct {
			ID, Status string
			Background bool
		}
		Final struct {
			ID, Status, Text string
			Usage            struct {
				OutputTokens int `json:"output_tokens"`
			}
		}
		Statuses []string
	}
	Stream struct {
		ID          string
		First, Rest []struct {
			Type, Delta, ID string
			Seq             int64
		}
	}
	Cancel struct {
		ID, First, Second, SecondID, After string
	}
	OtherScope int
}

// rawHooks keeps every webhook delivery as it came, for the SDK to verify.
type rawHooks struct {
	mu   sync.Mutex
	got  []rawHook
	srv  *httptest.Server
	seen map[string]bool
}

type rawHook struct {
	body   []byte
	header http.Header
}

func newRawHooks(t *testing.T) *rawHooks {
	h := &rawHooks{seen: map[string]bool{}}
	h.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		h.mu.Lock()
		h.got = append(h.got, rawHook{body: body, header: r.Header.Clone()})
		h.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(h.srv.Close)
	return h
}

// find returns the first delivery of an event of type typ about response id.
func (h *rawHooks) find(typ, id string) *rawHook {
	h.mu.Lock()
	defer h.mu.Unlock()
	for i, d := range h.got {
		var ev struct {
			Type string
			Data struct{ ID string }
		}
		if json.Unmarshal(d.body, &ev) == nil && ev.Type == typ && ev.Data.ID == id {
			return &h.got[i]
		}
	}
	return nil
}

func runSDKScript(t *testing.T, ctx context.Context, node, script string, args ...string) []byte {
	t.Helper()
	return testkit.RunSDKScript(t, ctx, node, script, args...)
}

func TestOpenAINodeSDKRunsBackgroundResponses(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	node, script := installSDKScript(t, ctx, "openai_responses.cjs")
	hooks := newRawHooks(t)
	g := startHandler(t, modelserver.Config{}, webhooksBlock(hooks.srv.URL, "", secretA)+"\n"+responsesBlock)
	var got sdkResponsesRun
	out := runSDKScript(t, ctx, node, script, "run", g.base+"/v1")
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("the script printed %q: %v", out, err)
	}

	checkSDKBackground(t, &got)
	checkSDKStream(t, &got)
	c := got.Cancel
	if c.First != "cancelled" || c.Second != "cancelled" || c.SecondID != c.ID || c.After != "cancelled" {
		t.Fatalf("cancel: %+v", c)
	}
	if got.OtherScope != 404 {
		t.Fatalf("another API key's retrieve answered %d, want 404", got.OtherScope)
	}
	if st := g.model.Stats(); st.Received != 3 || st.Abandoned != 1 {
		t.Fatalf("the model server got %d calls (%d cut), want 3 (1 cut): one per response", st.Received, st.Abandoned)
	}
	checkSDKUnwrap(t, ctx, node, script, hooks, got.Background.Created.ID)
	testkit.WaitFor(t, 10*time.Second, "the response.cancelled delivery", func() bool { return hooks.find("response.cancelled", c.ID) != nil })
}

func checkSDKBackground(t *testing.T, got *sdkResponsesRun) {
	t.Helper()
	b := got.Background
	if b.Created.Status != "queued" || !b.Created.Background || !strings.HasPrefix(b.Created.ID, "resp_") ||
		b.Final.ID != b.Created.ID || b.Final.Status != "completed" || b.Final.Text != "You said: poll me please" || b.Final.Usage.OutputTokens != 5 {
		t.Fatalf("background: %+v", b)
	}
	t.Logf("statuses seen while polling: %v", b.Statuses)
}

// checkSDKStream checks the stream the SDK dropped and resumed: numbered 0, 1, 2, ... across
// both reads, the gateway's id throughout, the text whole.
func checkSDKStream(t *testing.T, got *sdkResponsesRun) {
	t.Helper()
	s := got.Stream
	var text strings.Builder
	all := append(s.First, s.Rest...)
	for i, ev := range all {
		if ev.Seq != int64(i) {
			t.Fatalf("event %d has sequence_number %d: first %+v, then %+v", i, ev.Seq, s.First, s.Rest)
		}
		if ev.ID != "" && ev.ID != s.ID {
			t.Fatalf("event %d carries id %s, want %s", i, ev.ID, s.ID)
		}
		if ev.Type == "response.output_text.delta" {
			text.WriteString(ev.Delta)
		}
	}
	if text.String() != "You said: one two three four five six seven eight" || all[len(all)-1].Type != "response.completed" {
		t.Fatalf("the stream, dropped and resumed, gave %q ending with %+v", text.String(), all[len(all)-1])
	}
}

// checkSDKUnwrap has the SDK's webhooks.unwrap verify the completed response's event as it was
// delivered, and refuse it forged.
func checkSDKUnwrap(t *testing.T, ctx context.Context, node, script string, hooks *rawHooks, id string) {
	t.Helper()
	// The completed response's webhook, as delivered, verifies with the SDK's own unwrap.
	var hook *rawHook
	testkit.WaitFor(t, 10*time.Second, "the response.completed delivery", func() bool {
		hook = hooks.find("response.completed", id)
		return hook != nil
	})
	dir := t.TempDir()
	headers := map[string]string{}
	for name := range hook.header {
		headers[strings.ToLower(name)] = hook.header.Get(name)
	}
	hb, _ := json.Marshal(headers)
	payload, headerFile := filepath.Join(dir, "payload.json"), filepath.Join(dir, "headers.json")
	if os.WriteFile(payload, hook.body, 0o644) != nil || os.WriteFile(headerFile, hb, 0o644) != nil {
		t.Fatal("writing the delivery")
	}
	var unwrapped struct {
		Event struct {
			ID, Object, Type string
			CreatedAt        int64 `json:"created_at"`
			Data             struct{ ID string }
		}
		Forged string
	}
	out := runSDKScript(t, ctx, node, script, "unwrap", secretA, payload, headerFile)
	if err := json.Unmarshal(out, &unwrapped); err != nil {
		t.Fatalf("unwrap printed %q: %v", out, err)
	}
	e := unwrapped.Event
	if e.Object != "event" || e.Type != "response.completed" || e.Data.ID != id || !strings.HasPrefix(e.ID, "evt_") || e.CreatedAt == 0 {
		t.Fatalf("unwrapped %+v", e)
	}
	if unwrapped.Forged == "accepted" {
		t.Fatal("a forged payload verified")
	}
}
