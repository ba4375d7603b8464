// Package testkit holds the helpers that more than one package's tests use: free loopback ports
// for real listeners, a keyed load of concurrent clients, two webhook secrets, and the one
// bounded wait for a condition (WaitFor). It is for tests only; nothing outside _test.go files
// imports it.
package testkit
