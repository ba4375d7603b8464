// Package reqlog is a logger carrying a request's or an operation's fields (request_id,
// idempotency_key, operation_id), adding them only to the lines actually written: zap's With
// would encode them for every request, logged or not. Standard library and zap only.
package reqlog

import (
	"slices"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// Logger logs with its fields.
type Logger struct {
	l      *zap.Logger
	fields []zap.Field
}

// New returns a Logger writing to l with fields.
func New(l *zap.Logger, fields ...zap.Field) Logger { return Logger{l: l, fields: fields} }

// With returns a Logger with more fields.
func (rl Logger) With(f ...zap.Field) Logger {
	return Logger{l: rl.l, fields: append(slices.Clip(rl.fields), f...)}
}

func (rl Logger) write(level zapcore.Level, msg string, f []zap.Field) {
	if ce := rl.l.Check(level, msg); ce != nil {
		ce.Write(append(slices.Clip(rl.fields), f...)...)
	}
}

// Debug, Info, Warn and Error write one line at their level.
func (rl Logger) Debug(msg string, f ...zap.Field) { rl.write(zapcore.DebugLevel, msg, f) }
func (rl Logger) Info(msg string, f ...zap.Field)  { rl.write(zapcore.InfoLevel, msg, f) }
func (rl Logger) Warn(msg string, f ...zap.Field)  { rl.write(zapcore.WarnLevel, msg, f) }
func (rl Logger) Error(msg string, f ...zap.Field) { rl.write(zapcore.ErrorLevel, msg, f) }
