package module

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/mulligan-gw/mulligan/examples/modelserver"
	"github.com/mulligan-gw/mulligan/internal/apierr"
	"github.com/mulligan-gw/mulligan/internal/bodyfields"
	"github.com/mulligan-gw/mulligan/internal/testkit"
)

// resource is an operation's JSON form, read loosely: the tests check which fields are there.
type resource map[string]json.RawMessage

func decodeResource(t *testing.T, r result) resource {
	t.Helper()
	var res resource
	if r.err != nil || json.Unmarshal(r.body, &res) != nil {
		t.Fatalf("not an operation: %v %s", r.err, r.body)
	}
	return res
}

func (res resource) str(name string) string {
	var s string
	_ = json.Unmarshal(res[name], &s)
	return s
}

// chatWith is a chat completion body with extra top-level fields (JSON text each).
func chatWith(fields string) string {
	return `{"model":"demo",` + fields + `,"messages":[{"role":"user","content":"hi","metadata":{"nested":true}}]}`
}

func compact(t *testing.T, s string) string {
	t.Helper()
	var b bytes.Buffer
	if err := json.Compact(&b, []byte(s)); err != nil {
		t.Fatalf("%v: %s", err, s)
	}
	return b.String()
}

func TestOperationCarriesTypeMetadataAndTheTimesOfItsChanges(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t, secretA, nil)
	g := startHandler(t, modelserver.Config{}, "async {\n type chat_completion\n}\n"+webhooksBlock(rc.srv.URL+"/hook", "", secretA))
	const metadata = `{"job_id": "j-1", "tags": ["a", "b"]}`
	body := chatWith(`"metadata":` + metadata)

	// A long call, seen while it is not final, then canceled.
	slow := g.post(chatPath, "slow", body, "Prefer", "respond-async", "X-Mock-Latency", "30s")
	var accepted struct {
		OperationID       string `json:"operation_id"`
		WebhookRegistered *bool  `json:"webhook_registered"`
	}
	if json.Unmarshal(slow.body, &accepted) != nil || slow.StatusCode != 202 || accepted.WebhookRegistered == nil || !*accepted.WebhookRegistered {
		t.Fatalf("202: %d %s", slow.StatusCode, slow.body)
	}
	pending := decodeResource(t, g.get("/v1/operations/"+accepted.OperationID))
	if pending.str("type") != "chat_completion" || string(pending["metadata"]) != compact(t, metadata) ||
		string(pending["retry_after"]) != "2" || pending.str("updated_at") == "" {
		t.Fatalf("pending resource: %s", mustJSON(pending))
	}
	canceled := decodeResource(t, g.post("/v1/operations/"+accepted.OperationID+"/cancel", "", ""))
	if canceled.str("status") != "canceled" || canceled["retry_after"] != nil || canceled.str("updated_at") != canceled.str("finished_at") {
		t.Fatalf("canceled resource: %s", mustJSON(canceled))
	}

	// A quick call to the end.
	_, op := g.submit(t, "")
	g.await(t, op.OperationID)
	final := decodeResource(t, g.get(op.StatusURL))
	submitted, _ := time.Parse(time.RFC3339Nano, final.str("submitted_at"))
	updated, _ := time.Parse(time.RFC3339Nano, final.str("updated_at"))
	if final["retry_after"] != nil || final.str("updated_at") != final.str("finished_at") || !updated.After(submitted) || final["metadata"] != nil {
		t.Fatalf("final resource (submitted without metadata): %s", mustJSON(final))
	}

	// Every event carries the type and the metadata of its operation.
	testkit.WaitFor(t, 5*time.Second, "rc.delivered() == 2", func() bool { return rc.delivered() == 2 })
	rc.mu.Lock()
	defer rc.mu.Unlock()
	for _, ev := range rc.events {
		operation := ev["operation"].(map[string]any)
		var want any = map[string]any{"job_id": "j-1", "tags": []any{"a", "b"}}
		if operation["operation_id"] != accepted.OperationID {
			want = nil
		}
		if operation["type"] != "chat_completion" || fmt.Sprint(operation["metadata"]) != fmt.Sprint(want) {
			t.Errorf("event %v: type %v metadata %v", ev["event_type"], operation["type"], operation["metadata"])
		}
	}
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

func TestOperationWithoutWebhookOrTypeSaysSo(t *testing.T) {
	t.Parallel()
	g := startHandler(t, modelserver.Config{}, "")
	r, op := g.submit(t, "")
	if !strings.Contains(string(r.body), `"webhook_registered":false`) {
		t.Fatalf("202: %s", r.body)
	}
	if res := decodeResource(t, g.get(op.StatusURL)); res.str("type") != chatPath {
		t.Fatalf("type %q, want the route path", res.str("type"))
	}
}

