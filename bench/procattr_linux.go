package main

import "syscall"

// childAttr puts a gateway in its own process group, so a Ctrl-C reaches only the harness (which
// then stops it cleanly), and has the kernel kill it if the harness itself dies.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
