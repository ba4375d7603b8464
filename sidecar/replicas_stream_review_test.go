package main

import (
	"bufio"
	"testing"
	"time"

	"github.com/mulligan-gw/mulligan/examples/modelserver"
	"github.com/mulligan-gw/mulligan/store/postgres/pgtest"
)

// A stream over max_result is relayed to its first client but not recorded. A duplicate that
// asks for the stream on another replica must not be given part of it and then be left waiting
// with nothing more to come until the first attempt ends: docs/streams.md says joiners see such
// a stream end abruptly at once, and a new duplicate waits for its end and then runs again.
func TestUnrecordedStreamIsNotJoinedThroughAnotherReplica(t *testing.T) {
	dsn := pgtest.Database(t)
	_, upstream := startModelServer(t, modelserver.Config{ChunkDelay: 200 * time.Millisecond})
	rs := startReplicas(t, 2, upstream, dsn, "async {\n\t\t\tmax_result 1200B\n\t\t}")
	first := rs[0].openStream(t, "big")
	rd := bufio.NewReader(first.Body)
	if head, err := sseEvents(rd, 3); err != nil || len(head) != 3 {
		t.Fatalf("first client: %d events, %v", len(head), err)
	}
	go func() { _, _ = sseEvents(rd, 0) }() // the first client reads on to the end
	time.Sleep(2 * time.Second)              // past max_result: recording stopped
	start := time.Now()
	dup := rs[1].openStream(t, "big")
	got, err := sseEvents(bufio.NewReader(dup.Body), 0)
	t.Logf("duplicate on replica 1: status %d, %d events, %v, after %v", dup.StatusCode, len(got), err, time.Since(start))
	if dup.StatusCode == 200 && len(got) > 0 && err != nil {
		t.Fatalf("the duplicate joined a stream that is not recorded: %d events, then after %v an abrupt end (%v)",
			len(got), time.Since(start).Round(100*time.Millisecond), err)
	}
}
