package module

import (
	"os"
	"regexp"
	"testing"
)

// TestReadmeDocumentsEverySubdirective fails when the Caddyfile parser accepts a subdirective
// that the README's configuration reference does not show.
func TestReadmeDocumentsEverySubdirective(t *testing.T) {
	src, err := os.ReadFile("caddyfile.go")
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{"secret": true} // read by unmarshalEndpoint
	for _, m := range regexp.MustCompile(`case "([a-z_]+)"`).FindAllSubmatch(src, -1) {
		names[string(m[1])] = true
	}
	if len(names) < 30 {
		t.Fatalf("found only %d subdirectives in caddyfile.go: the pattern no longer matches the parser", len(names))
	}
	for name := range names {
		// In a Caddyfile block of the README: indented, first on its line.
		if !regexp.MustCompile(`(?m)^\s+` + name + `(\s|$)`).Match(readme) {
			t.Errorf("README.md does not document the %q subdirective", name)
		}
	}
}
