package main

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// TestOperatingDocListsEverySidecarVariable fails when `mulligan sidecar` reads a variable that
// the table in docs/operating.md does not list, or lists with another default.
func TestOperatingDocListsEverySidecarVariable(t *testing.T) {
	doc, err := os.ReadFile("../docs/operating.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range sidecarVars {
		// MULLIGAN_X_FILE shares the row of MULLIGAN_X, written "`MULLIGAN_X` / `_FILE`".
		name, suffix := v.Name, ""
		if base, ok := strings.CutSuffix(v.Name, "_FILE"); ok {
			name, suffix = base, "` / `_FILE"
		}
		row := regexp.MustCompile("(?m)^\\| `" + name + suffix + "`[^\n]*").Find(doc)
		if row == nil {
			t.Errorf("docs/operating.md has no table row for %s", v.Name)
			continue
		}
		if v.Default != "" && !strings.Contains(string(row), "| `"+v.Default+"` |") {
			t.Errorf("docs/operating.md gives %s another default than %q: %s", v.Name, v.Default, row)
		}
	}
}
