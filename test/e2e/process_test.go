package e2e

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mulligan-gw/mulligan/examples/modelserver"
	"github.com/mulligan-gw/mulligan/internal/testkit"
)

// binary is the sidecar built once for the whole test run: crash tests need a real process to
// SIGKILL.
var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "mulligan-bin")
	if err != nil {
		panic(err)
	}
	binary = filepath.Join(dir, "mulligan")
	build := exec.Command("go", "build", "-o", binary, "../../sidecar")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building the sidecar:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// gatewayProcess is the built binary running a Caddyfile on a data directory that outlives it.
type gatewayProcess struct {
	t       *testing.T
	dataDir string
	port    int
	base    string
	cmd     *exec.Cmd
	log     *os.File
	args    []string // the command line; default: run the Caddyfile in dataDir
	env     []string // the environment; default: this process's, with XDG dirs in dataDir
	bin     string   // the binary; default: the one built for this test run
}

// newGatewayProcess prepares (but does not start) a gateway in front of upstream.
func newGatewayProcess(t *testing.T, upstream, mulliganBody string, globals ...string) *gatewayProcess {
	dataDir := t.TempDir()
	ports := testkit.FreePorts(t, 2)
	p := &gatewayProcess{t: t, dataDir: dataDir, port: ports[0]}
	p.base = fmt.Sprintf("http://127.0.0.1:%d", p.port)
	cf := fmt.Sprintf(`{
	admin 127.0.0.1:%d
	persist_config off
	auto_https off
	%s
}
http://127.0.0.1:%d {
	mulligan {
		storage %s/badger
		%s
	}
	reverse_proxy %s
}
`, ports[1], strings.Join(globals, "\n"), p.port, dataDir, mulliganBody, strings.TrimPrefix(upstream, "http://"))
	if err := os.WriteFile(filepath.Join(dataDir, "Caddyfile"), []byte(cf), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.kill)
	return p
}

// start runs the binary and waits until it answers.
func (p *gatewayProcess) start() {
	p.t.Helper()
	var err error
	p.log, err = os.OpenFile(filepath.Join(p.dataDir, "gateway.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		p.t.Fatal(err)
	}
	args := p.args
	if args == nil {
		args = []string{"run", "--config", filepath.Join(p.dataDir, "Caddyfile"), "--adapter", "caddyfile"}
	}
	p.cmd = exec.Command(cmp.Or(p.bin, binary), args...)
	p.cmd.Env = p.env
	if p.env == nil {
		p.cmd.Env = append(os.Environ(), "XDG_DATA_HOME="+p.dataDir+"/xdg-data", "XDG_CONFIG_HOME="+p.dataDir+"/xdg-config")
	}
	p.cmd.Stdout, p.cmd.Stderr = p.log, p.log
	if err := p.cmd.Start(); err != nil {
		p.t.Fatal(err)
	}
	listening := false
	defer func() { // also when WaitFor fails the test: its log says why the gateway did not start
		if !listening {
			p.t.Logf("the gateway's log:\n%s", p.logText())
		}
	}()
	testkit.WaitFor(p.t, 20*time.Second, "the gateway listening", func() bool {
		c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", p.port))
		if err == nil {
			c.Close()
		}
		listening = err == nil
		return listening
	})
}

// terminate sends SIGTERM, as the kubelet does, and returns the exit code and how long the exit
// took; the process must be gone within `within`.
func (p *gatewayProcess) terminate(within time.Duration) (int, time.Duration) {
	p.t.Helper()
	start, cmd := time.Now(), p.cmd
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		p.t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	var err error
	select {
	case err = <-exited:
	case <-time.After(within):
		_ = cmd.Process.Signal(syscall.SIGKILL)
		<-exited
		p.cmd = nil
		p.log.Close()
		p.t.Fatalf("still running %s after SIGTERM; its log:\n%s", within, p.logText())
	}
	took := time.Since(start)
	p.cmd = nil
	p.log.Close()
	if exitErr, ok := errors.AsType[*exec.ExitError](err); ok {
		return exitErr.ExitCode(), took
	}
	if err != nil {
		p.t.Fatal(err)
	}
	return 0, took
}

// kill ends the process with SIGKILL: no cleanup, no flush, like a crash or an OOM kill.
func (p *gatewayProcess) kill() {
	if p.cmd == nil || p.cmd.Process == nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	_ = p.cmd.Wait()
	p.cmd = nil
	p.log.Close()
}

func (p *gatewayProcess) logText() string {
	b, _ := os.ReadFile(filepath.Join(p.dataDir, "gateway.log"))
	return string(b)
}

// post sends a keyed chat completion and reads the whole answer.
func (p *gatewayProcess) post(key, content string, timeout time.Duration) (*http.Response, []byte, error) {
	return p.sendWithin(timeout, "POST", "/v1/chat/completions", key, fmt.Sprintf(`{"messages":[{"role":"user","content":%q}]}`, content))
}

// send makes one request (with an Idempotency-Key when key is set, and extra header pairs)
// and reads the whole answer.
func (p *gatewayProcess) send(method, path, key, body string, headers ...string) (*http.Response, []byte, error) {
	return p.sendWithin(10*time.Second, method, path, key, body, headers...)
}

func (p *gatewayProcess) sendWithin(timeout time.Duration, method, path, key, body string, headers ...string) (*http.Response, []byte, error) {
	req, err := http.NewRequest(method, p.base+path, strings.NewReader(body))
	if err != nil {
		return nil, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := (&http.Client{Timeout: timeout}).Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp, b, err
}

func startModelServer(t *testing.T, cfg modelserver.Config) (*modelserver.Server, string) {
	m := modelserver.New(cfg)
	s := httptest.NewServer(m)
	t.Cleanup(s.Close)
	return m, s.URL
}
