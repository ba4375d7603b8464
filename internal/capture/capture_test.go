package capture

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
)

func TestTeeHoldsAWholeAnswerUntilRelease(t *testing.T) {
	client := httptest.NewRecorder()
	tee := NewTee(client, 1<<10)
	tee.Header().Set("Content-Type", "application/json")
	tee.Header().Set("Connection", "close")
	tee.WriteHeader(http.StatusCreated)
	_, _ = tee.Write([]byte(`{"ok":true}`))
	if client.Body.Len() != 0 {
		t.Fatalf("the client had %q before release", client.Body.String())
	}
	rec := tee.Recorded()
	if rec.Status != http.StatusCreated || string(rec.Body) != `{"ok":true}` || rec.Header.Get("Connection") != "" {
		t.Fatalf("recorded %+v", rec)
	}
	tee.Release()
	if client.Code != http.StatusCreated || client.Body.String() != `{"ok":true}` {
		t.Fatalf("client got %d %q", client.Code, client.Body.String())
	}
}

func TestTeeSendsAnAnswerPastTheLimitAtOnce(t *testing.T) {
	client := httptest.NewRecorder()
	tee := NewTee(client, 4)
	_, _ = tee.Write([]byte("0123456789"))
	if !tee.Recorded().Over || client.Body.String() != "0123456789" {
		t.Fatalf("over %v, client %q", tee.Recorded().Over, client.Body.String())
	}
}

func TestBufferFailsWritesPastItsLimit(t *testing.T) {
	b := NewBuffer(4)
	if _, err := b.Write([]byte("0123456789")); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("err %v", err)
	}
	if r := b.Result(); !r.Over || r.Status != http.StatusOK || len(r.Body) != 0 {
		t.Fatalf("result %+v", r)
	}
}
