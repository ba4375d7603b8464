package module

import (
	"bytes"
	"encoding/json"
	"mime"
	"net/http"

	"github.com/mulligan-gw/mulligan/internal/fingerprint"
	"github.com/mulligan-gw/mulligan/internal/tracing"

	"go.uber.org/zap"
)

// maxMetadata bounds the metadata an operation carries (compact JSON): it is copied into the
// resource and every event, so it must stay small. OpenAI's own limit (16 pairs of short
// strings) fits well within it.
const maxMetadata = 16 << 10

// bodyFields are the fields of a JSON request body the gateway reads for the operation the
// request becomes (docs/api.md): the top-level "metadata" object and "callback.url". Nothing
// else of the body is read, and the body goes upstream unchanged.
type bodyFields struct {
	// Metadata is the top-level "metadata" object, compact; nil when the body has none, or when
	// it is not an object or is over maxMetadata (then MetadataIgnored says why).
	Metadata        json.RawMessage
	MetadataIgnored string
	// CallbackURL is the string at callback.url, "" when there is none.
	CallbackURL string
}

// readBodyFields reads the fields the gateway uses from a JSON body. A body that is not JSON,
// not an object, or malformed has none of them: it still goes upstream as it is.
func readBodyFields(contentType string, body []byte) bodyFields {
	var out bodyFields
	mt, _, _ := mime.ParseMediaType(contentType)
	if !fingerprint.IsJSON(mt) || len(body) == 0 {
		return out
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return out
	}
	// Top-level keys are matched exactly (encoding/json's struct fields would also match
	// "Metadata" or "METADATA"); other values are skipped.
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return bodyFields{}
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return bodyFields{}
		}
		switch tok {
		case "metadata":
			out.Metadata, out.MetadataIgnored = boundedMetadata(raw)
		case "callback":
			var cb struct {
				URL *string `json:"url"`
			}
			if json.Unmarshal(raw, &cb) == nil && cb.URL != nil {
				out.CallbackURL = *cb.URL
			}
		}
	}
	return out
}

// boundedMetadata returns raw compacted when it is an object within maxMetadata; otherwise nil
// and why it was left out. null is no metadata, silently.
func boundedMetadata(raw json.RawMessage) (json.RawMessage, string) {
	var b bytes.Buffer
	if json.Compact(&b, raw) != nil {
		return nil, "not valid JSON"
	}
	switch {
	case b.String() == "null":
		return nil, ""
	case b.Len() == 0 || b.Bytes()[0] != '{':
		return nil, "not a JSON object"
	case b.Len() > maxMetadata:
		return nil, "larger than 16 KiB"
	}
	return b.Bytes(), ""
}

// describe reads what a converted request brings to its operation: its callback (header or
// body), its metadata and its trace context. It answers the client itself, and reports false,
// when the callback is refused. Metadata that is not an object or is too large is left out of
// the operation (the request still goes upstream unchanged), and a log line says why.
func (c *converter) describe(w http.ResponseWriter, kr *keyedRequest) bool {
	fields := readBodyFields(kr.r.Header.Get("Content-Type"), kr.body)
	callback, ok := c.callbackFor(w, kr.r, fields.CallbackURL)
	if !ok {
		return false
	}
	kr.callback, kr.metadata, kr.trace = callback, fields.Metadata, tracing.Of(kr.r)
	kr.log = kr.log.With(kr.trace.Fields()...)
	if fields.MetadataIgnored != "" {
		kr.log.Info("request metadata not kept with the operation", zap.String("reason", fields.MetadataIgnored))
	}
	return true
}
