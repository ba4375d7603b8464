package fingerprint

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"runtime"
	"strconv"
	"strings"
	"testing"
)

func fp(t testing.TB, ignore []string, method, path, query, ct, body string) []byte {
	t.Helper()
	f, err := New(ignore)
	if err != nil {
		t.Fatal(err)
	}
	return f.Sum(method, path, query, ct, []byte(body))
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

// referenceCanonicalJSON is the canonical form as first defined: the body decoded into any,
// pointers removed, re-encoded by encoding/json. The streaming canonicaliser must match it.
func referenceCanonicalJSON(ignore []string, body []byte) ([]byte, bool) {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, false
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, false
	}
	for _, p := range ignore {
		tokens, _ := ParsePointer(p)
		v = referenceRemove(v, tokens)
	}
	var out bytes.Buffer
	enc := json.NewEncoder(&out)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, false
	}
	return out.Bytes(), true
}

func referenceRemove(v any, tokens []string) any {
	if len(tokens) == 0 {
		return v
	}
	head, last := tokens[0], len(tokens) == 1
	switch node := v.(type) {
	case map[string]any:
		child, ok := node[head]
		switch {
		case !ok:
		case last:
			delete(node, head)
		default:
			node[head] = referenceRemove(child, tokens[1:])
		}
	case []any:
		i, err := strconv.Atoi(head)
		if err != nil || i < 0 || i >= len(node) {
			return v
		}
		if last {
			node[i] = nil
		} else {
			node[i] = referenceRemove(node[i], tokens[1:])
		}
	}
	return v
}

var fuzzIgnore = []string{"/metadata/request_id", "/0", "/a/+1", "/b"}

func TestCanonicalFormMatchesDecodingIntoAny(t *testing.T) {
	deep := strings.Repeat(`{"b":1,"a":`, 200) + `"x"` + strings.Repeat("}", 200)
	for _, body := range []string{
		`{"b":1,"a":[1,2,{"d":null,"c":true}],"a":"dup"}`, `{"z":{"y":{"x":1,"w":2},"v":[{"u":1,"t":2}]},"s":"\u2028\n\u0001é"}`,
		`[{"b":1,"a":2},{"d":{"f":1,"e":2},"c":3}]`, `{"metadata":{"user":"u","request_id":"r"},"a":[0,1,2],"b":{"x":1}}`,
		`[[1,2],{"a":[3,{"y":1,"x":2}]}]`, `{"a":1,"a":{"b":2},"a":{"c":3,"b":4}}`, deep,
		`123456789012345678901234567890e99999`, strings.Repeat("[", maxNesting) + strings.Repeat("]", maxNesting),
		strings.Repeat("[", maxNesting+1) + strings.Repeat("]", maxNesting+1), `{"b":[{"deep":` + strings.Repeat("[", maxNesting) + `]}]}`,
	} {
		want, wantOK := referenceCanonicalJSON(fuzzIgnore, []byte(body))
		got, gotOK := fpOf(t, fuzzIgnore).canonicalJSON([]byte(body))
		if gotOK != wantOK || !bytes.Equal(got, want) {
			t.Errorf("%.80s:\n got  %v %.200s\n want %v %.200s", body, gotOK, got, wantOK, want)
		}
	}
}

func fpOf(t testing.TB, ignore []string) *Fingerprinter {
	f, err := New(ignore)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// TestFingerprintMemoryIsOfTheOrderOfTheBody measures the bytes allocated to fingerprint 4 MiB
// bodies of the shapes that cost most: many small objects (the worst when decoded into any),
// with their keys out of order (each one to reorder), and one object of many members.
func TestFingerprintMemoryIsOfTheOrderOfTheBody(t *testing.T) {
	for _, tc := range []struct {
		name              string
		open, item, close string
	}{
		{"small objects", `{"items":[`, `{"id":%d,"name":"n%d","ok":true},`, `{}]}`},
		{"small objects out of order", `[`, `{"b":%d,"a":%d},`, `{}]`},
		{"one object of many members out of order", `{`, `"k%[1]d":0,"a%[1]d":0,`, `"":0}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b strings.Builder
			b.WriteString(tc.open)
			for i := 0; b.Len() < 4<<20; i++ {
				fmt.Fprintf(&b, tc.item, i, i)
			}
			body := []byte(b.String() + tc.close)
			f := fpOf(t, nil)
			runtime.GC()
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			sum := f.Sum("POST", "/p", "", "application/json", body)
			runtime.ReadMemStats(&after)
			allocated := after.TotalAlloc - before.TotalAlloc
			t.Logf("fingerprinting %d bytes allocated %d bytes (%.1fx the body)", len(body), allocated, float64(allocated)/float64(len(body)))
			if allocated > 4*uint64(len(body)) {
				t.Fatalf("allocated %.1fx the body", float64(allocated)/float64(len(body)))
			}
			if again := f.Sum("POST", "/p", "", "application/json", body); !bytes.Equal(again, sum) {
				t.Fatal("the same body fingerprints differently")
			}
		})
	}
}

func FuzzFingerprint(f *testing.F) {
	for _, s := range []string{`{"b":1,"a":[1,2,{"c":null}]}`, `[]`, `"x"`, `{"metadata":{"request_id":1}}`, `{`, `1e999`, `{"a":"\u00e9<>&"}`,
		strings.Repeat(`{"b":[`, 300) + strings.Repeat("]}", 300), strings.Repeat("[", maxNesting+1) + strings.Repeat("]", maxNesting+1),
		`-123456789012345678901234567890.123456789e-99999999`, `{"n":1e400,"m":-0.0000000000000000000000001}`, `{"b":1,"b":2,"a":{"+1":0}}`, `{"0":{"`, "0\x00"} {
		f.Add(s)
	}
	fpr, _ := New(fuzzIgnore)
	f.Fuzz(func(t *testing.T, body string) {
		sum := fpr.Sum("POST", "/p", "", "application/json", []byte(body))
		if len(sum) != 32 {
			t.Fatal("bad sum length")
		}
		canon, ok := fpr.canonicalJSON([]byte(body))
		if want, wantOK := referenceCanonicalJSON(fuzzIgnore, []byte(body)); ok != wantOK || !bytes.Equal(canon, want) {
			t.Fatalf("streaming canonical form differs from encoding/json's: %v %q, want %v %q", ok, canon, wantOK, want)
		}
		// Canonical output is a fixed point: canonicalising it again changes nothing.
		if ok {
			again, ok2 := fpr.canonicalJSON(canon)
			if !ok2 || !bytes.Equal(canon, again) {
				t.Fatalf("canonical form not stable: %q -> %q", canon, again)
			}
		}
	})
}
