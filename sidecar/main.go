// Command mulligan is Caddy with its standard modules and the Mulligan module: the ready
// gateway binary, for a sidecar container or a plain host. It takes Caddy's usual commands
// (`mulligan run --config Caddyfile`, `mulligan adapt`, `mulligan validate`, ...) and one of
// its own, `mulligan sidecar`, which builds the configuration from MULLIGAN_* environment
// variables alone (see sidecarVars), for a Kubernetes sidecar without a Caddyfile.
package main

import (
	"fmt"
	"os"
	"runtime"
	"strconv"

	"github.com/caddyserver/caddy/v2"
	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/spf13/cobra"
	"go.uber.org/zap"

	_ "github.com/caddyserver/caddy/v2/modules/standard"

	_ "github.com/mulligan-gw/mulligan/module"
)

func init() {
	caddycmd.RegisterCommand(caddycmd.Command{
		Name:  "sidecar",
		Usage: "[--print]",
		Short: "Runs the gateway configured from MULLIGAN_* environment variables",
		Long: `
Builds a Caddyfile from the MULLIGAN_* environment variables below, adapts it and
runs it in the foreground like 'run' does, until SIGTERM or SIGINT, which stop it
gracefully (in-flight requests get MULLIGAN_GRACE_PERIOD). No Caddyfile is needed:
this is the command of the Kubernetes sidecar container.

Variables (an empty value counts as unset; "-" means none):

` + sidecarHelp() + `
Every value is checked before anything starts, and each mistake is reported with
the variable's name. Secrets never enter the configuration: it names them by
placeholder ({env.MULLIGAN_WEBHOOK_SECRET}, {file.<path>}) and the module reads
them when it starts, so neither --print nor the admin API's GET /config/ shows
one.

SIGUSR1 rebuilds the configuration and reloads it, re-reading the secret files:
a rotated Kubernetes Secret takes effect without a restart.

With --print, prints the generated Caddyfile and exits.
`,
		CobraFunc: func(cmd *cobra.Command) {
			cmd.Flags().Bool("print", false, "Print the generated Caddyfile (it holds no secret) and exit")
			cmd.RunE = caddycmd.WrapCommandFuncForCobra(cmdSidecar)
		},
	})
}

func main() {
	profileRates()
	caddycmd.Main()
}

// profileRates turns on the runtime's block and mutex profiles, off by default (they cost
// time), when MULLIGAN_PROFILE_RATE is set: the block profile samples one blocking event per
// that many nanoseconds blocked, the mutex profile one contention in that many. They are read
// from the admin API's /debug/pprof/block and /debug/pprof/mutex (docs/operating.md,
// Profiling); the benchmark's -profile sets it.
func profileRates() {
	n, err := strconv.Atoi(os.Getenv("MULLIGAN_PROFILE_RATE"))
	if err != nil || n <= 0 {
		return
	}
	runtime.SetBlockProfileRate(n)
	runtime.SetMutexProfileFraction(n)
}

// sidecarSource names the configuration's source to Caddy's SIGUSR1 handler and logs.
const sidecarSource = "MULLIGAN_* environment"

// cmdSidecar runs the configuration built from the environment, as caddycmd's run does for a
// config file: trap signals, load, block. Caddy's signal handlers stop it (SIGTERM, SIGINT:
// caddy.Stop with grace_period, then exit).
func cmdSidecar(fl caddycmd.Flags) (int, error) {
	cfg, err := loadSidecarConfig(os.LookupEnv)
	if err != nil {
		return caddy.ExitCodeFailedStartup, err
	}
	if fl.Bool("print") {
		fmt.Print(cfg.Caddyfile())
		return caddy.ExitCodeSuccess, nil
	}

	if err := cfg.refuseBusyAddresses(answersTCP); err != nil {
		return caddy.ExitCodeFailedStartup, err
	}
	caddy.TrapSignals()
	logger, defaultLogger, _ := caddy.BufferedLog()
	defer caddy.UnbufferDefaultLogger(defaultLogger)

	config, err := adaptSidecarConfig(cfg, logger)
	if err != nil {
		return caddy.ExitCodeFailedStartup, err
	}
	caddy.SetLastConfig(sidecarSource, "caddyfile", reloadSidecarConfig)
	if err := caddy.Load(config, true); err != nil {
		return caddy.ExitCodeFailedStartup, fmt.Errorf("loading the configuration built from the MULLIGAN_* variables (`mulligan sidecar --print` shows it): %v", err)
	}
	caddy.Log().Info("serving the configuration built from the MULLIGAN_* variables",
		zap.String("upstream", cfg.Upstream),
		zap.String("listen", cfg.Bind+":"+cfg.Port),
		zap.String("storage", cfg.storageName()),
		zap.Bool("webhooks", cfg.WebhookURL != ""))
	select {}
}

// reloadSidecarConfig rebuilds the configuration from the environment on SIGUSR1: the
// variables are fixed for the process, but the secret files they name may have been rotated.
func reloadSidecarConfig(_, _ string) error {
	cfg, err := loadSidecarConfig(os.LookupEnv)
	if err != nil {
		return err
	}
	config, err := adaptSidecarConfig(cfg, caddy.Log())
	if err != nil {
		return err
	}
	return caddy.Load(config, true)
}

// adaptSidecarConfig adapts the generated Caddyfile to JSON, logging the adapter's warnings.
func adaptSidecarConfig(cfg *sidecarConfig, logger *zap.Logger) ([]byte, error) {
	config, warnings, err := cfg.Adapt()
	for _, w := range warnings {
		logger.Warn(w.String())
	}
	return config, err
}
