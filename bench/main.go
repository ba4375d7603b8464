// Command bench measures Mulligan side by side with plain Caddy: the same binary (Caddy v2 with
// the module), started on loopback with a bare reverse_proxy, with `mulligan` on Badger in
// front of it and, with -postgres, with `mulligan` on PostgreSQL, all in front of the example
// model server answering at once. It drives them at the same concurrency in interleaved short
// rounds, so machine noise hits them alike, and prints requests per second, p50 and p99
// latency and each Mulligan side's ratio to plain Caddy.
//
//	go run ./bench                               # every scenario, ~2-3 minutes on 2 cores
//	go run ./bench -scenarios replays -rounds 5  # one scenario, longer
//	go run ./bench -scale                        # also seed 10k and 1M keys: RSS and lookup p99
//	go run ./bench -postgres postgres://...      # Mulligan on PostgreSQL too, beside Badger
//	go run ./bench -postgres postgres://... -replicas 3  # 3 gateways on the database, load spread
//	go run ./bench -postgres postgres://... -pooled postgres://...  # also one through PgBouncer
//	go run ./bench -scenarios streams            # SSE: first event, throughput, 1,000 live streams
//	go run ./bench -scenarios flood              # capacity: interactive calls during a flood, ~12 minutes
//	go run ./bench -scenarios flood -floods mixed  # one of the floods only
//	go run ./bench -scenarios pace               # keyed streams at a model server's pace: first event added
//
// All traffic stays on 127.0.0.1. The processes it starts are stopped when it ends, also on
// Ctrl-C.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/mulligan-gw/mulligan/store/postgres"
)

// Scenario names accepted by -scenarios.
const (
	ScenarioPassthrough = "passthrough"
	ScenarioNewKeys     = "newkeys"
	ScenarioReplays     = "replays"
	ScenarioAsync       = "async"
	ScenarioWebhooks    = "webhooks"
	ScenarioStreams     = "streams"
	ScenarioFlood       = "flood"
)

// AllScenarios is the default -scenarios list, in the order they run.
var AllScenarios = []string{ScenarioPassthrough, ScenarioNewKeys, ScenarioReplays, ScenarioAsync, ScenarioWebhooks, ScenarioStreams}

// ExtraScenarios run only when -scenarios names them: the flood takes minutes, against gateways
// of its own.
var ExtraScenarios = []string{ScenarioFlood, ScenarioBatch, ScenarioPace, ScenarioResponses}

// knownScenarios is every scenario -scenarios accepts.
func knownScenarios() []string {
	return slices.Concat(AllScenarios, ExtraScenarios)
}

// Config is one run of the harness.
type Config struct {
	// Concurrency is the number of clients sending at once (closed loop), per gateway.
	Concurrency int
	// Duration is the length of one round of one gateway.
	Duration time.Duration
	// Rounds is how many rounds each gateway gets per scenario, interleaved with the other's.
	Rounds int
	// Scenarios lists what to measure (see AllScenarios).
	Scenarios []string
	// ReplayKeys is how many keys the replays scenario records first and then cycles through.
	ReplayKeys int
	// Operations is how many operations the end-to-end async and webhook scenarios submit.
	Operations int
	// AsyncOps caps the operations one accept round submits: every accepted operation is
	// executed afterwards (the runner drains a few hundred per second with its default
	// concurrency of 4) and the default queue holds 10000.
	AsyncOps int
	// BatchLines and BatchLineBytes shape the batch scenario's input file: how many lines, and
	// about how long each is (docs/batches.md, Performance).
	BatchLines     int
	BatchLineBytes int
	// LiveStreams is how many keyed streams the streams scenario holds open at once while it
	// reads the gateways' memory.
	LiveStreams int
	// PaceRate and PaceStream shape the pace scenario: keyed streamed calls a second (open
	// loop), each a stream that lasts PaceStream (bench/pace.go).
	PaceRate   float64
	PaceStream time.Duration
	// Scale seeds the store with ScaleKeys keys and ScaleOps operations (and 10k first) and
	// measures the gateway's memory and replay latency.
	Scale bool
	// ScaleKeys is the large key count of the scale run.
	ScaleKeys int
	// ScaleOps is how many finished operations the large scale run seeds.
	ScaleOps int
	// Postgres, when set, is a PostgreSQL URL DSN: a third gateway stores there (`storage
	// postgres`), measured beside plain Caddy and Mulligan on Badger; keys carry the run's id,
	// so runs may share the database.
	Postgres string
	// Replicas is how many gateway processes share the PostgreSQL database; the load is spread
	// over them round-robin. Above 1 it needs Postgres.
	Replicas int
	// Pooled, when set, is the same database as Postgres through a connection pooler in
	// transaction mode (PgBouncer): one more gateway stores through it, with no direct DSN, so
	// it polls for work as a large fleet does (docs/backends.md, "Through PgBouncer").
	Pooled string
	// FloodCalls is how many low-urgency calls the flood scenario's flooding tenant sends.
	FloodCalls int
	// FloodSlots and FloodLatency are the flood's model server: how many calls it runs at
	// once (the rest queue inside it) and how long each takes.
	FloodSlots   int
	FloodLatency time.Duration
	// FloodEvery is how often the interactive tenant sends a call during a flood.
	FloodEvery time.Duration
	// Floods names the floods to run (flood.go's floodKinds); empty runs them all.
	Floods []string
	// ProfileDir, when set, receives CPU, block and mutex profiles of each Mulligan gateway
	// during the first round of each scenario (bench/profile.go), and the batch scenario's
	// heap profiles at the end of each phase.
	ProfileDir string
	// Binary, when set, is a sidecar binary built already (`go build ./sidecar`), run instead of
	// building one for the run.
	Binary string
	// Progress receives one line per step; nil discards them.
	Progress io.Writer
}

