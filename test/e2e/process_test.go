package e2e

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mulligan-gw/mulligan/examples/modelserver"
	"github.com/mulligan-gw/mulligan/internal/testkit"
)

// binary is the sidecar built once for the whole test run: crash tests need a real process to
// SIGKILL.
var binary string

// TestMain builds the binary, then runs up to four parallel tests at once unless -test.parallel
// says otherwise: they mostly wait on processes, loopback calls and PostgreSQL's syncs, and the
// default (the number of cores, two on the project's machine) leaves the cores idle. The tests
// that must act within a time run one at a time, before them.
func TestMain(m *testing.M) {
	flag.Parse()
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if !set {
		_ = flag.Set("test.parallel", "4")
	}
	dir, err := os.MkdirTemp("", "mulligan-bin")
	if err != nil {
		panic(err)
	}
	if binary, err = testkit.BuildSidecar(context.Background(), dir); err != nil {
		fmt.Fprintln(os.Stderr, "building the sidecar:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	testkit.RemoveSDK()
	os.Exit(code)
}

// gatewayProcess is the built binary running a Caddyfile on a data directory that outlives it:
// testkit's process harness (shared with the benchmark), failing the test on what goes wrong.
type gatewayProcess struct {
	t       *testing.T
	dataDir string
	port    int
	base    string
	args    []string // the command line; default: run the Caddyfile in dataDir
	env     []string // the environment; default: testkit.DataEnv(dataDir)
	bin     string   // the binary; default: the one built for this test run
	proc    *testkit.Process
}

// newGatewayProcess prepares (but does not start) a gateway in front of upstream.
func newGatewayProcess(t *testing.T, upstream, mulliganBody string, globals ...string) *gatewayProcess {
	dataDir := t.TempDir()
	ports := testkit.FreePorts(t, 2)
	p := &gatewayProcess{t: t, dataDir: dataDir, port: ports[0]}
	p.base = fmt.Sprintf("http://127.0.0.1:%d", p.port)
	site := fmt.Sprintf("\tmulligan {\n\t\tstorage %s/badger\n\t\t%s\n\t}\n\treverse_proxy %s",
		dataDir, mulliganBody, strings.TrimPrefix(upstream, "http://"))
	cf := testkit.SiteConfig(ports[1], p.port, strings.Join(globals, "\n"), site)
	if err := os.WriteFile(filepath.Join(dataDir, "Caddyfile"), []byte(cf), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.cleanup)
	return p
}

// start runs the binary and waits until it answers.
func (p *gatewayProcess) start() {
	p.t.Helper()
	args := p.args
	if args == nil {
		args = []string{"run", "--config", filepath.Join(p.dataDir, "Caddyfile"), "--adapter", "caddyfile"}
	}
	env := p.env
	if env == nil {
		env = testkit.DataEnv(p.dataDir)
	}
	p.proc = &testkit.Process{Binary: cmp.Or(p.bin, binary), Args: args, Env: env, Dir: p.dataDir, Port: p.port}
	if err := p.proc.Start(context.Background(), 20*time.Second); err != nil {
		p.t.Fatalf("the gateway did not start: %v; its log:\n%s", err, p.logText())
	}
}

// terminate sends SIGTERM, as the kubelet does, and returns the exit code and how long the exit
// took; the process must be gone within `within`.
func (p *gatewayProcess) terminate(within time.Duration) (int, time.Duration) {
	p.t.Helper()
	code, took, err := p.proc.Terminate(within)
	if err != nil {
		p.t.Fatalf("%v; its log:\n%s", err, p.logText())
	}
	return code, took
}

// cleanup ends the process at the test's end and, when the test failed, logs the tail of the
// gateway's log: the data directory (and the log with it) is removed right after.
func (p *gatewayProcess) cleanup() {
	p.kill()
	if !p.t.Failed() {
		return
	}
	text := p.logText()
	const tail = 16 << 10
	if len(text) > tail {
		text = "…" + text[len(text)-tail:]
	}
	p.t.Logf("the log of the gateway on %s:\n%s", p.base, text)
}

// kill ends the process with SIGKILL: no cleanup, no flush, like a crash or an OOM kill.
func (p *gatewayProcess) kill() {
	if p.proc != nil {
		p.proc.Kill()
	}
}

// signal sends sig to the running process.
func (p *gatewayProcess) signal(sig os.Signal) {
	p.t.Helper()
	if err := p.proc.Signal(sig); err != nil {
		p.t.Fatal(err)
	}
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
