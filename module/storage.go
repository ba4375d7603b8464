package module

import (
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/mulligan-gw/mulligan/internal/batches"
	"github.com/mulligan-gw/mulligan/internal/courier"
	"github.com/mulligan-gw/mulligan/internal/runner"
	"github.com/mulligan-gw/mulligan/store"
	"github.com/mulligan-gw/mulligan/store/badger"
	"github.com/mulligan-gw/mulligan/store/postgres"
)

// Storage backends (docs/caddyfile.md, `storage`).
const (
	// BackendBadger is the embedded default: one process, one directory.
	BackendBadger = "badger"
	// BackendPostgres is one PostgreSQL database shared by many replicas.
	BackendPostgres = "postgres"
)

// Defaults of the storage-wide settings.
const (
	defaultConcurrency = runner.DefaultConcurrency
	defaultTakeover    = runner.DefaultTakeover
)

// storageSpec is what one storage is, and the settings that can only have one value per
// storage whatever blocks use it.
type storageSpec struct {
	backend  string
	location string // the Badger directory (absolute) or the PostgreSQL DSN
	direct   string // PostgreSQL: the DSN without a pooler, for migrations and LISTEN; "" for none
	sync     bool
	key      []byte

	concurrency int
	takeover    time.Duration
	memory      badger.Memory // Badger's sizes (storage_memory); zero fields take the defaults
}

// where identifies the storage itself: blocks naming the same one share it.
func (s storageSpec) where() string { return s.backend + " " + s.location }

// poolKey identifies one open handle: the storage and how it is opened. A reload that changes
// durability opens a second handle on the same storage, whose runner works beside the old one
// (as two replicas would) until the old config lets go.
func (s storageSpec) poolKey() string {
	h := sha256.Sum256(s.key)
	d := sha256.Sum256([]byte(s.direct))
	return fmt.Sprintf("%s|sync=%v|key=%x|direct=%x", s.where(), s.sync, h[:8], d[:8])
}

// name is how operators see the storage (admin API, metrics, logs): the directory, or the
// database as postgres://user@host:port/database, built from the parsed DSN so that no
// spelling of its password shows (postgres.DisplayName).
func (s storageSpec) name() string {
	if s.backend != BackendPostgres {
		return s.location
	}
	return postgres.DisplayName(s.location)
}

// storage is one open storage and the workers on it.
type storage struct {
	reg *registry // the one it is open in
	set storageSpec
	be  store.Backend
	run *runner.Runner
	// courier delivers the storage's outbox (docs/webhooks.md); the runner kicks it.
	courier *courier.Courier
	// batches moves the storage's batches along (docs/batches.md).
	batches *batches.Worker
}

// errStorageClosed answers a request that reached a config whose storage has closed.
var errStorageClosed = fmt.Errorf("%w: the configuration serving this request has stopped", store.ErrUnavailable)

// openStorage opens the storage and starts its runner. What a dead process left running is
// the takeover's (the Badger backend counts no lease of an earlier process as live).
func openStorage(reg *registry, set storageSpec, log *zap.Logger) (*storage, error) {
	log = log.With(zap.String("storage", set.name()))
	var be store.Backend
	switch set.backend {
	case BackendPostgres:
		pg, err := openPostgres(set, log)
		if err != nil {
			return nil, err
		}
		be = pg
	default:
		st, err := badger.Open(badger.Options{Dir: set.location, EncryptionKey: set.key, Sync: set.sync, Memory: set.memory,
			Logger: storeLogger{log.Named("badger").Sugar()}})
		if err != nil {
			return nil, fmt.Errorf("mulligan: %w", err)
		}
		st.SetSyncObserver(func(n int) { metrics.fsyncBatch.Observe(float64(n)) })
		be = st
	}
	be.SetAnnouncer(runner.Announcer(realClock, legacyExec()))
	// The batch hooks go in before the runner begins: a line it finishes is counted with them.
	be.SetBatchAnnouncer(batches.Announcer(realClock, newID))
	be.SetBatchLineSizer(batches.LineBytes)
	be.SetBatchSettled(batches.Settled(log))
	deliveries := newCourier(be, realClock, log)
	run := newRunner(be, set, reg, realClock, log, deliveries)
	work := batches.New(batches.Options{Store: be, Lines: batchLines{run}, Clock: realClock, Log: log})
	deliveries.Start()
	run.Start()
	work.Start()
	return &storage{reg: reg, set: set, be: be, run: run, courier: deliveries, batches: work}, nil
}

