package module

import (
	"net/http"

	"go.uber.org/zap"

	"github.com/mulligan-gw/mulligan/internal/bodyfields"
	"github.com/mulligan-gw/mulligan/internal/tracing"
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
	kr.callback, kr.metadata, kr.trace = callback, fields.Metadata, tracing.Of(kr.r)
	kr.log = kr.log.With(kr.trace.Fields()...)
	if fields.MetadataIgnored != "" {
		kr.log.Info("request metadata not kept with the operation", zap.String("reason", fields.MetadataIgnored))
	}
	return true
}
