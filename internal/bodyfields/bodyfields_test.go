package bodyfields

import (
	"strings"
	"testing"
)

func TestReadTakesTheTopLevelMetadataAndCallbackURL(t *testing.T) {
	f := Read("application/json; charset=utf-8",
		[]byte(`{"model":"m","metadata": { "team" : "a" },"callback":{"url":"https://hooks.example/x"}}`))
	if string(f.Metadata) != `{"team":"a"}` || f.MetadataIgnored != "" || f.CallbackURL != "https://hooks.example/x" {
		t.Fatalf("fields = %+v", f)
	}
}

func TestReadMatchesKeysExactlyAndIgnoresBodiesThatAreNotJSONObjects(t *testing.T) {
	for _, c := range []struct{ ct, body string }{
		{"application/json", `{"Metadata":{"a":1},"CALLBACK":{"url":"https://x"}}`},
		{"text/plain", `{"metadata":{"a":1}}`},
		{"application/json", `[{"metadata":{"a":1}}]`},
		{"application/json", `{"metadata":{"a":1},`},
		{"application/json", ``},
	} {
		if f := Read(c.ct, []byte(c.body)); f.Metadata != nil || f.CallbackURL != "" || f.MetadataIgnored != "" {
			t.Errorf("%s %q: fields = %+v, want none", c.ct, c.body, f)
		}
	}
}

func TestMetadataOtherThanASmallObjectIsLeftOutWithTheReason(t *testing.T) {
	big := `{"blob":"` + strings.Repeat("x", MaxMetadata) + `"}`
	for _, c := range []struct{ metadata, why string }{
		{`null`, ""},
		{`"text"`, "not a JSON object"},
		{`[1]`, "not a JSON object"},
		{big, "larger than 16 KiB"},
	} {
		f := Read("application/json", []byte(`{"metadata":`+c.metadata+`}`))
		if f.Metadata != nil || f.MetadataIgnored != c.why {
			t.Errorf("%.20s: metadata %s, reason %q; want none, %q", c.metadata, f.Metadata, f.MetadataIgnored, c.why)
		}
	}
}
