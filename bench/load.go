package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// requestTimeout bounds every request of the harness.
const requestTimeout = 30 * time.Second

// call sends request number seq of a scenario to a gateway at base, and returns an error unless
// the answer is the one the scenario expects.
type call func(ctx context.Context, base string, seq int64) error

// sample is what one gateway achieved in one scenario: answers as expected, other answers, the
// time it took, and the latency of every expected answer.
type sample struct {
	ok, errs int
	bytes    int64 // body bytes of the expected answers, where a scenario counts them
	elapsed  time.Duration
	lat      []time.Duration
	firstErr string
	sorted   bool
}

// record counts one request that took d and ended with err.
func (s *sample) record(d time.Duration, err error) {
	if err != nil {
		s.errs++
		if s.firstErr == "" {
			s.firstErr = err.Error()
		}
		return
	}
	s.ok++
	s.lat = append(s.lat, d)
	s.sorted = false
}

// add merges o into s, time included.
func (s *sample) add(o sample) {
	s.ok += o.ok
	s.errs += o.errs
	s.bytes += o.bytes
	s.elapsed += o.elapsed
	s.lat = append(s.lat, o.lat...)
	s.sorted = false
	if s.firstErr == "" {
		s.firstErr = o.firstErr
	}
}

// rps is expected answers per second.
func (s *sample) rps() float64 {
	if s.elapsed <= 0 {
		return 0
	}
	return float64(s.ok) / s.elapsed.Seconds()
}

// percentile returns the p-th percentile (0..100) of the latencies, nearest rank.
func (s *sample) percentile(p float64) time.Duration {
	if len(s.lat) == 0 {
		return 0
	}
	if !s.sorted {
		slices.Sort(s.lat)
		s.sorted = true
	}
	i := int(p/100*float64(len(s.lat)) + 0.5)
	return s.lat[min(max(i-1, 0), len(s.lat)-1)]
}

// closedLoop runs `workers` clients, each sending its next request as soon as the previous one
// is answered, for d or until limit requests are sent (0: no limit), to g (or its replicas in
// turn).
func closedLoop(ctx context.Context, workers int, d time.Duration, limit int64, g *gateway, seq *atomic.Int64, fn call) sample {
	deadline := time.Now().Add(d)
	var sent atomic.Int64
	return measured(workers, func(s *sample) bool {
		if ctx.Err() != nil || !time.Now().Before(deadline) || (limit != 0 && sent.Add(1) > limit) {
			return false
		}
		t0 := time.Now()
		n := seq.Add(1) - 1
		err := fn(ctx, g.pick(n), n)
		s.record(time.Since(t0), err)
		return true
	})
}

// measured runs `workers` goroutines, each calling step with its own sample until step
// reports false, and merges the samples.
func measured(workers int, step func(s *sample) bool) sample {
	start := time.Now()
	parts := make([]sample, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for step(&parts[w]) {
			}
		})
	}
	wg.Wait()
	total := sample{elapsed: time.Since(start)}
	for _, p := range parts {
		total.add(p)
	}
	return total
}

// openLoop sends at a fixed rate for d, whatever the answers' latency: a ticker releases the
// requests due so far. Latency runs from each request's scheduled time, so a stalled gateway
// is charged for the requests queued behind the stall (no coordinated omission). At most
// maxInFlight requests are outstanding; one more due is counted as an error. Requests go to g
// (or its replicas in turn).
func openLoop(ctx context.Context, rate float64, d time.Duration, maxInFlight int, g *gateway, seq *atomic.Int64, fn call) sample {
	return openLoopTimed(ctx, rate, d, maxInFlight, g, seq, func(ctx context.Context, base string, seq int64, intended time.Time) (time.Duration, error) {
		err := fn(ctx, base, seq)
		return time.Since(intended), err
	})
}

// timedCall is a call that measures its own latency; intended is when the open loop scheduled it.
type timedCall func(ctx context.Context, base string, seq int64, intended time.Time) (time.Duration, error)

// openLoopTimed is openLoop with the latency fn measured (openLoop's runs from the scheduled
// time to the end of the answer).
func openLoopTimed(ctx context.Context, rate float64, d time.Duration, maxInFlight int, g *gateway, seq *atomic.Int64, fn timedCall) sample {
	var (
		mu    sync.Mutex
		total = sample{elapsed: d}
		wg    sync.WaitGroup
		sem   = make(chan struct{}, maxInFlight)
		sent  int
	)
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	start := time.Now()
	for ctx.Err() == nil && time.Since(start) < d {
		<-tick.C
		for due := int(rate*time.Since(start).Seconds()) - sent; due > 0; due-- {
			intended := start.Add(time.Duration(float64(sent) / rate * float64(time.Second)))
			sent++
			select {
			case sem <- struct{}{}:
			default:
				mu.Lock()
				total.record(0, fmt.Errorf("over %d requests outstanding", maxInFlight))
				mu.Unlock()
				continue
			}
			wg.Go(func() {
				defer func() { <-sem }()
				n := seq.Add(1) - 1
				lat, err := fn(ctx, g.pick(n), n, intended)
				mu.Lock()
				total.record(lat, err)
				mu.Unlock()
			})
		}
	}
	wg.Wait()
	return total
}

// newClient is a keep-alive client with room for every concurrent connection the harness
// opens, so no request pays for a new TCP connection after the first round.
func newClient(concurrency int) *http.Client {
	return &http.Client{
		Timeout: requestTimeout,
		Transport: &http.Transport{
			DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConns:        0,
			MaxIdleConnsPerHost: 4*concurrency + 64,
			IdleConnTimeout:     90 * time.Second,
			DisableCompression:  true,
		},
	}
}

// send makes one request with a JSON body (nil for none) and header pairs, and returns the
// answer with its body read.
func send(ctx context.Context, c *http.Client, method, url string, body []byte, header ...string) (*http.Response, []byte, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return nil, nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp, b, err
}

// expectStatus is nil when resp has the wanted status, else an error quoting the answer.
func expectStatus(resp *http.Response, body []byte, want int) error {
	if resp.StatusCode == want {
		return nil
	}
	return fmt.Errorf("%s: %d %s", resp.Request.URL.Path, resp.StatusCode, bytes.TrimSpace(body[:min(len(body), 200)]))
}

// forEach calls fn(i) for every i in [0, n), `workers` at a time, and measures the calls.
func forEach(ctx context.Context, workers, n int, fn func(i int) error) sample {
	var next atomic.Int64
	return measured(workers, func(s *sample) bool {
		i := int(next.Add(1) - 1)
		if i >= n || ctx.Err() != nil {
			return false
		}
		t0 := time.Now()
		err := fn(i)
		s.record(time.Since(t0), err)
		return true
	})
}