// DefaultConfig is what `go run ./bench` runs without flags.
func DefaultConfig() Config {
	return Config{
		Concurrency: 64, Duration: 3 * time.Second, Rounds: 3, Scenarios: AllScenarios,
		Replicas: 1, ReplayKeys: 1000, Operations: 1000, AsyncOps: 4000, LiveStreams: 1000, BatchLines: 50000, BatchLineBytes: 586, ScaleKeys: 1_000_000, ScaleOps: 100_000,
		PaceRate: 200, PaceStream: time.Second,
		FloodCalls: 600, FloodSlots: 4, FloodLatency: 100 * time.Millisecond, FloodEvery: 200 * time.Millisecond,
	}
}

func main() {
	cfg := DefaultConfig()
	var scenarios string
	flag.IntVar(&cfg.Concurrency, "concurrency", cfg.Concurrency, "clients sending at once, per gateway")
	flag.DurationVar(&cfg.Duration, "duration", cfg.Duration, "length of one round")
	flag.IntVar(&cfg.Rounds, "rounds", cfg.Rounds, "rounds per gateway and scenario, interleaved plain/mulligan")
	flag.StringVar(&scenarios, "scenarios", strings.Join(AllScenarios, ","), "comma-separated scenarios: "+strings.Join(knownScenarios(), ", "))
	flag.IntVar(&cfg.ReplayKeys, "keys", cfg.ReplayKeys, "keys recorded, then replayed, by the replays scenario")
	flag.IntVar(&cfg.Operations, "ops", cfg.Operations, "operations submitted by the end-to-end async and webhook scenarios")
	flag.IntVar(&cfg.AsyncOps, "async-ops", cfg.AsyncOps, "most operations accepted per async accept round (the queue holds 10000)")
	flag.IntVar(&cfg.BatchLines, "batch-lines", cfg.BatchLines, "lines of the batch scenario's input file")
	flag.IntVar(&cfg.BatchLineBytes, "batch-line-bytes", cfg.BatchLineBytes, "about how long each line of the batch scenario's input file is, in bytes (at least 140)")
	flag.IntVar(&cfg.LiveStreams, "live-streams", cfg.LiveStreams, "keyed streams the streams scenario holds open at once to measure memory")
	flag.Float64Var(&cfg.PaceRate, "pace-rate", cfg.PaceRate, "keyed streamed calls a second of the pace scenario")
	flag.DurationVar(&cfg.PaceStream, "pace-stream", cfg.PaceStream, "how long each stream of the pace scenario lasts")
	flag.BoolVar(&cfg.Scale, "scale", false, "also seed 10k, then -scale-keys keys and -scale-ops operations, and measure RSS and replay p99 (slow)")
	flag.IntVar(&cfg.ScaleKeys, "scale-keys", cfg.ScaleKeys, "keys of the large scale run")
	flag.IntVar(&cfg.ScaleOps, "scale-ops", cfg.ScaleOps, "finished operations seeded by the large scale run")
	flag.StringVar(&cfg.ProfileDir, "profile", "", "a directory: write CPU, block and mutex profiles of each Mulligan gateway's first round of each scenario there (and the batch scenario's heap after each phase)")
	flag.StringVar(&cfg.Postgres, "postgres", "", "a postgres:// DSN: also measure Mulligan storing there, beside Badger (the scale run stays on Badger)")
	flag.IntVar(&cfg.Replicas, "replicas", cfg.Replicas, "PostgreSQL gateway processes on the one database, the load spread round-robin over them (needs -postgres)")
	flag.StringVar(&cfg.Pooled, "pooled", "", "a postgres:// DSN of the -postgres database through PgBouncer in transaction mode: also measure a gateway storing through it (needs -postgres, which migrates)")
	flag.IntVar(&cfg.FloodCalls, "flood-calls", cfg.FloodCalls, "low-urgency calls of the flood scenario's flood")
	flag.IntVar(&cfg.FloodSlots, "flood-slots", cfg.FloodSlots, "slots of the flood scenario's model server")
	flag.DurationVar(&cfg.FloodLatency, "flood-latency", cfg.FloodLatency, "time of one call on the flood scenario's model server")
	flag.DurationVar(&cfg.FloodEvery, "flood-every", cfg.FloodEvery, "interval of the interactive calls during a flood")
	flag.StringVar(&cfg.Binary, "binary", "", "a sidecar binary built already (go build ./sidecar): run it instead of building one")
	floods := flag.String("floods", "", "the floods of the flood scenario to run, comma-separated ("+strings.Join(floodKinds, ", ")+"); all when empty")
	flag.Parse()
	cfg.Scenarios = splitList(scenarios)
	cfg.Floods = splitList(*floods)
	cfg.Progress = os.Stderr

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if _, err := Run(ctx, cfg, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		stop()
		os.Exit(1)
	}
}

