package main

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mulligan-gw/mulligan/internal/testkit"
)

// The sides of the flood scenario, each in front of the flood's model server: plain Caddy,
// HAProxy queueing by priority class (the peer to beat), Mulligan without capacity, Mulligan
// with `capacity { limit auto 1 64 }`, the same steered by the model server's own metrics and,
// with -postgres, three replicas of it on one PostgreSQL sharing the model server's slots
// (`shared`), the calls spread over them in turn.

// floodSide is one gateway the flood runs against.
type floodSide struct {
	// name is the side's name in the table.
	name string
	// gw is the running gateway; nil when the side could not start.
	gw *gateway
	// mulligan sides also run the async flood (operations mean nothing to the others).
	mulligan bool
	// missing says why the side could not start.
	missing string
	// drop, when set, removes what the side made besides its processes (its database).
	drop func()
}

// Side names of the flood table.
const (
	floodPlain    = "plain Caddy"
	floodHAProxy  = "HAProxy"
	floodMulligan = "Mulligan"
	floodCapacity = "Mulligan + capacity"
	floodShared   = "Mulligan + capacity, 3 replicas (PostgreSQL, shared)"
	floodMetrics  = "Mulligan + capacity + server_metrics"
)

// floodMetricsBlock is the capacity of the side that steers by the model server's own queue
// (docs/capacity.md, "The model server's metrics"): read every 100 ms, saturated as soon as a
// call waits inside it.
func floodMetricsBlock(upstream string) string {
	return strings.Replace(floodCapacityBlock, "\t\t}\n",
		"\t\t\tserver_metrics http://"+upstream+"/metrics vllm {\n\t\t\t\tinterval 100ms\n\t\t\t\tmax_waiting 0\n\t\t\t}\n\t\t}\n", 1)
}

// floodReplicas is how many replicas the shared side runs.
const floodReplicas = 3

// floodAsyncBlock is the async block of both Mulligan sides: as many runners as the adaptive limit's
// maximum, so that what decides the load on the model server is the capacity block (or, without
// it, these 64 runners, as an operator who did not know the slot count would set them).
const floodAsyncBlock = "\t\tasync {\n\t\t\tconcurrency 64\n\t\t}\n"

// floodCapacityBlock is the capacity of the capacity side: the default adaptive limit, and a
// wait for a seat and a queue deadline far beyond the flood's drain time (the mixed flood's is
// about two minutes at full speed; HAProxy's queue waits as long), so that no flood work is dropped and the flood's throughput
// is comparable across sides.
const floodCapacityBlock = "\t\tcapacity {\n\t\t\tlimit auto 1 64\n\t\t\twait 10m\n\t\t\tmax_queue_wait 10m\n\t\t}\n"

// startFloodSides starts every side in front of upstream. A side that cannot start (HAProxy not
// installed, a build without the capacity block) is kept with the reason; any other failure
// stops the run.
func (h *harness) startFloodSides(ctx context.Context, upstream string) ([]*floodSide, error) {
	sides := []*floodSide{{name: floodPlain}, {name: floodHAProxy}, {name: floodMulligan, mulligan: true}, {name: floodCapacity, mulligan: true}}
	var err error
	if sides[0].gw, err = h.startGateway(ctx, "flood-plain", func(int) string { return plainSite(upstream) }); err != nil {
		return sides, err
	}
	if sides[1].gw, sides[1].missing, err = h.startHAProxy(ctx, upstream); err != nil {
		return sides, err
	}
	dir := h.badgerDir("flood-mulligan")
	if sides[2].gw, err = h.startGateway(ctx, "flood-mulligan", func(int) string { return mulliganSite(upstream, dir, floodAsyncBlock) }); err != nil {
		return sides, err
	}
	dir = h.badgerDir("flood-capacity")
	sides[3].gw, err = h.startGateway(ctx, "flood-capacity", func(int) string {
		return mulliganSite(upstream, dir, floodAsyncBlock+floodCapacityBlock)
	})
	if errors.Is(err, errGatewayExited) {
		sides[3].missing = "not available in this build (the binary refuses the capacity block)"
		h.logf("flood: %s: %v", floodCapacity, err)
		err = nil
	}
	if err != nil {
		return sides, err
	}
	metrics := &floodSide{name: floodMetrics, mulligan: true}
	sides = append(sides, metrics)
	dir = h.badgerDir("flood-metrics")
	if metrics.gw, err = h.startGateway(ctx, "flood-metrics", func(int) string {
		return mulliganSite(upstream, dir, floodAsyncBlock+floodMetricsBlock(upstream))
	}); err != nil {
		return sides, err
	}
	shared := &floodSide{name: floodShared, mulligan: true, missing: "needs -postgres"}
	sides = append(sides, shared)
	if h.cfg.Postgres != "" {
		shared.missing = ""
		var dsn string
		dsn, shared.drop, err = h.floodDatabase(ctx)
		if err != nil {
			shared.missing, err = "could not create its database: "+err.Error(), nil
			return sides, nil
		}
		shared.gw, err = h.startSharedFloodSide(ctx, upstream, dsn)
	}
	return sides, err
}

