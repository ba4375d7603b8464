package module

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/mulligan-gw/mulligan/internal/apierr"
	"github.com/mulligan-gw/mulligan/internal/capture"
	"github.com/mulligan-gw/mulligan/internal/fingerprint"
	"github.com/mulligan-gw/mulligan/internal/idemkey"
	"github.com/mulligan-gw/mulligan/internal/sse"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/jonboulle/clockwork"
	"go.uber.org/zap"

	"github.com/mulligan-gw/mulligan/internal/runner"
	"github.com/mulligan-gw/mulligan/internal/streams"
	"github.com/mulligan-gw/mulligan/internal/tracing"
	"github.com/mulligan-gw/mulligan/store"
)

const (
	headerExpires  = capture.HeaderExpires
	headerReplayed = capture.HeaderReplayed
	// pollInterval paces a waiting duplicate whose original is not held by this process
	// (a claim left by a crashed gateway).
	pollInterval = streams.PollInterval
)

// gate is the Idempotency-Key gate: claim, run once, record, replay (docs/api.md, Idempotency).
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
	fp        *fingerprint.Fingerprinter
	keyed     *streams.Keyed // how keyed streams are recorded and joined, and the claims held here (docs/streams.md)
	clock     clockwork.Clock
}

func newGate(c *IdempotencyConfig, a *AsyncConfig, clock clockwork.Clock) (*gate, error) {
	policy, err := parseStatusPolicy(c.StoreStatus)
	if err != nil {
		return nil, err
	}
	fp, err := fingerprint.New(c.FingerprintIgnore)
	if err != nil {
		return nil, err
	}
	return (&gate{
		header: c.Header, required: c.Required, ttl: time.Duration(c.TTL), lease: time.Duration(c.Lease),
		wait: time.Duration(c.WaitInflight), maxBody: c.MaxBody, maxResult: a.MaxResult,
		mismatch: c.MismatchStatus, policy: policy, fp: fp, clock: clock,
	}).withStreams(), nil
}

// withStreams gives g what its keyed streams are recorded and joined with.
func (g *gate) withStreams() *gate {
	g.keyed = &streams.Keyed{Records: g.policy.records, MaxBytes: g.maxResult, Expiry: g.expiry,
		Keep:  g.lease + g.ttl + time.Minute, // the record replays for ttl after the stream ends
		Lives: streams.NewLives(), Flights: streams.NewFlights()}
	return g
}

// keyedRequest is a covered request with its body read and, when it has a key, its record key
// and fingerprint.
type keyedRequest struct {
	r         *http.Request
	key       string // empty: no Idempotency-Key
	scope     string // hash of the tenant scope
	recordKey []byte
	fp        []byte
	body      []byte
	reserved  int64           // bytes of max_buffered the body holds
	callback  *store.Callback // where the operation's events go, for converted requests
	metadata  json.RawMessage // the body's metadata object, for converted requests
	trace     tracing.Context // the request's W3C Trace Context
	log       reqLog
	// replayed, when set, answers a converted request's replay of its key's record itself (a
	// background response's stream, docs/responses.md); false to answer it as recorded.
	replayed func(store.Claim) bool
}

// keyOf returns the request's idempotency key ("" when it has none and none is required). It
// answers the client itself, and reports false, when the key is missing but required or invalid.
func (g *gate) keyOf(w http.ResponseWriter, r *http.Request) (string, bool) {
	values := r.Header.Values(g.header)
	switch {
	case len(values) == 0 && g.required:
		countRequest(outcomeRejected)
		apierr.Write(w, apierr.Error{Code: apierr.CodeKeyRequired, Message: fmt.Sprintf("%s %s requires an %s header.", r.Method, r.URL.Path, g.header)})
		return "", false
	case len(values) == 0:
		return "", true
	case len(values) > 1:
		countRequest(outcomeRejected)
		apierr.Write(w, apierr.Error{Code: apierr.CodeKeyInvalid, Message: fmt.Sprintf("Send exactly one %s header.", g.header)})
		return "", false
	}
	key, err := idemkey.Parse(values[0])
	if err != nil {
		countRequest(outcomeRejected)
		apierr.Write(w, apierr.Error{Code: apierr.CodeKeyInvalid, Message: err.Error() + "; send 1 to 255 printable ASCII characters."})
		return "", false
	}
	return key, true
}

