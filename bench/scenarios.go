package main

import (
	"context"
	"fmt"
	"net/http"
)

// chatPath is the model server's chat endpoint, which every scenario posts to.
const chatPath = "/v1/chat/completions"

// chatBody is a small OpenAI chat request saying text. Its keys are sorted and it has no
// spaces: it is its own canonical JSON, which the scale run relies on (fingerprint.go).
func chatBody(text string) []byte {
	return fmt.Appendf(nil, `{"messages":[{"content":%q,"role":"user"}],"model":"bench"}`, text)
}

// chat posts a fresh chat request without key or Prefer, expecting 200.
func (h *harness) chat() call {
	return func(ctx context.Context, base string, seq int64) error {
		resp, body, err := send(ctx, h.client, http.MethodPost, base+chatPath, chatBody(fmt.Sprint("hello ", seq)))
		if err != nil {
			return err
		}
		return expectStatus(resp, body, http.StatusOK)
	}
}

// keyed posts the chat request of the key keyOf(seq), expecting 200; with wantReplay, the
// answers of every gateway but plain Caddy must be replays.
func (h *harness) keyed(keyOf func(seq int64) string, wantReplay bool) call {
	return func(ctx context.Context, base string, seq int64) error {
		key := keyOf(seq)
		resp, body, err := send(ctx, h.client, http.MethodPost, base+chatPath, chatBody(key), "Idempotency-Key", key)
		if err != nil {
			return err
		}
		if err := expectStatus(resp, body, http.StatusOK); err != nil {
			return err
		}
		if wantReplay && (h.plain == nil || base != h.plain.base) && resp.Header.Get("Idempotent-Replayed") != "true" {
			return fmt.Errorf("key %s answered without Idempotent-Replayed: true", key)
		}
		return nil
	}
}

// passthrough: a covered method (POST) without key or Prefer, which Mulligan lets through.
func (h *harness) passthrough(ctx context.Context) ([]Row, error) {
	plain, mull, err := h.closedRounds(ctx, ScenarioPassthrough, h.chat())
	return []Row{{Scenario: "pass-through (POST, no key)", Plain: resultOf(plain), Mulligan: resultsOf(mull)}}, err
}

// newKeys: every request carries a key never seen before, so each one is claimed, proxied and
// recorded (two fsynced writes under durability sync).
func (h *harness) newKeys(ctx context.Context) ([]Row, error) {
	keyOf := func(seq int64) string { return fmt.Sprintf("%s-new-%d", h.runID, seq) }
	plain, mull, err := h.closedRounds(ctx, ScenarioNewKeys, h.keyed(keyOf, false))
	return []Row{{Scenario: "new key per request (sync)", Plain: resultOf(plain), Mulligan: resultsOf(mull),
		Note: "plain: same keyed request proxied"}}, err
}

// replays: ReplayKeys keys are recorded first; then requests cycle through them and Mulligan
// answers each from its store without calling the model.
func (h *harness) replays(ctx context.Context) ([]Row, error) {
	n := int64(h.cfg.ReplayKeys)
	keyOf := func(seq int64) string { return fmt.Sprintf("%s-replay-%d", h.runID, seq%n) }
	h.logf("%s: recording %d keys", ScenarioReplays, n)
	record := h.keyed(keyOf, false)
	for _, g := range h.mulligans {
		s := forEach(ctx, h.cfg.Concurrency, int(n), func(i int) error { return record(ctx, g.pick(int64(i)), int64(i)) })
		if s.errs > 0 {
			return nil, fmt.Errorf("recording the keys on %s: %d failed: %s", g.name, s.errs, s.firstErr)
		}
	}
	plain, mull, err := h.closedRounds(ctx, ScenarioReplays, h.keyed(keyOf, true))
	return []Row{{Scenario: fmt.Sprintf("replay (%d recorded keys)", n), Plain: resultOf(plain), Mulligan: resultsOf(mull),
		Note: "plain: same request proxied to the model"}}, err
}
