package store

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
)

// filled returns an Operation with every field, nested ones included, set to a value that is
// not zero, distinct per field: a field added to Operation that the codec does not carry fails
// TestOperationCodecKeepsEveryField. Fields tagged json:"-" are not stored and stay zero.
func filled(t testing.TB) *Operation {
	op := new(Operation)
	n := 0
	fill(t, reflect.ValueOf(op).Elem(), &n)
	return op
}

var (
	timeType  = reflect.TypeFor[time.Time]()
	rawType   = reflect.TypeFor[json.RawMessage]()
	bytesType = reflect.TypeFor[[]byte]()
)

func fill(t testing.TB, v reflect.Value, n *int) {
	*n++
	switch v.Type() {
	case timeType:
		v.Set(reflect.ValueOf(time.Unix(1_700_000_000+int64(*n), int64(*n))))
		return
	case rawType: // JSON, as the JSON form of a record needs it
		v.SetBytes(fmt.Appendf(nil, `{"n":%d}`, *n))
		return
	case bytesType:
		v.SetBytes(fmt.Appendf(nil, "bytes %d", *n))
		return
	}
	switch v.Kind() {
	case reflect.String:
		v.SetString(strings.Repeat("x", *n))
	case reflect.Int, reflect.Int64:
		v.SetInt(-int64(*n) * 1_000_003) // negative and wide: signs and varint lengths survive
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Float64:
		v.SetFloat(float64(*n) + 0.25)
	case reflect.Slice:
		s := reflect.MakeSlice(v.Type(), 2, 2)
		for i := range 2 {
			fill(t, s.Index(i), n)
		}
		v.Set(s)
	case reflect.Pointer:
		v.Set(reflect.New(v.Type().Elem()))
		fill(t, v.Elem(), n)
	case reflect.Struct:
		for i := range v.NumField() {
			if v.Type().Field(i).Tag.Get("json") == "-" {
				continue
			}
			fill(t, v.Field(i), n)
		}
	default:
		t.Fatalf("the operation codec test cannot fill a %s (%s): teach fill and the codec", v.Type(), v.Kind())
	}
}

func TestOperationCodecKeepsEveryField(t *testing.T) {
	op := filled(t)
	op.ScopeLimit = 5 // not stored
	got, err := DecodeOperation(EncodeOperation(op))
	if err != nil {
		t.Fatal(err)
	}
	op.ScopeLimit = 0
	if !reflect.DeepEqual(got, op) {
		t.Fatalf("round trip lost a field:\n got %+v\nwant %+v", got, op)
	}
}

func TestOperationCodecKeepsZeroAndEmpty(t *testing.T) {
	for _, op := range []*Operation{
		{},
		{ID: "op_1", Status: StatusQueued, SubmittedAt: time.Unix(0, 0), Exec: &Execution{}, Error: &OperationError{}},
		{ID: "op_2", Result: &ResultMeta{Size: 1 << 30}, Exec: &Execution{Events: []string{"", "operation.running"}, RetryOn: []int{0, 503}}},
	} {
		got, err := DecodeOperation(EncodeOperation(op))
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, op) {
			t.Fatalf("round trip:\n got %+v\nwant %+v", got, op)
		}
	}
}

// An operation a release before the binary form stored (JSON) still reads, and the same.
func TestOperationCodecReadsJSONRecords(t *testing.T) {
	op := filled(t)
	old, err := Encode(op, nil)
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeOperation(old)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(EncodeOperation(got), EncodeOperation(op)) {
		t.Fatalf("a JSON record reads differently:\n got %+v\nwant %+v", got, op)
	}
}

// A field number this release does not know (written by a later one) is skipped.
func TestOperationCodecSkipsUnknownFields(t *testing.T) {
	v := EncodeOperation(&Operation{ID: "op_1", Attempts: 2})
	v = protowire.AppendTag(v, 1000, protowire.BytesType)
	v = protowire.AppendString(v, "later")
	v = protowire.AppendTag(v, 1001, protowire.Fixed64Type)
	v = protowire.AppendFixed64(v, 7)
	got, err := DecodeOperation(v)
	if err != nil {
		t.Fatal(err)
	}
	if got.ID != "op_1" || got.Attempts != 2 {
		t.Fatalf("got %+v", got)
	}
}

func TestOperationCodecRejectsCorruptValues(t *testing.T) {
	good := EncodeOperation(filled(t))
	wrongType := protowire.AppendTag([]byte{operationVersion}, opID, protowire.VarintType)
	wrongType = protowire.AppendVarint(wrongType, 1)
	for name, v := range map[string][]byte{
		"empty":           nil,
		"unknown version": {9, 1, 2},
		"truncated":       good[:len(good)-3],
		"bad length":      {operationVersion, byte(opID<<3 | 2), 0xff, 0xff, 0x7f},
		"wrong wire type": wrongType,
		"bad JSON":        {1, 2, '{', 'x'},
	} {
		if op, err := DecodeOperation(v); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: decoded %+v, %v; want ErrCorrupt", name, op, err)
		}
	}
}

func FuzzDecodeOperation(f *testing.F) {
	f.Add(EncodeOperation(filled(f)))
	f.Add(EncodeOperation(&Operation{ID: "op_1", Exec: &Execution{RetryOn: []int{503}}}))
	old, _ := Encode(&Operation{ID: "op_1", Status: StatusSucceeded, SubmittedAt: time.Unix(5, 0)}, nil)
	f.Add(old)
	f.Fuzz(func(t *testing.T, v []byte) {
		op, err := DecodeOperation(v)
		if err != nil {
			return
		}
		once := EncodeOperation(op)
		again, err := DecodeOperation(once)
		if err != nil {
			t.Fatalf("re-encoding a decoded operation broke it: %v", err)
		}
		if !bytes.Equal(EncodeOperation(again), once) {
			t.Fatalf("a decoded operation does not encode the same twice: %+v", op)
		}
	})
}

func BenchmarkOperationCodec(b *testing.B) {
	op := filled(b)
	jsonValue, _ := Encode(op, nil)
	binValue := EncodeOperation(op)
	b.Run("encode/binary", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			EncodeOperation(op)
		}
	})
	b.Run("encode/json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_, _ = Encode(op, nil)
		}
	})
	b.Run("decode/binary", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_, _ = DecodeOperation(binValue)
		}
	})
	b.Run("decode/json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_, _ = DecodeOperation(jsonValue)
		}
	})
	b.Logf("sizes: binary %d bytes, JSON %d bytes", len(binValue), len(jsonValue))
}
