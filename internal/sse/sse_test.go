package sse

import (
	"bytes"
	"fmt"
	"testing"
)

func TestSSESplitterFindsEventsAcrossChunksAndLineEnds(t *testing.T) {
	in := "data: a\n\n" + "id: x\r\ndata: b\r\n\r\n" + "\n" + "data: c\r\r" + "data: d\n"
	var got []string
	for _, size := range []int{1, 2, 3, 7, len(in)} {
		got = got[:0]
		var s Splitter
		for rest := []byte(in); len(rest) > 0; {
			n := min(size, len(rest))
			s.Push(rest[:n], func(b []byte) { got = append(got, string(b)) })
			rest = rest[n:]
		}
		want := []string{"data: a\n\n", "id: x\r\ndata: b\r\n\r\n", "data: c\r\r"}
		if fmt.Sprint(got) != fmt.Sprint(want) || string(s.Rest()) != "data: d\n" {
			t.Fatalf("chunks of %d: %q, rest %q", size, got, s.Rest())
		}
	}
	for block, want := range map[string]string{"data: a\n\n": "id: 7\ndata: a\n\n", "id: x\ndata: b\n\n": "id: x\ndata: b\n\n"} {
		if out, _ := WithEventID([]byte(block), 7); !bytes.Equal(out, []byte(want)) {
			t.Errorf("WithEventID(%q) = %q, want %q", block, out, want)
		}
	}
}
