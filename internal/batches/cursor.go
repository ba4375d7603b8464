package batches

import (
	"io"

	"github.com/mulligan-gw/mulligan/store"
)

// A batch's input is read once: the worker keeps, per batch whose lines it is creating, the
// open file and how far it has read (docs/batches.md, How lines run). Without it each pass
// read the file again from its first line to the first line not created, so a batch of n
// lines created a window at a time read the file about n/window times over.

// maxCursors bounds the input files held open at once; a batch beyond them has its file
// reopened (and read up to its first line not created) when its turn comes.
const maxCursors = 16

// cursor is a batch's input file, read up to line (the last line scanned, 1-based).
type cursor struct {
	rc   io.Closer
	sc   lineScanner
	line int
	used uint64 // the pass that last used it, to drop the least recently used
}

// lineScanner is what a cursor reads lines with (a bufio.Scanner).
type lineScanner interface {
	Scan() bool
	Bytes() []byte
	Err() error
}

// cursorAt returns b's input cursor at b.Created, opening the file (or skipping lines another
// replica created) when it is not there. The file is looked up first even with a cursor open,
// so a file deleted since the last pass is known gone (ErrNotFound) before a buffered line of
// it is used.
func (w *Worker) cursorAt(b *store.Batch) (*cursor, error) {
	c := w.cursors[b.ID]
	if c != nil {
		if _, err := w.st.GetFile(b.InputFileID); err != nil {
			w.dropCursor(b.ID)
			return nil, err
		}
		if c.line > b.Created {
			w.dropCursor(b.ID) // behind the cursor: read again from the start
			c = nil
		}
	}
	if c == nil {
		rc, err := w.st.OpenFile(b.InputFileID)
		if err != nil {
			return nil, err
		}
		c = &cursor{rc: rc, sc: NewLineScanner(countReads(rc))}
		w.keepCursor(b.ID, c)
	}
	w.passes++
	c.used = w.passes
	for c.line < b.Created && c.sc.Scan() {
		c.line++
	}
	return c, nil
}

// keepCursor holds c for batch id, closing the least recently used cursor past maxCursors.
func (w *Worker) keepCursor(id string, c *cursor) {
	if len(w.cursors) >= maxCursors {
		oldest := ""
		for k, o := range w.cursors {
			if oldest == "" || o.used < w.cursors[oldest].used {
				oldest = k
			}
		}
		w.dropCursor(oldest)
	}
	w.cursors[id] = c
}

func (w *Worker) dropCursor(id string) {
	if c := w.cursors[id]; c != nil {
		_ = c.rc.Close()
		delete(w.cursors, id)
	}
}

func (w *Worker) dropCursors() {
	for id := range w.cursors {
		w.dropCursor(id)
	}
}

// countReads counts what is read from an input file in mulligan_batch_input_read_bytes_total.
func countReads(r io.Reader) io.Reader { return &readCounter{r: r} }

type readCounter struct{ r io.Reader }

func (c *readCounter) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	metrics.inputRead.Add(float64(n))
	return n, err
}
