package e2e

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/mulligan-gw/mulligan/examples/modelserver"
	"github.com/mulligan-gw/mulligan/internal/testkit"
	"github.com/mulligan-gw/mulligan/webhook"
)

// Two valid Standard Webhooks secrets: the current one and the one being rotated out.
var secretNew, secretOld = testkit.SecretNew, testkit.SecretOld

// sidecarProcess is the built binary run as `mulligan sidecar`, configured by environment
// variables alone, on a data directory that outlives it. It reuses gatewayProcess's requests,
// kill and log; only the command line and the environment differ.
type sidecarProcess struct {
	*gatewayProcess
	admin string
}

// newSidecarProcess prepares (but does not start) `mulligan sidecar` with the given NAME=value
// variables on top of loopback ports and a temporary data directory. Call it once the test's
// other listeners are up (see testkit.FreePorts).
func newSidecarProcess(t *testing.T, env ...string) *sidecarProcess {
	ports := testkit.FreePorts(t, 2)
	p := &gatewayProcess{t: t, dataDir: t.TempDir(), port: ports[0], args: []string{"sidecar"}}
	p.base = fmt.Sprintf("http://127.0.0.1:%d", p.port)
	s := &sidecarProcess{gatewayProcess: p, admin: fmt.Sprintf("http://127.0.0.1:%d", ports[1])}
	s.env = append(testkit.DataEnv(p.dataDir),
		fmt.Sprintf("MULLIGAN_LISTEN=127.0.0.1:%d", p.port),
		fmt.Sprintf("MULLIGAN_ADMIN=127.0.0.1:%d", ports[1]),
		"MULLIGAN_DATA_DIR="+filepath.Join(p.dataDir, "badger"),
	)
	s.env = append(s.env, env...)
	t.Cleanup(p.cleanup)
	return s
}

// operation reads an operation's status as the operations API reports it.
func (s *sidecarProcess) operation(location string) (status string, done bool) {
	_, body, err := s.send("GET", location, "", "")
	var op struct {
		Status string `json:"status"`
		Done   bool   `json:"done"`
	}
	if err != nil || json.Unmarshal(body, &op) != nil {
		return "", false
	}
	return op.Status, op.Done
}