func TestMetadataOtherThanASmallObjectIsNotKept(t *testing.T) {
	g := startGateway(t, modelserver.Config{}, "")
	big := `{"blob":"` + strings.Repeat("x", bodyfields.MaxMetadata) + `"}`
	near := `{"blob":"` + strings.Repeat("x", bodyfields.MaxMetadata-20) + `"}`
	for _, tc := range []struct {
		name, body, contentType, want string
	}{
		{"an object is kept, compacted", chatWith(`"metadata": { "a" : 1 }`), "application/json", `{"a":1}`},
		{"an object just under 16 KiB is kept", chatWith(`"metadata":` + near), "application/json", near},
		{"an object over 16 KiB", chatWith(`"metadata":` + big), "application/json", ""},
		{"a string", chatWith(`"metadata":"job-1"`), "application/json", ""},
		{"an array", chatWith(`"metadata":[1,2]`), "application/json", ""},
		{"null", chatWith(`"metadata":null`), "application/json", ""},
		{"another spelling", chatWith(`"Metadata":{"a":1}`), "application/json", ""},
		{"only nested deeper", chatWith(`"n":1`), "application/json", ""},
		{"a body that is not JSON", chatWith(`"metadata":{"a":1}`), "text/plain", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := g.post(chatPath, "", tc.body, "Prefer", "respond-async", "Content-Type", tc.contentType)
			if r.StatusCode != 202 {
				t.Fatalf("%d %s", r.StatusCode, r.body)
			}
			res := decodeResource(t, g.get(decodeOp(t, r).StatusURL))
			if got := string(res["metadata"]); got != tc.want {
				t.Fatalf("metadata %.80q, want %.80q", got, tc.want)
			}
		})
	}
}

func TestRetryableErrorsCarryRetryAfterSecondsInDetails(t *testing.T) {
	t.Parallel()
	g := startHandler(t, modelserver.Config{}, "async {\n concurrency 1\n queue 1\n}")
	_, running := g.submit(t, "a", "X-Mock-Latency", "30s")
	testkit.WaitFor(t, 5*time.Second, "g.model.Stats().InFlight == 1", func() bool { return g.model.Stats().InFlight == 1 })
	_, queued := g.submit(t, "b")
	syncDone := make(chan result, 1)
	go func() { syncDone <- g.post(chatPath, "sync", chat("sync"), "X-Mock-Latency", "2s") }()
	testkit.WaitFor(t, 5*time.Second, "g.model.Stats().InFlight == 2", func() bool { return g.model.Stats().InFlight == 2 })

	for _, tc := range []struct {
		name        string
		r           result
		status      int
		code        apierr.Code
		seconds     int
		operationID string
	}{
		{"a result not there yet", g.get(queued.Links.Result), 409, apierr.CodeNotFinished, 2, queued.OperationID},
		{"a full queue", g.post(chatPath, "c", chat("c"), "Prefer", "respond-async"), 503, apierr.CodeQueueFull, 5, ""},
		{"a key in flight", g.post(chatPath, "sync", chat("sync")), 409, apierr.CodeInProgress, 1, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			expectError(t, tc.r, tc.status, tc.code, true)
			var e struct {
				Error struct {
					Details struct {
						RetryAfterSeconds *int   `json:"retry_after_seconds"`
						OperationID       string `json:"operation_id"`
					} `json:"details"`
				} `json:"error"`
			}
			_ = json.Unmarshal(tc.r.body, &e)
			d := e.Error.Details
			if d.RetryAfterSeconds == nil || *d.RetryAfterSeconds != tc.seconds || tc.r.Header.Get("Retry-After") != fmt.Sprint(tc.seconds) || d.OperationID != tc.operationID {
				t.Fatalf("details %s, Retry-After %q", tc.r.body, tc.r.Header.Get("Retry-After"))
			}
		})
	}
	<-syncDone
	g.post(running.Links.Cancel, "", "")
}

func TestCallbackUrlFromTheBodyIsUsedUnderTheSameAllowList(t *testing.T) {
	rc := newReceiver(t, secretA, nil)
	g := startGateway(t, modelserver.Config{}, "webhooks {\n endpoint hooks "+rc.srv.URL+"/hooks/* {\n secret "+secretA+"\n }\n allow_private\n}")
	allowed, refused := rc.srv.URL+"/hooks/job-7", rc.srv.URL+"/other"
	callback := func(url string) string { return chatWith(`"callback":{"url":"` + url + `"}`) }
	for _, tc := range []struct {
		name, body, header string
		status             int
		message            string // of a refusal
		registered         bool
	}{
		{"an allowed body URL", callback(allowed), "", 202, "", true},
		{"a body URL outside the endpoints", callback(refused), "", 422, "The callback URL matches no configured webhook endpoint.", false},
		{"header and body agreeing", callback(allowed), allowed, 202, "", true},
		{"header and body disagreeing", callback(rc.srv.URL + "/hooks/job-8"), allowed, 400, "The Callback-Url header and the body's callback.url name different URLs; send one of them.", false},
		{"neither", chat("x"), "", 202, "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			headers := []string{"Prefer", "respond-async"}
			if tc.header != "" {
				headers = append(headers, "Callback-Url", tc.header)
			}
			r := g.post(chatPath, "", tc.body, headers...)
			if tc.status != 202 {
				code := apierr.CodeCallbackNotAllow
				if tc.status == 400 {
					code = apierr.CodeInvalidRequest
				}
				expectError(t, r, tc.status, code, false)
				var e apierr.Body
				_ = json.Unmarshal(r.body, &e)
				if e.Error.Message != tc.message {
					t.Fatalf("message %q, want %q", e.Error.Message, tc.message)
				}
				return
			}
			if r.StatusCode != 202 || !strings.Contains(string(r.body), fmt.Sprintf(`"webhook_registered":%v`, tc.registered)) {
				t.Fatalf("%d %s", r.StatusCode, r.body)
			}
			g.await(t, decodeOp(t, r).OperationID)
		})
	}
	// Two accepted requests named the allowed URL; the refused ones never reached the upstream.
	testkit.WaitFor(t, 5*time.Second, "rc.delivered() == 2", func() bool { return rc.delivered() == 2 })
	if n := g.model.Stats().Received; n != 3 {
		t.Fatalf("the upstream ran %d times, want 3", n)
	}
}
