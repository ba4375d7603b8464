package consumer

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mulligan-gw/mulligan/webhook"
)

// testNow is the fixed clock of every test: deliveries are signed at it and
// verified against it.
var testNow = time.Unix(1_780_827_373, 0)

func testSecret(t *testing.T, fill string) webhook.Secret {
	t.Helper()
	s, err := webhook.ParseSecret("whsec_" + base64.StdEncoding.EncodeToString([]byte(strings.Repeat(fill, 32))))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// processedLog records what Process was called with.
type processedLog struct {
	mu     sync.Mutex
	events []Event
}

func (l *processedLog) add(ev Event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events = append(l.events, ev)
}

func (l *processedLog) all() []Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]Event(nil), l.events...)
}

// harness is a consumer served over real loopback HTTP.
type harness struct {
	t         *testing.T
	consumer  *Consumer
	server    *httptest.Server
	secrets   []webhook.Secret // what deliveries are signed with
	processed *processedLog
	stopOnce  sync.Once
}

// start serves a consumer on dir; cfg's zero fields get test values.
func start(t *testing.T, dir string, cfg Config) *harness {
	t.Helper()
	h := &harness{t: t, processed: &processedLog{}}
	if cfg.Secrets == nil {
		cfg.Secrets = []webhook.Secret{testSecret(t, "c")}
	}
	h.secrets = cfg.Secrets
	cfg.Dir, cfg.Now, cfg.Logf = dir, func() time.Time { return testNow }, t.Logf
	if cfg.Process == nil {
		cfg.Process = h.processed.add
	}
	c, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	h.consumer, h.server = c, httptest.NewServer(c)
	t.Cleanup(h.stop)
	return h
}

// stop shuts the server and the consumer down, as a restart would.
func (h *harness) stop() {
	h.stopOnce.Do(func() {
		h.server.Close()
		if err := h.consumer.Close(); err != nil {
			h.t.Errorf("Close: %v", err)
		}
	})
}

// deliver POSTs body as webhook id, signed as the gateway signs an attempt,
// and returns the status.
func (h *harness) deliver(id string, body []byte) int {
	h.t.Helper()
	return h.deliverSigned(id, body, webhook.Sign(h.secrets, id, testNow, body))
}

func (h *harness) deliverSigned(id string, body []byte, signature string) int {
	h.t.Helper()
	req, err := http.NewRequest(http.MethodPost, h.server.URL+"/webhooks/ai-jobs", bytes.NewReader(body))
	if err != nil {
		h.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(webhook.HeaderID, id)
	req.Header.Set(webhook.HeaderTimestamp, fmt.Sprint(testNow.Unix()))
	req.Header.Set(webhook.HeaderSignature, signature)
	resp, err := h.server.Client().Do(req)
	if err != nil {
		h.t.Fatalf("delivering %s: %v", id, err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// deliverX POSTs body as event id in the X-Webhook style, signed with secrets, and returns the
// status.
func (h *harness) deliverX(id string, body []byte, secrets []webhook.Secret) int {
	h.t.Helper()
	req, err := http.NewRequest(http.MethodPost, h.server.URL+"/webhooks/ai-jobs", bytes.NewReader(body))
	if err != nil {
		h.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(webhook.HeaderXID, id)
	req.Header.Set(webhook.HeaderXTimestamp, testNow.UTC().Format(time.RFC3339))
	req.Header.Set(webhook.HeaderXSignature, webhook.SignXWebhook(secrets, testNow, body))
	req.Header.Set(webhook.HeaderEventType, "operation.succeeded")
	resp, err := h.server.Client().Do(req)
	if err != nil {
		h.t.Fatalf("delivering %s: %v", id, err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// waitIdle waits for the queue to drain.
func (h *harness) waitIdle() {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := h.consumer.WaitIdle(ctx); err != nil {
		h.t.Fatalf("WaitIdle: %v", err)
	}
}

// event is a delivery body as Mulligan sends it, with a field from the
// future that consumers must ignore.
func event(id, opID, status string, version int64) []byte {
	done := status == "succeeded" || status == "failed" || status == "canceled"
	response := "null"
	if status == "succeeded" {
		response = `{"status":200,"content_type":"application/json","body":{"id":"chatcmpl-1"}}`
	}
	return fmt.Appendf(nil, `{"event_id":%q,"event_type":"operation.%s","event_version":"1.0",`+
		`"occurred_at":"2026-06-07T10:15:30Z","delivery_attempt":1,"added_later":{"x":1},`+
		`"operation":{"operation_id":%q,"status":%q,"done":%t,"version":%d,"method":"POST",`+
		`"path":"/v1/chat/completions","response":%s,"error":null,`+
		`"links":{"self":"/v1/operations/%s","cancel":"/v1/operations/%s/cancel","result":"/v1/operations/%s/result"}}}`,
		id, status, opID, status, done, version, response, opID, opID, opID)
}

// journaledIDs lists the webhook-ids of the journal's received records:
// what was accepted, independently of what ordering later let through.
func journaledIDs(t *testing.T, dir string) []string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, journalFile))
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for line := range bytes.Lines(data) {
		var r record
		if err := json.Unmarshal(line, &r); err != nil {
			t.Fatalf("journal line %q: %v", line, err)
		}
		if r.Kind == kindReceived {
			ids = append(ids, r.ID)
		}
	}
	return ids
}

// versionsOf lists "op@version" of events, in order.
func versionsOf(events []Event) []string {
	out := make([]string, len(events))
	for i, ev := range events {
		out[i] = fmt.Sprintf("%s@%d", ev.Operation.OperationID, ev.Operation.Version)
	}
	return out
}
