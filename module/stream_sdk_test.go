package module

import (
	"context"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mulligan-gw/mulligan/examples/modelserver"
	"github.com/mulligan-gw/mulligan/internal/testkit"
)

func TestOpenAINodeSDKGetsTheWholeAnswerAfterADroppedStream(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	node, scriptPath := installSDKScript(t, ctx, "openai_stream.cjs")

	g := startHandler(t, modelserver.Config{ChunkDelay: 40 * time.Millisecond}, "")
	prompt := "one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen"
	run := exec.CommandContext(ctx, node, scriptPath, g.base+"/v1", "sdk-stream-key", prompt)
	out, err := run.Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("the SDK script failed: %v\n%s\n%s", err, out, stderr)
	}
	var got struct {
		FirstChunks int    `json:"firstChunks"`
		Chunks      int    `json:"chunks"`
		Content     string `json:"content"`
		Replayed    string `json:"replayed"`
	}
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("the script printed %q: %v", out, err)
	}
	want := "You said: " + prompt
	if got.FirstChunks != 4 || got.Content != want || got.Chunks != len(strings.Fields(want)) {
		t.Fatalf("the SDK's retry got %d chunks %q (first attempt %d chunks), want %d chunks %q", got.Chunks, got.Content, got.FirstChunks, len(strings.Fields(want)), want)
	}
	t.Logf("the SDK's retry got %d chunks after dropping the first attempt at %d", got.Chunks, got.FirstChunks)
	if got.Replayed != "true" {
		t.Fatalf("the retry was not answered from the first execution: Idempotent-Replayed %q", got.Replayed)
	}
	if n := g.model.Stats().Received; n != 1 {
		t.Fatalf("the upstream ran %d times, want 1", n)
	}
}

// installSDKScript installs the openai SDK from npm (once per test process) and copies the
// test script testdata/<script> beside its node_modules; it returns node's path and the script's.
func installSDKScript(t *testing.T, ctx context.Context, script string) (node, scriptPath string) {
	t.Helper()
	return testkit.InstallSDKScript(t, ctx, filepath.Join("testdata", script))
}
