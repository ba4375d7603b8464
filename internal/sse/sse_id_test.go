package sse

import "testing"

// Within one event block the last id line counts, and one whose value holds a NUL is ignored
// (the HTML Living Standard's event stream interpretation).
func TestEventIDIsTheBlocksLastIDLine(t *testing.T) {
	for _, tc := range []struct {
		block, want string
		found       bool
	}{
		{"id: a\nid: b\ndata: x\n\n", "b", true},
		{"id: a\r\nid\r\ndata: x\r\n\r\n", "", true},
		{"id: a\nid: b\x00c\ndata: x\n\n", "a", true},
		{"id: b\x00c\ndata: x\n\n", "", false},
		{"data: x\n\n", "", false},
	} {
		if id, found := eventID([]byte(tc.block)); id != tc.want || found != tc.found {
			t.Errorf("eventID(%q) = %q %v, want %q %v", tc.block, id, found, tc.want, tc.found)
		}
	}
}
