package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/mulligan-gw/mulligan/examples/modelserver"
)

// Report is the outcome of a run, as printed.
type Report struct {
	// Sides names the Mulligan gateways measured beside plain Caddy, in Row.Mulligan's order:
	// "badger", then "postgres" (or "postgres×N" for N replicas) with -postgres.
	Sides []string
	// Rows are the scenarios, in the order they ran.
	Rows []Row
	// Connections are the PostgreSQL gateways' connections (empty without -postgres).
	Connections []ConnRow
	// Scale holds the -scale measurements (empty without -scale).
	Scale []ScaleRow
	// Flood holds the flood scenario's rows (empty without it).
	Flood []FloodRow
}

// Row is one scenario measured on every gateway.
type Row struct {
	// Scenario names the measurement.
	Scenario string
	// Plain is plain Caddy's result; nil when not measured.
	Plain *Result
	// Mulligan holds one result per Report.Sides; a nil entry (or a short slice) was not
	// measured.
	Mulligan []*Result
	// Note says what the numbers mean, or why they are missing.
	Note string
}

// Result is what one gateway achieved in one scenario.
type Result struct {
	// RPS is expected answers (or completed operations, or deliveries) per second.
	RPS float64
	// P50 and P99 are latencies of the expected answers.
	P50, P99 time.Duration
	// OK and Errors count expected and unexpected answers (transport errors included).
	OK, Errors int
	// FirstError quotes the first unexpected answer.
	FirstError string
}

func resultOf(s sample) *Result {
	return &Result{RPS: s.rps(), P50: s.percentile(50), P99: s.percentile(99), OK: s.ok, Errors: s.errs, FirstError: s.firstErr}
}

// resultsOf is resultOf of each sample.
func resultsOf(ss []sample) []*Result {
	out := make([]*Result, len(ss))
	for i := range ss {
		out[i] = resultOf(ss[i])
	}
	return out
}

// harness owns everything a run starts: the model server, the gateways, their temp dirs.
// mulligans are the Mulligan sides (sides.go): Badger, then PostgreSQL with -postgres.
type harness struct {
	cfg       Config
	progress  io.Writer
	client    *http.Client
	tmp       string
	binary    string
	model     *modelserver.Server
	source    *streamSource // the streams scenario's upstream, beside the model server
	modelSrv  *http.Server
	upstream  string // host:port of the model server
	plain     *gateway
	mulligans []*gateway
	conns     *connWatch
	runID     string
	seq       atomic.Int64
	floodRows []FloodRow // the flood scenario's (flood.go)
}

// Run builds the sidecar, starts the model server and both gateways, measures cfg.Scenarios
// (and the scale run with cfg.Scale), prints the tables to out and returns them.
func Run(ctx context.Context, cfg Config, out io.Writer) (*Report, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if cfg.ProfileDir != "" {
		if err := os.MkdirAll(cfg.ProfileDir, 0o755); err != nil {
			return nil, err
		}
	}
	printHeader(out, cfg)
	h := &harness{cfg: cfg, progress: cfg.Progress, client: newClient(cfg.Concurrency), runID: strconv.FormatInt(time.Now().UnixNano(), 36)}
	if h.progress == nil {
		h.progress = io.Discard
	}
	defer h.close()
	if err := h.start(ctx); err != nil {
		return nil, err
	}
	rep := &Report{}
	for _, g := range h.mulligans {
		rep.Sides = append(rep.Sides, g.name)
	}
	var err error
	for _, name := range cfg.Scenarios {
		var rows []Row
		if rows, err = h.scenario(ctx, name); err != nil {
			err = fmt.Errorf("%s: %w", name, err)
			break
		}
		rep.Rows = append(rep.Rows, rows...)
	}
	printTable(out, rep.Sides, rep.Rows)
	rep.Flood = h.floodRows
	printFlood(out, cfg, rep.Flood)
	if h.conns != nil {
		rep.Connections = h.conns.stop(ctx)
		printConnections(out, rep.Connections)
	}
	if err == nil && cfg.Scale {
		rep.Scale, err = h.scale(ctx)
		printScale(out, rep.Scale)
	}
	return rep, err
}

// scenario runs one named scenario.
func (h *harness) scenario(ctx context.Context, name string) ([]Row, error) {
	run, ok := map[string]func(context.Context) ([]Row, error){
		ScenarioPassthrough: h.passthrough, ScenarioNewKeys: h.newKeys, ScenarioReplays: h.replays,
		ScenarioAsync: h.async, ScenarioWebhooks: h.webhooks, ScenarioStreams: h.streams,
		ScenarioBatch: h.batch, ScenarioPace: h.pace, ScenarioResponses: h.responses,
		ScenarioFlood: func(ctx context.Context) ([]Row, error) { return nil, h.flood(ctx) }, // its own table (flood_report.go)
	}[name]
	if !ok {
		return nil, fmt.Errorf("unknown scenario %q", name)
	}
	return run(ctx)
}

