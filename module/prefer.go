package module

import (
	"strconv"
	"strings"
	"time"
)

// preferences are the parts of RFC 7240's Prefer header Mulligan acts on.
type preferences struct {
	respondAsync bool
	wait         time.Duration
	hasWait      bool
}

// parsePrefer reads Prefer headers. As RFC 7240 §2 asks, what it does not understand or cannot
// parse is ignored, never an error.
func parsePrefer(values []string) preferences {
	var p preferences
	for _, v := range values {
		for _, pref := range strings.Split(v, ",") {
			name, value, _ := strings.Cut(strings.SplitN(pref, ";", 2)[0], "=")
			name = strings.ToLower(strings.TrimSpace(name))
			value = strings.Trim(strings.TrimSpace(value), `"`)
			switch name {
			case "respond-async":
				p.respondAsync = true
			case "wait":
				if secs, err := strconv.ParseUint(value, 10, 31); err == nil && !p.hasWait {
					p.wait, p.hasWait = time.Duration(secs)*time.Second, true
				}
			}
		}
	}
	return p
}

// conversion decides whether a covered request becomes an operation, and how long it may run
// first to be answered directly (0: accept at once).
func conversion(cfg *AsyncConfig, prefer []string) (bool, time.Duration) {
	p := parsePrefer(prefer)
	window := time.Duration(0)
	if cfg.Mode == ModeAfter {
		window = time.Duration(cfg.After)
	}
	if p.hasWait {
		window = p.wait
	}
	switch cfg.Mode {
	case ModePrefer:
		return p.respondAsync, window
	default:
		return true, window
	}
}
