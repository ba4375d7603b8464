// Package postgres is the PostgreSQL backend of store.Backend: any number of gateway replicas on
// one database act as one gateway (docs/backends.md). Decisions (what a claim answers, the state
// machine, what an outbox step does to an event) are store's; this package stores, fences and
// finds, each step in one transaction.
package postgres

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mulligan-gw/mulligan/store"
)

// Options configures a Store.
type Options struct {
	// DSN locates the database: a URL (postgres://user:password@host:5432/db?sslmode=require) or
	// keyword/value pairs, as libpq takes them. It may go through a connection pooler in
	// transaction mode (PgBouncer), which Open recognises (pooler.go).
	DSN string
	// DirectDSN, when the DSN goes through a pooler, reaches the same database without it: what
	// needs a session (the migration lock, LISTEN for wake-ups) uses it, one connection at a
	// time. Without it, a pooled store does not migrate (ErrMigrationsNeedSession) and its
	// replica polls for work.
	DirectDSN string
	// Now is the clock; nil means time.Now. Replicas compare operations' leases on their own
	// clocks, so they must agree to well within `takeover` (NTP does); shared seats are leased on
	// the database's clock instead (seats.go).
	Now func() time.Time
	// Timeout bounds each call; past it the call fails with store.ErrUnavailable. Zero: 5s.
	Timeout time.Duration
	// MaxConns is the size of the connection pool; zero: the DSN's pool_max_conns, else 8. One
	// more connection (the direct DSN's, when the DSN goes through a pooler; none without one)
	// listens for wake-ups.
	MaxConns int32
	// SweepEvery is how often the retention sweep runs (on one replica at a time); zero: one
	// minute; negative: never (Sweep may still be called).
	SweepEvery time.Duration
	// DeadLetterRetention is how long a dead letter is kept; zero: 30 days.
	DeadLetterRetention time.Duration
	// Logger receives what goes wrong in the background (the listener, the sweep); nil discards.
	Logger store.Logger
	// ReplayCacheBytes bounds the completed records this replica keeps in memory, so that a
	// replay costs no round trip (docs/backends.md); zero: 32 MiB; negative: no cache.
	ReplayCacheBytes int64
	// ReplayCacheFor is how long a cached record is trusted without hearing of its eviction:
	// the longest a replica replays a key evicted elsewhere when the notice is lost; zero: 5s.
	ReplayCacheFor time.Duration

	// tracer sees every statement the pool sends (tests count round trips with it).
	tracer pgx.QueryTracer
}

// Defaults of Options.
const (
	DefaultTimeout             = 5 * time.Second
	DefaultMaxConns            = 8
	DefaultSweepEvery          = time.Minute
	DefaultDeadLetterRetention = 30 * 24 * time.Hour
)

// Store is one replica's handle on the database.
type Store struct {
	pool      *pgxpool.Pool
	opts      Options
	now       func() time.Time
	announcer atomic.Pointer[store.Announcer]
	batchAnn  batchAnnouncerSlot
	settled   atomic.Pointer[func(*store.Batch)]
	wake      chan struct{}
	notifyCh  chan struct{}
	seats     *seatNotices // seatnotice.go
	replays   *replayCache
	pooled    bool // the DSN goes through a connection pooler (pooler.go)
	// claiming lets one ClaimNext of this replica at a time hold a connection: its workers'
	// claims would otherwise take the pool from the accepts while each waits for its commit's
	// flush, and compete for the same head of the queue (docs/backends.md, "The capacity order").
	claiming sync.Mutex

	base   context.Context // canceled by Close
	cancel context.CancelFunc
	bg     sync.WaitGroup
	closed atomic.Bool
}

// The Store is a store.Backend.
var _ store.Backend = (*Store)(nil)

