// Package webhook signs, verifies and delivers Mulligan's webhooks in the
// Standard Webhooks v1 format (https://www.standardwebhooks.com/).
//
// A delivery is a POST of a JSON body with three headers: webhook-id (stable
// across retries, the consumer's dedupe key), webhook-timestamp (unix seconds
// of this attempt) and webhook-signature (one "v1,<base64 HMAC-SHA256>" per
// secret, space separated, so secrets can be rotated without downtime).
//
// [Deliverer] sends one message to one endpoint: a few quick in-process
// retries, a circuit breaker per endpoint and an SSRF guard applied at dial
// time. It persists nothing: the durable outbox that calls it records each
// [Outcome] and schedules the next try with [Backoff].
//
// An endpoint may instead use the X-Webhook style ([XWebhook]): X-Webhook-Id,
// X-Webhook-Timestamp (RFC 3339) and X-Webhook-Signature ("t=<timestamp>,v1=<hex
// HMAC-SHA256 of "t.body">", one v1= per raw secret). Every delivery, in either style,
// carries X-Event-Type.
//
// Consumers verify deliveries with [Verify] or with any Standard Webhooks
// library, and X-Webhook deliveries with [VerifyXWebhook].
//
// This package imports neither Caddy nor Badger.
package webhook
