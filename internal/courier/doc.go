// Package courier delivers a storage's webhook outbox (docs/webhooks.md): it reads due events
// from the store, signs and sends each through the webhook package, and writes back the
// outcome: delivered, retry later (durably scheduled with backoff), dead letter, or endpoint
// disabled (410). It claims each event before sending it, so one replica at a time delivers it.
//
// It imports neither Caddy nor the gateway: the gateway hands it, through Options, the store,
// a clock, how an event is rendered and traced, and what to count; through Configure, the
// endpoints its config declares. Its admin operations (Redeliver, RedeliverAll, Enable) and its
// Stats are what the admin API and metrics ask of it.
package courier
