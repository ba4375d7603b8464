package store

import (
	"bytes"
	"net/http"
	"testing"
	"time"
)

func TestDecodeRejectsCorruptRecords(t *testing.T) {
	for _, v := range [][]byte{nil, {9, 1}, {1}, {1, 200, 1}, {1, 2, '{', '}'}} {
		if _, err := DecodeRecord(v); err == nil && len(v) < 4 {
			t.Errorf("decoded %v", v)
		}
	}
}

func TestRecordCodecRoundTrips(t *testing.T) {
	now := time.Now()
	for _, rec := range []*Record{
		{State: InFlight, Fingerprint: fpA, Token: "tok", ClaimedAt: now, LeaseUntil: now.Add(time.Minute)},
		{State: Completed, Fingerprint: fpB, OperationID: "op_1", ClaimedAt: now, ExpiresAt: now.Add(time.Hour),
			Response: &Response{Status: 202, Header: http.Header{"A": {"1", "2"}, "Content-Type": {"application/json"}}, Body: []byte(`{"x":1}`)}},
		{State: Completed, Fingerprint: fpA, Response: &Response{Status: 204, Header: http.Header{}}},
	} {
		v, err := EncodeRecord(rec)
		if err != nil {
			t.Fatal(err)
		}
		got, err := DecodeRecord(v)
		if err != nil {
			t.Fatal(err)
		}
		if got.State != rec.State || !bytes.Equal(got.Fingerprint, rec.Fingerprint) || got.Token != rec.Token || got.OperationID != rec.OperationID ||
			!got.ClaimedAt.Equal(rec.ClaimedAt) || !got.LeaseUntil.Equal(rec.LeaseUntil) || !got.ExpiresAt.Equal(rec.ExpiresAt) {
			t.Fatalf("round trip: %+v -> %+v", rec, got)
		}
		if (rec.Response == nil) != (got.Response == nil) {
			t.Fatal("response lost or invented")
		}
		if rec.Response != nil && (got.Response.Status != rec.Response.Status || !bytes.Equal(got.Response.Body, rec.Response.Body) ||
			len(got.Response.Header) != len(rec.Response.Header) || got.Response.Header.Get("A") != rec.Response.Header.Get("A")) {
			t.Fatalf("response: %+v -> %+v", rec.Response, got.Response)
		}
	}
}

func FuzzDecodeRecord(f *testing.F) {
	v, _ := EncodeRecord(&Record{State: Completed, Fingerprint: fpA, Response: &Response{Status: 200, Header: http.Header{"A": {"b"}}, Body: []byte("x")}})
	f.Add(v)
	f.Add([]byte{2, 1, 0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Fuzz(func(t *testing.T, v []byte) {
		rec, err := DecodeRecord(v)
		if err != nil {
			return
		}
		again, err := EncodeRecord(rec)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := DecodeRecord(again); err != nil {
			t.Fatalf("re-encoding a decoded record broke it: %v", err)
		}
	})
}

// Two fingerprints, as the record codec's tests use them.
var (
	fpA = bytes.Repeat([]byte{2}, 32)
	fpB = bytes.Repeat([]byte{3}, 32)
)
