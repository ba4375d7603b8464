package badger

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mulligan-gw/mulligan/store"
	"golang.org/x/sys/unix"
)

// A power cut after the WAL reached the disk and before the value log did leaves WAL entries
// pointing at value-log pages never written. The store opens on that image, serves every
// acknowledged record, and rolls back the writes whose values are gone, logging them: an
// operation never reads as final without its result, a queued one never fails the queue read.
func TestOpenAfterAPowerCutLostTheValueLogTail(t *testing.T) {
	for name, key := range map[string][]byte{"plain": nil, "encrypted": bytes.Repeat([]byte{3}, 32)} {
		t.Run(name, func(t *testing.T) { testOpenAfterAPowerCut(t, key) })
	}
}

func testOpenAfterAPowerCut(t *testing.T, encryptionKey []byte) {
	dir, image := t.TempDir(), t.TempDir()
	st, err := Open(Options{Dir: dir, Sync: true, EncryptionKey: encryptionKey})
	if err != nil {
		t.Fatal(err)
	}
	big := func(c byte) []byte { return bytes.Repeat([]byte{c}, 4<<10) } // above ValueThreshold: the value log
	accept := func(id string, key []byte, metadata []byte, body []byte) {
		t.Helper()
		op := &store.Operation{ID: id, Scope: "s", Status: store.StatusQueued, Retention: time.Hour, SubmittedAt: time.Now(), Metadata: metadata}
		ka := &store.KeyAccept{Key: key, Fingerprint: fpA, Response: store.Response{Status: 202, Body: []byte(id)}, Expires: time.Now().Add(time.Hour)}
		if _, err := st.AcceptOperation(op, &store.Request{Method: "POST", URL: "/v1/x", Body: body}, ka); err != nil {
			t.Fatal(err)
		}
	}
	// Acknowledged: each call returned after its sync.
	keyBig, keyA, keyC := bytes.Repeat([]byte{7}, 32), bytes.Repeat([]byte{8}, 32), bytes.Repeat([]byte{9}, 32)
	claim, err := st.ClaimKey(keyBig, fpA, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.CompleteKey(keyBig, claim.Token, store.Response{Status: 200, Body: big('k')}, time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	accept("op_a", keyA, nil, []byte("small"))
	vlogs := snapshotValueLogs(t, dir) // what the disk holds of the value log at this sync

	// Synced here, but in the image only their WAL entries reach the disk.
	if got, err := st.ClaimNext("w", time.Minute); err != nil || got == nil || got.ID != "op_a" {
		t.Fatalf("claimed %v, %v", got, err)
	}
	if _, err := st.Transition("op_a", store.Change{To: store.StatusSucceeded, Holder: "w", Result: &store.Response{Status: 200, Body: big('r')}}); err != nil {
		t.Fatal(err)
	}
	accept("op_c", keyC, []byte(fmt.Sprintf("%q", big('m'))), big('q'))
	copyImage(t, dir, image)
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	for name, data := range vlogs {
		writeSparse(t, filepath.Join(image, name), data)
	}

	log := &capturingLogger{}
	re, err := Open(Options{Dir: image, Sync: true, Logger: log, EncryptionKey: encryptionKey})
	if err != nil {
		t.Fatalf("the store does not open on the image a power cut leaves: %v", err)
	}
	defer re.Close()
	if rec, err := re.LookupKey(keyBig); err != nil || rec == nil || rec.State != store.Completed || !bytes.Equal(rec.Response.Body, big('k')) {
		t.Errorf("the acknowledged key with a value in the value log: %+v, %v", rec, err)
	}
	if rec, err := re.LookupKey(keyA); err != nil || rec == nil || rec.OperationID != "op_a" {
		t.Errorf("the acknowledged accept's key: %+v, %v", rec, err)
	}
	op, err := re.GetOperation("op_a")
	if err != nil || op.Status.Final() {
		t.Errorf("op_a after the rollback: %+v, %v; want it queued or running (its final write never reached the disk)", op, err)
	}
	if _, err := re.LoadResult("op_a"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("op_a's result: %v, want ErrNotFound", err)
	}
	if _, err := re.GetOperation("op_c"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("op_c, whose accept never reached the disk: %v, want ErrNotFound", err)
	}
	if rec, err := re.LookupKey(keyC); err != nil || rec != nil {
		t.Errorf("op_c's key: %+v, %v; want none (nothing was acknowledged)", rec, err)
	}
	// The recovery finds op_a again: queued, or running with a lease no process holds.
	queued, _ := re.OperationsIn(store.StatusQueued)
	expired, _ := re.ExpiredLeases(10)
	if len(queued)+len(expired) != 1 {
		t.Errorf("queued %v, expired %v; want op_a in one", queued, expired)
	}
	if !strings.Contains(log.String(), "rolled back") || !strings.Contains(log.String(), "o/op_c") {
		t.Errorf("nothing logged of the rollback: %q", log.String())
	}
}

type capturingLogger struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *capturingLogger) Errorf(f string, v ...any)   { l.printf(f, v...) }
func (l *capturingLogger) Warningf(f string, v ...any) { l.printf(f, v...) }
func (l *capturingLogger) Infof(string, ...any)        {}
func (l *capturingLogger) Debugf(string, ...any)       {}
func (l *capturingLogger) printf(f string, v ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	fmt.Fprintf(&l.b, f+"\n", v...)
}
func (l *capturingLogger) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// snapshotValueLogs reads the written extents of dir's value logs (Badger preallocates them
// sparse, hundreds of MiB).
func snapshotValueLogs(t *testing.T, dir string) map[string]map[int64][]byte {
	t.Helper()
	out := map[string]map[int64][]byte{}
	names, _ := filepath.Glob(filepath.Join(dir, "*.vlog"))
	for _, p := range names {
		out[filepath.Base(p)] = extents(t, p)
	}
	return out
}

// extents maps each data extent's offset in path to its bytes.
func extents(t *testing.T, path string) map[int64][]byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[int64][]byte{}
	for off := int64(0); ; {
		start, err := unix.Seek(int(f.Fd()), off, unix.SEEK_DATA)
		if err != nil {
			break // ENXIO: no data past off
		}
		end, err := unix.Seek(int(f.Fd()), start, unix.SEEK_HOLE)
		if err != nil {
			t.Fatal(err)
		}
		b := make([]byte, end-start)
		if _, err := f.ReadAt(b, start); err != nil && err != io.EOF {
			t.Fatal(err)
		}
		out[start], off = b, end
	}
	return out
}

