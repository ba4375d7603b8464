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
	return nil
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
	req, err := http.NewRequest("POST", gateway+"/v1/chat/completions", strings.NewReader(s.body))
	if err != nil {
		return "", err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", s.key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
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
