// Package testkit holds the helpers that more than one package's tests use: free loopback ports
// for real listeners, and a keyed load of concurrent clients. It is for tests only; nothing
// outside _test.go files imports it.
package testkit
