package module

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/mulligan-gw/mulligan/store"
)

const (
	headerExpires  = "Idempotency-Expires"
	headerReplayed = "Idempotent-Replayed"
	// pollInterval paces a waiting duplicate whose original is not held by this process
	// (a claim left by a crashed gateway).
	pollInterval = 50 * time.Millisecond
)

// gate is the Idempotency-Key gate: claim, run once, record, replay (CONTRACT.md §2).
type gate struct {
	header    string
	required  bool
	ttl       time.Duration
	lease     time.Duration
	wait      time.Duration
	maxBody   int64
	maxResult int64
	mismatch  int
	policy    statusPolicy
	fp        *fingerprinter
	flights   *flights
	now       func() time.Time
}

func newGate(c *IdempotencyConfig, a *AsyncConfig) (*gate, error) {
	policy, err := parseStatusPolicy(c.StoreStatus)
	if err != nil {
		return nil, err
	}
	fp, err := newFingerprinter(c.FingerprintIgnore)
	if err != nil {
		return nil, err
	}
	return &gate{
		header: c.Header, required: c.Required, ttl: time.Duration(c.TTL), lease: time.Duration(c.Lease),
		wait: time.Duration(c.WaitInflight), maxBody: c.MaxBody, maxResult: a.MaxResult,
		mismatch: c.MismatchStatus, policy: policy, fp: fp, flights: newFlights(), now: time.Now,
	}, nil
}

// keyedRequest is a covered request with a valid key and its body read.
type keyedRequest struct {
	r         *http.Request
	key       string
	recordKey []byte
	fp        []byte
	body      []byte
	log       *zap.Logger
}

// serve runs one covered request through the gate.
func (g *gate) serve(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, st *store.Store, scope string, log *zap.Logger) error {
	values := r.Header.Values(g.header)
	if len(values) == 0 {
		if g.required {
			writeError(w, apiError{Code: CodeKeyRequired, Message: fmt.Sprintf("%s %s requires an %s header.", r.Method, r.URL.Path, g.header)})
			return nil
		}
		return next.ServeHTTP(w, r)
	}
	if len(values) > 1 {
		writeError(w, apiError{Code: CodeKeyInvalid, Message: fmt.Sprintf("Send exactly one %s header.", g.header)})
		return nil
	}
	key, err := parseKey(values[0])
	if err != nil {
		writeError(w, apiError{Code: CodeKeyInvalid, Message: err.Error() + "; send 1 to 255 printable ASCII characters."})
		return nil
	}
	body, err := g.readBody(w, r)
	if errors.Is(err, errAnswered) {
		return nil
	}
	if err != nil {
		return err
	}
	kr := &keyedRequest{
		r: r, key: key, body: body,
		recordKey: recordKey(scope, r.Method, r.URL.Path, key),
		fp:        g.fp.sum(r.Method, r.URL.Path, r.URL.RawQuery, r.Header.Get("Content-Type"), body),
		log:       log.With(zap.String("idempotency_key", key)),
	}
	return g.claimAndRun(w, kr, next, st)
}

// errAnswered means the gate already wrote the answer.
var errAnswered = errors.New("answered")

// readBody reads the whole body with a hard limit, answering 413 past it.
func (g *gate) readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	tooLarge := func() ([]byte, error) {
		writeError(w, apiError{Code: CodeRequestTooLarge, Message: fmt.Sprintf("The request body is over the %d-byte limit.", g.maxBody),
			Details: map[string]any{"max_body": g.maxBody}})
		return nil, errAnswered
	}
	if r.ContentLength > g.maxBody {
		return tooLarge()
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, g.maxBody+1))
	if err != nil {
		return nil, caddyhttp.Error(http.StatusBadRequest, fmt.Errorf("reading request body: %w", err))
	}
	if int64(len(body)) > g.maxBody {
		return tooLarge()
	}
	return body, nil
}

// recordKey names a record by (scope hash, method, route path, key): tenants never share one.
func recordKey(scope, method, path, key string) []byte {
	scopeHash := sha256.Sum256([]byte(scope))
	h := sha256.New()
	writeField(h, scopeHash[:])
	for _, part := range []string{method, path, key} {
		writeField(h, []byte(part))
	}
	return h.Sum(nil)
}