// batchLines is what the batch worker asks of the runner executing a storage's lines.
type batchLines struct{ run *runner.Runner }

func (l batchLines) Kick()                   { l.run.Kick() }
func (l batchLines) Cancel(id string)        { l.run.Cancel(id) }
func (l batchLines) Cut(op *store.Operation) { countFinal(op) }

// Destruct stops the storage's services, each waited for, then closes the backend; the pool
// calls it when the last user lets go. The batch worker stops first (a pass under way writes
// to the backend and asks the runner to start or stop lines), then the runner, then the
// courier, which gets what is left of the runner's grace period to deliver what is due.
func (s *storage) Destruct() error {
	for _, p := range s.reg.seatPoolsAt(s.set.where()) {
		p.moveSharedSeats(s)
	}
	s.batches.Stop()
	if deadline, done := s.run.Shutdown(s.sharedInProcess()); done {
		s.courier.Flush(deadline)
		s.courier.Stop()
		return s.be.Close()
	}
	go func() { // executions go on in this process under another handle's config: see shutdown
		s.run.Drain()
		s.courier.Stop()
		_ = s.be.Close()
	}()
	return nil
}

// sharedInProcess reports whether another open handle of this process works the same storage
// (a reload that changed how it is opened).
func (s *storage) sharedInProcess() bool {
	_, open := s.reg.storagesAt(s.set.where())
	for _, o := range open {
		if o != s {
			return true
		}
	}
	return false
}

// storageRef is one config's reference to one storage: the blocks naming it, checked against
// each other when the config loads, and the open storage the config holds from Start to
// Cleanup.
type storageRef struct {
	reg   *registry
	set   storageSpec
	log   *zap.Logger
	ready chan struct{}
	key   string   // the pool key, once started
	open  *storage // the open storage, once started; nil after Cleanup

	explicit  map[string]string        // storage-wide setting -> the value a block set explicitly
	endpoints map[string]*webhookSetup // every block's webhook endpoints, by name
	declared  map[string][]byte        // endpoint name -> what declares it, to compare blocks
}

// blockSpec is what one block asks of its storage.
type blockSpec struct {
	set      storageSpec
	explicit map[string]string // storage-wide settings the block set, as written
	webhooks *webhookSetup     // nil without webhooks
	declared *WebhooksConfig   // the webhooks as the block declares them (placeholders unexpanded)
}

// join adds a block to the reference, refusing settings that cannot hold for both blocks.
func (u *storageRef) join(b blockSpec) error {
	for name, v := range b.explicit {
		if prev, ok := u.explicit[name]; ok && prev != v && name == "encryption_key" {
			return fmt.Errorf("two mulligan blocks on storage %s set different encryption keys: a storage has one; give both blocks the same key", u.set.name())
		}
		if prev, ok := u.explicit[name]; ok && prev != v && name == "direct" {
			return fmt.Errorf("two mulligan blocks on storage %s name different direct DSNs: a storage has one; name the same in both, or in one only", u.set.name())
		}
		if prev, ok := u.explicit[name]; ok && prev != v {
			return fmt.Errorf("two mulligan blocks on storage %s set %s differently (%s and %s): it applies to the whole storage; set it the same in both, or in one only",
				u.set.name(), name, prev, v)
		}
		u.explicit[name] = v
		switch name {
		case "concurrency":
			u.set.concurrency = b.set.concurrency
		case "takeover":
			u.set.takeover = b.set.takeover
		case "durability":
			u.set.sync = b.set.sync
		case "encryption_key":
			u.set.key = b.set.key
		case "direct":
			u.set.direct = b.set.direct
		default:
			u.set.memory = mergeMemory(u.set.memory, b.set.memory, name)
		}
	}
	if b.webhooks == nil {
		return nil
	}
	for _, ec := range b.declared.Endpoints {
		id := endpointIdentity(ec, b.declared)
		if prev, ok := u.declared[ec.Name]; ok && string(prev) != string(id) {
			return fmt.Errorf("two mulligan blocks on storage %s declare webhook endpoint %q with different settings (URL, secrets or delivery options): its events are delivered from one outbox; give it one definition, or a different name in each block",
				u.set.name(), ec.Name)
		}
		u.declared[ec.Name], u.endpoints[ec.Name] = id, b.webhooks
	}
	return nil
}

