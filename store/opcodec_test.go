package store

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
)

// filled returns an Operation with every field, nested ones included, set to a value that is
// not zero, distinct per field: a field added to Operation that the codec does not carry fails
// TestOperationCodecKeepsEveryField. ScopeLimit is not stored and stays zero.
func filled(t testing.TB) *Operation {
	return filledValue[Operation](t, "ScopeLimit")
}

// filledValue is a T with every field but those named in skip filled as filled fills them.
func filledValue[T any](t testing.TB, skip ...string) *T {
	v := new(T)
	f := filler{t: t, skip: skip}
	f.fill(reflect.ValueOf(v).Elem())
	return v
}

// filler sets values that are not zero, distinct per field (its count n), skipping the fields
// named in skip.
type filler struct {
	t    testing.TB
	n    int
	skip []string
}

var (
	timeType  = reflect.TypeFor[time.Time]()
	rawType   = reflect.TypeFor[json.RawMessage]()
	bytesType = reflect.TypeFor[[]byte]()
)

func (f *filler) fill(v reflect.Value) {
	f.n++
	n := f.n
	switch v.Type() {
	case timeType:
		v.Set(reflect.ValueOf(time.Unix(1_700_000_000+int64(n), int64(n))))
		return
	case rawType: // JSON, as the JSON form of a record needs it
		v.SetBytes(fmt.Appendf(nil, `{"n":%d}`, n))
		return
	case bytesType:
		v.SetBytes(fmt.Appendf(nil, "bytes %d", n))
		return
	}
	switch v.Kind() {
	case reflect.String:
		v.SetString(strings.Repeat("x", n))
	case reflect.Int, reflect.Int64:
		v.SetInt(-int64(n) * 1_000_003) // negative and wide: signs and varint lengths survive
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Uint8: // a byte of a body
		v.SetUint(uint64('a' + n%26))
	case reflect.Float64:
		v.SetFloat(float64(n) + 0.25)
	case reflect.Slice:
		s := reflect.MakeSlice(v.Type(), 2, 2)
		for i := range 2 {
			f.fill(s.Index(i))
		}
		v.Set(s)
	case reflect.Map:
		m := reflect.MakeMap(v.Type())
		for range 2 {
			k, e := reflect.New(v.Type().Key()).Elem(), reflect.New(v.Type().Elem()).Elem()
			f.fill(k)
			f.fill(e)
			m.SetMapIndex(k, e)
		}
		v.Set(m)
	case reflect.Pointer:
		v.Set(reflect.New(v.Type().Elem()))
		f.fill(v.Elem())
	case reflect.Struct:
		for i := range v.NumField() {
			if !slices.Contains(f.skip, v.Type().Field(i).Name) {
				f.fill(v.Field(i))
			}
		}
	default:
		f.t.Fatalf("the codec tests cannot fill a %s (%s): teach fill and the codec", v.Type(), v.Kind())
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

// Every field of a request and of a response survives the round trip, bodies included.
func TestRequestAndResponseCodecsKeepEveryField(t *testing.T) {
	req := filledValue[Request](t)
	got, err := DecodeRequest(EncodeRequest(req))
	if err != nil || !reflect.DeepEqual(got, req) {
		t.Fatalf("request round trip (%v):\n got %+v\nwant %+v", err, got, req)
	}
	resp := filledValue[Response](t)
	back, err := DecodeResponse(EncodeResponse(resp))
	if err != nil || !reflect.DeepEqual(back, resp) {
		t.Fatalf("response round trip (%v):\n got %+v\nwant %+v", err, back, resp)
	}
}

// A request or response stored as JSON (Encode, the body after it) still reads, and the same;
// an absent header reads as an empty one, in either form.
func TestRequestAndResponseCodecsReadJSONRecords(t *testing.T) {
	req := filledValue[Request](t)
	old, err := Encode(req, req.Body)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := DecodeRequest(old); err != nil || !reflect.DeepEqual(got, req) {
		t.Fatalf("a JSON request reads differently (%v):\n got %+v\nwant %+v", err, got, req)
	}
	resp := filledValue[Response](t)
	if old, err = Encode(resp, resp.Body); err != nil {
		t.Fatal(err)
	}
	if got, err := DecodeResponse(old); err != nil || !reflect.DeepEqual(got, resp) {
		t.Fatalf("a JSON response reads differently (%v):\n got %+v\nwant %+v", err, got, resp)
	}
	bare := &Request{Method: "POST"}
	old, _ = Encode(bare, nil)
	for _, v := range [][]byte{old, EncodeRequest(bare)} {
		if got, err := DecodeRequest(v); err != nil || got.Header == nil || len(got.Header) != 0 || got.Body != nil {
			t.Fatalf("a request without header or body reads as %+v, %v", got, err)
		}
	}
	if got, err := DecodeResponse(EncodeResponse(&Response{Status: 204})); err != nil || got.Header == nil || got.Status != 204 {
		t.Fatalf("a response without header reads as %+v, %v", got, err)
	}
}

func TestRequestAndResponseCodecsRejectCorruptValues(t *testing.T) {
	req, resp := EncodeRequest(filledValue[Request](t)), EncodeResponse(filledValue[Response](t))
	for name, v := range map[string][]byte{
		"empty":                           nil,
		"truncated request":               req[:len(req)-3],
		"truncated response":              resp[:len(resp)-3],
		"a header of a varint":            {requestVersion, 6<<3 | 0, 1},
		"a response's header of a varint": {responseVersion, 2<<3 | 0, 1},
		"unknown version":                 {9, 1},
	} {
		if _, err := DecodeRequest(v); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: request decoded, %v; want ErrCorrupt", name, err)
		}
		if _, err := DecodeResponse(v); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: response decoded, %v; want ErrCorrupt", name, err)
		}
	}
}

