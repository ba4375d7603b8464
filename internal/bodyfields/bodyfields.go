// Package bodyfields reads the few fields of a JSON request body the gateway keeps with the
// operation the request becomes (docs/api.md): the top-level "metadata" object and
// "callback.url". Nothing else of the body is read, and the body goes upstream unchanged.
package bodyfields

import (
	"bytes"
	"encoding/json"
	"mime"

	"github.com/mulligan-gw/mulligan/internal/fingerprint"
)

// MaxMetadata bounds the metadata an operation carries (compact JSON): it is copied into the
// resource and every event, so it must stay small. OpenAI's own limit (16 pairs of short
// strings) fits well within it.
const MaxMetadata = 16 << 10

// Fields are the fields of a JSON request body the gateway reads for the operation the
// request becomes (docs/api.md): the top-level "metadata" object and "callback.url". Nothing
// else of the body is read, and the body goes upstream unchanged.
type Fields struct {
	// Metadata is the top-level "metadata" object, compact; nil when the body has none, or when
	// it is not an object or is over MaxMetadata (then MetadataIgnored says why).
	Metadata        json.RawMessage
	MetadataIgnored string
	// CallbackURL is the string at callback.url, "" when there is none.
	CallbackURL string
}

// Read reads the fields the gateway uses from a JSON body. A body that is not JSON,
// not an object, or malformed has none of them: it still goes upstream as it is.
func Read(contentType string, body []byte) Fields {
	var out Fields
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
			return Fields{}
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return Fields{}
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

// boundedMetadata returns raw compacted when it is an object within MaxMetadata; otherwise nil
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
	case b.Len() > MaxMetadata:
		return nil, "larger than 16 KiB"
	}
	return b.Bytes(), ""
}
