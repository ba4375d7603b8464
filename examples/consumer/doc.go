// Package consumer is an example receiver of Mulligan's webhooks that does
// what every consumer of signed, retried events has to do, and shows how:
//
//  1. Read the raw body under a size limit (413 above it).
//  2. Verify the signature over the raw bytes with [webhook.Verify] before
//     parsing anything (401 on failure, nothing recorded); a delivery from an
//     endpoint with "signature x-webhook" (X-Webhook-Signature) is verified
//     with [webhook.VerifyXWebhook] and Config.XWebhookSecrets instead.
//  3. Deduplicate by webhook-id (X-Webhook-Id in the other style), which
//     stays the same across retries, in durable storage: a redelivery after
//     a restart is still recognised.
//  4. Acknowledge fast: answer 200 as soon as the event is durably
//     journaled, and do the work afterwards from an in-process queue, so a
//     slow handler never makes the gateway time out and retry.
//  5. Order by operation version, not by arrival: retries and parallel
//     deliveries arrive out of order, so an event whose operation.version is
//     not newer than what was already processed is stale and ignored.
//  6. When an event cannot be trusted to be the latest state, ask the
//     gateway: GET {gateway}{operation.links.self} returns the truth.
//
// # The journal
//
// Everything durable lives in one append-only JSON-lines file,
// Dir/journal.jsonl, fsynced after every line. No database is needed:
//
//	{"kind":"received","id":"evt_1","at":"...","event":{...the verified body...}}
//	{"kind":"processed","id":"evt_1","at":"...","outcome":"processed","operation_id":"op_1","version":3,"final":true}
//
// A "received" line is written (and fsynced) before the 200: it is both the
// dedupe record and the durable queue. A "processed" line is written after
// the event was handled, with outcome "processed" or "stale" and, for
// processed events, the operation version now known. At start the journal is
// replayed: every received id is remembered for deduplication, the highest
// version per operation is rebuilt from the processed lines, and received
// events without a processed line are handled before anything new. A torn
// last line (a crash in the middle of a write) is cut off; it was never
// acknowledged, so the gateway redelivers it.
//
// # Crashes
//
//   - Before the received line is fsynced: no 2xx was sent, the gateway
//     retries with the same webhook-id, nothing is lost.
//   - After the fsync but before the 200 reached the gateway: the gateway
//     retries; the retry finds the id in the journal and is answered 200
//     without being processed again. The event itself is processed from the
//     journal after the restart.
//   - After Process ran but before its processed line was fsynced: the event
//     is processed again after the restart. Processing is therefore
//     at-least-once: make Process idempotent (key its effects by event id or
//     by operation id and version), or commit its effects and the marker
//     together.
//
// # Polling the gateway
//
// The consumer polls GET {gateway}{operation.links.self} when it is unsure
// the delivered state is the latest: a non-final event whose version skips
// past the next one (a transition was missed, so this state may already be
// superseded), or any newer event for an operation already seen final (the
// contract says final states are final, so the gateway is asked rather than
// the event believed). A final event is never polled for: a final state is
// never superseded, so the gateway could only confirm it.
//
// A poll that fails (gateway down, timeout, 404 after retention) does not
// lose or block the event: it is processed as delivered, which is authentic
// (signed) and newer than anything processed for that operation, and the
// failure is logged. Any later state reaches the consumer as its own event,
// because the gateway writes an event with every status change. Retrying
// the poll instead would hold up every event behind it in the queue.
//
// # Limits of the example
//
// The journal and the in-memory dedupe set grow without bound; a long-lived
// consumer would compact the journal, keeping ids for as long as the
// gateway may redeliver (its webhooks max_age, 72h by default, plus any
// manual redelivery of dead letters) and the latest version per operation.
// One consumer process owns a Dir at a time.
package consumer
