package batches

import (
	"bufio"
	"encoding/json"
	"errors"
	"io"
	"strings"

	"github.com/mulligan-gw/mulligan/store"
)

// A batch's output and error files are assembled when read, in line order, from each line's
// stored operation and result (docs/batches.md): nothing is copied, and memory holds one line.
// Their sizes are counted as the lines settle (LineBytes), so a file object is read without
// assembling its file.

// outputLine is OpenAI's batch output (and error) line.
type outputLine struct {
	ID       string        `json:"id"`
	CustomID string        `json:"custom_id"`
	Response *lineResponse `json:"response"`
	Error    *lineError    `json:"error"`
}

type lineResponse struct {
	StatusCode int             `json:"status_code"`
	RequestID  string          `json:"request_id"`
	Body       json.RawMessage `json:"body"`
}

type lineError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// WriteLines writes b's output lines (succeeded) or error lines (every other final
// line) to w, and returns the bytes written.
func WriteLines(w io.Writer, st store.Operations, b *store.Batch, succeeded bool) (int64, error) {
	cw := &countingWriter{w: bufio.NewWriterSize(w, 32<<10)}
	enc := json.NewEncoder(cw)
	for line := 1; line <= b.Created; line++ {
		op, err := st.GetOperation(store.LineOperationID(b.ID, line))
		if errors.Is(err, store.ErrNotFound) {
			continue // past its retention
		}
		if err != nil {
			return cw.n, err
		}
		if !op.Status.Final() || (op.Status == store.StatusSucceeded) != succeeded {
			continue
		}
		out, err := lineOf(st, op)
		if err != nil {
			return cw.n, err
		}
		if err := enc.Encode(out); err != nil {
			return cw.n, err
		}
	}
	return cw.n, cw.w.(*bufio.Writer).Flush()
}

// lineOf is line operation op's output line, with its stored result.
func lineOf(st store.Operations, op *store.Operation) (outputLine, error) {
	var res *store.Response
	if op.Result != nil {
		r, err := st.LoadResult(op.ID)
		switch {
		case err == nil:
			res = r
		case !errors.Is(err, store.ErrNotFound):
			return outputLine{}, err
		}
	}
	return lineWith(op, res), nil
}

// lineWith is line operation op's output line: the upstream's response res when there was
// one, else why the line did not run.
func lineWith(op *store.Operation, res *store.Response) outputLine {
	out := outputLine{ID: "batch_req_" + strings.TrimPrefix(op.ID, "op_batch_"), CustomID: op.Batch.CustomID}
	if res != nil {
		out.Response = &lineResponse{StatusCode: res.Status, RequestID: res.Header.Get(headerRequestID), Body: jsonBody(res.Body)}
		if out.Response.RequestID == "" {
			out.Response.RequestID = op.ID
		}
		return out
	}
	out.Error = &lineError{Code: store.LineCancelled, Message: "The batch was cancelled before this request finished."}
	if e := op.Error; e != nil {
		out.Error = &lineError{Code: e.Code, Message: e.Message}
	}
	return out
}

// LineBytes is every storage's batch line sizer: the bytes line operation op, just final with
// the upstream response res, takes in its file, as WriteLines writes it (json.Marshal
// and an Encoder write the same bytes; the Encoder adds the newline).
func LineBytes(op *store.Operation, res *store.Response) int64 {
	b, err := json.Marshal(lineWith(op, res))
	if err != nil {
		return -1
	}
	return int64(len(b)) + 1
}

// FileBytes is the size of b's output file (output) or error file: counted as its lines
// settled, or, for a batch some of whose lines were counted without a size (settled by a
// previous release), found by assembling the file.
func FileBytes(st store.Operations, b *store.Batch, output bool) (int64, error) {
	switch c := b.FileBytes; {
	case c == nil:
		return WriteLines(io.Discard, st, b, output)
	case output:
		return c.Output, nil
	default:
		return c.Errors, nil
	}
}

// jsonBody is body as JSON: itself when it is JSON, else a JSON string of it.
func jsonBody(body []byte) json.RawMessage {
	if json.Valid(body) {
		return body
	}
	s, _ := json.Marshal(string(body))
	return s
}

type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// headerRequestID is the upstream's request id a line's response shows (docs/batches.md).
const headerRequestID = "X-Request-Id"