// floodDatabase creates a database of its own for the shared side beside the -postgres one, on
// the same cluster, and returns its DSN and what drops it: replicas on one database are one
// fleet, and the -postgres gateway's runners, in front of another upstream, would claim the
// flood's operations.
func (h *harness) floodDatabase(ctx context.Context) (string, func(), error) {
	name := "mulligan_bench_flood_" + h.runID
	conn, err := pgx.Connect(ctx, h.cfg.Postgres)
	if err != nil {
		return "", nil, err
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		return "", nil, err
	}
	drop := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if conn, err := pgx.Connect(ctx, h.cfg.Postgres); err == nil {
			_, _ = conn.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
			_ = conn.Close(ctx)
		}
	}
	u, err := url.Parse(h.cfg.Postgres)
	if err != nil {
		drop()
		return "", nil, err
	}
	u.Path = "/" + name
	return u.String(), drop, nil
}

// startSharedFloodSide starts floodReplicas gateways on the database dsn, whose capacity block
// shares the model server's slots between them (`shared` = its slots: an operator who knows the
// slot count bounds the fleet by it).
func (h *harness) startSharedFloodSide(ctx context.Context, upstream, dsn string) (*gateway, error) {
	fleet := &gateway{name: "flood-shared"}
	block := strings.Replace(floodCapacityBlock, "\t\t}\n", fmt.Sprintf("\t\t\tshared %d\n\t\t}\n", h.cfg.FloodSlots), 1)
	for i := range floodReplicas {
		name := fmt.Sprintf("flood-shared-%d", i+1)
		named, err := withApplicationName(dsn, h.applicationName(name))
		if err != nil {
			return fleet, err
		}
		r, err := h.startGateway(ctx, name, func(int) string { return mulliganSite(upstream, "postgres "+named, floodAsyncBlock+block) })
		if err != nil {
			return fleet, err
		}
		fleet.replicas = append(fleet.replicas, r)
	}
	fleet.base, fleet.admin = fleet.replicas[0].base, fleet.replicas[0].admin
	return fleet, nil
}

// stopFloodSides stops the sides that started.
func stopFloodSides(sides []*floodSide) {
	for _, s := range sides {
		s.gw.stop()
		if s.drop != nil {
			s.drop()
		}
	}
}

// startHAProxy runs haproxy in front of upstream with the flood model server's slots as the
// server's maxconn; missing says why it did not when haproxy is not installed or refused to
// start. Its global maxconn leaves room for every flood call under a 20,000 file limit.
func (h *harness) startHAProxy(ctx context.Context, upstream string) (g *gateway, missing string, err error) {
	bin, err := exec.LookPath("haproxy")
	if err != nil {
		return nil, "haproxy not installed (Debian: apt-get install -y haproxy)", nil
	}
	dir := filepath.Join(h.tmp, "flood-haproxy")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, "", err
	}
	ports, err := testkit.PickPorts(1)
	if err != nil {
		return nil, "", err
	}
	conf := filepath.Join(dir, "haproxy.cfg")
	if err := os.WriteFile(conf, []byte(haproxyConfig(ports[0], upstream, h.cfg.FloodSlots)), 0o644); err != nil {
		return nil, "", err
	}
	h.logf("starting HAProxy")
	g, err = startProcess(ctx, dir, "haproxy", ports[0], exec.Command(bin, "-db", "-f", conf))
	if errors.Is(err, errGatewayExited) {
		return nil, "haproxy did not start: " + err.Error(), nil
	}
	return g, "", err
}

// haproxyConfig queues in HAProxy what the model server cannot take: `maxconn` on the server
// is its slot count, and the queue is served by priority class, taken from the RFC 9218
// urgency of the Priority header (u=0 first; u=3 without one), oldest first within a class.
func haproxyConfig(port int, upstream string, slots int) string {
	var rules strings.Builder
	rules.WriteString("\thttp-request set-priority-class int(3)\n")
	for u := range 8 {
		fmt.Fprintf(&rules, "\thttp-request set-priority-class int(%d) if { req.hdr(priority) -m reg ^\\ *u=%d(\\ *;.*)?\\ *$ }\n", u, u)
	}
	return fmt.Sprintf(`global
	maxconn 8000

defaults
	mode http
	timeout connect 5s
	timeout client 10m
	timeout server 10m
	timeout queue 10m

frontend flood
	bind 127.0.0.1:%d
%s	default_backend model

backend model
	server model %s maxconn %d
`, port, rules.String(), upstream, slots)
}
