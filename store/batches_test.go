package store

import "testing"

func TestBatchOfLineFindsTheBatchOfALineOperationOnly(t *testing.T) {
	for id, want := range map[string]string{
		LineOperationID("batch_06h3abc", 12): "batch_06h3abc",
		"op_06h3abc":                         "",
		"op_batch_":                          "",
	} {
		if got := BatchOfLine(id); got != want {
			t.Errorf("BatchOfLine(%q) = %q, want %q", id, got, want)
		}
	}
}
