package consumer

import (
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/mulligan-gw/mulligan/webhook"
)

// Reasons a verified event is not accepted; each maps to a 503, so the
// gateway keeps the event and retries it later.
var (
	errShuttingDown = errors.New("shutting down")
	errQueueFull    = errors.New("queue full")
)

// retryAfterSeconds is the Retry-After sent with a 503.
const retryAfterSeconds = "5"

// ServeHTTP receives one delivery: it reads the raw body, verifies its
// signature, and journals the event before answering 200. A duplicate
// webhook-id is answered 200 and not processed again. Processing happens
// later, on the queue.
//
// Statuses tell the gateway what to do (docs/webhooks.md, Delivery and retries): 2xx delivered; 401,
// 400 and 413 dead-letter at once (a retry would fail the same way); 503
// retries later.
func (c *Consumer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		http.Error(w, "webhooks are POSTed", http.StatusMethodNotAllowed)
		return
	}
	body, status, err := readBody(w, r, c.cfg.MaxBodyBytes)
	if err != nil {
		http.Error(w, err.Error(), status)
		return
	}
	// Verify the raw bytes before parsing anything: re-encoded JSON would
	// not verify, and an unverified body must not be trusted at all.
	id, err := c.verify(r.Header, body)
	if err != nil {
		c.cfg.Logf("consumer: refused a delivery: %v", err)
		http.Error(w, "signature verification failed", http.StatusUnauthorized)
		return
	}
	if typ, ok := responseEvent(body); ok {
		// The Responses API's webhooks (docs/responses.md) carry only the response's id, for
		// the receiver to retrieve it: there is no operation to order or poll here.
		c.cfg.Logf("consumer: %s %s", typ, id)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintln(w, `{"status":"accepted"}`)
		return
	}
	ev, err := parseEvent(body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	duplicate, err := c.accept(id, body, ev)
	if err != nil {
		w.Header().Set("Retry-After", retryAfterSeconds)
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	if duplicate {
		fmt.Fprintln(w, `{"status":"duplicate"}`)
		return
	}
	fmt.Fprintln(w, `{"status":"accepted"}`)
}

// verify checks a delivery in the style its headers show (X-Webhook-Signature
// or Standard Webhooks' webhook-signature) and returns its id, the dedupe key
// of either style.
func (c *Consumer) verify(h http.Header, body []byte) (string, error) {
	if h.Get(webhook.HeaderXSignature) != "" {
		return h.Get(webhook.HeaderXID), webhook.VerifyXWebhook(c.cfg.XWebhookSecrets, h, body, c.cfg.Now())
	}
	return h.Get(webhook.HeaderID), webhook.Verify(c.cfg.Secrets, h, body, c.cfg.Now())
}

// readBody reads the whole body, up to limit bytes. On failure it also
// returns the status to answer: 413 above the limit, 400 otherwise.
func readBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, int, error) {
	tooLarge := fmt.Errorf("body over %d bytes", limit)
	if r.ContentLength > limit { // refuse before reading when the size is announced
		return nil, http.StatusRequestEntityTooLarge, tooLarge
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	var overLimit *http.MaxBytesError
	switch {
	case errors.As(err, &overLimit):
		return nil, http.StatusRequestEntityTooLarge, tooLarge
	case err != nil:
		return nil, http.StatusBadRequest, fmt.Errorf("reading the body: %w", err)
	}
	return body, 0, nil
}

// accept journals a verified event under its webhook-id and queues it,
// unless the id was accepted before (duplicate). When accept returns nil the
// event is durable: only then may the delivery be acknowledged.
func (c *Consumer) accept(id string, body []byte, ev Event) (duplicate bool, err error) {
	c.mu.Lock() // one lock across check and write: concurrent retries journal an id once
	defer c.mu.Unlock()
	switch {
	case c.closed:
		return false, errShuttingDown
	case c.isSeen(id):
		return true, nil
	case len(c.queue) == cap(c.queue):
		return false, errQueueFull // nothing journaled: the gateway retries later
	}
	err = c.journal.append(record{Kind: kindReceived, ID: id, At: c.cfg.Now().UTC(), Event: body})
	if err != nil {
		c.cfg.Logf("consumer: %s: journaling: %v", id, err)
		return false, errors.New("storage unavailable")
	}
	c.seen[id] = struct{}{}
	c.pending.add(1)
	c.queue <- queuedEvent{id: id, event: ev} // never blocks: only senders hold c.mu, and it is not full
	return false, nil
}

// isSeen reports whether id was accepted before. c.mu must be held.
func (c *Consumer) isSeen(id string) bool {
	_, seen := c.seen[id]
	return seen
}