// prepare reads the body, within the handler's budget of buffered bodies, and computes what
// the gate needs of a covered request. The caller gives the reservation back when done.
func (g *gate) prepare(w http.ResponseWriter, r *http.Request, budget *byteBudget, key, scope string, log reqLog) (*keyedRequest, error) {
	body, reserved, err := g.readBody(w, r, budget, log)
	if err != nil {
		return nil, err
	}
	kr := &keyedRequest{r: r, key: key, scope: idemkey.Scope(scope), body: body, reserved: reserved, log: log}
	if key != "" {
		kr.recordKey = idemkey.Record(scope, r.Method, r.URL.Path, key)
		kr.fp = g.fp.Sum(r.Method, r.URL.Path, r.URL.RawQuery, r.Header.Get("Content-Type"), body)
		kr.log = log.With(zap.String("idempotency_key", key))
	}
	return kr, nil
}

// errAnswered means the gate already wrote the answer.
var errAnswered = errors.New("answered")

// bodyChunk is the first buffer of a body; it doubles as bytes arrive.
const bodyChunk = 32 << 10

// readBody reads the whole body with a hard limit, answering 413 past it, and 503 GATEWAY_BUSY
// when the bodies being held at once would pass max_buffered. Every byte of buffer is reserved
// before it is allocated, and the buffer grows as bytes arrive, never ahead of them to the
// Content-Length: a client that promises a large body and stalls holds one chunk of the budget,
// not its whole promise. It returns the bytes reserved.
func (g *gate) readBody(w http.ResponseWriter, r *http.Request, budget *byteBudget, log reqLog) ([]byte, int64, error) {
	if r.ContentLength > g.maxBody {
		return nil, 0, g.tooLarge(w)
	}
	end := g.maxBody + 1 // room for one byte past the body: its end, or max_body passed
	if r.ContentLength >= 0 {
		end = r.ContentLength + 1
	}
	var reserved int64
	grow := func(buf []byte, size int64) ([]byte, bool) {
		// The byte past max_body only detects an overrun and is not counted, so that one body
		// of max_body fits a max_buffered of max_body.
		need := min(size, g.maxBody) - reserved
		if !budget.take(need) {
			return buf, false
		}
		reserved += need
		return append(make([]byte, 0, size), buf...), true
	}
	buf, ok := grow(nil, min(end, bodyChunk))
	for ok {
		if len(buf) == cap(buf) {
			if buf, ok = grow(buf, min(2*int64(cap(buf)), end)); !ok {
				break
			}
		}
		n, err := r.Body.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		switch {
		case int64(len(buf)) > g.maxBody:
			budget.give(reserved)
			return nil, 0, g.tooLarge(w)
		case err == io.EOF:
			return buf, reserved, nil
		case err != nil:
			budget.give(reserved)
			log.Debug("reading the request body", zap.Error(err))
			countRequest(outcomeRejected)
			apierr.Write(w, apierr.Error{Code: apierr.CodeInvalidRequest, Message: "The request body could not be read; send it again."})
			return nil, 0, errAnswered
		}
	}
	budget.give(reserved)
	countRequest(outcomeBusy)
	apierr.Write(w, apierr.Error{Code: apierr.CodeBusy, RetryAfter: time.Second, Details: map[string]any{"max_buffered": budget.limit},
		Message: "The gateway is holding as many request bodies as it may; retry shortly."})
	return nil, 0, errAnswered
}

func (g *gate) tooLarge(w http.ResponseWriter) error {
	countRequest(outcomeRejected)
	apierr.Write(w, apierr.Error{Code: apierr.CodeRequestTooLarge, Message: fmt.Sprintf("The request body is over the %d-byte limit.", g.maxBody),
		Details: map[string]any{"max_body": g.maxBody}})
	return errAnswered
}

// claimAndRun claims the key and runs the request, or answers from the record.
func (g *gate) claimAndRun(w http.ResponseWriter, kr *keyedRequest, next caddyhttp.Handler, st store.Backend) error {
	deadline := g.clock.Now().Add(g.wait)
	wait := waiting{interval: pollInterval}
	streamAsked := false
	for {
		claim, durable, err := g.claim(st, kr)
		if err != nil {
			return g.storageFailed(w, kr, err)
		}
		switch {
		case claim.Outcome == store.Claimed:
			countRequest(outcomeNew)
			return g.run(w, kr, next, st, claim.Token, durable)
		case g.joinStream(w, kr, st, claim):
			return nil
		case claim.Outcome == store.InProgress && !streamAsked:
			// A duplicate of a request that asks for a stream, arriving before the first
			// attempt's answer has begun, waits for it (up to streamWaitMax) and then joins it,
			// as it would have a moment later (docs/streams.md): no 409 for streams.
			streamAsked = true
			if asksForStream(kr) {
				wait.stream, wait.backoff = true, true
				deadline = later(deadline, g.clock.Now().Add(min(g.lease, streamWaitMax)))
			}
		}
		if claim.Outcome == store.InProgress && g.clock.Now().Before(deadline) && g.awaitFlight(kr, deadline, &wait) {
			continue
		}
		g.answer(w, kr, claim)
		return nil
	}
}

