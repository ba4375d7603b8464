package responses

import (
	"context"
	"encoding/json"
	"strconv"
	"time"

	"github.com/dgraph-io/ristretto/v2"
	"github.com/jonboulle/clockwork"

	"github.com/mulligan-gw/mulligan/internal/streams"
	"github.com/mulligan-gw/mulligan/store"
)

// Store is what reading a background response asks of the gateway, for one call: the
// operation as stored, the running attempt's stream, the recorded answer within the memory
// budget, and the wait for an answer to begin. The request path implements it over its
// storage and runner; this package never reaches past it.
type Store interface {
	// GetOperation is the operation id as stored now.
	GetOperation(id string) (*store.Operation, error)
	// Live is the running attempt's stream of op, here or on another replica; nil when none
	// has begun.
	Live(op *store.Operation) streams.Source
	// LoadResult is op's recorded answer (nil when it has none), with times its size reserved
	// from the bytes the gateway holds in memory at once until release gives them back; it
	// fails when the reservation does not fit (docs/responses.md, Limits).
	LoadResult(op *store.Operation, times int64) (res *store.Response, release func(), err error)
	// AwaitAnswer waits until op's answer begins as a stream, op ends, or a while passes, and
	// returns op as it then is; nil when the client left.
	AwaitAnswer(op *store.Operation) *store.Operation
}

// A Reader reads background responses for one call: their objects as a poll sees them and
// their event streams (docs/responses.md).
type Reader struct {
	Store Store
	// Clock decides the stream's keep-alive and how long a follower waits for a response to
	// settle: the gateway's one clock.
	Clock clockwork.Clock
	// Context is the call's: the client leaving ends the stream and its waits.
	Context context.Context
	// Objects keeps the final objects of finished responses across calls.
	Objects *Objects
	// KeepAlive is how often a stream writes an SSE comment; zero is KeepAlive.
	KeepAlive time.Duration
}

// KeepAlive is how often a response's stream writes an SSE comment, which clients ignore, so
// that proxies with an idle timeout (often 60 s) keep it open while it waits for a seat or for
// a slow model's next event (docs/responses.md).
const KeepAlive = 15 * time.Second

// Object is op's response object as it stands: from its request while it waits or runs, from
// the final event of its recorded answer once it has finished, failed with the reason when
// the answer carries no final object.
func (rd *Reader) Object(op *store.Operation) (Object, error) {
	created := op.SubmittedAt.Unix()
	switch op.Status {
	case store.StatusQueued:
		return Base(op.ID, created, Queued, op.Echo), nil
	case store.StatusRunning:
		o := Base(op.ID, created, InProgress, op.Echo)
		if out := rd.partialOutput(op); out != nil {
			o["output"] = out
		}
		return o, nil
	case store.StatusCanceled:
		return Base(op.ID, created, Cancelled, op.Echo), nil
	}
	key := op.ID + "@" + strconv.FormatInt(op.Version, 10) // a final op's version moves no more
	if o, ok := rd.Objects.get(key); ok {
		return o, nil
	}
	res, release, err := rd.Store.LoadResult(op, 2) // the answer, and its final event decoded
	if err != nil {
		return nil, err
	}
	defer release()
	o := FinalObject(op, res)
	rd.Objects.set(key, o)
	return o, nil
}

// partialOutput is the output the running attempt of op has streamed so far, here or on
// another replica; nil when none has begun.
func (rd *Reader) partialOutput(op *store.Operation) []any {
	src := rd.Store.Live(op)
	if src == nil {
		return nil
	}
	var p Partial
	for cursor := uint64(0); ; {
		evs, _, _, err := src.Next(cursor)
		if err != nil || len(evs) == 0 {
			return p.Output()
		}
		for _, e := range evs {
			if e.Seq > cursor {
				p.Add(e.Data)
				cursor = e.Seq
			}
		}
	}
}

// FinalObject is the final response object of a finished op whose recorded answer is res (nil
// when none was kept): the upstream's final object with the gateway's id, else failed with the
// upstream's error or the operation's.
func FinalObject(op *store.Operation, res *store.Response) Object {
	created := op.SubmittedAt.Unix()
	failed := func(code, message string) Object {
		return Base(op.ID, created, Failed, op.Echo).Failure(code, message)
	}
	if res != nil && op.Status == store.StatusSucceeded {
		if o, ok := Final(res.Header.Get("Content-Type"), res.Body); ok {
			return o.Own(op.ID, created)
		}
		return failed("UPSTREAM_ERROR", "The upstream's answer ended without a final response event.")
	}
	if res != nil {
		if code, msg, ok := UpstreamError(res.Body); ok {
			return failed(code, msg)
		}
	}
	if op.Error != nil {
		return failed(op.Error.Code, op.Error.Message)
	}
	return failed("UPSTREAM_ERROR", "The upstream call failed.")
}

// Objects keeps the final objects of finished responses, encoded, so that the polls of one
// read its recorded answer once, not each time (docs/responses.md, Limits): ristretto's
// cost-bounded cache, by bytes. One is shared by every call of the process.
type Objects struct {
	c *ristretto.Cache[string, []byte]
}

// The final objects kept at most, in bytes, and the largest one kept.
const (
	objectsBytes    = 32 << 20
	maxCachedObject = 1 << 20
)

// NewObjects returns an empty cache of final objects.
func NewObjects() *Objects {
	c, err := ristretto.NewCache(&ristretto.Config[string, []byte]{NumCounters: 1 << 16, MaxCost: objectsBytes, BufferItems: 64})
	if err != nil {
		panic(err) // only a config out of range
	}
	return &Objects{c}
}

// Wait returns once the objects set so far are kept (ristretto admits them in the background).
func (c *Objects) Wait() { c.c.Wait() }

func (c *Objects) get(key string) (Object, bool) {
	if b, ok := c.c.Get(key); ok {
		return DecodeObject(b)
	}
	return nil, false
}

func (c *Objects) set(key string, o Object) {
	if b, err := json.Marshal(o); err == nil && len(b) <= maxCachedObject {
		c.c.Set(key, b, int64(len(b)))
	}
}
