package consumer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// journalFile is the journal's name inside Config.Dir.
const journalFile = "journal.jsonl"

// Record kinds: a verified event was accepted, or it was handled.
const (
	kindReceived  = "received"
	kindProcessed = "processed"
)

// Outcomes of handling an event, written in processed records.
const (
	outcomeProcessed = "processed" // Process was called
	outcomeStale     = "stale"     // not newer than what was processed; ignored
)

// record is one line of the journal; see the package documentation.
type record struct {
	Kind string    `json:"kind"`
	ID   string    `json:"id"` // the webhook-id
	At   time.Time `json:"at"`
	// Event is the verified body (received records only).
	Event json.RawMessage `json:"event,omitempty"`
	// The rest are for processed records: what happened and, when the event
	// was processed, the operation state it made known.
	Outcome     string `json:"outcome,omitempty"`
	OperationID string `json:"operation_id,omitempty"`
	Version     int64  `json:"version,omitempty"`
	Final       bool   `json:"final,omitempty"`
}

// journal is the append-only JSON-lines file that makes deduplication and
// the queue survive restarts. It is safe for concurrent use.
type journal struct {
	mu   sync.Mutex
	file *os.File
	size int64 // bytes of complete lines; the next record is written here
}

// openJournal opens (creating) Dir/journal.jsonl and returns it with its
// records. A torn last line, left by a crash in the middle of a write, is
// cut off so the next append starts on a line of its own.
func openJournal(dir string) (*journal, []record, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, nil, err
	}
	path := filepath.Join(dir, journalFile)
	file, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, nil, err
	}
	records, size, err := readRecords(file)
	if err == nil {
		err = syncDir(dir) // the file's directory entry must survive a crash too
	}
	if err != nil {
		file.Close()
		return nil, nil, fmt.Errorf("journal %s: %w", path, err)
	}
	return &journal{file: file, size: size}, records, nil
}

// readRecords parses every complete line, truncates a torn tail and
// returns the records and the size of the complete lines.
func readRecords(file *os.File) ([]record, int64, error) {
	data, err := io.ReadAll(file)
	if err != nil {
		return nil, 0, err
	}
	complete := bytes.LastIndexByte(data, '\n') + 1
	if complete < len(data) {
		if err := truncate(file, int64(complete)); err != nil {
			return nil, 0, err
		}
	}
	var records []record
	for i, line := range bytes.Split(data[:complete], []byte{'\n'}) {
		if len(line) == 0 {
			continue
		}
		var r record
		if err := json.Unmarshal(line, &r); err != nil {
			// A complete line that does not parse is corruption, not a torn
			// write: refuse to start rather than forget what it held.
			return nil, 0, fmt.Errorf("line %d: %w", i+1, err)
		}
		records = append(records, r)
	}
	return records, int64(complete), nil
}

// append writes r as one line and fsyncs it: once append returns nil, the
// record survives a crash or power loss.
func (j *journal) append(r record) error {
	line, err := json.Marshal(r) // compact: a JSON value holds no raw newline
	if err != nil {
		return err
	}
	line = append(line, '\n')
	j.mu.Lock()
	defer j.mu.Unlock()
	_, err = j.file.WriteAt(line, j.size)
	if err == nil {
		err = j.file.Sync()
	}
	if err != nil {
		// Cut off what may have been written (disk full, say): the caller
		// reports failure, and a partial line would run into the next record.
		return errors.Join(err, truncate(j.file, j.size))
	}
	j.size += int64(len(line))
	return nil
}

// close closes the file.
func (j *journal) close() error {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.file.Close()
}

// truncate cuts file to size, durably.
func truncate(file *os.File, size int64) error {
	if err := file.Truncate(size); err != nil {
		return err
	}
	return file.Sync()
}

// syncDir fsyncs a directory so a newly created file in it is durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
