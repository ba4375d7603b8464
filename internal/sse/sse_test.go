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

// TestSSESplitterHoldsOnlyThePartialEvent: a large read of whole events (a proxy reads up to
// 32 KiB at once) leaves the splitter holding no buffer of that size while the stream is quiet,
// and a read that ends mid-event leaves it holding that partial event alone.
func TestSSESplitterHoldsOnlyThePartialEvent(t *testing.T) {
	var s Splitter
	event := "data: " + string(bytes.Repeat([]byte("x"), 400)) + "\n\n"
	read := bytes.Repeat([]byte(event), 80) // 32 KiB of whole events
	n := 0
	s.Push(read, func([]byte) { n++ })
	if n != 80 || s.Buffered() != 0 || cap(s.buf) != 0 {
		t.Fatalf("%d events; after them the splitter holds %d bytes in a buffer of %d", n, s.Buffered(), cap(s.buf))
	}
	s.Push(append(append([]byte(nil), read...), "data: par"...), func([]byte) { n++ })
	if n != 160 || string(s.Partial()) != "data: par" || cap(s.buf) > keptBuffer {
		t.Fatalf("%d events; partial %q in a buffer of %d", n, s.Partial(), cap(s.buf))
	}
	s.Push([]byte("tial\n\n"), func(b []byte) {
		if string(b) != "data: partial\n\n" {
			t.Fatalf("completed %q", b)
		}
		n++
	})
	if n != 161 || s.Buffered() != 0 {
		t.Fatalf("%d events, %d bytes held", n, s.Buffered())
	}
}
