package module

import "github.com/mulligan-gw/mulligan/store"

// Lookup by key (GET {operations}?idempotency_key=<key>, docs/api.md) walks the caller's own
// operations, newest first, and keeps those submitted with the key. The key's idempotency
// record cannot answer it: the record is named by scope, method, route path and key, and a
// lookup knows neither the method nor the path. Walking the scope's list needs no index to keep
// in step in every backend, and is scope-checked by construction (it reads only the caller's
// list). Its cost is one operation read per operation walked: a recent key is found at once,
// and one call walks at most keyLookupPages pages, answering next_after to go on from.
const (
	keyLookupPages    = 20
	keyLookupPageSize = 100
)

// listFunc lists a scope's operations like store.Operations.ListOperations.
type listFunc func(scope string, status store.Status, after string, limit int) ([]*store.Operation, string, error)

// withKey is list keeping only the operations submitted with key.
func withKey(list listFunc, key string) listFunc {
	return func(scope string, status store.Status, after string, limit int) ([]*store.Operation, string, error) {
		var found []*store.Operation
		for range keyLookupPages {
			ops, next, err := list(scope, status, after, keyLookupPageSize)
			if err != nil {
				return nil, "", err
			}
			for i, op := range ops {
				if op.IdempotencyKey != key {
					continue
				}
				if found = append(found, op); len(found) == limit {
					if i == len(ops)-1 && next == "" {
						return found, "", nil
					}
					return found, op.ID, nil
				}
			}
			if next == "" {
				return found, "", nil
			}
			after = next
		}
		return found, after, nil
	}
}
