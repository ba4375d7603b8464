package module

import (
	"bytes"
	"testing"
)

func fp(t testing.TB, ignore []string, method, path, query, ct, body string) []byte {
	t.Helper()
	f, err := newFingerprinter(ignore)
	if err != nil {
		t.Fatal(err)
	}
	return f.sum(method, path, query, ct, []byte(body))
}

func TestFingerprintCanonicalisesJSON(t *testing.T) {
	a := fp(t, nil, "POST", "/v1/chat/completions", "", "application/json", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`)
	b := fp(t, nil, "POST", "/v1/chat/completions", "", "application/json", "{\n  \"messages\": [ {\"content\":\"hi\", \"role\":\"user\"} ],\n  \"model\": \"m\"\n}")
	if !bytes.Equal(a, b) {
		t.Fatal("key order and whitespace changed the fingerprint")
	}
}

func TestFingerprintSeparatesWhatMatters(t *testing.T) {
	base := fp(t, nil, "POST", "/p", "a=1", "application/json", `{"x":1}`)
	for name, other := range map[string][]byte{
		"method":       fp(t, nil, "PATCH", "/p", "a=1", "application/json", `{"x":1}`),
		"path":         fp(t, nil, "POST", "/q", "a=1", "application/json", `{"x":1}`),
		"query":        fp(t, nil, "POST", "/p", "a=2", "application/json", `{"x":1}`),
		"content type": fp(t, nil, "POST", "/p", "a=1", "text/plain", `{"x":1}`),
		"body":         fp(t, nil, "POST", "/p", "a=1", "application/json", `{"x":2}`),
		"number text":  fp(t, nil, "POST", "/p", "a=1", "application/json", `{"x":1.0}`),
	} {
		if bytes.Equal(base, other) {
			t.Errorf("a different %s gave the same fingerprint", name)
		}
	}
}

func TestFingerprintIgnoresConfiguredPointers(t *testing.T) {
	ignore := []string{"/metadata/request_id", "/tags/1", "/a~1b"}
	a := fp(t, ignore, "POST", "/p", "", "application/json", `{"metadata":{"request_id":"r1","user":"u"},"tags":["x","y"],"a/b":1}`)
	b := fp(t, ignore, "POST", "/p", "", "application/json", `{"metadata":{"request_id":"r2","user":"u"},"tags":["x","z"],"a/b":2}`)
	if !bytes.Equal(a, b) {
		t.Fatal("ignored pointers still changed the fingerprint")
	}
	c := fp(t, ignore, "POST", "/p", "", "application/json", `{"metadata":{"request_id":"r2","user":"v"},"tags":["x","z"]}`)
	if bytes.Equal(a, c) {
		t.Fatal("a field outside the ignored pointers did not count")
	}
}

func TestFingerprintOfNonJSONIsRaw(t *testing.T) {
	a := fp(t, nil, "POST", "/p", "", "application/json", `{"x":1} trailing`)
	b := fp(t, nil, "POST", "/p", "", "application/json", `{"x":1}  trailing`)
	if bytes.Equal(a, b) {
		t.Fatal("invalid JSON was canonicalised")
	}
}

func FuzzFingerprint(f *testing.F) {
	for _, s := range []string{`{"b":1,"a":[1,2,{"c":null}]}`, `[]`, `"x"`, `{"metadata":{"request_id":1}}`, `{`, `1e999`, `{"a":"\u00e9<>&"}`} {
		f.Add(s)
	}
	fpr, _ := newFingerprinter([]string{"/metadata/request_id", "/0"})
	f.Fuzz(func(t *testing.T, body string) {
		sum := fpr.sum("POST", "/p", "", "application/json", []byte(body))
		if len(sum) != 32 {
			t.Fatal("bad sum length")
		}
		// Canonical output is a fixed point: canonicalising it again changes nothing.
		if canon, ok := fpr.canonicalJSON([]byte(body)); ok {
			again, ok2 := fpr.canonicalJSON(canon)
			if !ok2 || !bytes.Equal(canon, again) {
				t.Fatalf("canonical form not stable: %q -> %q", canon, again)
			}
		}
	})
}
