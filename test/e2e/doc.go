// Package e2e holds the system tests: they build the mulligan binary once (sidecar/), run it as
// real processes on real Badger directories and a real PostgreSQL, SIGKILL, SIGTERM and restart
// them, and check over HTTP what a client and a webhook consumer see (docs/development.md,
// Tests). The process harness is process_test.go.
package e2e
