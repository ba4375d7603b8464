package store

// Key layout. Every key starts with a one-letter family and a slash, so families never collide
// and each can be scanned by prefix.
const (
	prefixIdempotency = "i/" // i/<32-byte record key>          -> idempotency record
	keyPing           = "m/ping"
)

func idempotencyKey(k []byte) []byte {
	return append([]byte(prefixIdempotency), k...)
}
