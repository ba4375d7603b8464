package main

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
)

// startTimeout bounds how long a gateway may take to open its port.
const startTimeout = 30 * time.Second

// errGatewayExited means the gateway process ended before it listened: usually a config it
// rejected (its log says why).
var errGatewayExited = errors.New("the gateway exited before it listened")

// buildSidecar builds the sidecar binary (stock Caddy plus the module) into dir.
func buildSidecar(ctx context.Context, dir string) (string, error) {
	bin := filepath.Join(dir, "bin", "mulligan")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "./sidecar")
	cmd.Dir = moduleRoot()
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./sidecar: %v\n%s", err, out)
	}
	return bin, nil
}

// moduleRoot is the repository root: the nearest parent of the working directory holding
// go.mod (`go run ./bench` runs from the root, `go test` from bench/).
func moduleRoot() string {
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

// gateway is one running Caddy process of the benchmark, with its own data directory and
// admin port; or, with replicas, several processes on one database that the load is spread
// over (pick), its base and admin being the first replica's.
type gateway struct {
	replicas []*gateway
	name     string
	dir      string
	port     int
	base     string // http://127.0.0.1:port
	admin    string // http://127.0.0.1:admin port
	cmd      *exec.Cmd
	exited   chan struct{}
	log      *os.File
}

// siteConfig is the Caddyfile of a gateway listening on port: global options keeping it on
// loopback, quiet and stateless, then one site with the given body.
func siteConfig(adminPort, port int, body string) string {
	return fmt.Sprintf(`{
	admin 127.0.0.1:%d
	persist_config off
	auto_https off
	log {
		level ERROR
	}
}

http://127.0.0.1:%d {
%s
}
`, adminPort, port, body)
}

// plainSite is plain Caddy: a bare reverse proxy.
func plainSite(upstream string) string {
	return "\treverse_proxy " + upstream
}

// mulliganSite is the same proxy with Mulligan in front; extra goes inside the mulligan block.
func mulliganSite(upstream, storage, extra string) string {
	return fmt.Sprintf("\tmulligan {\n\t\tstorage %s\n\t\tdurability sync\n%s\t}\n\treverse_proxy %s", storage, extra, upstream)
}

// startGateway writes the Caddyfile of site into dir, runs the binary on it and waits until
// it listens.
func startGateway(ctx context.Context, binary, dir, name string, site func(port int) string) (*gateway, error) {
	ports, err := freePorts(2)
	if err != nil {
		return nil, err
	}
	conf := filepath.Join(dir, "Caddyfile")
	if err := os.WriteFile(conf, []byte(siteConfig(ports[1], ports[0], site(ports[0]))), 0o644); err != nil {
		return nil, err
	}
	cmd := exec.Command(binary, "run", "--config", conf, "--adapter", "caddyfile")
	cmd.Env = append(os.Environ(), "XDG_DATA_HOME="+filepath.Join(dir, "xdg-data"), "XDG_CONFIG_HOME="+filepath.Join(dir, "xdg-config"))
	g, err := startProcess(ctx, dir, name, ports[0], cmd)
	if g != nil {
		g.admin = fmt.Sprintf("http://127.0.0.1:%d", ports[1])
	}
	return g, err
}

// startProcess runs cmd, its output going to dir/gateway.log, and waits until it listens on
// port.
func startProcess(ctx context.Context, dir, name string, port int, cmd *exec.Cmd) (*gateway, error) {
	g := &gateway{name: name, dir: dir, port: port, base: fmt.Sprintf("http://127.0.0.1:%d", port), cmd: cmd, exited: make(chan struct{})}
	var err error
	if g.log, err = os.Create(filepath.Join(dir, "gateway.log")); err != nil {
		return nil, err
	}
	g.cmd.Stdout, g.cmd.Stderr = g.log, g.log
	g.cmd.SysProcAttr = childAttr()
	if err := g.cmd.Start(); err != nil {
		g.log.Close()
		return nil, err
	}
	go func() { _ = g.cmd.Wait(); close(g.exited) }()
	if err := g.waitListening(ctx); err != nil {
		g.stop()
		return nil, err
	}
	return g, nil
}

// waitListening polls the port until it accepts, the process exits or startTimeout passes.
func (g *gateway) waitListening(ctx context.Context) error {
	deadline := time.Now().Add(startTimeout)
	for time.Now().Before(deadline) {
		if c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", g.port), time.Second); err == nil {
			c.Close()
			return nil
		}
		select {
		case <-g.exited:
			return fmt.Errorf("%s: %w: %s", g.name, errGatewayExited, g.logError())
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	return fmt.Errorf("%s did not listen within %s: %s", g.name, startTimeout, g.logError())
}

// logError is the most telling line of the gateway's log: its last error, else its last line.
func (g *gateway) logError() string {
	b, _ := os.ReadFile(filepath.Join(g.dir, "gateway.log"))
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.Contains(lines[i], "Error") || strings.Contains(lines[i], "error") {
			return strings.TrimSpace(lines[i])
		}
	}
	return strings.TrimSpace(lines[len(lines)-1])
}

// stop asks the process to end (SIGTERM), and kills it if it has not within 10 s.
func (g *gateway) stop() {
	if g != nil {
		for _, r := range g.replicas {
			r.stop()
		}
	}
	if g == nil || g.cmd == nil || g.cmd.Process == nil {
		return
	}
	_ = g.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-g.exited:
	case <-time.After(10 * time.Second):
		_ = g.cmd.Process.Kill()
		<-g.exited
	}
	g.log.Close()
	g.cmd = nil
}

// rssBytes is the process's resident set size, from /proc/<pid>/status (Linux only).
func (g *gateway) rssBytes() (int64, error) { return g.procStatus("VmRSS") }

// procStatus reads one size field of /proc/<pid>/status, such as VmRSS, RssAnon or RssFile;
// of a set of replicas, their sum.
func (g *gateway) procStatus(field string) (int64, error) {
	if g.cmd == nil && len(g.replicas) > 0 {
		var sum int64
		for _, r := range g.replicas {
			n, err := r.procStatus(field)
			if err != nil {
				return 0, err
			}
			sum += n
		}
		return sum, nil
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", g.cmd.Process.Pid))
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

// freePorts returns n distinct loopback ports free at the time of the call.
func freePorts(n int) ([]int, error) {
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}
