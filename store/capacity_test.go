package store

import (
	"encoding/json"
	"testing"
)

func TestOperationStoredWithoutUrgencyReadsAsTheDefault(t *testing.T) {
	var old, set Operation
	if err := json.Unmarshal([]byte(`{"id":"op_1","status":"queued"}`), &old); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(`{"id":"op_2","status":"queued","urgency":0}`), &set); err != nil {
		t.Fatal(err)
	}
	if old.Urgency != DefaultUrgency || old.ID != "op_1" || set.Urgency != 0 {
		t.Fatalf("without urgency %d (want %d), with urgency 0: %d", old.Urgency, DefaultUrgency, set.Urgency)
	}
}
