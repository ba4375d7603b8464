package store

import (
	"net/http"

	"google.golang.org/protobuf/encoding/protowire"
)

// An operation's request and result are written once and read once or twice, each on the path
// of an asynchronous call, so Badger stores them in the binary form of operations
// (opcodec.go): a version byte of their own, then numbered fields, the body last as one. Values
// written before (version 1, the JSON of Encode with the body after it) still decode.
const (
	requestVersion  = 4
	responseVersion = 5
)

// EncodeRequest is the stored form of req, its body included (DecodeRequest reads it).
func EncodeRequest(req *Request) []byte {
	b := make([]byte, 0, 256+len(req.Body))
	b = append(b, requestVersion)
	b = appendString(b, 1, req.Method)
	b = appendString(b, 2, req.URL)
	b = appendString(b, 3, req.Host)
	b = appendString(b, 4, req.Proto)
	b = appendString(b, 5, req.RemoteAddr)
	b = appendHeader(b, 6, req.Header)
	return appendBody(b, 7, req.Body)
}

// DecodeRequest reads what EncodeRequest wrote, or a request stored as JSON by Encode; anything
// else is ErrCorrupt. The header is never nil.
func DecodeRequest(v []byte) (*Request, error) {
	req := &Request{}
	var err error
	switch {
	case len(v) == 0:
		return nil, ErrCorrupt
	case v[0] == requestVersion:
		req.Header = http.Header{}
		err = eachField(v[1:], req.setField)
	default:
		req.Body, err = Decode(v, req)
		if req.Header == nil {
			req.Header = http.Header{}
		}
	}
	if err != nil {
		return nil, err
	}
	return req, nil
}

func (req *Request) setField(f field) {
	switch f.num {
	case 1:
		req.Method = f.string()
	case 2:
		req.URL = f.string()
	case 3:
		req.Host = f.string()
	case 4:
		req.Proto = f.string()
	case 5:
		req.RemoteAddr = f.string()
	case 6:
		f.headerEntry(req.Header)
	case 7:
		req.Body = f.bytes()
	}
}

// EncodeResponse is the stored form of resp, its body included (DecodeResponse reads it).
func EncodeResponse(resp *Response) []byte {
	b := make([]byte, 0, 128+len(resp.Body))
	b = append(b, responseVersion)
	b = appendInt(b, 1, int64(resp.Status))
	b = appendHeader(b, 2, resp.Header)
	return appendBody(b, 3, resp.Body)
}

// DecodeResponse reads what EncodeResponse wrote, or a response stored as JSON by Encode;
// anything else is ErrCorrupt. The header is never nil.
func DecodeResponse(v []byte) (*Response, error) {
	resp := &Response{}
	var err error
	switch {
	case len(v) == 0:
		return nil, ErrCorrupt
	case v[0] == responseVersion:
		resp.Header = http.Header{}
		err = eachField(v[1:], resp.setField)
	default:
		resp.Body, err = Decode(v, resp)
		if resp.Header == nil {
			resp.Header = http.Header{}
		}
	}
	if err != nil {
		return nil, err
	}
	return resp, nil
}

func (resp *Response) setField(f field) {
	switch f.num {
	case 1:
		resp.Status = int(f.int())
	case 2:
		f.headerEntry(resp.Header)
	case 3:
		resp.Body = f.bytes()
	}
}

// appendHeader writes each of h's names as a nested message: the name (1), then its values (2).
func appendHeader(b []byte, num protowire.Number, h http.Header) []byte {
	for name, values := range h {
		b = appendMessage(b, num, func(b []byte) []byte {
			b = protowire.AppendTag(b, 1, protowire.BytesType)
			b = protowire.AppendString(b, name)
			for _, v := range values {
				b = protowire.AppendTag(b, 2, protowire.BytesType)
				b = protowire.AppendString(b, v)
			}
			return b
		})
	}
	return b
}

// appendBody writes a body as a field, present only when not empty.
func appendBody(b []byte, num protowire.Number, body []byte) []byte {
	if len(body) == 0 {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendBytes(b, body)
}

// headerEntry adds the header entry appendHeader wrote to h.
func (f field) headerEntry(h http.Header) {
	var name string
	var values []string
	f.message(func(e field) {
		switch e.num {
		case 1:
			name = e.string()
		case 2:
			values = append(values, e.string())
		}
	})
	h[name] = append(h[name], values...)
}