// claim claims the key. Where the store can commit a claim before it is durable (Badger), the
// upstream is called while the claim's fsync runs, and durable waits for it before the client
// hears anything (docs/api.md, "Durability"); elsewhere durable is nil and the claim is durable
// when it returns.
func (g *gate) claim(st store.Backend, kr *keyedRequest) (store.Claim, func() error, error) {
	if early, ok := st.(store.EarlyClaimer); ok {
		return early.ClaimKeyEarly(kr.recordKey, kr.fp, g.lease)
	}
	claim, err := st.ClaimKey(kr.recordKey, kr.fp, g.lease)
	return claim, nil, err
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// asksForStream reports whether a request asks for an event-stream answer: Accept:
// text/event-stream, or a JSON body with "stream": true (the OpenAI-style APIs' switch).
func asksForStream(kr *keyedRequest) bool {
	if sse.WantsEventStream(kr.r) {
		return true
	}
	if !bytes.Contains(kr.body, []byte(`"stream"`)) {
		return false
	}
	var v struct {
		Stream bool `json:"stream"`
	}
	return json.Unmarshal(kr.body, &v) == nil && v.Stream
}

// answer responds to a request whose key is not the caller's to run: replay, mismatch or
// in progress.
func (g *gate) answer(w http.ResponseWriter, kr *keyedRequest, claim store.Claim) {
	switch claim.Outcome {
	case store.Replay:
		if claim.Record.Streamed {
			// The answer is a recorded stream that joinStream could not give (a failed read, or
			// the key expired and was claimed again meanwhile): the record's own body is empty
			// and must never be passed off as the stream.
			_ = g.storageFailed(w, kr, errors.New("the recorded stream could not be read"))
			return
		}
		countRequest(outcomeReplayed)
		kr.log.Debug("replaying recorded response")
		capture.Replay(w, claim.Record)
	case store.Mismatch:
		countRequest(outcomeMismatch)
		apierr.Write(w, apierr.Error{Code: apierr.CodeKeyReused, Status: g.mismatch,
			Message: "This Idempotency-Key was used with a different request; use a new key for a new request."})
	default:
		countRequest(outcomeInProgress)
		apierr.Write(w, apierr.Error{Code: apierr.CodeInProgress, RetryAfter: time.Second, Details: apierr.OperationDetails(claim.Record),
			Message: "A request with this Idempotency-Key is still being processed; retry later."})
	}
}

// How long a duplicate that asks for a stream waits for the original's answer to begin, and
// how far apart it looks for it when another process holds the claim (docs/streams.md).
const (
	streamWaitMax = time.Minute
	streamPollMax = time.Second
)

// waiting is how a duplicate waits for the in-flight original.
type waiting struct {
	// stream: the duplicate asks for a stream; it also wakes when the original's answer begins
	// as a stream in this process (once: then it waits for the end).
	stream bool
	// backoff: it looks less often, the longer it waits, when another process holds the claim.
	backoff bool
	// interval is how soon to look again at a claim another process holds.
	interval time.Duration
}

// awaitFlight waits until the in-flight original ends (or, for a duplicate that asks for a
// stream, its answer begins here), the deadline passes or the client leaves; when another
// process holds the claim it looks again after w.interval. It reports whether it is worth
// claiming again: not when the key already has maxStreamWaiters stream duplicates waiting.
func (g *gate) awaitFlight(kr *keyedRequest, deadline time.Time, w *waiting) bool {
	if w.backoff { // a stream duplicate: it holds one of the key's places while it waits
		if !g.keyed.Flights.EnterWait(string(kr.recordKey)) {
			return false
		}
		defer g.keyed.Flights.LeaveWait(string(kr.recordKey))
	}
	done, begun := g.keyed.Flights.Wait(string(kr.recordKey))
	if !w.stream {
		begun = nil
	}
	wait := g.clock.Until(deadline)
	if done == nil && wait > w.interval {
		wait = w.interval
		if w.backoff {
			w.interval = min(2*w.interval, streamPollMax)
		}
	}
	t := g.clock.NewTimer(wait)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-begun:
		w.stream = false // woken once: a stream it cannot join is waited out, not spun on
		return true
	case <-t.Chan():
		return g.clock.Now().Before(deadline) || done == nil
	case <-kr.r.Context().Done():
		return false
	}
}

func (g *gate) storageFailed(w http.ResponseWriter, kr *keyedRequest, err error) error {
	countRequest(outcomeStorage)
	kr.log.Error("storage unavailable", zap.Error(err))
	apierr.Write(w, apierr.Error{Code: apierr.CodeStorage, Message: "The gateway's storage is unavailable; retry shortly.", RetryAfter: time.Second})
	return nil
}