// endpointIdentity is what makes two declarations of an endpoint the same: its URL, secrets
// and signature, and the delivery options of the block declaring it.
func endpointIdentity(ec EndpointConfig, w *WebhooksConfig) []byte {
	delivery := *w
	delivery.Endpoints, delivery.Default, delivery.Events = nil, "", nil
	b, _ := json.Marshal(struct {
		Endpoint EndpointConfig
		Delivery WebhooksConfig
	}{ec, delivery})
	return b
}

// newStorageRef starts the record of a storage's use by a config, from its first block.
func newStorageRef(reg *registry, set storageSpec, log *zap.Logger) *storageRef {
	return &storageRef{reg: reg, set: set, log: log, ready: make(chan struct{}), explicit: map[string]string{},
		endpoints: map[string]*webhookSetup{}, declared: map[string][]byte{}}
}

// storeStartWait bounds how long a request that arrives while its config is still starting
// waits for the storage.
const storeStartWait = 10 * time.Second

// acquire returns the storage once the config has opened it, and the function that lets it
// go. Apps start in no fixed order, so a request can reach a handler a moment before.
func (u *storageRef) acquire() (*storage, func(), error) {
	select {
	case <-u.ready:
	default:
		t := realClock.NewTimer(storeStartWait)
		defer t.Stop()
		select {
		case <-u.ready:
		case <-t.Chan():
			return nil, nil, store.ErrUnavailable
		}
	}
	if u.key == "" {
		return nil, nil, errStorageClosed
	}
	s, done, err := u.reg.acquireStorage(u.key)
	if errors.Is(err, errStorageClosed) {
		// A request that reached this config after it let go (a connection kept alive across a
		// reload): served on the handle a newer config holds on the same storage, if any.
		if keys, _ := u.reg.storagesAt(u.set.where()); len(keys) > 0 {
			return u.reg.acquireStorage(keys[len(keys)-1])
		}
	}
	return s, done, err
}

// directOf resolves a block's direct DSN (`storage postgres <dsn> { direct <dsn> }`): PostgreSQL
// only, and a DSN that parses, checked when the config loads.
func directOf(backend, direct string) (string, error) {
	if direct == "" {
		return "", nil
	}
	if backend != BackendPostgres {
		return "", errors.New("storage_direct (direct) applies to storage postgres only")
	}
	direct = caddy.NewReplacer().ReplaceAll(direct, "")
	if strings.TrimSpace(direct) == "" {
		return "", errors.New("storage postgres: direct needs a DSN (postgres://user:password@host:5432/db, or {env.MULLIGAN_STORAGE_DIRECT}); this one is empty once its placeholders are expanded")
	}
	if err := postgres.CheckDSN(direct); err != nil {
		return "", fmt.Errorf("storage postgres: direct: %w", err)
	}
	return direct, nil
}

// storageOf resolves a block's `storage` into its backend and location.
func storageOf(backend, location string) (string, string, error) {
	switch backend {
	case "", BackendBadger:
		if location == "" {
			location = filepath.Join(caddy.AppDataDir(), "mulligan")
		}
		abs, err := filepath.Abs(location)
		return BackendBadger, abs, err
	case BackendPostgres:
		location = caddy.NewReplacer().ReplaceAll(location, "")
		if strings.TrimSpace(location) == "" {
			return "", "", errors.New("storage postgres needs a DSN (postgres://user:password@host:5432/db, or {env.MULLIGAN_POSTGRES_URL})")
		}
		return BackendPostgres, location, nil
	default:
		return "", "", fmt.Errorf("storage backend must be %s or %s, got %q", BackendBadger, BackendPostgres, backend)
	}
}
