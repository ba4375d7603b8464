package webhook

import (
	"fmt"
	"net/url"
	"path"
	"strings"
)

// Pattern is an endpoint's URL, or a pattern of them with * standing for any characters of
// the path (https://consumer.example.com/webhooks/*), that a request's callback URL must match.
type Pattern struct{ u *url.URL }

// ParsePattern reads an endpoint's URL: an absolute http(s) URL without credentials or a
// wildcard host.
func ParsePattern(raw string) (*Pattern, error) {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || strings.Contains(u.Host, "*") || u.User != nil {
		return nil, fmt.Errorf("URL %q must be an absolute http(s) URL without credentials or a wildcard host", raw)
	}
	return &Pattern{u: u}, nil
}

// String is the pattern as written.
func (p *Pattern) String() string { return p.u.String() }

// Wildcard reports whether the pattern stands for more than one URL.
func (p *Pattern) Wildcard() bool { return strings.Contains(p.u.String(), "*") }

// ParseCallback reads a request's callback URL: absolute http(s), without credentials or a
// fragment. It reports false for any other.
func ParseCallback(raw string) (*url.URL, bool) {
	u, err := url.Parse(raw)
	if err != nil || u.User != nil || u.Fragment != "" || (u.Scheme != "http" && u.Scheme != "https") {
		return nil, false
	}
	return u, true
}

// Matches compares scheme and host exactly and the cleaned path against the pattern's, where *
// stands for any characters.
func (p *Pattern) Matches(u *url.URL) bool {
	if u.Scheme != p.u.Scheme || !strings.EqualFold(u.Host, p.u.Host) {
		return false
	}
	cleaned := path.Clean("/" + u.Path)
	if strings.HasSuffix(u.Path, "/") && cleaned != "/" {
		cleaned += "/"
	}
	if cleaned != u.Path && u.Path != "" {
		return false // dot segments or doubled slashes: refuse rather than guess
	}
	return glob(p.u.Path, u.Path) && (p.u.RawQuery == "" || p.u.RawQuery == u.RawQuery)
}

// glob matches s against pattern, where * stands for any run of characters.
func glob(pattern, s string) bool {
	parts := strings.Split(pattern, "*")
	if len(parts) == 1 {
		return pattern == s
	}
	if !strings.HasPrefix(s, parts[0]) {
		return false
	}
	s = s[len(parts[0]):]
	for _, mid := range parts[1 : len(parts)-1] {
		i := strings.Index(s, mid)
		if i < 0 {
			return false
		}
		s = s[i+len(mid):]
	}
	return strings.HasSuffix(s, parts[len(parts)-1])
}

// ParseSecrets reads an endpoint's secrets for its signature style, each entry holding one or
// more separated by spaces: Standard Webhooks secrets (whsec_ and base64), or, for
// X-Webhook, secrets used as written, their bytes the HMAC key.
func ParseSecrets(style Style, raws []string) ([]Secret, error) {
	parse := ParseSecret
	if style == XWebhook {
		parse = RawSecret // the seed's consumers key their HMAC with the secret as written
	}
	var out []Secret
	for _, raw := range raws {
		for _, s := range strings.Fields(raw) {
			secret, err := parse(s)
			if err != nil {
				return nil, err
			}
			out = append(out, secret)
		}
	}
	return out, nil
}