func FuzzDecodeRequest(f *testing.F) {
	f.Add(EncodeRequest(filledValue[Request](f)))
	f.Add(EncodeResponse(filledValue[Response](f)))
	f.Fuzz(func(t *testing.T, v []byte) {
		if req, err := DecodeRequest(v); err == nil {
			if again, err := DecodeRequest(EncodeRequest(req)); err != nil || !reflect.DeepEqual(again, req) {
				t.Fatalf("a decoded request does not survive its re-encoding (%v): %+v -> %+v", err, req, again)
			}
		}
		if resp, err := DecodeResponse(v); err == nil {
			if again, err := DecodeResponse(EncodeResponse(resp)); err != nil || !reflect.DeepEqual(again, resp) {
				t.Fatalf("a decoded response does not survive its re-encoding (%v): %+v -> %+v", err, resp, again)
			}
		}
	})
}

func BenchmarkRequestCodec(b *testing.B) {
	req := &Request{Method: "POST", URL: "/v1/chat/completions", Host: "model.internal", Proto: "HTTP/1.1", RemoteAddr: "10.0.0.7:51234",
		Header: http.Header{"Content-Type": {"application/json"}, "Authorization": {"Bearer sk-0123456789abcdef"}, "User-Agent": {"openai-python/1.40"},
			"Accept": {"application/json"}, "Traceparent": {"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}},
		Body: []byte(`{"model":"m","messages":[{"role":"user","content":"hello"}]}`)}
	jsonValue, _ := Encode(req, req.Body)
	binValue := EncodeRequest(req)
	b.Run("encode/binary", func(b *testing.B) {
		for b.Loop() {
			EncodeRequest(req)
		}
	})
	b.Run("encode/json", func(b *testing.B) {
		for b.Loop() {
			_, _ = Encode(req, req.Body)
		}
	})
	b.Run("decode/binary", func(b *testing.B) {
		for b.Loop() {
			_, _ = DecodeRequest(binValue)
		}
	})
	b.Run("decode/json", func(b *testing.B) {
		for b.Loop() {
			_, _ = DecodeRequest(jsonValue)
		}
	})
}
