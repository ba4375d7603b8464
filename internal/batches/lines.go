package batches

import (
	"bufio"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"unicode/utf8"

	"github.com/mulligan-gw/mulligan/store"
)

// A batch's input lines, as validated and turned into operations (docs/batches.md).

// MaxLineBytes bounds one input line: a line is read whole to be checked and stored.
const MaxLineBytes = 16 << 20

// maxBatchErrors bounds the errors a failed batch lists; the count of the rest is in the last.
const maxBatchErrors = 1000

// maxCustomIDBytes bounds a custom_id: it is kept in every line's operation and output line.
const maxCustomIDBytes = 512

// maxEchoBytes bounds a value of the caller's echoed in an error message, so a batch's errors
// stay small whatever the file holds.
const maxEchoBytes = 100

// echo is s as an error message quotes it: at most maxEchoBytes, cut at a character boundary.
func echo(s string) string {
	if len(s) <= maxEchoBytes {
		return strconv.Quote(s)
	}
	cut := maxEchoBytes
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return strconv.Quote(s[:cut]) + "..."
}

// InputLine is one line of a batch's input file (OpenAI's request input object).
type InputLine struct {
	CustomID *string         `json:"custom_id"`
	Method   string          `json:"method"`
	URL      string          `json:"url"`
	Body     json.RawMessage `json:"body"`
}

// NewLineScanner reads a file's lines, each up to MaxLineBytes.
func NewLineScanner(r io.Reader) *bufio.Scanner {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), MaxLineBytes)
	return sc
}

// ParseLine checks one line against the batch's endpoint; the error names what is wrong.
func ParseLine(raw []byte, endpoint string) (InputLine, *store.BatchError) {
	var in InputLine
	// Unmarshal, not a Decoder: a Decoder copies the whole line into its own buffer first, a
	// copy per line per read of the file (the batch heap profiles, docs/batches.md).
	if err := json.Unmarshal(raw, &in); err != nil {
		return in, &store.BatchError{Code: "invalid_json_line", Message: "This line is not a JSON object."}
	}
	switch {
	case in.CustomID == nil || *in.CustomID == "":
		return in, &store.BatchError{Code: "missing_required_parameter", Param: "custom_id", Message: "This line has no custom_id."}
	case len(*in.CustomID) > maxCustomIDBytes:
		return in, &store.BatchError{Code: "invalid_custom_id", Param: "custom_id",
			Message: fmt.Sprintf("custom_id %s is over %d bytes.", echo(*in.CustomID), maxCustomIDBytes)}
	case in.Method != "POST":
		return in, &store.BatchError{Code: "invalid_method", Param: "method", Message: "method must be POST."}
	case in.URL != endpoint:
		return in, &store.BatchError{Code: "invalid_url", Param: "url",
			Message: fmt.Sprintf("url %s differs from the batch's endpoint %q.", echo(in.URL), endpoint)}
	case len(in.Body) == 0 || in.Body[0] != '{':
		return in, &store.BatchError{Code: "invalid_body", Param: "body", Message: "body must be a JSON object."}
	}
	return in, nil
}

// ValidateLines reads the whole input: every line is checked and every custom_id must be
// unique. It returns the number of lines and the errors (at most maxBatchErrors kept). A
// custom_id is remembered as a 16-byte hash (a collision of SHA-256's first 128 bits is not a
// concern), so the memory is bounded by the line count, not by the ids' length.
func ValidateLines(r io.Reader, endpoint string) (int, []store.BatchError, error) {
	sc := NewLineScanner(r)
	seen := map[[16]byte]int{}
	var errs []store.BatchError
	n, more := 0, 0
	add := func(e store.BatchError) {
		if len(errs) < maxBatchErrors {
			errs = append(errs, e)
		} else {
			more++
		}
	}
	for sc.Scan() {
		n++
		in, bad := ParseLine(sc.Bytes(), endpoint)
		if bad == nil {
			h := customIDHash(*in.CustomID)
			if first, dup := seen[h]; dup {
				bad = &store.BatchError{Code: "duplicate_custom_id", Param: "custom_id",
					Message: fmt.Sprintf("custom_id %s was already used on line %d.", echo(*in.CustomID), first)}
			} else {
				seen[h] = n
			}
		}
		if bad != nil {
			bad.Line = n
			add(*bad)
		}
	}
	if err := sc.Err(); errors.Is(err, bufio.ErrTooLong) {
		add(store.BatchError{Code: "line_too_long", Line: n + 1, Message: fmt.Sprintf("This line is over %d bytes.", MaxLineBytes)})
	} else if err != nil {
		return 0, nil, err
	}
	if more > 0 {
		errs = append(errs, store.BatchError{Code: "too_many_errors", Message: fmt.Sprintf("%d more lines have errors.", more)})
	}
	return n, errs, nil
}

// customIDHash is the first 16 bytes of a custom_id's SHA-256: what validation remembers of it.
func customIDHash(id string) [16]byte {
	sum := sha256.Sum256([]byte(id))
	return [16]byte(sum[:16])
}
