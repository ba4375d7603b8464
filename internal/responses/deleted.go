package responses

import (
	"net/http"

	"github.com/mulligan-gw/mulligan/internal/idemkey"
	"github.com/mulligan-gw/mulligan/store"
)

// A deleted response answers 404 from then on, on every replica and through the operations
// API too (docs/responses.md): a record beside the idempotency keys marks it, so that every
// replica reads it from the shared store.

// KeyReader is the store's role a deletion is read through.
type KeyReader interface {
	LookupKey(key []byte) (*store.Record, error)
}

// Deleted reports whether op is a background response that was deleted.
func Deleted(keys KeyReader, op *store.Operation) (bool, error) {
	if op.Kind != Kind {
		return false, nil
	}
	rec, err := keys.LookupKey(DeletedKey(op))
	return err == nil && rec != nil, err
}

// DeletedKey names the record that marks op deleted.
func DeletedKey(op *store.Operation) []byte {
	return idemkey.Record(op.Scope, http.MethodDelete, "responses", op.ID)
}
