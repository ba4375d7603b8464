package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mulligan-gw/mulligan/webhook"
)

// benchSecret signs the webhook scenario's deliveries. It is a throwaway, used on loopback only.
const benchSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

// receiver is a loopback webhook consumer: it verifies every delivery and remembers when the
// first verified event of each operation arrived.
type receiver struct {
	secrets []webhook.Secret
	mu      sync.Mutex
	first   map[string]time.Time // operation id -> first verified delivery
	events  map[string]string    // webhook-id -> operation id
	bad     int
	badErr  string
	total   int
	resent  int         // verified deliveries of a webhook-id already delivered
	extra   int         // verified events for an operation that already had one (another webhook-id)
	refuse  atomic.Bool // answer 400 (the event is dead-lettered) until cleared
	refused map[string]bool
}

// ServeHTTP verifies one delivery (Standard Webhooks signature) and records it.
func (rc *receiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	now := time.Now()
	if err == nil {
		err = webhook.Verify(rc.secrets, r.Header, body, now)
	}
	var ev struct {
		Operation opView `json:"operation"`
	}
	if err == nil {
		err = json.Unmarshal(body, &ev)
	}
	if err == nil && rc.refuse.Load() {
		rc.mu.Lock()
		rc.refused[r.Header.Get(webhook.HeaderID)] = true
		rc.mu.Unlock()
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	rc.mu.Lock()
	defer rc.mu.Unlock()
	rc.total++
	if err != nil {
		rc.bad++
		rc.badErr = err.Error()
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	rc.note(r.Header.Get(webhook.HeaderID), ev.Operation.OperationID, now)
	w.WriteHeader(http.StatusNoContent)
}

// note records a verified delivery of event id about operation op; the caller holds mu.
func (rc *receiver) note(id, op string, now time.Time) {
	_, seenEvent := rc.events[id]
	_, seenOp := rc.first[op]
	switch {
	case seenEvent:
		rc.resent++
	case seenOp:
		rc.extra++
	default:
		rc.first[op] = now
	}
	rc.events[id] = op
}

// rate is verified deliveries per second between the first and the last.
func (rc *receiver) rate() float64 {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	var lo, hi time.Time
	for _, at := range rc.first {
		if lo.IsZero() || at.Before(lo) {
			lo = at
		}
		hi = maxTime(hi, at)
	}
	if !hi.After(lo) {
		return 0
	}
	return float64(len(rc.first)-1) / hi.Sub(lo).Seconds()
}

func (rc *receiver) delivered() int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return len(rc.first)
}

// webhookBlock is the webhooks configuration inside `mulligan { }`: every final operation is
// delivered to the local receiver.
func webhookBlock(receiverURL string) string {
	return fmt.Sprintf("\t\twebhooks {\n\t\t\tendpoint local %s {\n\t\t\t\tsecret %s\n\t\t\t}\n\t\t\tdefault local\n\t\t\tallow_private\n\t\t}\n",
		receiverURL, benchSecret)
}

// webhooks measures signed deliveries per second: Operations operations are submitted to a
// separate gateway per Mulligan side configured with a default endpoint, and timed until each
// has been delivered and verified. Plain Caddy has no counterpart. With replicas, the
// PostgreSQL side's webhooks gateway is one process.
func (h *harness) webhooks(ctx context.Context) ([]Row, error) {
	row := Row{Scenario: fmt.Sprintf("webhooks (%d signed deliveries)", h.cfg.Operations)}
	drain := Row{Scenario: fmt.Sprintf("webhooks, outbox drain (%d events)", h.cfg.Operations)}
	var notes, drainNotes []string
	for i, side := range h.mulligans {
		storage := h.badgerDir("webhooks-" + side.name)
		if i > 0 {
			var err error
			if storage, err = h.postgresStorage("webhooks"); err != nil {
				return nil, err
			}
		}
		res, note, drained, drainNote, err := h.webhooksOn(ctx, "webhooks-"+side.name, storage)
		if err != nil {
			return nil, err
		}
		row.Mulligan, drain.Mulligan = append(row.Mulligan, res), append(drain.Mulligan, drained)
		notes, drainNotes = append(notes, side.name+": "+note), append(drainNotes, side.name+": "+drainNote)
		if res == nil {
			row.Note = strings.Join(notes, "; ")
			return []Row{row}, nil
		}
	}
	row.Note = "deliveries/s, submit to verified delivery (async concurrency 32); no plain counterpart; " + strings.Join(notes, "; ")
	drain.Note = strings.Join(drainNotes, "; ")
	return []Row{row, drain}, nil
}

// webhooksOn runs the webhook measurements on a gateway named name storing in storage: the
// deliveries, then the outbox drain. A gateway rejecting the config skips both (nil results).
func (h *harness) webhooksOn(ctx context.Context, name, storage string) (res *Result, note string, drained *Result, drainNote string, err error) {
	secret, err := webhook.ParseSecret(benchSecret)
	if err != nil {
		return nil, "", nil, "", err
	}
	rc := &receiver{secrets: []webhook.Secret{secret}, first: map[string]time.Time{}, events: map[string]string{}, refused: map[string]bool{}}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, "", nil, "", err
	}
	srv := &http.Server{Handler: rc, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(l) }()
	defer srv.Close()

	hookURL := fmt.Sprintf("http://%s/hook", l.Addr())
	g, err := h.startGateway(ctx, name, func(int) string {
		// A wide runner, so that executing the operations does not limit the deliveries measured.
		return mulliganSite(h.upstream, storage, webhookBlock(hookURL)+"\t\tasync {\n\t\t\tconcurrency 32\n\t\t}\n")
	})
	if errors.Is(err, errGatewayExited) {
		note = "skipped: the gateway rejected the webhooks config: " + err.Error()
		h.logf("webhooks: %s", note)
		return nil, note, nil, "", nil
	}
	if err != nil {
		return nil, "", nil, "", err
	}
	defer g.stop()
	res = resultOf(h.deliverAll(ctx, g, rc))
	note = strings.TrimPrefix(rc.anomalies(), "; ")
	if note == "" {
		note = "no anomalies"
	}
	drained, drainNote = h.drainOutbox(ctx, g, rc)
	return res, note, drained, drainNote, nil
}