// start builds the binary and starts the model server and both gateways.
func (h *harness) start(ctx context.Context) error {
	var err error
	if h.tmp, err = os.MkdirTemp("", "mulligan-bench-"); err != nil {
		return err
	}
	if h.binary = h.cfg.Binary; h.binary == "" {
		h.logf("building the sidecar binary")
		if h.binary, err = buildSidecar(ctx, h.tmp); err != nil {
			return err
		}
	}
	if err := h.startModel(); err != nil {
		return err
	}
	if h.plain, err = h.startGateway(ctx, "plain", func(int) string { return plainSite(h.upstream) }); err != nil {
		return err
	}
	if err := h.startSides(ctx); err != nil {
		return err
	}
	if h.cfg.Postgres != "" {
		h.conns = h.watchConnections(ctx)
	}
	return h.warmUp(ctx)
}

// startGateway starts a gateway named name in its own directory under the run's temp dir.
func (h *harness) startGateway(ctx context.Context, name string, site func(port int) string) (*gateway, error) {
	dir := filepath.Join(h.tmp, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	h.logf("starting the %s gateway", name)
	return startGateway(ctx, h.binary, dir, name, site, h.profileEnv()...)
}

// startModel serves the example model server, answering at once, and the streams scenario's
// event source, on a loopback port.
func (h *harness) startModel() error {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	h.model = modelserver.New(modelserver.Config{Latency: 0})
	h.source = newStreamSource()
	mux := http.NewServeMux()
	mux.Handle(streamPath, h.source)
	mux.Handle("/", h.model)
	h.modelSrv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	h.upstream = l.Addr().String()
	go func() { _ = h.modelSrv.Serve(l) }()
	return nil
}

// warmUp opens the client's connections and lets both processes settle before measuring.
func (h *harness) warmUp(ctx context.Context) error {
	d := min(time.Second, h.cfg.Duration)
	for _, g := range h.gateways() {
		s := closedLoop(ctx, h.cfg.Concurrency, d, 0, g, &h.seq, h.chat())
		if s.ok == 0 {
			return fmt.Errorf("warm-up of %s: no request succeeded: %s", g.name, s.firstErr)
		}
	}
	return ctx.Err()
}

// close stops everything start started and removes the temp dir.
func (h *harness) close() {
	if h.conns != nil {
		h.conns.stop(context.Background())
	}
	for _, g := range h.gateways() {
		g.stop()
	}
	if h.modelSrv != nil {
		_ = h.modelSrv.Close()
	}
	h.client.CloseIdleConnections()
	if h.tmp != "" {
		_ = os.RemoveAll(h.tmp)
	}
}

// gateways is plain Caddy, then the Mulligan sides.
func (h *harness) gateways() []*gateway {
	return append([]*gateway{h.plain}, h.mulligans...)
}

// alternate measures round on each gateway cfg.Rounds times, interleaved, rotating which goes
// first every round so that drift hits them all alike. It returns plain Caddy's sample and one
// per Mulligan side.
func (h *harness) alternate(ctx context.Context, name string, round func(g *gateway) (sample, error)) (plain sample, mull []sample, err error) {
	all := h.gateways()
	samples := make([]sample, len(all))
	for r := range h.cfg.Rounds {
		for k := range all {
			i := (k + r) % len(all)
			g := all[i]
			profiled := h.startProfiles(ctx, name, r, g)
			s, err := round(g)
			profiled()
			if err == nil {
				err = ctx.Err()
			}
			if err != nil {
				return samples[0], samples[1:], err
			}
			h.logf("%s: round %d/%d %-10s %8.0f/s  p99 %s  errors %d", name, r+1, h.cfg.Rounds, g.name, s.rps(), fmtDuration(s.percentile(99)), s.errs)
			samples[i].add(s)
		}
	}
	return samples[0], samples[1:], nil
}

// closedRounds is alternate with a closed loop of fn per round.
func (h *harness) closedRounds(ctx context.Context, name string, fn call) (plain sample, mull []sample, err error) {
	return h.alternate(ctx, name, func(g *gateway) (sample, error) {
		return closedLoop(ctx, h.cfg.Concurrency, h.cfg.Duration, 0, g, &h.seq, fn), nil
	})
}

func (h *harness) logf(format string, args ...any) {
	fmt.Fprintf(h.progress, "[%s] %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
}

// badgerDir is the Badger directory of the gateway named name, in its own directory.
func (h *harness) badgerDir(name string) string {
	return filepath.Join(h.tmp, name, "badger")
}
