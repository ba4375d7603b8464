package module

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/mulligan-gw/mulligan/examples/modelserver"
	"github.com/mulligan-gw/mulligan/internal/apierr"
	"github.com/mulligan-gw/mulligan/internal/testkit"
)

// rawRequest sends text over a new connection and reads one response.
func rawRequest(t *testing.T, addr, text string) (*http.Response, []byte) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(15 * time.Second))
	if _, err := io.WriteString(conn, text); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, b
}

func TestUnreadableBodyIsRejectedInTheErrorSchema(t *testing.T) {
	t.Parallel()
	g := startHandler(t, modelserver.Config{}, "")
	resp, body := rawRequest(t, strings.TrimPrefix(g.base, "http://"), "POST "+chatPath+" HTTP/1.1\r\nHost: 127.0.0.1\r\n"+
		"Idempotency-Key: k\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n")
	expectError(t, result{Response: resp, body: body}, 400, apierr.CodeInvalidRequest, false)
	if n := g.model.Stats().Received; n != 0 {
		t.Fatalf("the unreadable request reached the upstream %d times", n)
	}
}

func TestBodiesOverMaxBufferedGet503(t *testing.T) {
	t.Parallel()
	g := startHandler(t, modelserver.Config{}, "idempotency {\n max_body 600KiB\n max_buffered 1MiB\n}")
	body := `{"pad":"` + strings.Repeat("x", 600<<10-10) + `"}`
	// A request whose upstream call is under way holds its body's share of the budget.
	held := make(chan result, 1)
	go func() { held <- g.post(chatPath, "held", body, "X-Mock-Latency", "3s") }()
	testkit.WaitFor(t, 5*time.Second, "g.model.Stats().InFlight == 1", func() bool { return g.model.Stats().InFlight == 1 })
	busy := g.post(chatPath, "busy", body)
	expectError(t, busy, 503, apierr.CodeBusy, true)
	if r := <-held; r.err != nil || r.StatusCode != 200 {
		t.Fatalf("the held request: %v %v", r.err, r.Status)
	}
	if r := g.post(chatPath, "busy", body); r.StatusCode != 200 {
		t.Fatalf("the budget was not given back: %v %.200s", r.Status, r.body)
	}
}

// A body counts against max_buffered as its bytes arrive, not as its Content-Length promises:
// a client that announces a large body and sends none of it holds almost nothing, so idle
// connections cannot keep everyone else at 503 GATEWAY_BUSY.
func TestStalledBodyHoldsOnlyTheBytesItSent(t *testing.T) {
	t.Parallel()
	g := startHandler(t, modelserver.Config{}, "idempotency {\n max_body 600KiB\n max_buffered 1MiB\n}")
	conn, err := net.Dial("tcp", strings.TrimPrefix(g.base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(15 * time.Second))
	fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nIdempotency-Key: stalled\r\nContent-Type: application/json\r\n"+
		"Content-Length: %d\r\nExpect: 100-continue\r\n\r\n", chatPath, 600<<10)
	// net/http says 100 Continue when the handler first reads the body: it is now reading.
	if line, err := bufio.NewReader(conn).ReadString('\n'); err != nil || !strings.Contains(line, "100") {
		t.Fatalf("no 100 Continue: %q %v", line, err)
	}
	fmt.Fprint(conn, "{")
	body := `{"pad":"` + strings.Repeat("x", 500<<10) + `"}`
	for i := range 3 {
		if r := g.post(chatPath, fmt.Sprintf("k%d", i), body); r.err != nil || r.StatusCode != 200 {
			t.Fatalf("a body while another connection stalls: %v %v %.200s", r.err, r.Status, r.body)
		}
	}
}

// A body of exactly max_body fits a max_buffered of max_body, with or without Content-Length:
// otherwise it would get a retryable 503 GATEWAY_BUSY that no retry can pass.
func TestBodyOfMaxBodyFitsAMaxBufferedOfMaxBody(t *testing.T) {
	t.Parallel()
	g := startHandler(t, modelserver.Config{}, "idempotency {\n max_body 64KiB\n max_buffered 64KiB\n}")
	body := `{"pad":"` + strings.Repeat("x", 64<<10-10) + `"}`
	for _, tc := range []struct {
		name string
		body io.Reader
	}{
		{"with Content-Length", strings.NewReader(body)},
		{"chunked", io.MultiReader(strings.NewReader(body))}, // no length known: sent chunked
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequest("POST", g.base+chatPath, tc.body)
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Idempotency-Key", tc.name)
			if r := g.do(req); r.err != nil || r.StatusCode != 200 {
				t.Fatalf("a body of max_body: %v %v %.200s", r.err, r.Status, r.body)
			}
		})
	}
	expectError(t, g.post(chatPath, "over", body+" "), 413, apierr.CodeRequestTooLarge, false)
}
