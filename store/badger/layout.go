package badger

import (
	"encoding/binary"

	"github.com/mulligan-gw/mulligan/store"
)

// Key layout. Every key starts with a one-letter family and a slash, so families never collide
// and each can be scanned by prefix. Operation ids sort by creation time, so the queue and the
// scope index are in time order.
const (
	prefixIdempotency = "i/" // i/<32-byte record key>        -> idempotency record
	prefixOperation   = "o/" // o/<op id>                     -> operation
	prefixRequest     = "r/" // r/<op id>                     -> the request to send (until final)
	prefixResult      = "x/" // x/<op id>                     -> the upstream response (for retention)
	prefixQueue       = "q/" // q/<op id>                     -> (empty) queued, FIFO
	prefixRunning     = "u/" // u/<op id>                     -> (empty) running
	prefixScope       = "s/" // s/<scope hash>/<op id>        -> (empty) the scope's operations
	prefixEvent       = "e/" // e/<event id>                  -> webhook event
	prefixPending     = "p/" // p/<due, 8 bytes>/<event id>   -> (empty) pending, by due time
	prefixDead        = "d/" // d/<event id>                  -> (empty) dead letter
	prefixEndpoint    = "n/" // n/<endpoint name>             -> endpoint state
	prefixStreamHead  = "t/" // t/<stream id>                 -> a recorded stream's state
	prefixStreamEvent = "v/" // v/<stream id><token>/<seq, 8 bytes> -> events from seq on (a segment)
	prefixStreamID    = "y/" // y/<stream id><token>/<event id>     -> its seq (upstream ids only)
	keyPing           = "m/ping"
	keySynced         = "m/synced" // the newest commit version a sync covered (recovery.go)
)

func idempotencyKey(k []byte) []byte { return append([]byte(prefixIdempotency), k...) }
func operationKey(id string) []byte  { return []byte(prefixOperation + id) }
func requestKey(id string) []byte    { return []byte(prefixRequest + id) }
func resultKey(id string) []byte     { return []byte(prefixResult + id) }

func streamHeadKey(k []byte) []byte { return append([]byte(prefixStreamHead), k...) }

// A stream's id is a record key (a SHA-256: 32 bytes) or an operation's id (never a '/' in it),
// and the token is 32 hex digits, so the '/' ending one stream's prefix falls where the other's
// ends too: one stream's prefix is never a prefix of another's.
func streamEventPrefix(k []byte, token string) []byte {
	return append(append(append([]byte(prefixStreamEvent), k...), token...), '/')
}

func streamEventKey(k []byte, token string, seq uint64) []byte {
	return binary.BigEndian.AppendUint64(streamEventPrefix(k, token), seq)
}

func streamIDPrefix(k []byte, token string) []byte {
	return append(append(append([]byte(prefixStreamID), k...), token...), '/')
}

func streamIDKey(k []byte, token, id string) []byte { return append(streamIDPrefix(k, token), id...) }

func scopeIndexKey(scope, id string) []byte { return []byte(prefixScope + scope + "/" + id) }

// indexPrefix is the index family of the statuses that have one.
func indexPrefix(s store.Status) []byte {
	switch s {
	case store.StatusQueued:
		return []byte(prefixQueue)
	case store.StatusRunning:
		return []byte(prefixRunning)
	}
	return nil
}
