package module

import (
	"slices"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// reqLog logs with a request's fields (request_id, idempotency_key), adding them only to the
// lines actually written: zap's With would encode them for every request, logged or not.
type reqLog struct {
	l      *zap.Logger
	fields []zap.Field
}

func newReqLog(l *zap.Logger, fields ...zap.Field) reqLog { return reqLog{l: l, fields: fields} }

// with returns a reqLog with more fields.
func (rl reqLog) with(f ...zap.Field) reqLog {
	return reqLog{l: rl.l, fields: append(slices.Clip(rl.fields), f...)}
}

func (rl reqLog) write(level zapcore.Level, msg string, f []zap.Field) {
	if ce := rl.l.Check(level, msg); ce != nil {
		ce.Write(append(slices.Clip(rl.fields), f...)...)
	}
}

// Debug, Info, Warn and Error write one line at their level.
func (rl reqLog) Debug(msg string, f ...zap.Field) { rl.write(zapcore.DebugLevel, msg, f) }
func (rl reqLog) Info(msg string, f ...zap.Field)  { rl.write(zapcore.InfoLevel, msg, f) }
func (rl reqLog) Warn(msg string, f ...zap.Field)  { rl.write(zapcore.WarnLevel, msg, f) }
func (rl reqLog) Error(msg string, f ...zap.Field) { rl.write(zapcore.ErrorLevel, msg, f) }
