package capacity

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"
	"go.uber.org/zap"
)

// StaleReads is how many reads of the model server's metrics in a row may fail before they
// count as stale, and latency steers the limit again (docs/capacity.md).
const StaleReads = 3

// WatchConfig is which model server's metrics a ServerWatch reads, and what saturates it.
type WatchConfig struct {
	Label      string // the pool as logs name it
	URL        string // the Prometheus endpoint
	Names      MetricNames
	Every      time.Duration // how often it is read; a read may take as long
	Saturation Saturation
}

// WatchOptions are what a ServerWatch is given to do its work.
type WatchOptions struct {
	Clock  clockwork.Clock
	Log    *zap.Logger
	Client *http.Client
	// Read is told how each read went (nil error: the metrics were applied); nil: nobody asks.
	Read func(error)
}

// ServerWatch reads one pool's model server metrics every interval and steers the pool's limit
// by them; it never holds up a call: a read that fails or is late only lets the metrics go
// stale.
type ServerWatch struct {
	pool *Pool
	cfg  WatchConfig
	o    WatchOptions
	stop chan struct{}
	done chan struct{}

	mu    sync.Mutex
	fresh bool // a read succeeded within the last StaleReads
	said  bool // the log has said whether they steer
}

// StartServerWatch reads cfg's metrics for p until Close.
func StartServerWatch(p *Pool, cfg WatchConfig, o WatchOptions) *ServerWatch {
	if o.Read == nil {
		o.Read = func(error) {}
	}
	w := &ServerWatch{pool: p, cfg: cfg, o: o, stop: make(chan struct{}), done: make(chan struct{})}
	go w.run()
	return w
}

// Close stops the watch and waits for it.
func (w *ServerWatch) Close() {
	close(w.stop)
	<-w.done
}

func (w *ServerWatch) run() {
	defer close(w.done)
	t := w.o.Clock.NewTicker(w.cfg.Every)
	defer t.Stop()
	missed := 0
	for {
		err := w.read()
		if err != nil {
			if missed++; missed == StaleReads {
				w.setFresh(false, err)
			}
		} else {
			missed = 0
			w.setFresh(true, nil)
		}
		w.o.Read(err)
		select {
		case <-w.stop:
			return
		case <-t.Chan():
		}
	}
}

// read fetches and applies the metrics once, within an interval. The fetch's own timeout is the
// network's, on real time; when the state read stops steering is the clock's.
func (w *ServerWatch) read() error {
	ctx, cancel := context.WithTimeout(context.Background(), w.cfg.Every)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, w.cfg.URL, nil)
	if err != nil {
		return err
	}
	resp, err := w.o.Client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("the model server's metrics answered %d", resp.StatusCode)
	}
	st, err := ParseServerState(resp.Body, w.cfg.Names)
	if err != nil {
		return err
	}
	w.pool.Follow(st, w.cfg.Saturation, w.o.Clock.Now().Add(StaleReads*w.cfg.Every))
	return nil
}

// setFresh notes whether the metrics steer the limit, saying so in the log the first time and
// when it changes (the metric is mulligan_capacity_server_metrics_fresh): an endpoint wrong or
// unreachable from the start is logged too, not only one that stops answering.
func (w *ServerWatch) setFresh(fresh bool, err error) {
	w.mu.Lock()
	changed := w.fresh != fresh || !w.said
	w.fresh, w.said = fresh, true
	w.mu.Unlock()
	switch {
	case changed && fresh:
		w.o.Log.Info("the model server's metrics steer the capacity limit", zap.String("pool", w.cfg.Label), zap.String("url", w.cfg.URL))
	case changed:
		w.o.Log.Warn("the model server's metrics are stale or unreachable; the capacity limit follows latency",
			zap.String("pool", w.cfg.Label), zap.String("url", w.cfg.URL), zap.Error(err))
	}
}
