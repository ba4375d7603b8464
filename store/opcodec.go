package store

import (
	"encoding/json"
	"fmt"
	"math"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
)

// Operations are read and written on every step of their life, so Badger stores them in a
// binary form of their own rather than as JSON (docs/backends.md, "Operations on disk"): a
// version byte, then numbered fields in protobuf's wire format (protowire: tags, varints,
// length-delimited bytes), each present only when not zero, a nested message for each pointer
// field. A reader skips the field numbers it does not know, so a field added later is read as
// absent by a release without it. Values written before this form (version 1, the JSON of
// Encode) still decode.
const operationVersion = 3

// The field numbers of Operation and of its nested messages; a number is never reused.
const (
	opID protowire.Number = iota + 1
	opScope
	opServer
	opStatus
	opVersion
	opMethod
	opPath
	opIdempotencyKey
	opSubmittedAt
	opStartedAt
	opFinishedAt
	opCancelRequestedAt
	opAttempts
	opRetention
	opError
	opResult
	opCallback
	opHolder
	opLeaseUntil
	opExec
	opType
	opMetadata
	opUpdatedAt
	opTraceparent
	opTracestate
	opUrgency
	opQueueDeadline
	opBatch
	opKind
	opEcho
	opFairKey
	opWeight
	opLift
	opCharged
	opChargedBand
	opChargedNewcomer
	opNewcomersCharged
)

// EncodeOperation is the stored form of op (DecodeOperation reads it). ScopeLimit is not
// stored.
func EncodeOperation(op *Operation) []byte {
	b := make([]byte, 0, 320)
	b = append(b, operationVersion)
	b = appendString(b, opID, op.ID)
	b = appendString(b, opScope, op.Scope)
	b = appendString(b, opServer, op.Server)
	b = appendString(b, opStatus, string(op.Status))
	b = appendInt(b, opVersion, op.Version)
	b = appendString(b, opMethod, op.Method)
	b = appendString(b, opPath, op.Path)
	b = appendString(b, opIdempotencyKey, op.IdempotencyKey)
	b = appendTime(b, opSubmittedAt, op.SubmittedAt)
	b = appendTime(b, opStartedAt, op.StartedAt)
	b = appendTime(b, opFinishedAt, op.FinishedAt)
	b = appendTime(b, opCancelRequestedAt, op.CancelRequestedAt)
	b = appendInt(b, opAttempts, int64(op.Attempts))
	b = appendInt(b, opRetention, int64(op.Retention))
	if e := op.Error; e != nil {
		b = appendMessage(b, opError, func(b []byte) []byte {
			b = appendString(b, 1, e.Code)
			b = appendString(b, 2, e.Message)
			return appendBool(b, 3, e.Retryable)
		})
	}
	if r := op.Result; r != nil {
		b = appendMessage(b, opResult, func(b []byte) []byte {
			b = appendInt(b, 1, int64(r.Status))
			b = appendString(b, 2, r.ContentType)
			return appendInt(b, 3, int64(r.Size))
		})
	}
	if c := op.Callback; c != nil {
		b = appendMessage(b, opCallback, func(b []byte) []byte {
			return appendString(appendString(b, 1, c.Endpoint), 2, c.URL)
		})
	}
	b = appendString(b, opHolder, op.Holder)
	b = appendTime(b, opLeaseUntil, op.LeaseUntil)
	if op.Exec != nil {
		b = appendMessage(b, opExec, op.Exec.appendTo)
	}
	b = appendString(b, opType, op.Type)
	if len(op.Metadata) > 0 {
		b = protowire.AppendTag(b, opMetadata, protowire.BytesType)
		b = protowire.AppendBytes(b, op.Metadata)
	}
	b = appendTime(b, opUpdatedAt, op.UpdatedAt)
	b = appendString(b, opTraceparent, op.Traceparent)
	b = appendString(b, opTracestate, op.Tracestate)
	b = appendInt(b, opUrgency, int64(op.Urgency))
	b = appendTime(b, opQueueDeadline, op.QueueDeadline)
	if l := op.Batch; l != nil {
		b = appendMessage(b, opBatch, func(b []byte) []byte {
			b = appendString(b, 1, l.Batch)
			b = appendInt(b, 2, int64(l.Line))
			return appendString(b, 3, l.CustomID)
		})
	}
	b = appendString(b, opKind, op.Kind)
	b = appendString(b, opFairKey, op.FairKey)
	b = appendInt(b, opWeight, int64(math.Float64bits(op.Weight))) // the bits: exact
	b = appendInt(b, opLift, int64(op.Lift))
	b = appendInt(b, opCharged, op.Charged)
	b = appendInt(b, opChargedBand, int64(op.ChargedBand))
	b = appendBool(b, opChargedNewcomer, op.ChargedNewcomer)
	b = appendInt(b, opNewcomersCharged, op.NewcomersCharged)
	if len(op.Echo) > 0 {
		b = protowire.AppendTag(b, opEcho, protowire.BytesType)
		b = protowire.AppendBytes(b, op.Echo)
	}
	return b
}

