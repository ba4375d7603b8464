package module

import (
	"strings"
	"testing"

	"github.com/mulligan-gw/mulligan/examples/modelserver"
)

// A process that has made no delivery attempt answers an empty list, not null: the attempts
// are per process (docs/operating.md), so every replica but one may have none.
func TestAdminAttemptsAreAnEmptyListBeforeAnyDelivery(t *testing.T) {
	g := startGateway(t, modelserver.Config{}, "")
	if got := strings.TrimSpace(g.adminCall("GET", "/mulligan/attempts")); got != `{"attempts":[]}` {
		t.Fatalf("GET /mulligan/attempts with no attempt made: %s, want {\"attempts\":[]}", got)
	}
}
