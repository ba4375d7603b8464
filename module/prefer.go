package module

import (
	"time"

	"github.com/mulligan-gw/mulligan/internal/prefer"
)

// conversion decides whether a covered request becomes an operation, and how long it may run
// first to be answered directly (0: accept at once).
func conversion(cfg *AsyncConfig, values []string) (bool, time.Duration) {
	p := prefer.Parse(values)
	window := time.Duration(0)
	if cfg.Mode == ModeAfter {
		window = time.Duration(cfg.After)
	}
	if p.HasWait {
		window = p.Wait
	}
	switch cfg.Mode {
	case ModePrefer:
		return p.RespondAsync, window
	default:
		return true, window
	}
}
