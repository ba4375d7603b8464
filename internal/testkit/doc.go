// Package testkit holds the helpers that more than one package's tests use: free loopback ports
// for real listeners, the gateway process harness (the built binary, started, killed and read),
// a keyed load of concurrent clients, two webhook secrets, and the one bounded wait for a
// condition (WaitFor). The system tests (test/e2e) and the benchmark (bench) share it; nothing
// the gateway itself runs imports it.
package testkit
