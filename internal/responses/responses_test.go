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
	for body, p := range map[string]string{`{"background":"yes"}`: "background", `{"background":true,"stream":1}`: "stream",
		`{"background":true,"metadata":[]}`: "metadata", `{"background":true,"metadata":{"a":{}}}`: "metadata",
		`{"background":true,"metadata":{},"tools":"` + strings.Repeat("t", MaxEcho) + `"}`: "tools"} {
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
	if n, ended := Count([]byte(stream)); n != 3 || !ended {
		t.Errorf("Count %d %v, want 3 and ended (the comment is not an event)", n, ended)
	}
	// A last event without its blank line is no event, for Final as for Count.
	cut := strings.TrimSuffix(stream, "\n")
	if o, ok := Final("text/event-stream", []byte(cut)); ok {
		t.Errorf("final of a stream whose completed event is cut short: %v", o)
	}
	if n, ended := Count([]byte(cut)); n != 2 || ended {
		t.Errorf("Count of the cut stream %d %v, want 2 and not ended", n, ended)
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
	if n, err := ParseStartingAfter(nil); n != -1 || err != nil {
		t.Errorf("absent: %d %v", n, err)
	}
	if n, err := ParseStartingAfter([]string{"12"}); n != 12 || err != nil {
		t.Errorf("12: %d %v", n, err)
	}
	for _, bad := range [][]string{{""}, {"-1"}, {"x"}, {"1e3"}, {"99999999999999999999"}, {"+5"}, {" 5"}, {"5 "}, {"1", "99"}} {
		if _, err := ParseStartingAfter(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestParseStream(t *testing.T) {
	for _, c := range []struct {
		in   []string
		want bool
	}{{nil, false}, {[]string{"true"}, true}, {[]string{"false"}, false}} {
		if got, err := ParseStream(c.in); got != c.want || err != nil {
			t.Errorf("%q: %v %v", c.in, got, err)
		}
	}
	for _, bad := range [][]string{{""}, {"1"}, {"True"}, {"yes"}, {"true", "true"}} {
		if _, err := ParseStream(bad); err == nil {
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

func TestPartialFoldsTheOutputSoFar(t *testing.T) {
	var p Partial
	for _, ev := range []string{
		`{"type":"response.created","response":{"id":"r"}}`,
		`{"type":"response.output_item.added","output_index":0,"item":{"id":"m","type":"message","content":[]}}`,
		`{"type":"response.content_part.added","output_index":0,"content_index":0,"part":{"type":"output_text","text":""}}`,
		`{"type":"response.output_text.delta","output_index":0,"content_index":0,"delta":"Hel"}`,
		`{"type":"response.output_text.delta","output_index":0,"content_index":0,"delta":"lo"}`,
		`{"type":"response.output_text.delta","output_index":7,"content_index":0,"delta":"lost"}`,
		`{"type":"response.output_item.added","output_index":99999,"item":{}}`,
	} {
		p.Add([]byte("data: " + ev + "\n\n"))
	}
	b, _ := json.Marshal(p.Output())
	if string(b) != `[{"content":[{"text":"Hello","type":"output_text"}],"id":"m","type":"message"}]` {
		t.Fatalf("output %s", b)
	}
}

// FuzzUpstreamEvents feeds arbitrary upstream bytes to everything that reads them: none may
// panic, and an event relayed is always one event with the gateway's id.
func FuzzUpstreamEvents(f *testing.F) {
	f.Add([]byte("event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"id\":\"x\"}}\n\n"))
	f.Add([]byte("data: {\"type\":\"response.output_text.delta\",\"output_index\":-1,\"content_index\":1e99,\"delta\":3}\n\n"))
	f.Add([]byte("data: {\"type\":\"response.output_item.added\",\"output_index\":0,\"item\":{\"content\":\"no\"}}\n\ndata: {\"type\":\"response.content_part.added\",\"output_index\":0,\"content_index\":0,\"part\":{}}\n\n"))
	f.Add([]byte(": comment\n\ndata: [DONE]\n\n"))
	f.Add([]byte("data: {\"type\":\"a\\n\\nevent: forged\"}\n\n"))
	f.Fuzz(func(t *testing.T, body []byte) {
		var p Partial
		var split sseSplit
		split.each(body, func(block []byte) {
			p.Add(block)
			if out, _, ok := Event(block, 3, "resp_gw", 1); ok && strings.Count(string(out), "\n\n") != 1 {
				t.Fatalf("relayed %q as %q", block, out)
			}
		})
		_ = p.Output()
		Final("text/event-stream", body)
		Final("application/json", body)
		Count(body)
		_, _ = ParseCreate(body)
		UpstreamError(body)
	})
}
