package consumer

import (
	"context"
	"errors"
	"log"
	"net/http"
	"sync"
	"time"

	"github.com/mulligan-gw/mulligan/webhook"
)

// Defaults for the zero values of Config.
const (
	// DefaultMaxBodyBytes caps a delivery's body; larger ones get 413.
	DefaultMaxBodyBytes = 4 << 20
	// DefaultQueueSize is how many accepted events may wait for processing
	// before new deliveries are answered 503 (the gateway retries them).
	DefaultQueueSize = 1024
	// DefaultPollTimeout bounds a poll of the gateway by the default client.
	DefaultPollTimeout = 10 * time.Second
)

// ErrClosed is returned by WaitIdle once the consumer is closed.
var ErrClosed = errors.New("consumer: closed")

// Config configures a Consumer. Dir and Secrets or XWebhookSecrets are required.
type Config struct {
	// Secrets verify Standard Webhooks deliveries (the default style): the
	// endpoint's whsec_... secrets. During a rotation list both; a delivery
	// signed with any of them is accepted.
	Secrets []webhook.Secret
	// XWebhookSecrets verify deliveries of an endpoint with "signature
	// x-webhook" (X-Webhook-Signature), made with webhook.RawSecret from the
	// secrets as configured. A delivery is verified in the style its headers
	// show, with that style's secrets.
	XWebhookSecrets []webhook.Secret
	// Dir holds the journal (created if missing). One consumer per Dir.
	Dir string
	// Gateway is the gateway's origin, such as http://127.0.0.1:8080, that
	// operation links are relative to. Empty turns polling off.
	Gateway string
	// PollHeader is sent with every poll, typically the Authorization the
	// gateway scopes operations by (another scope's operation is a 404).
	PollHeader http.Header
	// Client polls the gateway. Default: a client with DefaultPollTimeout.
	Client *http.Client
	// Process handles each event once it is the newest known state of its
	// operation. It runs on one goroutine, in order, and at least once per
	// event (see the package documentation): make it idempotent.
	Process func(Event)
	// Now is the clock signatures are checked against. Default time.Now.
	Now func() time.Time
	// Logf reports stale events, polls and errors. Default log.Printf.
	Logf func(format string, args ...any)
	// MaxBodyBytes caps a delivery's body. Default DefaultMaxBodyBytes.
	MaxBodyBytes int64
	// QueueSize bounds the events waiting for Process. Default DefaultQueueSize.
	QueueSize int
}

// Consumer receives Mulligan's webhooks: it is an http.Handler for the
// endpoint's URL. Create it with New and Close it when done.
type Consumer struct {
	cfg     Config
	journal *journal

	mu     sync.Mutex // guards seen and closed; held across the journal write
	seen   map[string]struct{}
	closed bool
	queue  chan queuedEvent

	versions   versionTracker // used by the queue's goroutine only
	pending    pendingCount
	stop       context.Context // done once Close is called
	stopWorker context.CancelFunc
	workerDone chan struct{}
}

// New opens (or creates) the journal in cfg.Dir, replays it, and starts the
// goroutine that processes events, beginning with those accepted before a
// restart but not processed yet.
func New(cfg Config) (*Consumer, error) {
	cfg, err := withDefaults(cfg)
	if err != nil {
		return nil, err
	}
	j, records, err := openJournal(cfg.Dir)
	if err != nil {
		return nil, err
	}
	state, err := replay(records)
	if err != nil {
		j.close()
		return nil, err
	}
	c := &Consumer{
		cfg: cfg, journal: j, seen: state.seen, versions: state.versions,
		queue: make(chan queuedEvent, cfg.QueueSize), workerDone: make(chan struct{}),
		pending: newPendingCount(),
	}
	c.stop, c.stopWorker = context.WithCancel(context.Background())
	c.pending.add(len(state.backlog))
	go c.work(state.backlog)
	return c, nil
}

// withDefaults checks cfg and fills in its zero values.
func withDefaults(cfg Config) (Config, error) {
	switch {
	case len(cfg.Secrets) == 0 && len(cfg.XWebhookSecrets) == 0:
		return cfg, errors.New("consumer: no secrets to verify deliveries with")
	case cfg.Dir == "":
		return cfg, errors.New("consumer: no Dir for the journal")
	}
	if cfg.Client == nil {
		cfg.Client = &http.Client{Timeout: DefaultPollTimeout}
	}
	if cfg.Process == nil {
		cfg.Process = func(Event) {}
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logf == nil {
		cfg.Logf = log.Printf
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if cfg.QueueSize <= 0 {
		cfg.QueueSize = DefaultQueueSize
	}
	return cfg, nil
}

// Close stops accepting deliveries (they get 503, so the gateway retries
// them later), lets the event being processed finish, and closes the
// journal. Events still queued stay journaled: the next New on the same Dir
// processes them. Close is safe to call more than once.
func (c *Consumer) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	c.mu.Unlock()
	c.stopWorker()
	<-c.workerDone
	return c.journal.close()
}

// WaitIdle blocks until every accepted event has been handled (processed or
// ignored as stale), ctx ends, or the consumer is closed with events left.
func (c *Consumer) WaitIdle(ctx context.Context) error {
	select {
	case <-c.pending.zero():
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-c.workerDone:
		select {
		case <-c.pending.zero():
			return nil
		default:
			return ErrClosed
		}
	}
}