// run sends the claimed request upstream on a context that outlives the client (bounded by the
// lease), streams the answer to the client, and records or releases the key. durable, when
// set, waits for the claim's fsync: nothing of the answer goes to the client before it.
func (g *gate) run(w http.ResponseWriter, kr *keyedRequest, next caddyhttp.Handler, st store.Backend, token string, durable func() error) error {
	defer g.keyed.Flights.Start(string(kr.recordKey), token)()
	ctx, cancel := detachedContext(kr.r.Context(), g.lease)
	defer cancel()
	up := kr.r.WithContext(ctx)
	setBody(up, kr.body)

	tee := capture.NewTee(w, g.maxResult)
	tee.Trailers = []string{headerExpires} // a stream says until when it replays at its end
	// refused: the claim's fsync failed, and the client was answered 503 instead.
	refused := false
	if durable != nil {
		tee.Ready = func(client http.ResponseWriter) bool {
			err := durable()
			if err == nil {
				return true
			}
			refused = true
			kr.log.Error("storage unavailable", zap.Error(err))
			for name := range client.Header() { // the upstream's, copied for its answer
				if name != apierr.HeaderRequestID {
					client.Header().Del(name)
				}
			}
			apierr.Write(client, apierr.Error{Code: apierr.CodeStorage, Message: "The gateway's storage is unavailable; retry shortly.", RetryAfter: time.Second})
			return false
		}
	}
	stream := g.keyed.Record(st, kr.recordKey, token, tee, kr.log) // every backend records streams
	tee.Streams = stream
	defer func() {
		// reverse_proxy panics with http.ErrAbortHandler when the upstream breaks off its body
		// (docs/api.md): the half answer is dropped, the key freed at once, and the panic goes
		// on so that net/http aborts the client's connection instead of ending it cleanly.
		if v := recover(); v != nil {
			if !stream.Abandon() {
				g.recordOutcome(st, kr, token, attemptResult{})
			}
			panic(v)
		}
	}()
	err := next.ServeHTTP(tee, up)
	tee.WaitReady() // an upstream that answered nothing: the error answer comes after the claim too
	if tee.Streaming() {
		var expires time.Time
		if expires, err = stream.End(err); !expires.IsZero() {
			tee.Client().Header().Set(headerExpires, expires.UTC().Format(http.TimeFormat)) // the trailer declared with the headers
		}
	} else {
		err = g.settle(w, kr, st, token, tee, err)
	}
	if refused {
		return nil // answered 503 STORAGE_UNAVAILABLE
	}
	return err
}

// settle records or releases the key after an answer that was not streamed, and releases the
// held answer to the client once its record is durable.
func (g *gate) settle(w http.ResponseWriter, kr *keyedRequest, st store.Backend, token string, tee *capture.Tee, err error) error {
	if err == nil && !tee.Written() {
		tee.WriteHeader(http.StatusOK) // the handler wrote nothing: net/http's implicit 200
	}
	res := runner.ResultOf(tee.Recorded())
	if err != nil {
		res.Status = 0
	}
	if expires, ok := g.recordOutcome(st, kr, token, res); ok {
		w.Header().Set(headerExpires, expires.UTC().Format(http.TimeFormat)) // a trailer if streamed
	}
	if err == nil {
		tee.Release() // only now that the record is durable
	}
	return err
}

// recordOutcome records res for the key held under token when the policy keeps it, else releases
// the key so that the next retry runs again. It reports until when the key replays, and whether
// it was recorded: the replay window starts now, when the response is recorded.
func (g *gate) recordOutcome(st store.Keys, kr *keyedRequest, token string, res attemptResult) (time.Time, bool) {
	if res.Status == 0 || res.Over || !g.policy.records(res.Status) {
		if err := st.ReleaseKey(kr.recordKey, token); err != nil {
			kr.log.Warn("releasing idempotency key", zap.Error(err))
		}
		kr.log.Debug("upstream outcome not recorded; key released", zap.Int("status", res.Status), zap.Bool("too_large", res.Over))
		return time.Time{}, false
	}
	expires := g.expiry()
	resp := store.Response{Status: res.Status, Header: res.Header, Body: res.Body}
	if err := st.CompleteKey(kr.recordKey, token, resp, expires); err != nil {
		kr.log.Error("recording response", zap.Error(err))
		return time.Time{}, false
	}
	kr.log.Debug("response recorded for replay", zap.Int("status", res.Status), zap.Int("bytes", len(res.Body)))
	return expires, true
}

// expiry is until when a key recorded now replays: ttl from now, rounded up to the whole second
// that Idempotency-Expires can say.
func (g *gate) expiry() time.Time {
	return g.clock.Now().Add(g.ttl + time.Second - 1).Truncate(time.Second)
}

// setBody gives r a fresh, replayable copy of body.
func setBody(r *http.Request, body []byte) {
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
}