func (e *Execution) appendTo(b []byte) []byte {
	b = appendInt(b, 1, int64(e.Timeout))
	b = appendInt(b, 2, int64(e.Retries))
	if len(e.RetryOn) > 0 {
		b = appendMessage(b, 3, func(b []byte) []byte {
			for _, s := range e.RetryOn {
				b = protowire.AppendVarint(b, protowire.EncodeZigZag(int64(s)))
			}
			return b
		})
	}
	b = appendInt(b, 4, e.MaxResult)
	b = appendString(b, 5, e.OnCrash)
	for _, ev := range e.Events {
		b = protowire.AppendTag(b, 6, protowire.BytesType)
		b = protowire.AppendString(b, ev)
	}
	return appendString(b, 7, e.Prefix)
}

// DecodeOperation reads what EncodeOperation wrote, or an operation stored as JSON by Encode;
// anything else is ErrCorrupt.
func DecodeOperation(v []byte) (*Operation, error) {
	op := new(Operation)
	var err error
	switch {
	case len(v) == 0:
		return nil, ErrCorrupt
	case v[0] == operationVersion:
		err = eachField(v[1:], op.setField)
	default:
		_, err = Decode(v, op)
	}
	if err != nil {
		return nil, err
	}
	return op, nil
}

func (op *Operation) setField(f field) {
	switch f.num {
	case opID:
		op.ID = f.string()
	case opScope:
		op.Scope = f.string()
	case opServer:
		op.Server = f.string()
	case opStatus:
		op.Status = Status(f.string())
	case opVersion:
		op.Version = f.int()
	case opMethod:
		op.Method = f.string()
	case opPath:
		op.Path = f.string()
	case opIdempotencyKey:
		op.IdempotencyKey = f.string()
	case opSubmittedAt:
		op.SubmittedAt = f.time()
	case opStartedAt:
		op.StartedAt = f.time()
	case opFinishedAt:
		op.FinishedAt = f.time()
	case opCancelRequestedAt:
		op.CancelRequestedAt = f.time()
	case opAttempts:
		op.Attempts = int(f.int())
	case opRetention:
		op.Retention = time.Duration(f.int())
	case opError:
		op.Error = new(OperationError)
		f.message(op.Error.setField)
	case opResult:
		op.Result = new(ResultMeta)
		f.message(op.Result.setField)
	case opCallback:
		op.Callback = new(Callback)
		f.message(op.Callback.setField)
	case opHolder:
		op.Holder = f.string()
	case opLeaseUntil:
		op.LeaseUntil = f.time()
	case opExec:
		op.Exec = new(Execution)
		f.message(op.Exec.setField)
	case opType:
		op.Type = f.string()
	case opMetadata:
		op.Metadata = json.RawMessage(f.bytes())
	case opUpdatedAt:
		op.UpdatedAt = f.time()
	case opTraceparent:
		op.Traceparent = f.string()
	case opTracestate:
		op.Tracestate = f.string()
	case opUrgency:
		op.Urgency = int(f.int())
	case opQueueDeadline:
		op.QueueDeadline = f.time()
	case opBatch:
		op.Batch = new(BatchLine)
		f.message(op.Batch.setField)
	case opKind:
		op.Kind = f.string()
	case opFairKey:
		op.FairKey = f.string()
	case opWeight:
		op.Weight = math.Float64frombits(uint64(f.int()))
	case opEcho:
		op.Echo = f.bytes()
	case opLift:
		op.Lift = int(f.int())
	case opCharged:
		op.Charged = f.int()
	case opChargedBand:
		op.ChargedBand = int(f.int())
	case opChargedNewcomer:
		op.ChargedNewcomer = f.int() != 0
	case opNewcomersCharged:
		op.NewcomersCharged = f.int()
	}
}

func (e *OperationError) setField(f field) {
	switch f.num {
	case 1:
		e.Code = f.string()
	case 2:
		e.Message = f.string()
	case 3:
		e.Retryable = f.int() != 0
	}
}

func (r *ResultMeta) setField(f field) {
	switch f.num {
	case 1:
		r.Status = int(f.int())
	case 2:
		r.ContentType = f.string()
	case 3:
		r.Size = int(f.int())
	}
}

func (c *Callback) setField(f field) {
	switch f.num {
	case 1:
		c.Endpoint = f.string()
	case 2:
		c.URL = f.string()
	}
}

