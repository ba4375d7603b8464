package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/mulligan-gw/mulligan/internal/testkit"
)

// startTimeout bounds how long a gateway may take to open its port.
const startTimeout = 30 * time.Second

// errGatewayExited means the gateway process ended before it listened: usually a config it
// rejected (its log says why).
var errGatewayExited = testkit.ErrExited

// buildSidecar builds the sidecar binary (stock Caddy plus the module) into dir/bin.
func buildSidecar(ctx context.Context, dir string) (string, error) {
	return testkit.BuildSidecar(ctx, filepath.Join(dir, "bin"))
}

// gateway is one running Caddy process of the benchmark, with its own data directory and
// admin port; or, with replicas, several processes on one database that the load is spread
// over (pick), its base and admin being the first replica's.
type gateway struct {
	*testkit.Process
	replicas []*gateway
	name     string
	base     string // http://127.0.0.1:port
	admin    string // http://127.0.0.1:admin port
}

// siteConfig is the Caddyfile of a gateway listening on port: global options keeping it on
// loopback, quiet and stateless, then one site with the given body.
func siteConfig(adminPort, port int, body string) string {
	return testkit.SiteConfig(adminPort, port, "log {\n\t\tlevel ERROR\n\t}", body)
}

// plainSite is plain Caddy: a bare reverse proxy.
func plainSite(upstream string) string {
	return "\treverse_proxy " + upstream
}

// mulliganSite is the same proxy with Mulligan in front; extra goes inside the mulligan block.
func mulliganSite(upstream, storage, extra string) string {
	return fmt.Sprintf("\tmulligan {\n\t\tstorage %s\n\t\tdurability sync\n%s\t}\n\treverse_proxy %s", storage, extra, upstream)
}

// startGateway writes the Caddyfile of site into dir, runs the binary on it (env added to its
// environment) and waits until it listens.
func startGateway(ctx context.Context, binary, dir, name string, site func(port int) string, env ...string) (*gateway, error) {
	ports, err := testkit.PickPorts(2)
	if err != nil {
		return nil, err
	}
	conf := filepath.Join(dir, "Caddyfile")
	if err := os.WriteFile(conf, []byte(siteConfig(ports[1], ports[0], site(ports[0]))), 0o644); err != nil {
		return nil, err
	}
	cmd := exec.Command(binary, "run", "--config", conf, "--adapter", "caddyfile")
	cmd.Env = append(testkit.DataEnv(dir), env...)
	g, err := startProcess(ctx, dir, name, ports[0], cmd)
	if g != nil {
		g.admin = fmt.Sprintf("http://127.0.0.1:%d", ports[1])
	}
	return g, err
}

// startProcess runs cmd's program with its arguments and environment, its output going to
// dir/gateway.log, and waits until it listens on port.
func startProcess(ctx context.Context, dir, name string, port int, cmd *exec.Cmd) (*gateway, error) {
	p := &testkit.Process{Binary: cmd.Path, Args: cmd.Args[1:], Env: cmd.Env, Dir: dir, Port: port}
	if err := p.Start(ctx, startTimeout); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return &gateway{Process: p, name: name, base: fmt.Sprintf("http://127.0.0.1:%d", port)}, nil
}

// stop ends the gateway (and its replicas) gently: SIGTERM, then SIGKILL after 10 s.
func (g *gateway) stop() {
	if g == nil {
		return
	}
	for _, r := range g.replicas {
		r.stop()
	}
	if g.Process != nil {
		g.Stop()
	}
}

// rssBytes is the process's resident set size, from /proc/<pid>/status (Linux only).
func (g *gateway) rssBytes() (int64, error) { return g.procStatus("VmRSS") }

// procStatus reads one size field of /proc/<pid>/status; of a set of replicas, their sum.
func (g *gateway) procStatus(field string) (int64, error) {
	if g.Process == nil && len(g.replicas) > 0 {
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
	return g.ProcStatus(field)
}