// Open connects to the database, applies the migrations it lacks (under an advisory lock, so
// replicas starting together do not race), and starts listening for wake-ups and sweeping.
// Through a connection pooler the lock and LISTEN go over DirectDSN; without one the database
// must be migrated already, and the replica polls (pooler.go).
func Open(ctx context.Context, opts Options) (*Store, error) {
	if opts.DSN == "" {
		return nil, errors.New("postgres: no DSN given")
	}
	cfg, err := pgxpool.ParseConfig(opts.DSN)
	if err != nil {
		return nil, fmt.Errorf("postgres: %w", withoutDSN(err)) // a bad DSN is a configuration error, not an outage
	}
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultTimeout
	}
	if opts.MaxConns <= 0 && !sizesPool(opts.DSN) {
		opts.MaxConns = DefaultMaxConns
	}
	if opts.SweepEvery == 0 {
		opts.SweepEvery = DefaultSweepEvery
	}
	if opts.DeadLetterRetention <= 0 {
		opts.DeadLetterRetention = DefaultDeadLetterRetention
	}
	if opts.ReplayCacheBytes == 0 {
		opts.ReplayCacheBytes = DefaultReplayCacheBytes
	}
	if opts.ReplayCacheFor <= 0 {
		opts.ReplayCacheFor = DefaultReplayCacheFor
	}
	if opts.MaxConns > 0 {
		cfg.MaxConns = opts.MaxConns
	}
	if opts.tracer != nil {
		cfg.ConnConfig.Tracer = opts.tracer
	}
	if cfg.ConnConfig.ConnectTimeout == 0 || cfg.ConnConfig.ConnectTimeout > opts.Timeout {
		cfg.ConnConfig.ConnectTimeout = opts.Timeout
	}
	direct, err := parseDirect(opts.DirectDSN)
	if err != nil {
		return nil, err
	}
	pooled, err := throughPooler(ctx, cfg.ConnConfig)
	if err != nil {
		return nil, unavailable(err)
	}
	// session is where the migration lock and LISTEN go: the direct DSN, else the DSN itself
	// when no pooler stands in between; nil means neither has a session to offer.
	session := direct
	if session == nil && !pooled {
		session = cfg.ConnConfig.Copy()
	}
	if session != nil && (session.ConnectTimeout == 0 || session.ConnectTimeout > opts.Timeout) {
		session.ConnectTimeout = opts.Timeout
	}
	if pooled && !setsExecMode(opts.DSN) {
		cfg.ConnConfig.DefaultQueryExecMode = pooledExecMode
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, unavailable(err)
	}
	if session != nil {
		err = migrateOver(ctx, session, opts.Logger)
	} else {
		err = checkMigrated(ctx, pool, opts.Logger)
	}
	if err != nil {
		pool.Close()
		if errors.Is(err, ErrSchemaOutOfRange) || errors.Is(err, ErrMigrationsNeedSession) {
			return nil, err // a deployment error, not an outage
		}
		return nil, unavailable(fmt.Errorf("migrating: %w", err))
	}
	if err := ensureNewcomers(ctx, pool); err != nil {
		pool.Close()
		return nil, unavailable(err)
	}
	s := &Store{pool: pool, opts: opts, now: opts.Now, wake: make(chan struct{}, 1), notifyCh: make(chan struct{}, 1),
		seats: newSeatNotices(), replays: newReplayCache(opts.ReplayCacheBytes, opts.ReplayCacheFor), pooled: pooled}
	if s.now == nil {
		s.now = time.Now
	}
	s.base, s.cancel = context.WithCancel(context.Background())
	s.bg.Add(2)
	go s.notifier()
	go s.seatNotifier()
	if session != nil {
		s.bg.Add(1)
		go s.listen(session)
	} else if opts.Logger != nil {
		opts.Logger.Infof("postgres: the storage DSN goes through a connection pooler and no direct DSN is named: no LISTEN, this replica polls for work, and replays are read from the database")
	}
	if opts.SweepEvery > 0 {
		s.bg.Add(1)
		go s.sweepEvery(opts.SweepEvery)
	}
	return s, nil
}

// Close stops the background work and closes the pool. It is safe to call more than once.
func (s *Store) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
	s.cancel()
	s.bg.Wait()
	s.pool.Close()
	return nil
}

// Ping reports whether the database answers; it writes nothing.
func (s *Store) Ping() error {
	ctx, cancel, err := s.ctx()
	if err != nil {
		return err
	}
	defer cancel()
	return unavailable(s.pool.Ping(ctx))
}

