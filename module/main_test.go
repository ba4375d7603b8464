package module

import (
	"flag"
	"os"
	"testing"

	"github.com/mulligan-gw/mulligan/internal/testkit"
)

// quietGlobals are the global options of a test's Caddy that only quiet its log.
const quietGlobals = "log {\n level ERROR\n }"

// TestMain runs up to five parallel tests at once unless -test.parallel says otherwise: the
// module's parallel tests mostly wait on loopback calls, timers and Badger's syncs, so the
// default of GOMAXPROCS (two on the project's machine) would leave the cores idle; eight at once
// starved timed waits under -race in CI.
func TestMain(m *testing.M) {
	flag.Parse()
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if !set {
		_ = flag.Set("test.parallel", "5")
	}
	code := m.Run()
	testkit.RemoveSDK()
	os.Exit(code)
}
