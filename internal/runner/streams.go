package runner

import (
	"context"
	"net/http"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"
	"go.uber.org/zap"

	"github.com/mulligan-gw/mulligan/internal/reqlog"
	"github.com/mulligan-gw/mulligan/internal/streams"
	"github.com/mulligan-gw/mulligan/store"
)

// opStream is the event stream of an operation's answer (a streams.Broadcast), for GET
// {operations}/{id}/result with Accept: text/event-stream (docs/streams.md), live while the
// runner's attempt receives it.
type opStream = streams.Broadcast

// opStreams are the streams of the operations this runner is executing, by operation id.
type opStreams struct {
	mu   sync.Mutex
	m    map[string]*opStream
	recs map[*opStream]*opRecording // each stream's copy to a shared store; nil: none
	// changed is closed when an attempt starts or ends, for followers waiting for an answer to
	// begin (await); nil until one waits.
	changed chan struct{}
}

// start registers a fresh stream for an attempt of operation id, copied to the store by rec
// when it is set.
func (o *opStreams) start(id string, rec *opRecording) *opStream {
	s := streams.NewBroadcast(nil)
	if rec != nil {
		s = streams.NewBroadcast(rec)
	}
	o.mu.Lock()
	if o.m == nil {
		o.m, o.recs = map[string]*opStream{}, map[*opStream]*opRecording{}
	}
	o.m[id], o.recs[s] = s, rec
	o.signal()
	o.mu.Unlock()
	return s
}

// end ends an attempt's stream and its recording, and forgets them.
func (o *opStreams) end(id string, s *opStream, whole bool) {
	o.mu.Lock()
	if o.m[id] == s {
		delete(o.m, id)
	}
	rec := o.recs[s]
	delete(o.recs, s)
	o.signal()
	o.mu.Unlock()
	rec.end(whole)
	if whole {
		s.Finish(streams.Whole)
	} else {
		s.Finish(streams.BrokeOff)
	}
}

// get returns the live event stream of operation id, or nil.
func (o *opStreams) get(id string) *opStream {
	o.mu.Lock()
	s := o.m[id]
	o.mu.Unlock()
	if s == nil || !s.Started() {
		return nil
	}
	return s
}

// StreamOf returns the live event stream of operation id on this runner, or nil.
func (r *Runner) StreamOf(id string) *opStream {
	if r == nil {
		return nil
	}
	return r.streams.get(id)
}

// opRecording copies an operation's streamed answer into a store shared by replicas, so that a
// follower on another replica than the one running the operation reads the stream there. It is
// a keyed stream's appender (streams.Live, group-committed beside the relay) on a stream named by
// the operation's own id and held by this attempt (store.OperationHolder): the store checks in
// each write that the operation still runs under this worker, so an attempt whose operation was
// taken over can neither replace nor write into the running attempt's stream, and followers
// read a stream whose holder lost the operation as aborted. A nil *opRecording records nothing.
type opRecording struct {
	clock  clockwork.Clock
	st     store.StreamRecorder
	id     string
	holder store.StreamHolder
	keep   time.Duration // how long the store keeps the events: the attempt's whole run, and a minute
	log    reqlog.Logger
	live   *streams.Live
}

// recordingFor returns what copies the stream of an attempt of operation id to a shared store,
// or nil when the storage is this process's alone (its followers are all here). Every backend
// records streams; only storage that replicas share, PostgreSQL, has followers elsewhere.
func (r *Runner) recordingFor(ctx context.Context, id string) *opRecording {
	if r.shared == nil {
		return nil
	}
	keep := time.Hour
	if dl, ok := ctx.Deadline(); ok {
		keep = r.clock.Until(dl) + 30*time.Second
	}
	return &opRecording{clock: r.clock, st: r.shared, id: id, holder: store.OperationHolder(r.worker), keep: keep + time.Minute,
		log: reqlog.New(r.log, zap.String("operation_id", id))}
}

// CurrentRecording reads the live recording of operation op's running attempt, or reports
// false when there is none: none begun yet, or one whose holder no longer holds the operation
// (taken over, or its lease ran out), which the store reads as aborted.
func (r *Runner) CurrentRecording(op *store.Operation) (store.StreamPage, bool) {
	if r == nil || r.shared == nil || op.Status != store.StatusRunning {
		return store.StreamPage{}, false
	}
	page, err := r.shared.ReadEvents([]byte(op.ID), 0, 0)
	if err != nil || page.State != store.StreamLive {
		return store.StreamPage{}, false
	}
	return page, true
}

// Begin implements streams.Copier: the recording begins with the answer's head.
func (o *opRecording) Begin(status int, header http.Header) {
	o.live = streams.NewLive(o.st, []byte(o.id), o.holder, status, header, o.keep)
	go o.live.AppendEvents(o.log)
}

// Add implements streams.Copier.
func (o *opRecording) Add(events []store.StreamEvent) {
	if o.live != nil && len(events) > 0 {
		o.live.Add(events)
	}
}

// end finishes the recording when the attempt's answer was whole and every event is stored,
// else aborts it; followers elsewhere then see the stream end the same way. A finished
// recording is kept a minute: by then the operation's stored result answers.
func (o *opRecording) end(whole bool) {
	if o == nil || o.live == nil {
		return
	}
	if o.live.Drain() && whole {
		err := o.st.FinishStream([]byte(o.id), o.holder, o.clock.Now().Add(time.Minute))
		if err == nil {
			return
		}
		o.log.Warn("finishing the recording of the operation's stream", zap.Error(err))
	}
	if err := o.st.AbortStream([]byte(o.id), o.holder); err != nil {
		o.log.Warn("ending the recording of the operation's stream", zap.Error(err))
	}
}

// FollowStored returns operation op's live stream as recorded in a shared store, from another
// replica than the one running it, with the page that found it; nil when there is none. It
// breaks off when the store reads it as aborted: the upstream broke off, or the operation
// stopped running under the holder that recorded it (a takeover after that replica died).
func (r *Runner) FollowStored(op *store.Operation) (*streams.Stored, store.StreamPage) {
	page, ok := r.CurrentRecording(op)
	if !ok {
		return nil, page
	}
	return streams.NewStored(r.shared, []byte(op.ID), page.Token, r.clock), page
}

// StoredProgress is the progress of operation op's stream as recorded in a shared store: its
// events and bytes so far; false when there is none.
func (r *Runner) StoredProgress(op *store.Operation) (events int, bytes int64, ok bool) {
	page, ok := r.CurrentRecording(op)
	if !ok {
		return 0, 0, false
	}
	return int(page.Events), page.Bytes, true
}