// Size reports the database's size in bytes, 0 when it cannot be read.
func (s *Store) Size() int64 {
	ctx, cancel, err := s.ctx()
	if err != nil {
		return 0
	}
	defer cancel()
	var n int64
	if err := s.pool.QueryRow(ctx, `SELECT pg_database_size(current_database())`).Scan(&n); err != nil {
		return 0
	}
	return n
}

// ctx is the context of one call: bounded by Timeout, canceled by Close.
func (s *Store) ctx() (context.Context, context.CancelFunc, error) {
	if s.closed.Load() {
		return nil, nil, store.ErrClosed
	}
	ctx, cancel := context.WithTimeout(s.base, s.opts.Timeout)
	return ctx, cancel, nil
}

// do runs fn in a transaction, mapping database failures to store.ErrUnavailable. fn's domain
// errors (store.ErrNotFound, ErrNotHolder, ErrIllegalTransition) pass through as they are.
func (s *Store) do(fn func(ctx context.Context, tx pgx.Tx) error) error {
	ctx, cancel, err := s.ctx()
	if err != nil {
		return err
	}
	defer cancel()
	return unavailable(retrySafe(func() error {
		var settled []*store.Batch
		tctx := context.WithValue(ctx, settledKey{}, &settled)
		err := pgx.BeginFunc(tctx, s.pool, func(tx pgx.Tx) error { return fn(tctx, tx) })
		if err == nil {
			s.tellSettled(settled)
		}
		return err
	}))
}

// retrySafe runs fn again, once, when it failed before anything reached the server: after the
// database restarted, each pooled connection fails that way once.
func retrySafe(fn func() error) error {
	err := fn()
	if err != nil && pgconn.SafeToRetry(err) {
		err = fn()
	}
	return err
}

// sizesPool reports whether dsn sets pool_max_conns (pgxpool reads it): an operator's pool size
// is kept, not overridden by the default.
func sizesPool(dsn string) bool {
	c, err := pgconn.ParseConfig(dsn)
	return err == nil && c.RuntimeParams["pool_max_conns"] != ""
}

// execer writes: the pool, a transaction, or a pipeline of a transaction's writes.
type execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// pipeline queues a transaction's writes to send them together, in one round trip (pgx's
// batch), where nothing between them reads what an earlier one wrote. Its Exec answers no
// command tag: a write whose rows affected matter goes through the transaction itself.
type pipeline struct{ b pgx.Batch }

func (p *pipeline) Exec(_ context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	p.b.Queue(sql, args...)
	return pgconn.CommandTag{}, nil
}

// send runs the queued writes in tx, in order; the first that fails is the error.
func (p *pipeline) send(ctx context.Context, tx pgx.Tx) error {
	if p.b.Len() == 0 {
		return nil
	}
	return tx.SendBatch(ctx, &p.b).Close()
}

// querier is the pool or a transaction.
type querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// query runs fn outside a transaction, with the same error mapping as do.
func (s *Store) query(fn func(ctx context.Context, db querier) error) error {
	ctx, cancel, err := s.ctx()
	if err != nil {
		return err
	}
	defer cancel()
	return unavailable(retrySafe(func() error { return fn(ctx, s.pool) }))
}

// domain marks errors that are answers, not failures of the database (a store.Answer).
type domain struct{ error }

func (d domain) Unwrap() error { return d.error }

// StoreAnswer makes domain a store.Answer.
func (d domain) StoreAnswer() error { return d.error }

// answer marks err, when there is one, as an answer.
func answer(err error) error {
	if err == nil {
		return nil
	}
	return domain{err}
}

// unavailable wraps a failure of the database in store.ErrUnavailable (callers answer 503
// STORAGE_UNAVAILABLE) and unwraps domain answers: store.Unavailable.
func unavailable(err error) error { return store.Unavailable(err) }

func (s *Store) logf(format string, args ...any) {
	if s.opts.Logger != nil {
		s.opts.Logger.Warningf(format, args...)
	}
}
