package module

import (
	"net/http"

	"github.com/mulligan-gw/mulligan/internal/bodyfields"

	"go.uber.org/zap"
)

// describe reads what a converted request brings to its operation: its callback (header or
// body), its metadata and its trace context. It answers the client itself, and reports false,
// when the callback is refused. Metadata that is not an object or is too large is left out of
// the operation (the request still goes upstream unchanged), and a log line says why.
func (c *converter) describe(w http.ResponseWriter, kr *keyedRequest) bool {
	fields := bodyfields.Read(kr.r.Header.Get("Content-Type"), kr.body)
	callback, ok := c.callbackFor(w, kr.r, fields.CallbackURL)
	if !ok {
		return false
	}
	kr.callback, kr.metadata, kr.trace = callback, fields.Metadata, traceOf(kr.r)
	kr.log = kr.log.with(kr.trace.fields()...)
	if fields.MetadataIgnored != "" {
		kr.log.Info("request metadata not kept with the operation", zap.String("reason", fields.MetadataIgnored))
	}
	return true
}
