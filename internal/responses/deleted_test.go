package responses

import (
	"bytes"
	"testing"

	"github.com/mulligan-gw/mulligan/store"
)

// keys holds the records of one test by key.
type keys map[string]*store.Record

func (k keys) LookupKey(key []byte) (*store.Record, error) { return k[string(key)], nil }

// A response is deleted once its record is there; the record is the response's own, by scope
// and id, and an operation that is not a response is never read as deleted.
func TestDeletedReadsTheResponsesOwnRecord(t *testing.T) {
	op := &store.Operation{ID: "resp_1", Scope: "alice", Kind: Kind}
	k := keys{}
	if gone, err := Deleted(k, op); gone || err != nil {
		t.Fatalf("before: %v %v", gone, err)
	}
	k[string(DeletedKey(op))] = &store.Record{}
	if gone, err := Deleted(k, op); !gone || err != nil {
		t.Fatalf("after: %v %v", gone, err)
	}
	other := *op
	other.Scope = "bob"
	if bytes.Equal(DeletedKey(&other), DeletedKey(op)) {
		t.Fatal("two scopes share a deletion record")
	}
	notResponse := *op
	notResponse.Kind = ""
	if gone, _ := Deleted(k, &notResponse); gone {
		t.Fatal("an operation that is not a response read as deleted")
	}
}
