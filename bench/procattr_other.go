//go:build !linux

package main

import "syscall"

// childAttr keeps the defaults outside Linux: the harness stops its gateways on Ctrl-C itself.
func childAttr() *syscall.SysProcAttr { return nil }
