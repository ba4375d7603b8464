// Package prefer reads the parts of RFC 7240's Prefer header the gateway acts on
// (docs/api.md: respond-async and wait).
package prefer

import (
	"strconv"
	"strings"
	"time"
)

// Preferences are the parts of the Prefer headers the gateway acts on.
type Preferences struct {
	RespondAsync bool
	Wait         time.Duration
	HasWait      bool // a wait preference was given (Wait may be zero)
}

// Parse reads Prefer headers. As RFC 7240 §2 asks, what it does not understand or cannot parse
// is ignored, never an error; of several waits the first counts.
func Parse(values []string) Preferences {
	var p Preferences
	for _, v := range values {
		for _, pref := range strings.Split(v, ",") {
			name, value, _ := strings.Cut(strings.SplitN(pref, ";", 2)[0], "=")
			name = strings.ToLower(strings.TrimSpace(name))
			value = strings.Trim(strings.TrimSpace(value), `"`)
			switch name {
			case "respond-async":
				p.RespondAsync = true
			case "wait":
				if secs, err := strconv.ParseUint(value, 10, 31); err == nil && !p.HasWait {
					p.Wait, p.HasWait = time.Duration(secs)*time.Second, true
				}
			}
		}
	}
	return p
}
