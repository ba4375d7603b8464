package testkit

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// OpenAISDK is the npm package the SDK tests install: the official client, from the registry.
const OpenAISDK = "openai@7"

// RequireNode returns the paths of node and npm. Without them the test is skipped, except
// under CI, where a missing toolchain must not pass for a green test.
func RequireNode(t testing.TB) (node, npm string) {
	t.Helper()
	node, nodeErr := exec.LookPath("node")
	npm, npmErr := exec.LookPath("npm")
	if nodeErr == nil && npmErr == nil {
		return node, npm
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("node and npm are required under CI to run the openai SDK tests: %v %v", nodeErr, npmErr)
	}
	t.Skip("skipping an openai npm SDK test: node or npm is not installed (it runs whenever they are, and always under CI=true)")
	return "", ""
}

// sdk is the openai SDK installed for the test process, by the first test that needs it; an
// install that failed is tried again by the next.
var sdk struct {
	mu  sync.Mutex
	dir string
}

// InstallSDKScript installs the openai SDK from npm once per test process (RemoveSDK removes
// it) and copies the script at src beside its node_modules, under a name of t's own; it returns
// node's path and the script's.
func InstallSDKScript(t testing.TB, ctx context.Context, src string) (node, script string) {
	t.Helper()
	node, npm := RequireNode(t)
	dir, err := installSDK(ctx, npm)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	name := strings.Map(func(r rune) rune {
		if r == '/' || r == ' ' {
			return '_'
		}
		return r
	}, t.Name())
	script = filepath.Join(dir, name+"-"+filepath.Base(src))
	if err := os.WriteFile(script, b, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(script) })
	return node, script
}

// installSDK installs the SDK into a directory of the process's unless it is there already,
// and returns the directory.
func installSDK(ctx context.Context, npm string) (string, error) {
	sdk.mu.Lock()
	defer sdk.mu.Unlock()
	if sdk.dir != "" {
		return sdk.dir, nil
	}
	dir, err := os.MkdirTemp("", "mulligan-openai-sdk-")
	if err != nil {
		return "", err
	}
	install := exec.CommandContext(ctx, npm, "install", "--no-audit", "--no-fund", "--silent", "--prefix", dir, OpenAISDK)
	if out, err := install.CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		return "", fmt.Errorf("npm install %s: %v\n%s", OpenAISDK, err, out)
	}
	sdk.dir = dir
	return dir, nil
}

// RemoveSDK removes the SDK InstallSDKScript installed, if it did: a package whose tests use it
// calls this from TestMain once they are done.
func RemoveSDK() {
	sdk.mu.Lock()
	defer sdk.mu.Unlock()
	if sdk.dir != "" {
		os.RemoveAll(sdk.dir)
	}
}

// RunSDKScript runs node script with args and returns what it printed; the test fails with its
// output and errors when it fails.
func RunSDKScript(t testing.TB, ctx context.Context, node, script string, args ...string) []byte {
	t.Helper()
	out, err := exec.CommandContext(ctx, node, append([]string{script}, args...)...).Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("the SDK script failed: %v\n%s\n%s", err, out, stderr)
	}
	return out
}
