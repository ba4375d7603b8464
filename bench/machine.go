package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"runtime"
	"strings"
	"time"
)

// machineLine describes where the numbers come from: CPUs, CPU model, Go version.
func machineLine() string {
	return fmt.Sprintf("%d CPUs (nproc), %s, %s %s/%s, GOMAXPROCS=%d",
		runtime.NumCPU(), cpuModel(), runtime.Version(), runtime.GOOS, runtime.GOARCH, runtime.GOMAXPROCS(0))
}

// cpuModel is the first "model name" of /proc/cpuinfo, or "unknown CPU" elsewhere.
func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return "unknown CPU"
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name, value, ok := strings.Cut(sc.Text(), ":")
		if ok && strings.TrimSpace(name) == "model name" {
			return strings.TrimSpace(value)
		}
	}
	return "unknown CPU"
}

// printHeader writes what a reader needs to reproduce the run.
func printHeader(w io.Writer, cfg Config) {
	fmt.Fprintf(w, "# mulligan bench, %s\n", time.Now().UTC().Format("2006-01-02 15:04 MST"))
	fmt.Fprintf(w, "machine: %s\n", machineLine())
	fmt.Fprintf(w, "command: %s\n", commandLine())
	fmt.Fprintf(w, "effective: %s\n\n", cfg.flagLine())
}

// commandLine is the command as typed, assuming `go run ./bench` (os.Args[0] is a temporary
// binary then).
func commandLine() string {
	return strings.TrimSpace("go run ./bench " + strings.Join(os.Args[1:], " "))
}
