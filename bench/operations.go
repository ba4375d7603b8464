package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"
)

// drainTimeout bounds the wait for the gateway's queue to empty between rounds.
const drainTimeout = 3 * time.Minute

// operationsPath is where the Mulligan gateway serves operations (the default).
const operationsPath = "/v1/operations"

// opView is the part of an operation (202 answer or GET) the harness reads.
type opView struct {
	OperationID string `json:"operation_id"`
	Status      string `json:"status"`
	Done        bool   `json:"done"`
}

// submission is one accepted operation and when it was submitted.
type submission struct {
	id string
	at time.Time
}

// newestOp remembers the newest accepted operation: ids sort by time and the queue is FIFO, so
// once it is done the queue is (all but) empty.
type newestOp struct {
	mu sync.Mutex
	id string
}

func (n *newestOp) observe(id string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.id = max(n.id, id)
}

func (n *newestOp) take() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	id := n.id
	n.id = ""
	return id
}

// submit posts a chat request with Prefer: respond-async to the Mulligan gateway and returns
// the operation id of its 202.
func (h *harness) submit(ctx context.Context, base, text string, header ...string) (string, error) {
	header = append(header, "Prefer", "respond-async")
	resp, body, err := send(ctx, h.client, http.MethodPost, base+chatPath, chatBody(text), header...)
	if err != nil {
		return "", err
	}
	if err := expectStatus(resp, body, http.StatusAccepted); err != nil {
		return "", err
	}
	var v opView
	if err := json.Unmarshal(body, &v); err != nil || v.OperationID == "" {
		return "", fmt.Errorf("202 without operation_id: %.200s", body)
	}
	return v.OperationID, nil
}

// accept sends the async request: the Mulligan gateway must answer 202, plain Caddy proxies it
// (Prefer means nothing to it) and must answer 200.
func (h *harness) accept(newest *newestOp) call {
	return func(ctx context.Context, base string, seq int64) error {
		text := fmt.Sprint("async ", seq)
		if base == h.plain.base {
			resp, body, err := send(ctx, h.client, http.MethodPost, base+chatPath, chatBody(text), "Prefer", "respond-async")
			if err != nil {
				return err
			}
			return expectStatus(resp, body, http.StatusOK)
		}
		id, err := h.submit(ctx, base, text)
		if err == nil {
			newest.observe(id)
		}
		return err
	}
}

// getOperation polls one operation, with header pairs (an Authorization: the operation's
// scope).
func (h *harness) getOperation(ctx context.Context, base, id string, header ...string) (opView, error) {
	var v opView
	resp, body, err := send(ctx, h.client, http.MethodGet, base+operationsPath+"/"+id, nil, header...)
	if err != nil {
		return v, err
	}
	if err := expectStatus(resp, body, http.StatusOK); err != nil {
		return v, err
	}
	return v, json.Unmarshal(body, &v)
}

// drain waits until operation id (the newest accepted on g) is done, so the runner's backlog
// does not slow down the next round, whichever gateway it measures. Replicas share their
// database, so the first one answers for all.
func (h *harness) drain(ctx context.Context, g *gateway, id string) error {
	if id == "" {
		return nil
	}
	start := time.Now()
	for time.Since(start) < drainTimeout {
		v, err := h.getOperation(ctx, g.base, id)
		if err != nil {
			return fmt.Errorf("polling %s: %w", id, err)
		}
		if v.Done {
			h.logf("queue drained in %s", time.Since(start).Round(time.Millisecond))
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return fmt.Errorf("the queue did not drain within %s", drainTimeout)
}

// pollWindow is how many of the oldest unfinished operations awaitDone polls at once: the
// runner's default concurrency. Polling more would steal the CPU the runner needs.
const pollWindow = 4

// awaitDone polls the submitted operations until each is done, and returns a sample whose
// latencies run from submission to the poll that saw it done, and whose time runs from start
// to the last one done. The runner is FIFO by id, so only the oldest pollWindow operations not
// yet done are polled at a time.
func (h *harness) awaitDone(ctx context.Context, base string, start time.Time, subs []submission, timeout time.Duration) sample {
	slices.SortFunc(subs, func(a, b submission) int { return strings.Compare(a.id, b.id) })
	res := sample{}
	last := start
	deadline := time.Now().Add(timeout)
	for len(subs) > 0 && ctx.Err() == nil && time.Now().Before(deadline) {
		window := subs[:min(len(subs), pollWindow)]
		done := make([]time.Time, len(window))
		failed := make([]error, len(window))
		forEach(ctx, pollWindow, len(window), func(i int) error {
			v, err := h.getOperation(ctx, base, window[i].id)
			if err == nil && v.Done {
				done[i] = time.Now()
				if v.Status != "succeeded" {
					failed[i] = fmt.Errorf("operation %s ended %s", v.OperationID, v.Status)
				}
			}
			return err
		})
		var left []submission
		for i, s := range window {
			if done[i].IsZero() {
				left = append(left, s)
				continue
			}
			res.record(done[i].Sub(s.at), failed[i])
			last = maxTime(last, done[i])
		}
		if len(left) == len(window) {
			time.Sleep(5 * time.Millisecond)
		}
		subs = append(left, subs[len(window):]...)
	}
	for range subs {
		res.record(0, fmt.Errorf("not done within %s", timeout))
	}
	res.elapsed = last.Sub(start)
	return res
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
