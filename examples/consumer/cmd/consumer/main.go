// Command consumer runs the example webhook consumer: it receives Mulligan's
// signed events, verifies them, deduplicates them by webhook-id in a durable
// journal, and prints one line per processed event.
//
//	WEBHOOK_SECRET=whsec_... consumer -listen 127.0.0.1:9000 -data ./consumer-data -gateway http://127.0.0.1:8080
//
// -secret (or WEBHOOK_SECRET) takes several comma-separated secrets during a
// rotation. GATEWAY_AUTHORIZATION, when set, is sent as the Authorization of
// polls, since the gateway scopes operations by it. Every path on -listen
// receives webhooks. SIGINT or SIGTERM stops it gracefully.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/mulligan-gw/mulligan/examples/consumer"
	"github.com/mulligan-gw/mulligan/webhook"
)

// shutdownGrace is how long in-flight deliveries get to finish on shutdown.
const shutdownGrace = 5 * time.Second

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("consumer", flag.ContinueOnError)
	fs.SetOutput(stderr)
	listen := fs.String("listen", "127.0.0.1:9000", "address to receive webhooks on")
	secretList := fs.String("secret", os.Getenv("WEBHOOK_SECRET"), "whsec_... signing secret(s), comma-separated during a rotation (default $WEBHOOK_SECRET)")
	xSecretList := fs.String("x-webhook-secret", os.Getenv("X_WEBHOOK_SECRET"), "raw secret(s) of an endpoint with signature x-webhook, comma-separated during a rotation (default $X_WEBHOOK_SECRET)")
	dir := fs.String("data", "./consumer-data", "directory of the dedupe journal")
	gateway := fs.String("gateway", "http://127.0.0.1:8080", "gateway origin to poll operations from; empty disables polling")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	secrets, xSecrets, err := parseBothSecrets(*secretList, *xSecretList)
	if err != nil {
		fmt.Fprintf(stderr, "consumer: %v\n", err)
		return 2
	}
	logger := log.New(stderr, "", log.LstdFlags)
	c, err := consumer.New(consumer.Config{
		Secrets:         secrets,
		XWebhookSecrets: xSecrets,
		Dir:             *dir,
		Gateway:         *gateway,
		PollHeader:      pollHeader(os.Getenv("GATEWAY_AUTHORIZATION")),
		Process:         func(ev consumer.Event) { fmt.Fprintln(stdout, describe(ev)) },
		Logf:            logger.Printf,
	})
	if err != nil {
		fmt.Fprintf(stderr, "consumer: %v\n", err)
		return 1
	}
	defer c.Close()
	return serve(*listen, c, logger)
}

// serve runs the HTTP server until a signal, then shuts it down.
func serve(addr string, c *consumer.Consumer, logger *log.Logger) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		logger.Printf("consumer: %v", err)
		return 1
	}
	srv := &http.Server{Handler: c, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute}
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()
	logger.Printf("consumer listening on http://%s", ln.Addr())
	select {
	case err := <-serveErr:
		logger.Printf("consumer: %v", err)
		return 1
	case <-ctx.Done():
	}
	stop()
	shutdownCtx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		srv.Close()
	}
	return 0
}

// parseBothSecrets reads the whsec_... secrets of Standard Webhooks endpoints
// and the raw secrets of x-webhook ones; at least one is needed.
func parseBothSecrets(standard, x string) ([]webhook.Secret, []webhook.Secret, error) {
	secrets, err := parseSecrets(standard, webhook.ParseSecret)
	if err != nil {
		return nil, nil, err
	}
	xSecrets, err := parseSecrets(x, webhook.RawSecret)
	if err != nil {
		return nil, nil, err
	}
	if len(secrets)+len(xSecrets) == 0 {
		return nil, nil, errors.New("no secret: pass -secret whsec_... or -x-webhook-secret, or set WEBHOOK_SECRET")
	}
	return secrets, xSecrets, nil
}

// parseSecrets reads a comma-separated list of secrets with parse.
func parseSecrets(list string, parse func(string) (webhook.Secret, error)) ([]webhook.Secret, error) {
	var secrets []webhook.Secret
	for _, text := range strings.Split(list, ",") {
		if strings.TrimSpace(text) == "" {
			continue
		}
		s, err := parse(strings.TrimSpace(text))
		if err != nil {
			return nil, err
		}
		secrets = append(secrets, s)
	}
	return secrets, nil
}

// pollHeader carries the gateway credentials of polls, if any.
func pollHeader(authorization string) http.Header {
	if authorization == "" {
		return nil
	}
	return http.Header{"Authorization": {authorization}}
}

// describe renders one processed event as a line of output.
func describe(ev consumer.Event) string {
	op := ev.Operation
	line := fmt.Sprintf("%s %s %s status=%s version=%d", ev.EventID, ev.EventType, op.OperationID, op.Status, op.Version)
	if op.Error != nil {
		line += " error=" + op.Error.Code
	}
	if op.Response != nil {
		line += fmt.Sprintf(" upstream_status=%d", op.Response.Status)
	}
	if ev.Refreshed {
		line += " (refreshed from the gateway)"
	}
	return line
}