// copyImage copies dir's files into image, sparse files as sparse.
func copyImage(t *testing.T, dir, image string) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Name() == "LOCK" || !e.Type().IsRegular() {
			continue
		}
		info, err := e.Info()
		if err != nil {
			t.Fatal(err)
		}
		dst := filepath.Join(image, e.Name())
		writeSparse(t, dst, extents(t, filepath.Join(dir, e.Name())))
		if err := os.Truncate(dst, info.Size()); err != nil {
			t.Fatal(err)
		}
	}
}

// writeSparse makes path hold extents and zeros elsewhere, keeping its size.
func writeSparse(t *testing.T, path string, data map[int64][]byte) {
	t.Helper()
	info, err := os.Stat(path)
	size := int64(0)
	if err == nil {
		size = info.Size()
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for off, b := range data {
		if _, err := f.WriteAt(b, off); err != nil {
			t.Fatal(err)
		}
		size = max(size, off+int64(len(b)))
	}
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
}

// A store closed cleanly reopens with nothing rolled back, and its check at open starts after
// the close's recorded sync.
func TestACleanReopenRollsNothingBack(t *testing.T) {
	dir := t.TempDir()
	st, err := Open(Options{Dir: dir, Sync: true})
	if err != nil {
		t.Fatal(err)
	}
	key := bytes.Repeat([]byte{5}, 32)
	c, err := st.ClaimKey(key, fpA, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	body := bytes.Repeat([]byte{'b'}, 4<<10)
	if err := st.CompleteKey(key, c.Token, store.Response{Status: 200, Body: body}, time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	log := &capturingLogger{}
	re, err := Open(Options{Dir: dir, Sync: true, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	defer re.Close()
	if rec, err := re.LookupKey(key); err != nil || rec == nil || !bytes.Equal(rec.Response.Body, body) {
		t.Errorf("after a clean reopen: %+v, %v", rec, err)
	}
	if log.String() != "" {
		t.Errorf("logged at a clean reopen: %q", log.String())
	}
	since, err := syncedVersion(re.sh.db)
	if err != nil || since == 0 {
		t.Errorf("the recorded sync: %d, %v; want the close's", since, err)
	}
}
