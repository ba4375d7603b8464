package testkit

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/mulligan-gw/mulligan/internal/clocks"
)

// The gateway process harness: the built binary run for real, which the system tests
// (test/e2e) SIGKILL and restart and the benchmark (bench) drives with load. Both start, stop
// and read gateways through it.

// ErrExited means the process ended before it listened: usually a config it rejected (its log
// says why).
var ErrExited = errors.New("the gateway exited before it listened")

// BuildSidecar builds the sidecar binary (stock Caddy plus the module) into dir/mulligan, from
// the repository root.
func BuildSidecar(ctx context.Context, dir string) (string, error) {
	bin := filepath.Join(dir, "mulligan")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "./sidecar")
	cmd.Dir = ModuleRoot()
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./sidecar: %v\n%s", err, out)
	}
	return bin, nil
}

// ModuleRoot is the repository root: the nearest parent of the working directory holding go.mod
// (`go run ./bench` runs from the root, `go test` from the package's directory).
func ModuleRoot() string {
	dir, _ := os.Getwd()
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d
		}
		if filepath.Dir(d) == d {
			return dir
		}
	}
}

// SiteConfig is the Caddyfile of a gateway serving body on 127.0.0.1:port, its admin API on
// adminPort: global options keeping it on loopback and stateless (plus globals), then one site.
func SiteConfig(adminPort, port int, globals, body string) string {
	return fmt.Sprintf(`{
	admin 127.0.0.1:%d
	persist_config off
	auto_https off
	%s
}

http://127.0.0.1:%d {
%s
}
`, adminPort, globals, port, body)
}

// CleanEnv is this process's environment without MULLIGAN_* variables, so a developer's shell
// cannot change what a test or a benchmark configures.
func CleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "MULLIGAN_") {
			env = append(env, kv)
		}
	}
	return env
}

// DataEnv is CleanEnv with Caddy's data and config directories (XDG_DATA_HOME,
// XDG_CONFIG_HOME) under dir.
func DataEnv(dir string) []string {
	return append(CleanEnv(), "XDG_DATA_HOME="+filepath.Join(dir, "xdg-data"), "XDG_CONFIG_HOME="+filepath.Join(dir, "xdg-config"))
}

// Process is one gateway process: a binary with its arguments and environment, its output
// appended to Dir/gateway.log, serving on Port.
type Process struct {
	Binary string
	Args   []string
	Env    []string
	Dir    string // the data directory: it outlives the process, for a restart on the same data
	Port   int    // where it serves; it has started once this accepts connections

	cmd    *exec.Cmd
	exited chan struct{}
	err    error // the process's exit, once exited is closed
	log    *os.File
}

// LogPath is where the process's output goes.
func (p *Process) LogPath() string { return filepath.Join(p.Dir, "gateway.log") }

// Running reports whether the process has been started and has not ended.
func (p *Process) Running() bool {
	if p.cmd == nil {
		return false
	}
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// Start runs the process and waits, up to within, until its port accepts connections. It
// fails when the process exits first (ErrExited, with the telling line of its log) or ctx ends.
func (p *Process) Start(ctx context.Context, within time.Duration) error {
	log, err := os.OpenFile(p.LogPath(), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	p.log, p.exited = log, make(chan struct{})
	p.cmd = exec.Command(p.Binary, p.Args...)
	p.cmd.Env, p.cmd.Stdout, p.cmd.Stderr = p.Env, log, log
	p.cmd.SysProcAttr = childAttr()
	if err := p.cmd.Start(); err != nil {
		log.Close()
		p.cmd = nil
		return err
	}
	exited, cmd := p.exited, p.cmd
	go func() { p.err = cmd.Wait(); close(exited) }()
	if err := p.waitListening(ctx, within); err != nil {
		p.Kill()
		return err
	}
	return nil
}

// waitListening polls the port until it accepts, the process exits, ctx ends or within passes.
func (p *Process) waitListening(ctx context.Context, within time.Duration) error {
	expired := time.NewTimer(within)
	defer expired.Stop()
	for every := 5 * time.Millisecond; ; every = min(2*every, 50*time.Millisecond) {
		if c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", p.Port), time.Second); err == nil {
			c.Close()
			return nil
		}
		select {
		case <-p.exited:
			return fmt.Errorf("%w: %s", ErrExited, p.LogError())
		case <-ctx.Done():
			return ctx.Err()
		case <-expired.C:
			return fmt.Errorf("not listening on port %d within %s: %s", p.Port, within, p.LogError())
		case <-time.After(every):
		}
	}
}

// Terminate sends SIGTERM, as the kubelet does, and waits up to within for the exit; it returns
// the exit code and how long the exit took. A process still running after within is killed and
// reported as an error.
func (p *Process) Terminate(within time.Duration) (code int, took time.Duration, err error) {
	if !p.Running() {
		return 0, 0, errors.New("the gateway is not running")
	}
	start := clocks.Real.Now()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		return 0, 0, err
	}
	select {
	case <-p.exited:
	case <-time.After(within):
		p.Kill()
		return 0, clocks.Real.Since(start), fmt.Errorf("still running %s after SIGTERM", within)
	}
	took = clocks.Real.Since(start)
	p.release()
	if exitErr, ok := errors.AsType[*exec.ExitError](p.err); ok {
		return exitErr.ExitCode(), took, nil
	}
	return 0, took, p.err
}

// Kill ends the process with SIGKILL: no cleanup, no flush, like a crash or an OOM kill. It
// does nothing to a process not running.
func (p *Process) Kill() {
	if p.cmd == nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.exited
	p.release()
}

// Stop ends the process gently: SIGTERM, and SIGKILL if it has not exited within 10 s.
func (p *Process) Stop() {
	if p.Running() {
		if _, _, err := p.Terminate(10 * time.Second); err == nil {
			return
		}
	}
	p.Kill()
}

func (p *Process) release() {
	p.log.Close()
	p.cmd = nil
}

// Pid is the running process's id, or 0.
func (p *Process) Pid() int {
	if p.cmd == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// Log is everything the process (and the ones before it on the same directory) wrote.
func (p *Process) Log() string {
	b, _ := os.ReadFile(p.LogPath())
	return string(b)
}

// LogError is the most telling line of the log: its last error, else its last line.
func (p *Process) LogError() string {
	lines := strings.Split(strings.TrimSpace(p.Log()), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.Contains(lines[i], "Error") || strings.Contains(lines[i], "error") {
			return strings.TrimSpace(lines[i])
		}
	}
	return strings.TrimSpace(lines[len(lines)-1])
}

// ProcStatus reads one size field of /proc/<pid>/status, such as VmRSS, RssAnon or RssFile, in
// bytes (Linux only).
func (p *Process) ProcStatus(field string) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.Pid()))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, field+":"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("no %s line", field)
}

// Signal sends sig to the running process.
func (p *Process) Signal(sig os.Signal) error {
	if p.cmd == nil {
		return errors.New("the gateway is not running")
	}
	return p.cmd.Process.Signal(sig)
}
