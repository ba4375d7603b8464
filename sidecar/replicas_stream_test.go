package main

import (
	"bufio"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mulligan-gw/mulligan/examples/modelserver"
	"github.com/mulligan-gw/mulligan/store/postgres/pgtest"
)

// sseEvents reads whole events (blocks ending in a blank line, as relayed) until n have come
// (n <= 0: to the end). err is nil only after n events or at a clean end.
func sseEvents(rd *bufio.Reader, n int) ([]string, error) {
	var out []string
	var block strings.Builder
	for n <= 0 || len(out) < n {
		line, err := rd.ReadString('\n')
		block.WriteString(line)
		if err != nil {
			if err == io.EOF && block.Len() == 0 {
				return out, nil
			}
			return out, err
		}
		if strings.TrimRight(line, "\r\n") == "" {
			out = append(out, block.String())
			block.Reset()
		}
	}
	return out, nil
}

// eventID is the id line's value of a relayed event.
func eventID(event string) string {
	for line := range strings.SplitSeq(event, "\n") {
		if v, ok := strings.CutPrefix(line, "id: "); ok {
			return strings.TrimRight(v, "\r")
		}
	}
	return ""
}

// A keyed stream relayed by one replica is joined, resumed and replayed through the others
// from the recording in PostgreSQL (docs/streams.md): the client drops on replica 0 after 5
// events, its retry lands on replica 1 and gets the whole stream from the first event, a
// Last-Event-ID resume on replica 2 gets the rest after event 4, and after the end every
// replica replays the same bytes. The model ran once.
func TestStreamIsJoinedResumedAndReplayedAcrossReplicas(t *testing.T) {
	dsn := pgtest.Database(t)
	model, upstream := startModelServer(t, modelserver.Config{ChunkDelay: 100 * time.Millisecond})
	rs := startReplicas(t, 3, upstream, dsn, "")
	whole := len(streamWords) + 2 + 1 // "You said:" and [DONE]

	first := rs[0].openStream(t, "s")
	head, err := sseEvents(bufio.NewReader(first.Body), 5)
	if err != nil || len(head) != 5 {
		t.Fatalf("before the drop: %d events, %v", len(head), err)
	}
	first.Body.Close() // the client loses its connection mid-answer

	var (
		wg             sync.WaitGroup
		joined, resume []string
		jerr, rerr     error
		jresp, rresp   *http.Response
	)
	wg.Go(func() {
		jresp = rs[1].openStream(t, "s")
		joined, jerr = sseEvents(bufio.NewReader(jresp.Body), 0)
	})
	wg.Go(func() {
		rresp = rs[2].openStream(t, "s", "Last-Event-ID", eventID(head[3]))
		resume, rerr = sseEvents(bufio.NewReader(rresp.Body), 0)
	})
	wg.Wait()
	t.Logf("join on replica 1: %d %d events (%v); resume after %q on replica 2: %d %d events (%v)",
		jresp.StatusCode, len(joined), jerr, eventID(head[3]), rresp.StatusCode, len(resume), rerr)
	if jerr != nil || jresp.StatusCode != 200 || len(joined) != whole {
		t.Fatalf("the join on another replica got %d: %d of %d events, %v", jresp.StatusCode, len(joined), whole, jerr)
	}
	if strings.Join(joined[:5], "") != strings.Join(head, "") {
		t.Fatalf("the join's first events differ from what the first client read:\n%q\n%q", joined[:5], head)
	}
	if rerr != nil || rresp.StatusCode != 200 || strings.Join(resume, "") != strings.Join(joined[4:], "") {
		t.Fatalf("the resume after event 4 on another replica got %d: %d events (%v), want events 5 to %d", rresp.StatusCode, len(resume), rerr, whole)
	}
	for i, r := range rs {
		resp := r.openStream(t, "s")
		all, err := sseEvents(bufio.NewReader(resp.Body), 0)
		if err != nil || resp.StatusCode != 200 || resp.Header.Get("Idempotent-Replayed") != "true" || strings.Join(all, "") != strings.Join(joined, "") {
			t.Fatalf("replica %d replays %d %q: %d events (%v), not the stream", i, resp.StatusCode, resp.Header.Get("Idempotent-Replayed"), len(all), err)
		}
	}
	if runs := model.Stats().ByKey["s"]; runs != 1 {
		t.Fatalf("the model ran %d times for the key, want 1", runs)
	}
}
