// Command model-server runs the bundled Mulligan example model server: a slow,
// optionally flaky, OpenAI-compatible mock to put behind the gateway.
//
//	model-server -listen 127.0.0.1:8000 -latency 1s -chunk-delay 50ms -fail-rate 0 -fail-status 503 -slots 0
//
// -slots N makes it process at most N requests at once, the others waiting
// inside it first come first served, as an inference server's batch slots do.
//
// It prints "model-server listening on ADDR" to stderr once it accepts
// connections and shuts down gracefully on SIGINT or SIGTERM.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/mulligan-gw/mulligan/examples/modelserver"
)

// shutdownGrace is how long in-flight requests get to finish on shutdown
// before their connections are closed.
const shutdownGrace = 5 * time.Second

func main() {
	os.Exit(run(os.Args[1:], os.Stderr))
}

func run(args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("model-server", flag.ContinueOnError)
	fs.SetOutput(stderr)
	listen := fs.String("listen", "127.0.0.1:8000", "address to listen on (host:port; port 0 picks a free one)")
	latency := fs.Duration("latency", time.Second, "time every model request waits before answering")
	chunkDelay := fs.Duration("chunk-delay", 50*time.Millisecond, "pause after each chunk of a streamed answer")
	failRate := fs.Float64("fail-rate", 0, "probability (0..1) that a request answers -fail-status instead")
	failStatus := fs.Int("fail-status", http.StatusServiceUnavailable, "HTTP status of randomly injected failures")
	seed := fs.Int64("seed", 0, "seed of the failure-injection random number generator")
	slots := fs.Int("slots", 0, "requests processed at once, the others queued first come first served (0: no limit)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	switch {
	case fs.NArg() > 0:
		fmt.Fprintf(stderr, "model-server: unexpected arguments %q\n", fs.Args())
		return 2
	case *slots < 0:
		fmt.Fprintln(stderr, "model-server: -slots must not be negative")
		return 2
	case *latency < 0 || *chunkDelay < 0:
		fmt.Fprintln(stderr, "model-server: -latency and -chunk-delay must not be negative")
		return 2
	case *failRate < 0 || *failRate > 1:
		fmt.Fprintln(stderr, "model-server: -fail-rate must be between 0 and 1")
		return 2
	case *failStatus < 200 || *failStatus > 599:
		fmt.Fprintln(stderr, "model-server: -fail-status must be an HTTP status between 200 and 599")
		return 2
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		fmt.Fprintf(stderr, "model-server: %v\n", err)
		return 1
	}
	srv := &http.Server{
		Handler: modelserver.New(modelserver.Config{
			Latency:    *latency,
			ChunkDelay: *chunkDelay,
			FailRate:   *failRate,
			FailStatus: *failStatus,
			Seed:       *seed,
			Slots:      *slots,
		}),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
	}
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()
	fmt.Fprintf(stderr, "model-server listening on %s\n", ln.Addr())

	select {
	case err := <-serveErr:
		fmt.Fprintf(stderr, "model-server: %v\n", err)
		return 1
	case <-ctx.Done():
	}
	stop() // a second signal kills the process the default way

	shutdownCtx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		// Grace period over: closing the connections cancels the
		// requests still waiting.
		srv.Close()
	}
	if err := <-serveErr; err != nil && !errors.Is(err, http.ErrServerClosed) {
		fmt.Fprintf(stderr, "model-server: %v\n", err)
		return 1
	}
	return 0
}