// drainOutbox has the receiver refuse every event (each is dead-lettered at once), then
// redelivers them all through the admin API and measures signed deliveries per second from the
// first to the last: the courier alone, not the operations' execution before it.
func (h *harness) drainOutbox(ctx context.Context, g *gateway, rc *receiver) (*Result, string) {
	rc.mu.Lock()
	rc.first, rc.events, rc.refused = map[string]time.Time{}, map[string]string{}, map[string]bool{}
	rc.mu.Unlock()
	rc.refuse.Store(true)
	n := h.cfg.Operations
	_, sub := h.submitAll(ctx, g, n, "drain ")
	want := n - sub.errs
	deadline := time.Now().Add(doneTimeout)
	for rc.refusedCount() < want && ctx.Err() == nil && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	rc.refuse.Store(false)
	start := time.Now()
	// The receiver's refusal comes before the gateway records the dead letter, so the last
	// ones may not be dead yet: redeliver until every refused event has been put back.
	for put := 0; put < want && ctx.Err() == nil && time.Now().Before(deadline); {
		n, err := h.redeliverDead(ctx, g)
		if err != nil {
			h.logf("webhooks: redelivering the dead letters: %v", err)
			break
		}
		if put += n; put < want {
			time.Sleep(20 * time.Millisecond)
		}
	}
	for rc.delivered() < want && ctx.Err() == nil && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	res := &Result{RPS: rc.rate(), OK: rc.delivered(), Errors: want - rc.delivered()}
	return res, fmt.Sprintf("deliveries/s from the first to the last of %d dead letters redelivered at once; all in %s", want, time.Since(start).Round(time.Millisecond))
}

// redeliverDead puts every dead letter of g back in its outbox and returns how many.
func (h *harness) redeliverDead(ctx context.Context, g *gateway) (int, error) {
	resp, body, err := send(ctx, h.client, http.MethodPost, g.admin+"/mulligan/dead-letters/redeliver", nil)
	if err != nil {
		return 0, err
	}
	if err := expectStatus(resp, body, http.StatusOK); err != nil {
		return 0, err
	}
	var v struct {
		Redelivering int `json:"redelivering"`
	}
	return v.Redelivering, json.Unmarshal(body, &v)
}

func (rc *receiver) refusedCount() int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return len(rc.refused)
}

// deliverAll submits Operations operations to g and waits until the receiver has a verified
// delivery for each, or doneTimeout passes.
func (h *harness) deliverAll(ctx context.Context, g *gateway, rc *receiver) sample {
	n := h.cfg.Operations
	start := time.Now()
	subs, sub := h.submitAll(ctx, g, n, "hook ")
	want := n - sub.errs
	deadline := time.Now().Add(doneTimeout)
	for rc.delivered() < want && ctx.Err() == nil && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	h.logf("webhooks: %d of %d operations delivered, %d deliveries received", rc.delivered(), want, rc.total)
	res := sample{errs: sub.errs, firstErr: sub.firstErr}
	last := start
	rc.mu.Lock()
	defer rc.mu.Unlock()
	for _, s := range subs {
		at, ok := rc.first[s.id]
		switch {
		case s.id == "":
		case !ok:
			res.record(0, fmt.Errorf("operation %s: no verified delivery within %s", s.id, doneTimeout))
		default:
			res.record(at.Sub(s.at), nil)
			last = maxTime(last, at)
		}
	}
	res.elapsed = last.Sub(start)
	return res
}

// anomalies describes deliveries beyond one verified event per operation.
func (rc *receiver) anomalies() string {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	var out string
	if rc.bad > 0 {
		out += fmt.Sprintf("; %d deliveries failed verification: %s", rc.bad, rc.badErr)
	}
	if rc.resent > 0 {
		out += fmt.Sprintf("; %d redeliveries of an event already answered 204", rc.resent)
	}
	if rc.extra > 0 {
		out += fmt.Sprintf("; %d extra events for operations already notified", rc.extra)
	}
	return out
}