func splitList(s string) []string {
	var out []string
	for _, part := range strings.Split(s, ",") {
		if part = strings.TrimSpace(part); part != "" {
			out = append(out, part)
		}
	}
	return out
}

// validate rejects a configuration the harness cannot run.
func (c Config) validate() error {
	switch {
	case c.Concurrency < 1:
		return fmt.Errorf("-concurrency must be at least 1")
	case c.Duration <= 0 || c.Rounds < 1:
		return fmt.Errorf("-duration and -rounds must be positive")
	case c.ReplayKeys < 1 || c.Operations < 1 || c.AsyncOps < 1 || c.LiveStreams < 1:
		return fmt.Errorf("-keys, -ops, -async-ops and -live-streams must be positive")
	case c.Replicas < 1 || (c.Replicas > 1 && c.Postgres == ""):
		return fmt.Errorf("-replicas must be at least 1, and above 1 needs -postgres")
	case c.Pooled != "" && c.Postgres == "":
		return fmt.Errorf("-pooled needs -postgres: the direct DSN's gateway applies the migrations")
	case c.Scale && (c.ScaleKeys < scaleSmallKeys || c.ScaleOps < 0):
		return fmt.Errorf("-scale-keys must be at least %d and -scale-ops not negative", scaleSmallKeys)
	case c.PaceRate <= 0 || c.PaceStream < paceEvents*time.Millisecond:
		return fmt.Errorf("-pace-rate must be positive and -pace-stream at least %s", paceEvents*time.Millisecond)
	case c.FloodCalls < 1 || c.FloodSlots < 1 || c.FloodLatency <= 0 || c.FloodEvery <= 0:
		return fmt.Errorf("-flood-calls, -flood-slots, -flood-latency and -flood-every must be positive")
	}
	for _, f := range c.Floods {
		if !slices.Contains(floodKinds, f) {
			return fmt.Errorf("-floods: no flood %q (there are %s)", f, strings.Join(floodKinds, ", "))
		}
	}
	for _, f := range []struct{ flag, dsn string }{{"-postgres", c.Postgres}, {"-pooled", c.Pooled}} {
		if f.dsn == "" {
			continue
		}
		if _, err := withApplicationName(f.dsn, "check"); err != nil {
			return fmt.Errorf("%s %w", f.flag, err)
		}
	}
	known := map[string]bool{}
	for _, s := range knownScenarios() {
		known[s] = true
	}
	for _, s := range c.Scenarios {
		if !known[s] {
			return fmt.Errorf("unknown scenario %q (known: %s)", s, strings.Join(knownScenarios(), ", "))
		}
	}
	return nil
}

// flagLine is the command that reproduces cfg, every flag spelled out.
func (c Config) flagLine() string {
	line := fmt.Sprintf("go run ./bench -concurrency %d -duration %s -rounds %d -scenarios %s -keys %d -ops %d -async-ops %d -live-streams %d",
		c.Concurrency, c.Duration, c.Rounds, strings.Join(c.Scenarios, ","), c.ReplayKeys, c.Operations, c.AsyncOps, c.LiveStreams)
	if c.Postgres != "" {
		line += fmt.Sprintf(" -postgres %s -replicas %d", postgres.DisplayName(c.Postgres), c.Replicas)
	}
	if c.Binary != "" {
		line += " -binary " + c.Binary // a binary built already: which one was measured
	}
	if c.Pooled != "" {
		line += " -pooled " + postgres.DisplayName(c.Pooled)
	}
	if slices.Contains(c.Scenarios, ScenarioFlood) {
		line += fmt.Sprintf(" -flood-calls %d -flood-slots %d -flood-latency %s -flood-every %s", c.FloodCalls, c.FloodSlots, c.FloodLatency, c.FloodEvery)
		if len(c.Floods) > 0 {
			line += " -floods " + strings.Join(c.Floods, ",")
		}
	}
	if slices.Contains(c.Scenarios, ScenarioPace) {
		line += fmt.Sprintf(" -pace-rate %g -pace-stream %s", c.PaceRate, c.PaceStream)
	}
	if c.Scale {
		line += fmt.Sprintf(" -scale -scale-keys %d -scale-ops %d", c.ScaleKeys, c.ScaleOps)
	}
	return line
}
