package main

import (
	"context"
	"fmt"
	"net/http"
	"runtime"
	"time"

	"github.com/mulligan-gw/mulligan/internal/fingerprint"
	"github.com/mulligan-gw/mulligan/internal/idemkey"
	"github.com/mulligan-gw/mulligan/store"
	"github.com/mulligan-gw/mulligan/store/badger"
)

// seedLease and seedTTL are what the gateway uses by default (lease 10m, ttl 24h).
const (
	seedLease = 10 * time.Minute
	seedTTL   = 24 * time.Hour
)

// scaleKey is the idempotency key of seeded record i; its request body is chatBody(scaleKey(i)).
func scaleKey(i int) string { return fmt.Sprintf("scale-%d", i) }

// seededResponse is a recorded chat completion of typical size.
func seededResponse(i int) store.Response {
	h := http.Header{}
	h.Set("Content-Type", "application/json")
	h.Set("X-Execution-Id", fmt.Sprint(i))
	body := fmt.Appendf(nil, `{"id":"chatcmpl-seed-%d","object":"chat.completion","created":1780000000,"model":"bench",`+
		`"choices":[{"index":0,"message":{"role":"assistant","content":"You said: %s"},"finish_reason":"stop"}],`+
		`"usage":{"prompt_tokens":3,"completion_tokens":4,"total_tokens":7}}`+"\n", i, scaleKey(i))
	return store.Response{Status: http.StatusOK, Header: h, Body: body}
}

// seedWorkers writes in parallel: Badger commits scale with concurrent writers.
func seedWorkers() int { return 4 * runtime.GOMAXPROCS(0) }

// seedKeys records keys [from, to) in the store at dir, exactly as the gateway would have
// recorded POST /v1/chat/completions with that key and body (no fsync: it is a fixture).
func seedKeys(ctx context.Context, dir string, from, to int) error {
	st, err := badger.Open(badger.Options{Dir: dir, Sync: false})
	if err != nil {
		return err
	}
	defer st.Close()
	expires := time.Now().Add(seedTTL).Truncate(time.Second)
	s := forEach(ctx, seedWorkers(), to-from, func(i int) error {
		i += from
		key := scaleKey(i)
		rk := idemkey.Record("", http.MethodPost, chatPath, key)
		fp := requestFingerprint(http.MethodPost, chatPath, "application/json", chatBody(key))
		claim, err := st.ClaimKey(rk, fp, seedLease)
		if err != nil {
			return err
		}
		if claim.Outcome != store.Claimed {
			return fmt.Errorf("key %s already recorded", key)
		}
		return st.CompleteKey(rk, claim.Token, seededResponse(i), expires)
	})
	if s.errs > 0 {
		return fmt.Errorf("seeding keys: %d failed, first: %s", s.errs, s.firstErr)
	}
	return ctx.Err()
}

// requestFingerprint is the fingerprint the gateway computes for a request on a route with no
// fingerprint_ignore pointers: with idemkey.Record, what a seeded record must carry to replay.
func requestFingerprint(method, path, contentType string, body []byte) []byte {
	f, _ := fingerprint.New(nil)
	return f.Sum(method, path, "", contentType, body)
}

// seedOperations stores n finished operations (queued, running, then succeeded with a
// result), the way the runner leaves them.
func seedOperations(ctx context.Context, dir string, from, n int) error {
	st, err := badger.Open(badger.Options{Dir: dir, Sync: false})
	if err != nil {
		return err
	}
	defer st.Close()
	s := forEach(ctx, seedWorkers(), n, func(i int) error {
		i += from
		now := time.Now()
		op := &store.Operation{ID: fmt.Sprintf("op_seed%09d", i), Scope: idemkey.Scope(""), Status: store.StatusQueued, Version: 1,
			Method: http.MethodPost, Path: chatPath, SubmittedAt: now, Retention: seedTTL, Urgency: store.DefaultUrgency}
		body := chatBody(fmt.Sprint("seeded operation ", i))
		req := &store.Request{Method: http.MethodPost, URL: chatPath, Host: "127.0.0.1",
			Header: http.Header{"Content-Type": {"application/json"}}, Body: body}
		if _, err := st.AcceptOperation(op, req, nil); err != nil {
			return err
		}
		if _, err := st.Transition(op.ID, store.Change{To: store.StatusRunning}); err != nil {
			return err
		}
		result := seededResponse(i)
		_, err := st.Transition(op.ID, store.Change{To: store.StatusSucceeded, Result: &result})
		return err
	})
	if s.errs > 0 {
		return fmt.Errorf("seeding operations: %d failed, first: %s", s.errs, s.firstErr)
	}
	return ctx.Err()
}
