package main

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/mulligan-gw/mulligan/examples/modelserver"
)

// step is one request of the tour, printed as the curl command a reader can repeat.
type step struct {
	title   string
	key     string
	body    string
	headers map[string]string
}

func runTour(gateway string, model *modelserver.Server) error {
	run := newRunID()
	prompt := `{"model":"demo","messages":[{"role":"user","content":"Say hello"}]}`
	key := "tour-" + run

	show(gateway, step{title: "1. A first keyed request runs upstream once", key: key, body: prompt})
	show(gateway, step{title: "2. The client retries: the recorded answer is replayed, the model is not called", key: key, body: prompt})
	show(gateway, step{title: "3. Same key, different payload: refused", key: key,
		body: `{"model":"demo","messages":[{"role":"user","content":"Something else"}]}`})
	show(gateway, step{title: "4. A malformed key: refused before anything runs", key: strings.Repeat("k", 300), body: prompt})

	fmt.Printf("\n== 5. A duplicate while the first is still running: 409, retry later\n")
	slow := "tour-slow-" + run
	var wg sync.WaitGroup
	wg.Go(func() { _, _ = send(gateway, step{key: slow, body: prompt}) })
	time.Sleep(200 * time.Millisecond)
	show(gateway, step{title: "   (the duplicate)", key: slow, body: prompt})
	wg.Wait()

	s := model.Stats()
	fmt.Printf("\nThe model server ran %d requests for %d keyed calls from clients.\n", s.Received, 6)
	return asyncTour(gateway, run, prompt)
}

// asyncTour shows request -> 202 -> poll -> result, and a cancel.
func asyncTour(gateway, run, prompt string) error {
	fmt.Printf("\n== 6. A slow call made asynchronous: 202 Accepted and an operation to poll\n")
	fmt.Printf("$ curl -si %s/v1/chat/completions -H 'Prefer: respond-async' -H 'Idempotency-Key: job-%s' -d '%s'\n", gateway, run, prompt)
	resp, body, err := do("POST", gateway+"/v1/chat/completions", prompt, "Prefer", "respond-async", "Idempotency-Key", "job-"+run)
	if err != nil {
		return err
	}
	fmt.Printf("   HTTP %s\n   Location: %s\n   Preference-Applied: %s\n   %s\n", resp.Status, resp.Header.Get("Location"), resp.Header.Get("Preference-Applied"), strings.TrimSpace(string(body)))
	status := gateway + resp.Header.Get("Location")
	for i := 0; i < 50; i++ {
		fmt.Printf("$ curl -s %s\n", status)
		_, body, err = do("GET", status, "")
		if err != nil {
			return err
		}
		fmt.Printf("   %s\n", abbreviate(strings.TrimSpace(string(body))))
		if strings.Contains(string(body), `"done":true`) {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	fmt.Printf("$ curl -s %s/result\n", status)
	if _, body, err = do("GET", status+"/result", ""); err != nil {
		return err
	}
	fmt.Printf("   %s\n", abbreviate(strings.TrimSpace(string(body))))
	time.Sleep(300 * time.Millisecond) // the signed webhook of the final status arrives meanwhile

	fmt.Printf("\n== 7. Cancel a running operation: the connection to the model server is closed\n")
	resp, _, err = do("POST", gateway+"/v1/chat/completions", prompt, "Prefer", "respond-async")
	if err != nil {
		return err
	}
	time.Sleep(300 * time.Millisecond)
	cancel := gateway + resp.Header.Get("Location") + "/cancel"
	fmt.Printf("$ curl -si -X POST %s\n", cancel)
	resp, body, err = do("POST", cancel, "")
	if err != nil {
		return err
	}
	fmt.Printf("   HTTP %s\n   %s\n", resp.Status, abbreviate(strings.TrimSpace(string(body))))
	time.Sleep(300 * time.Millisecond)
	if err := batchTour(gateway, run); err != nil {
		return err
	}
	return responseTour(gateway, run)
}

// do sends one request with header pairs and reads the answer.
func do(method, url, body string, headers ...string) (*http.Response, []byte, error) {
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		return nil, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp, b, err
}

func show(gateway string, s step) {
	if s.title != "" {
		fmt.Printf("\n== %s\n", s.title)
	}
	fmt.Printf("$ curl -si %s/v1/chat/completions -H 'Idempotency-Key: %s' -H 'Content-Type: application/json' -d '%s'\n", gateway, abbreviate(s.key), s.body)
	out, err := send(gateway, s)
	if err != nil {
		fmt.Printf("   error: %v\n", err)
		return
	}
	fmt.Println(out)
}

func send(gateway string, s step) (string, error) {
	resp, body, err := do("POST", gateway+"/v1/chat/completions", s.body, "Idempotency-Key", s.key)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "   HTTP %s\n", resp.Status)
	for _, h := range []string{"Idempotent-Replayed", "Idempotency-Expires", "Retry-After", "X-Execution-Id", "X-Request-Id"} {
		if v := resp.Header.Get(h); v != "" {
			fmt.Fprintf(&b, "   %s: %s\n", h, v)
		}
	}
	fmt.Fprintf(&b, "   %s", abbreviate(strings.TrimSpace(string(body))))
	return b.String(), nil
}

func abbreviate(s string) string {
	if len(s) > 240 {
		return s[:240] + "..."
	}
	return s
}

func newRunID() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
