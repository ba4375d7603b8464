// Command demo is the one-command tour of Mulligan: it starts the example model server on
// 127.0.0.1:8000, the example webhook consumer on 127.0.0.1:9000, and Caddy with the Mulligan
// module on :8080 (examples/demo/Caddyfile: the repository's default plus a webhook endpoint;
// the embedded Badger store in Caddy's data directory), walks through what the gateway does with
// real requests, then keeps everything running for your own curl commands until Ctrl-C.
//
//	go run ./examples/demo
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	_ "github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	_ "github.com/caddyserver/caddy/v2/modules/standard"

	"github.com/mulligan-gw/mulligan/examples/consumer"
	"github.com/mulligan-gw/mulligan/examples/modelserver"
	_ "github.com/mulligan-gw/mulligan/module"
	"github.com/mulligan-gw/mulligan/webhook"
)

func main() {
	caddyfile := flag.String("config", "examples/demo/Caddyfile", "the Caddyfile to run")
	hookAddr := flag.String("consumer", "127.0.0.1:9000", "where the example webhook consumer listens")
	modelAddr := flag.String("model", "127.0.0.1:8000", "where the example model server listens")
	latency := flag.Duration("latency", 1500*time.Millisecond, "the model server's answer time")
	tour := flag.Bool("tour", true, "walk through the features once started")
	flag.Parse()
	log.SetFlags(0)

	model := modelserver.New(modelserver.Config{Latency: *latency, ChunkDelay: 50 * time.Millisecond})
	ln, err := net.Listen("tcp", *modelAddr)
	if err != nil {
		log.Fatalf("model server: %v", err)
	}
	go func() { _ = http.Serve(ln, model) }()
	fmt.Printf("model server on http://%s (latency %s)\n", *modelAddr, *latency)

	if err := startConsumer(*hookAddr); err != nil {
		log.Fatalf("webhook consumer: %v", err)
	}
	if err := startCaddy(*caddyfile); err != nil {
		log.Fatalf("gateway: %v", err)
	}
	defer caddy.Stop()
	gateway := "http://127.0.0.1:8080"
	fmt.Printf("gateway on %s, storing in %s\n", gateway, caddy.AppDataDir()+"/mulligan")

	if *tour {
		if err := runTour(gateway, model); err != nil {
			fmt.Printf("tour: %v\n", err)
		}
	}
	fmt.Printf("\nboth keep running; try the curl commands in the README. Ctrl-C stops.\n")
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	<-ctx.Done()
}

// demoSecret is the demo Caddyfile's webhook secret.
const demoSecret = "whsec_ZGVtby1zZWNyZXQtZGVtby1zZWNyZXQtMTIzNA=="

// startConsumer runs the example consumer, printing every event it processes.
func startConsumer(addr string) error {
	secret, err := webhook.ParseSecret(demoSecret)
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "mulligan-demo-consumer")
	if err != nil {
		return err
	}
	c, err := consumer.New(consumer.Config{
		Secrets: []webhook.Secret{secret}, Dir: dir, Gateway: "http://127.0.0.1:8080",
		Process: func(ev consumer.Event) {
			fmt.Printf("   >> webhook received and verified: %s %s %s (version %d, attempt %d)\n",
				ev.EventID, ev.EventType, ev.Operation.OperationID, ev.Operation.Version, ev.DeliveryAttempt)
		},
		Logf: func(string, ...any) {},
	})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	go func() { _ = http.Serve(ln, c) }()
	fmt.Printf("webhook consumer on http://%s/webhooks\n", addr)
	return nil
}

func startCaddy(path string) error {
	src, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("%s not found: run this from the repository root", path)
	}
	if err != nil {
		return err
	}
	adapted, _, err := caddyconfig.GetAdapter("caddyfile").Adapt(src, map[string]any{"filename": path})
	if err != nil {
		return err
	}
	// Keep Caddy's own log to warnings, so the tour reads cleanly in a terminal.
	var cfg map[string]any
	if err := json.Unmarshal(adapted, &cfg); err != nil {
		return err
	}
	cfg["logging"] = map[string]any{"logs": map[string]any{"default": map[string]any{"level": "WARN"}}}
	adapted, _ = json.Marshal(cfg)
	return caddy.Load(adapted, true)
}