// TestSidecarRunsTheWalkthroughFromEnvironmentAlone runs the README walkthrough against
// `mulligan sidecar` configured only by MULLIGAN_* variables (no Caddyfile), stops it with
// SIGTERM as Kubernetes does, and restarts it on the same data directory.
func TestSidecarRunsTheWalkthroughFromEnvironmentAlone(t *testing.T) {
	t.Parallel()
	model, upstream := startModelServer(t, modelserver.Config{Latency: 200 * time.Millisecond})
	const key = "hex:00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"
	keyFile := filepath.Join(t.TempDir(), "encryption-key")
	if err := os.WriteFile(keyFile, []byte(key+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s := newSidecarProcess(t, "MULLIGAN_UPSTREAM="+upstream, "MULLIGAN_GRACE_PERIOD=5s", "MULLIGAN_ENCRYPTION_KEY_FILE="+keyFile)
	s.start()

	// 1. A first keyed request runs upstream once.
	resp, first, err := s.post("order-42", "hi", 10*time.Second)
	if err != nil || resp.StatusCode != 200 || resp.Header.Get("Idempotency-Expires") == "" {
		t.Fatalf("first request: %v %v %s", err, resp, first)
	}
	// 2. The retry, key order and spacing changed, is replayed byte for byte.
	resp, body, err := s.send("POST", "/v1/chat/completions", "order-42", `{ "messages": [ {"content":"hi", "role":"user"} ] }`)
	if err != nil || resp.StatusCode != 200 || resp.Header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(body, first) {
		t.Fatalf("retry: %v %v %s", err, resp, body)
	}
	// 3. Same key, different payload.
	resp, body, err = s.post("order-42", "bye", 10*time.Second)
	if err != nil || resp.StatusCode != 409 || !bytes.Contains(body, []byte("IDEMPOTENCY_KEY_REUSED_WITH_DIFFERENT_PAYLOAD")) {
		t.Fatalf("different payload: %v %v %s", err, resp, body)
	}
	// 6. Asynchronous: 202 and an operation to poll, then its result.
	resp, body, err = s.send("POST", "/v1/chat/completions", "job-1", `{"messages":[{"role":"user","content":"a long essay"}]}`, "Prefer", "respond-async")
	location := ""
	if resp != nil {
		location = resp.Header.Get("Location")
	}
	if err != nil || resp.StatusCode != 202 || !strings.HasPrefix(location, "/v1/operations/op_") {
		t.Fatalf("async submit: %v %v %s", err, resp, body)
	}
	testkit.WaitFor(t, 15*time.Second, "the operation finished", func() bool { _, done := s.operation(location); return done })
	if status, _ := s.operation(location); status != "succeeded" {
		t.Fatalf("the operation ended %q", status)
	}
	resp, body, err = s.send("GET", location+"/result", "", "")
	if err != nil || resp.StatusCode != 200 || !bytes.Contains(body, []byte(`"choices"`)) {
		t.Fatalf("result: %v %v %s", err, resp, body)
	}

	// The admin API serves the config, which names the key file but holds no key.
	res, err := http.Get(s.admin + "/config/")
	if err != nil {
		t.Fatal(err)
	}
	config, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if !bytes.Contains(config, []byte("{file."+keyFile+"}")) || bytes.Contains(config, []byte(key)) {
		t.Fatalf("the served config: %s", config)
	}

	// SIGTERM, as the kubelet sends it: a graceful stop well within the grace period.
	if code, _ := s.terminate(20 * time.Second); code != 0 {
		t.Fatalf("exit code %d after SIGTERM; log:\n%s", code, s.logText())
	}
	if !strings.Contains(s.logText(), `"signal":"SIGTERM"`) {
		t.Fatalf("the log does not show the SIGTERM shutdown:\n%s", s.logText())
	}

	// Restarted on the same volume (and key), it still replays the key and serves the operation.
	s.start()
	resp, body, err = s.post("order-42", "hi", 10*time.Second)
	if err != nil || resp.StatusCode != 200 || resp.Header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(body, first) {
		t.Fatalf("after the restart: %v %v %s", err, resp, body)
	}
	if status, _ := s.operation(location); status != "succeeded" {
		t.Fatalf("after the restart the operation reads %q", status)
	}
	if n := model.Stats().ByKey["order-42"]; n != 1 {
		t.Fatalf("the model ran order-42 %d times", n)
	}
}

// TestSidecarSignsWebhooksWithTheMountedSecrets delivers operations' final events to
// MULLIGAN_WEBHOOK_URL, signed with every secret of MULLIGAN_WEBHOOK_SECRET_FILE (a consumer
// that still knows only the older secret verifies them), and after the file is rotated and the
// sidecar gets SIGUSR1, with the new secret.
func TestSidecarSignsWebhooksWithTheMountedSecrets(t *testing.T) {
	t.Parallel()
	secretNext := "whsec_" + base64.StdEncoding.EncodeToString([]byte("next-signing-key-of-32-bytes-lon"))
	var (
		mu       sync.Mutex
		accepted []webhook.Secret // what the consumer verifies with
		events   []string         // "<event_type> <operation_id>" of each verified delivery
	)
	consumerKnows := func(secret string) {
		s, err := webhook.ParseSecret(secret)
		if err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		accepted = []webhook.Secret{s}
		mu.Unlock()
	}
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		defer mu.Unlock()
		if webhook.Verify(accepted, r.Header, body, time.Now()) != nil {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		var ev struct {
			Type      string `json:"event_type"`
			Operation struct {
				ID string `json:"operation_id"`
			} `json:"operation"`
		}
		_ = json.Unmarshal(body, &ev)
		events = append(events, ev.Type+" "+ev.Operation.ID)
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(receiver.Close)
	_, upstream := startModelServer(t, modelserver.Config{Latency: 50 * time.Millisecond})
	secrets := filepath.Join(t.TempDir(), "webhook-secrets")
	if err := os.WriteFile(secrets, []byte(secretNew+"\n"+secretOld+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s := newSidecarProcess(t, "MULLIGAN_UPSTREAM="+upstream, "MULLIGAN_WEBHOOK_URL="+receiver.URL+"/hooks",
		"MULLIGAN_WEBHOOK_SECRET_FILE="+secrets, "MULLIGAN_WEBHOOK_ALLOW_PRIVATE=true")
	s.start()

	delivered := func(secret string) {
		t.Helper()
		consumerKnows(secret)
		// A reload (the rotation below) closes the old server's connections: a request caught by
		// that is retried under its key, as any client would, and runs once.
		var resp *http.Response
		var body []byte
		var err error
		for try := 0; try < 20; try++ {
			resp, body, err = s.send("POST", "/v1/chat/completions", "notify-"+secret, `{"messages":[{"role":"user","content":"notify me"}]}`, "Prefer", "respond-async")
			if err == nil {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		var op struct {
			ID string `json:"operation_id"`
		}
		if err != nil || resp.StatusCode != 202 || json.Unmarshal(body, &op) != nil {
			t.Fatalf("async submit: %v %v %s", err, resp, body)
		}
		want := "operation.succeeded " + op.ID
		testkit.WaitFor(t, 15*time.Second, want+" verified with one secret", func() bool {
			mu.Lock()
			defer mu.Unlock()
			return slices.Contains(events, want)
		})
	}
	delivered(secretOld)

	// Rotation: the mounted file changes, SIGUSR1 reloads it.
	if err := os.WriteFile(secrets, []byte(secretNext+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s.signal(syscall.SIGUSR1)
	testkit.WaitFor(t, 15*time.Second, "the reload", func() bool { return strings.Contains(s.logText(), "successfully reloaded config") })
	delivered(secretNext)
}

// TestSidecarRefusesABadEnvironmentBeforeStarting checks that the binary exits 1 at once,
// naming every bad variable and showing no secret.
func TestSidecarRefusesABadEnvironmentBeforeStarting(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, "sidecar")
	cmd.Env = append(testkit.CleanEnv(), "HOME="+t.TempDir(), "MULLIGAN_ASYNC_QUEUE=lots", "MULLIGAN_WEBHOOK_SECRET="+secretNew)
	out, err := cmd.CombinedOutput()
	exitErr, ok := errors.AsType[*exec.ExitError](err)
	if !ok || exitErr.ExitCode() != 1 {
		t.Fatalf("want exit code 1, got %v:\n%s", err, out)
	}
	for _, name := range []string{"MULLIGAN_UPSTREAM", "MULLIGAN_ASYNC_QUEUE", "MULLIGAN_WEBHOOK_SECRET"} {
		if !bytes.Contains(out, []byte(name)) {
			t.Errorf("%s is not named in:\n%s", name, out)
		}
	}
	if bytes.Contains(out, []byte(secretNew)) {
		t.Fatalf("the output shows the secret:\n%s", out)
	}
}

// TestSidecarPrintShowsTheConfigWithoutSecrets checks `mulligan sidecar --print`.
func TestSidecarPrintShowsTheConfigWithoutSecrets(t *testing.T) {
	t.Parallel()
	secrets := filepath.Join(t.TempDir(), "webhook-secrets")
	if err := os.WriteFile(secrets, []byte(secretNew), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, "sidecar", "--print")
	cmd.Env = append(testkit.CleanEnv(), "MULLIGAN_UPSTREAM=http://model:8000", "MULLIGAN_ENCRYPTION_KEY=0123456789abcdef",
		"MULLIGAN_WEBHOOK_URL=https://consumer.example.com/hook", "MULLIGAN_WEBHOOK_SECRET_FILE="+secrets)
	out, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	// The generated Caddyfile itself is checked in sidecar/env_test.go; here, that the binary
	// prints one for this environment and no secret in it.
	if !bytes.Contains(out, []byte("http://model:8000")) || !bytes.Contains(out, []byte("https://consumer.example.com/hook")) ||
		bytes.Contains(out, []byte(secretNew)) || bytes.Contains(out, []byte("0123456789abcdef")) {
		t.Fatalf("--print printed:\n%s", out)
	}
}

// TestSidecarRefusesAnAddressAnotherProcessServes checks that a second gateway started on a
// listen or admin address already in use exits at once naming it, instead of sharing the port.
func TestSidecarRefusesAnAddressAnotherProcessServes(t *testing.T) {
	t.Parallel()
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	ports := testkit.FreePorts(t, 2)
	free := func(i int) string { return fmt.Sprintf("127.0.0.1:%d", ports[i]) }
	for _, tc := range []struct{ name, listen, admin, want string }{
		{"listen", busy.Addr().String(), free(0), "MULLIGAN_LISTEN: " + busy.Addr().String() + " already answers"},
		{"admin", free(1), busy.Addr().String(), "MULLIGAN_ADMIN: " + busy.Addr().String() + " already answers"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, binary, "sidecar")
			cmd.Env = append(testkit.CleanEnv(), "HOME="+t.TempDir(), "MULLIGAN_UPSTREAM=127.0.0.1:1",
				"MULLIGAN_DATA_DIR="+t.TempDir(), "MULLIGAN_LISTEN="+tc.listen, "MULLIGAN_ADMIN="+tc.admin)
			out, err := cmd.CombinedOutput()
			exitErr, ok := errors.AsType[*exec.ExitError](err)
			if !ok || exitErr.ExitCode() != 1 {
				t.Fatalf("want exit code 1, got %v:\n%s", err, out)
			}
			if !bytes.Contains(out, []byte(tc.want)) {
				t.Fatalf("the refusal does not say %q:\n%s", tc.want, out)
			}
		})
	}
}
