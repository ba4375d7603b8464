package responses

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestParseCreate(t *testing.T) {
	c, err := ParseCreate([]byte(`{"model":"m","input":"hi","background":true,"metadata":{"a":"b"},"temperature":0.25,"extra":1}`))
	if err != nil || !c.Background || c.Stream {
		t.Fatalf("%+v %v", c, err)
	}
	var up, echo map[string]any
	_ = json.Unmarshal(c.Upstream, &up)
	_ = json.Unmarshal(c.Echo, &echo)
	if _, has := up["background"]; has || up["stream"] != true || up["extra"] != 1.0 || up["input"] != "hi" {
		t.Errorf("upstream body %s", c.Upstream)
	}
	if echo["model"] != "m" || echo["temperature"] != 0.25 || echo["metadata"].(map[string]any)["a"] != "b" || echo["input"] != nil {
		t.Errorf("echo %s", c.Echo)
	}
	if c, err := ParseCreate([]byte(`{"input":"x","stream":true}`)); err != nil || c.Background || !c.Stream || c.Upstream != nil {
		t.Errorf("not background: %+v %v", c, err)
	}
	for _, bad := range []string{``, `[]`, `{"a":`, `"x"`, `{} {}`} {
		if _, err := ParseCreate([]byte(bad)); err != ErrNotObject {
			t.Errorf("%q: %v", bad, err)
		}
	}
	for body, p := range map[string]string{`{"background":"yes"}`: "background", `{"background":true,"stream":1}`: "stream"} {
		if _, err := ParseCreate([]byte(body)); err == nil || err.(*FieldError).Param != p {
			t.Errorf("%s: %v", body, err)
		}
	}
}

func TestFinalAndEvent(t *testing.T) {
	stream := "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_up\",\"status\":\"in_progress\"}}\n\n" +
		": keep-alive\n\n" +
		"data: {\"type\":\"response.output_text.delta\",\"delta\":\"hi\",\"sequence_number\":9}\n\n" +
		"event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"id\":\"resp_up\",\"status\":\"completed\",\"created_at\":5,\"usage\":{\"output_tokens\":12345678901234567}}}\n\n"
	o, ok := Final("text/event-stream", []byte(stream))
	if !ok || o.Status() != Completed {
		t.Fatalf("final %v %v", o, ok)
	}
	own, _ := json.Marshal(o.Own("resp_gw", 7))
	if !strings.Contains(string(own), `"id":"resp_gw"`) || !strings.Contains(string(own), `"created_at":7`) ||
		!strings.Contains(string(own), `"background":true`) || !strings.Contains(string(own), `12345678901234567`) {
		t.Errorf("owned %s", own)
	}
	if n := Count([]byte(stream)); n != 3 {
		t.Errorf("Count %d, want 3 (the comment is not an event)", n)
	}
	out, typ, ok := Event([]byte("data: {\"type\":\"response.output_text.delta\",\"delta\":\"hi\",\"sequence_number\":9}\n\n"), 4, "resp_gw", 7)
	if !ok || typ != "response.output_text.delta" || string(out) != "event: response.output_text.delta\ndata: {\"delta\":\"hi\",\"sequence_number\":4,\"type\":\"response.output_text.delta\"}\n\n" {
		t.Errorf("event %q", out)
	}
	if _, _, ok := Event([]byte("data: [DONE]\n\n"), 0, "", 0); ok {
		t.Error("[DONE] relayed")
	}
	if _, ok := Final("text/event-stream", []byte("data: {\"type\":\"response.created\",\"response\":{}}\n\n")); ok {
		t.Error("a stream without a final event has a final object")
	}
	if o, ok := Final("application/json", []byte(`{"object":"response","status":"incomplete"}`)); !ok || o.Status() != Incomplete {
		t.Errorf("JSON answer: %v %v", o, ok)
	}
	if _, ok := Final("application/json", []byte(`{"error":{"message":"no"}}`)); ok {
		t.Error("an error body has a final object")
	}
	if code, msg, ok := UpstreamError([]byte(`{"error":{"message":"no","type":"server_error","code":null}}`)); !ok || code != "server_error" || msg != "no" {
		t.Errorf("upstream error %q %q %v", code, msg, ok)
	}
}

func TestParseStartingAfter(t *testing.T) {
	if n, err := ParseStartingAfter("", false); n != -1 || err != nil {
		t.Errorf("absent: %d %v", n, err)
	}
	if n, err := ParseStartingAfter("12", true); n != 12 || err != nil {
		t.Errorf("12: %d %v", n, err)
	}
	for _, bad := range []string{"", "-1", "x", "1e3", "99999999999999999999"} {
		if _, err := ParseStartingAfter(bad, true); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestWebhookTypes(t *testing.T) {
	for _, s := range []string{Completed, Failed, Cancelled, Incomplete} {
		if !IsWebhookType(WebhookType(s)) {
			t.Errorf("%s", s)
		}
	}
	for _, typ := range []string{"", "response.", "response.queued", "response.in_progress", "operation.succeeded", "batch.completed"} {
		if IsWebhookType(typ) {
			t.Errorf("%q is a webhook type", typ)
		}
	}
}
