package module

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestReadmeCaddyfileReferenceShowsEverySubdirective fails when the Caddyfile parser accepts a
// subdirective that the Caddyfile reference (docs/caddyfile.md, linked from the README) does not
// show in one of its Caddyfile blocks.
func TestReadmeCaddyfileReferenceShowsEverySubdirective(t *testing.T) {
	sources, err := filepath.Glob("caddyfile*.go")
	if err != nil {
		t.Fatal(err)
	}
	// The parser's words: "case" labels of the block loops, and words compared with d.Val()
	// (secret in an endpoint block).
	accepted := regexp.MustCompile(`case "([a-z_]+)"|d\.Val\(\) [!=]= "([a-z_]+)"`)
	names := map[string]bool{}
	for _, file := range sources {
		if strings.HasSuffix(file, "_test.go") {
			continue
		}
		src, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range accepted.FindAllSubmatch(src, -1) {
			names[string(m[1])+string(m[2])] = true
		}
	}
	if len(names) < 30 || !names["secret"] {
		t.Fatalf("found only %d subdirectives in %v: the pattern no longer matches the parser", len(names), sources)
	}
	doc, err := os.ReadFile("../docs/caddyfile.md")
	if err != nil {
		t.Fatal(err)
	}
	var blocks []byte
	for _, m := range regexp.MustCompile("(?s)```caddyfile\n(.*?)```").FindAllSubmatch(doc, -1) {
		blocks = append(blocks, m[1]...)
	}
	if len(blocks) == 0 {
		t.Fatal("docs/caddyfile.md has no ```caddyfile block")
	}
	for name := range names {
		// Indented and first on its line: a subdirective, not a word in a comment.
		if !regexp.MustCompile(`(?m)^\s+` + name + `(\s|$)`).Match(blocks) {
			t.Errorf("docs/caddyfile.md does not show the %q subdirective in a Caddyfile block", name)
		}
	}
}

// TestReadmeStatesTheKeyRetentionWindow checks that the README tells users how long a completed
// idempotency key replays, with the default the code applies, and the header that says it.
func TestReadmeStatesTheKeyRetentionWindow(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(fmt.Sprintf(`replays for \**%d hours\**`, defaultTTL/time.Hour)),
		regexp.MustCompile("`" + headerExpires + "`"),
		regexp.MustCompile("`ttl`"),
	} {
		if !want.Match(readme) {
			t.Errorf("README.md does not state the idempotency key retention window: nothing matches %q", want)
		}
	}
}