func (e *Execution) setField(f field) {
	switch f.num {
	case 1:
		e.Timeout = time.Duration(f.int())
	case 2:
		e.Retries = int(f.int())
	case 3:
		e.RetryOn = f.packedInts(e.RetryOn)
	case 4:
		e.MaxResult = f.int()
	case 5:
		e.OnCrash = f.string()
	case 6:
		e.Events = append(e.Events, f.string())
	case 7:
		e.Prefix = f.string()
	}
}

func (l *BatchLine) setField(f field) {
	switch f.num {
	case 1:
		l.Batch = f.string()
	case 2:
		l.Line = int(f.int())
	case 3:
		l.CustomID = f.string()
	}
}

// field is one field of a message as eachField found it: a varint (x) or length-delimited
// bytes (b). A getter of the other kind marks the message corrupt.
type field struct {
	num protowire.Number
	typ protowire.Type
	x   uint64
	b   []byte
	bad *bool
}

func (f field) want(t protowire.Type) bool {
	if f.typ != t {
		*f.bad = true
		return false
	}
	return true
}

func (f field) string() string {
	if !f.want(protowire.BytesType) {
		return ""
	}
	return string(f.b)
}

func (f field) bytes() []byte {
	if !f.want(protowire.BytesType) {
		return nil
	}
	return append([]byte(nil), f.b...)
}

func (f field) int() int64 {
	if !f.want(protowire.VarintType) {
		return 0
	}
	return protowire.DecodeZigZag(f.x)
}

// time reads a time written by appendTime: Unix nanoseconds, present only for a non-zero time.
func (f field) time() time.Time {
	if !f.want(protowire.VarintType) {
		return time.Time{}
	}
	return time.Unix(0, protowire.DecodeZigZag(f.x))
}

func (f field) message(set func(field)) {
	if f.want(protowire.BytesType) && eachField(f.b, set) != nil {
		*f.bad = true
	}
}

func (f field) packedInts(out []int) []int {
	if !f.want(protowire.BytesType) {
		return out
	}
	for b := f.b; len(b) > 0; {
		x, n := protowire.ConsumeVarint(b)
		if n < 0 {
			*f.bad = true
			return out
		}
		out, b = append(out, int(protowire.DecodeZigZag(x))), b[n:]
	}
	return out
}

// eachField hands set every varint and length-delimited field of message m, in order; fields
// of other wire types are skipped, as unknown numbers are by the setters.
func eachField(m []byte, set func(field)) error {
	bad := false
	for len(m) > 0 {
		num, typ, n := protowire.ConsumeTag(m)
		if n < 0 {
			return fmt.Errorf("%w: %v", ErrCorrupt, protowire.ParseError(n))
		}
		m = m[n:]
		f := field{num: num, typ: typ, bad: &bad}
		switch typ {
		case protowire.VarintType:
			f.x, n = protowire.ConsumeVarint(m)
		case protowire.BytesType:
			f.b, n = protowire.ConsumeBytes(m)
		default:
			n = protowire.ConsumeFieldValue(num, typ, m)
		}
		if n < 0 {
			return fmt.Errorf("%w: %v", ErrCorrupt, protowire.ParseError(n))
		}
		m = m[n:]
		if typ == protowire.VarintType || typ == protowire.BytesType {
			set(f)
		}
		if bad {
			return fmt.Errorf("%w: field %d has the wrong wire type", ErrCorrupt, num)
		}
	}
	return nil
}

func appendString(b []byte, num protowire.Number, s string) []byte {
	if s == "" {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendString(b, s)
}

func appendInt(b []byte, num protowire.Number, x int64) []byte {
	if x == 0 {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.VarintType)
	return protowire.AppendVarint(b, protowire.EncodeZigZag(x))
}

func appendBool(b []byte, num protowire.Number, v bool) []byte {
	if !v {
		return b
	}
	return appendInt(b, num, 1)
}

// appendTime writes t as Unix nanoseconds (the range time.Unix covers: years 1678 to 2262),
// omitted when t is zero, so that the Unix epoch itself still reads back as itself.
func appendTime(b []byte, num protowire.Number, t time.Time) []byte {
	if t.IsZero() {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.VarintType)
	return protowire.AppendVarint(b, protowire.EncodeZigZag(t.UnixNano()))
}

// appendMessage writes the nested message that body appends, length-prefixed, in place: the
// length takes one byte unless the message is 128 bytes or more, when the body is moved up.
func appendMessage(b []byte, num protowire.Number, body func([]byte) []byte) []byte {
	b = protowire.AppendTag(b, num, protowire.BytesType)
	at := len(b)
	b = body(append(b, 0))
	n := len(b) - at - 1
	if n < 0x80 {
		b[at] = byte(n)
		return b
	}
	grow := protowire.SizeVarint(uint64(n)) - 1
	b = append(b, make([]byte, grow)...)
	copy(b[at+1+grow:], b[at+1:at+1+n])
	protowire.AppendVarint(b[:at], uint64(n))
	return b
}
