package e2e

import (
	"bufio"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/mulligan-gw/mulligan/examples/modelserver"
	"github.com/mulligan-gw/mulligan/internal/testkit"
)

// streamWords is the prompt of the crash test's stream: the example model server answers one
// chunk per word of "You said: <prompt>".
var streamWords = strings.Fields(strings.Repeat("tick tock ", 15))

// openStream posts a keyed streaming chat completion, with extra header pairs, and returns the
// response, unread.
func (p *gatewayProcess) openStream(t *testing.T, key string, headers ...string) *http.Response {
	t.Helper()
	body := fmt.Sprintf(`{"stream":true,"messages":[{"role":"user","content":%q}]}`, strings.Join(streamWords, " "))
	req, err := http.NewRequest("POST", p.base+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	return doStream(t, req, headers...)
}

// doStream sends req with extra header pairs and returns the response, unread; its body is
// closed when the test ends.
func doStream(t *testing.T, req *http.Request, headers ...string) *http.Response {
	t.Helper()
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// readEvents reads events (blocks ending in a blank line) until n have come or the stream
// ends; err is nil only at a clean end or after n events.
func readEvents(rd *bufio.Reader, n int) (events int, err error) {
	partial := false
	for n <= 0 || events < n {
		line, err := rd.ReadString('\n')
		if err != nil {
			if partial || err.Error() != "EOF" {
				return events, fmt.Errorf("after %d events: %w", events, err)
			}
			return events, nil
		}
		if strings.TrimRight(line, "\r\n") == "" {
			events++
			partial = false
		} else {
			partial = true
		}
	}
	return events, nil
}

// TestKilledGatewayNeverReplaysAPartialStream kills the real process (SIGKILL) while it relays
// and records a keyed stream, and restarts it on the same data directory: a retry within the
// lease follows what was recorded and then ends abruptly, never cleanly as if whole; after the
// lease the retry runs the request again and gets the whole answer.
func TestKilledGatewayNeverReplaysAPartialStream(t *testing.T) {
	t.Parallel()
	model, upstream := startModelServer(t, modelserver.Config{ChunkDelay: 100 * time.Millisecond})
	p := newGatewayProcess(t, upstream, "idempotency {\n lease 12s\n}") // the kill, the restart and the retry fit in it on a loaded machine
	p.start()
	whole := len(streamWords) + 2 + 1 // "You said:" and [DONE]

	first := p.openStream(t, "k")
	if n, err := readEvents(bufio.NewReader(first.Body), 5); err != nil || n != 5 {
		t.Fatalf("before the crash: %d events, %v", n, err)
	}
	p.kill()
	p.start()

	retry := p.openStream(t, "k")
	n, err := readEvents(bufio.NewReader(retry.Body), 0)
	t.Logf("within the lease: %d %q, %d events, then %v", retry.StatusCode, retry.Header.Get("Idempotent-Replayed"), n, err)
	if retry.StatusCode == http.StatusOK && err == nil {
		t.Fatalf("a retry within the lease got a clean stream of %d events: the partial recording passed for whole", n)
	}

	testkit.WaitFor(t, 25*time.Second, "the lease expired", func() bool {
		resp := p.openStream(t, "k")
		if resp.StatusCode != http.StatusOK {
			return false
		}
		n, err := readEvents(bufio.NewReader(resp.Body), 0)
		if resp.Header.Get("Idempotent-Replayed") == "true" && err != nil {
			return false // still the dead stream, ended abruptly: the lease had not quite run out
		}
		if err != nil || n != whole || resp.Header.Get("Idempotent-Replayed") != "" {
			t.Fatalf("after the lease: %d of %d events (%v), replayed %q", n, whole, err, resp.Header.Get("Idempotent-Replayed"))
		}
		return true
	})
	if runs := model.Stats().ByKey["k"]; runs != 2 {
		t.Fatalf("the upstream ran %d times for the key, want 2 (one cut by the crash, one after the lease)", runs)
	}
}
