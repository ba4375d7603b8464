package e2e

import (
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/mulligan-gw/mulligan/examples/modelserver"
)

// TestValidateBesideARunningGateway runs `mulligan validate` on the Caddyfile of a running
// gateway: validation provisions the module but must not open (and lock) its Badger directory.
func TestValidateBesideARunningGateway(t *testing.T) {
	t.Parallel()
	_, upstream := startModelServer(t, modelserver.Config{})
	p := newGatewayProcess(t, upstream, "durability sync")
	p.start()
	out, err := exec.Command(binary, "validate", "--config", filepath.Join(p.dataDir, "Caddyfile"), "--adapter", "caddyfile").CombinedOutput()
	if err != nil {
		t.Fatalf("validate beside a running gateway: %v\n%s", err, out)
	}
	if resp, _, err := p.post("after-validate", "still serving", 10*time.Second); err != nil || resp.StatusCode != 200 {
		t.Fatalf("the gateway stopped serving after a validate: %v %v", err, resp)
	}
}
