package module

import (
	"go.uber.org/zap"

	"github.com/mulligan-gw/mulligan/internal/reqlog"
)

// reqLog logs with a request's fields, only on the lines actually written (internal/reqlog).
type reqLog = reqlog.Logger

func newReqLog(l *zap.Logger, fields ...zap.Field) reqLog { return reqlog.New(l, fields...) }