// claimAndRun claims the key and runs the request, or answers from the record.
func (g *gate) claimAndRun(w http.ResponseWriter, kr *keyedRequest, next caddyhttp.Handler, st *store.Store) error {
	deadline := g.now().Add(g.wait)
	for {
		claim, err := st.ClaimKey(kr.recordKey, kr.fp, g.lease)
		if err != nil {
			return g.storageFailed(w, kr, err)
		}
		switch claim.Outcome {
		case store.Claimed:
			return g.run(w, kr, next, st, claim.Token)
		case store.Replay:
			kr.log.Debug("replaying recorded response")
			replay(w, claim.Record)
			return nil
		case store.Mismatch:
			writeError(w, apiError{Code: CodeKeyReused, Status: g.mismatch,
				Message: "This Idempotency-Key was used with a different request; use a new key for a new request."})
			return nil
		case store.InProgress:
			if g.now().Before(deadline) && g.awaitFlight(kr, deadline) {
				continue
			}
			writeError(w, apiError{Code: CodeInProgress, RetryAfter: time.Second,
				Message: "A request with this Idempotency-Key is still being processed; retry later."})
			return nil
		}
	}
}

// awaitFlight waits until the in-flight original ends, the deadline passes or the client
// leaves. It reports whether it is worth claiming again.
func (g *gate) awaitFlight(kr *keyedRequest, deadline time.Time) bool {
	done := g.flights.wait(string(kr.recordKey))
	wait := time.Until(deadline)
	if done == nil && wait > pollInterval {
		wait = pollInterval
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
		return g.now().Before(deadline) || done == nil
	case <-kr.r.Context().Done():
		return false
	}
}

func (g *gate) storageFailed(w http.ResponseWriter, kr *keyedRequest, err error) error {
	kr.log.Error("storage unavailable", zap.Error(err))
	writeError(w, apiError{Code: CodeStorage, Message: "The gateway's storage is unavailable; retry shortly.", RetryAfter: time.Second})
	return nil
}

// run sends the claimed request upstream on a context that outlives the client (bounded by the
// lease), streams the answer to the client, and records or releases the key.
func (g *gate) run(w http.ResponseWriter, kr *keyedRequest, next caddyhttp.Handler, st *store.Store, token string) error {
	defer g.flights.start(string(kr.recordKey))()
	ctx, cancel := detachedContext(kr.r.Context(), g.lease)
	defer cancel()
	up := kr.r.WithContext(ctx)
	setBody(up, kr.body)

	expires := g.now().Add(g.ttl).Truncate(time.Second)
	tee := newTeeWriter(w, g.maxResult, func(status int) {
		if g.policy.records(status) {
			w.Header().Set(headerExpires, expires.UTC().Format(http.TimeFormat))
		}
	})
	err := next.ServeHTTP(tee, up)
	if err == nil && tee.status == 0 {
		tee.WriteHeader(http.StatusOK) // the handler wrote nothing: net/http's implicit 200
	}
	switch {
	case err != nil || !g.policy.records(tee.status) || tee.overran:
		if rerr := st.ReleaseKey(kr.recordKey, token); rerr != nil {
			kr.log.Warn("releasing idempotency key", zap.Error(rerr))
		}
		kr.log.Debug("upstream outcome not recorded; key released", zap.Int("status", tee.status), zap.Bool("too_large", tee.overran))
		return err
	}
	resp := store.Response{Status: tee.status, Header: tee.header, Body: tee.body.Bytes()}
	if err := st.CompleteKey(kr.recordKey, token, resp, expires); err != nil {
		kr.log.Error("recording response", zap.Error(err))
	}
	return nil
}

// setBody gives r a fresh, replayable copy of body.
func setBody(r *http.Request, body []byte) {
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
}

// replay writes a recorded response byte for byte, marked as a replay.
func replay(w http.ResponseWriter, rec *store.Record) {
	resp := rec.Response
	h := w.Header()
	for k, v := range resp.Header {
		h[k] = v
	}
	h.Set(headerReplayed, "true")
	h.Set(headerExpires, rec.ExpiresAt.UTC().Format(http.TimeFormat))
	h.Set("Content-Length", strconv.Itoa(len(resp.Body)))
	h.Del("Transfer-Encoding")
	w.WriteHeader(resp.Status)
	_, _ = w.Write(resp.Body)
}
