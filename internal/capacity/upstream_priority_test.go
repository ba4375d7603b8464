package capacity

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/mulligan-gw/mulligan/store"
)

func TestUpstreamPriorityMapping(t *testing.T) {
	for _, c := range []struct {
		mode    string
		urgency int
		want    int
	}{
		{PassPriorityVLLM, 0, -3}, {PassPriorityVLLM, 3, 0}, {PassPriorityVLLM, 7, 4},
		{PassPrioritySGLang, 0, 3}, {PassPrioritySGLang, 3, 0}, {PassPrioritySGLang, 7, -4},
	} {
		if got := UpstreamPriority(c.mode, c.urgency); got != c.want {
			t.Errorf("UpstreamPriority(%s, %d) = %d, want %d", c.mode, c.urgency, got, c.want)
		}
	}
	for _, m := range []string{"", "vllm", "sglang"} {
		if !ValidPassPriority(m) {
			t.Errorf("%q should be valid", m)
		}
	}
	if ValidPassPriority("tgi") {
		t.Error("tgi should not be valid")
	}
}

func TestSetBodyPriority(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{`{}`, `{"priority":-3}`},
		{` { } `, `{"priority":-3}`},
		{`{"model":"m"}`, `{"priority":-3,"model":"m"}`},
		{`{"priority":5,"model":"m"}`, `{"priority":-3,"model":"m"}`},
		{`{"model":"m", "priority" : 5 }`, `{"priority":-3,"model":"m"}`},
		{`{"priorit\u0079":5,"n":12345678901234567890123}`, `{"priority":-3,"n":12345678901234567890123}`},
		{`{"priority":1,"priority":2,"x":1.50e3}`, `{"priority":-3,"x":1.50e3}`},
		{`{"a":{"priority":9},"b":["}",{"c":"\"{"}],"é":"日本\u00e9"}`,
			`{"priority":-3,"a":{"priority":9},"b":["}",{"c":"\"{"}],"é":"日本\u00e9"}`},
		{`{"t":true,"f":false,"z":null,"n":-0.5}`, `{"priority":-3,"t":true,"f":false,"z":null,"n":-0.5}`},
	} {
		got, err := SetBodyPriority([]byte(c.in), -3)
		if err != nil || string(got) != c.want {
			t.Errorf("SetBodyPriority(%s) = %s, %v; want %s", c.in, got, err, c.want)
		}
	}
	for _, bad := range []string{``, `[]`, `"x"`, `3`, `{`, `{"a":1}{}`, `null`, `{"a":}`} {
		if _, err := SetBodyPriority([]byte(bad), 0); err != ErrNotJSONObject {
			t.Errorf("SetBodyPriority(%q) error = %v, want ErrNotJSONObject", bad, err)
		}
	}
}

func FuzzSetBodyPriority(f *testing.F) {
	for _, s := range []string{`{}`, `{"priority":1}`, `{"a":[1,{"b":"}"}],"priority":"x"}`, `[1]`, `{"\u0070riority":2}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		out, err := SetBodyPriority(body, 4)
		var obj map[string]json.RawMessage
		isObject := json.Valid(body) && json.Unmarshal(body, &obj) == nil && obj != nil
		if !isObject {
			if err == nil {
				t.Fatalf("accepted %q", body)
			}
			return
		}
		if err != nil {
			t.Fatalf("refused object %q: %v", body, err)
		}
		var got map[string]json.RawMessage
		if err := json.Unmarshal(out, &got); err != nil {
			t.Fatalf("output %q of %q is not JSON: %v", out, body, err)
		}
		if strings.TrimSpace(string(got["priority"])) != "4" {
			t.Fatalf("priority of %q = %s", out, got["priority"])
		}
		for k, v := range obj {
			if k != "priority" && string(got[k]) != string(v) {
				t.Fatalf("member %q changed: %s -> %s", k, v, got[k])
			}
		}
	})
}

// An operation's attempt carries its stored urgency in the server's scale, on a copy: the
// stored request is left as it is, and a body that is not a JSON object goes unchanged.
func TestWithStoredPriorityRewritesACopy(t *testing.T) {
	req := &store.Request{Header: http.Header{"Content-Type": {"application/json"}, "Content-Length": {"17"}}, Body: []byte(`{"priority":9,"a":1}`)}
	got := WithStoredPriority(PassPriorityVLLM, 1, req)
	if string(got.Body) != `{"priority":-2,"a":1}` || got.Header.Get("Content-Length") != "21" {
		t.Fatalf("rewritten: %s %v", got.Body, got.Header)
	}
	if string(req.Body) != `{"priority":9,"a":1}` || req.Header.Get("Content-Length") != "17" {
		t.Fatalf("the stored request changed: %s %v", req.Body, req.Header)
	}
	for _, c := range []struct {
		mode string
		req  *store.Request
	}{
		{"", req},
		{PassPriorityVLLM, &store.Request{Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`[1]`)}},
		{PassPriorityVLLM, &store.Request{Header: http.Header{"Content-Type": {"text/plain"}}, Body: []byte(`{}`)}},
		{PassPriorityVLLM, nil},
	} {
		if got := WithStoredPriority(c.mode, 0, c.req); got != c.req {
			t.Errorf("%q %v: rewritten to %v, want it sent as it is", c.mode, c.req, got)
		}
	}
	if !RefusesBody(PassPrioritySGLang, "application/json", []byte(`[1]`)) || RefusesBody("", "application/json", []byte(`[1]`)) ||
		RefusesBody(PassPrioritySGLang, "text/plain", []byte(`[1]`)) || RefusesBody(PassPrioritySGLang, "application/json", []byte(`{}`)) {
		t.Error("RefusesBody: only a body declared JSON that is not an object, with pass_priority on")
	}
}
