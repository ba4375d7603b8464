package postgres

import (
	"math/rand/v2"
	"testing"
	"unicode/utf8"
)

// For every storable string x, x < s exactly when x < ceiling(s), and x > s exactly when
// x >= above(s), whatever bytes s holds.
func TestCursorsThatCannotBeStoredPageAsTheirBytesSay(t *testing.T) {
	alphabet := []string{"\x00", "\x01", "a", "z", "\x7f", "\xc2\x80", "\xc3", "\xa9", "\xed\x9f\xbf", "\xee\x80\x80",
		"\xef\xbf\xbd", "\xf4\x8f\xbf\xbf", "\xf4\x90", "\xf5", "\xff"}
	rnd := rand.New(rand.NewPCG(1, 2))
	gen := func() string {
		s := ""
		for range rnd.IntN(4) {
			s += alphabet[rnd.IntN(len(alphabet))]
		}
		return s
	}
	var valid []string
	for len(valid) < 400 {
		if x := gen(); storable(x) {
			valid = append(valid, x)
		}
	}
	valid = append(valid, "\U0010FFFF", "\U0010FFFF\U0010FFFF", "a\U0010FFFF")
	for range 3000 {
		s := gen()
		if rnd.IntN(4) == 0 {
			s = valid[rnd.IntN(len(valid))] + "\xff"
		}
		c, bounded := ceiling(s)
		a, hasAbove := above(s)
		if (bounded && !storable(c)) || (hasAbove && !storable(a)) || !utf8.ValidString(c) {
			t.Fatalf("%q: ceiling %q above %q not storable", s, c, a)
		}
		for _, x := range valid {
			if below := x < s; below != (!bounded || x < c) {
				t.Fatalf("%q < %q is %v, but against its ceiling %q (%v) it is not", x, s, below, c, bounded)
			}
			if over := x > s; over != (hasAbove && x >= a) {
				t.Fatalf("%q > %q is %v, but against %q (%v) it is not", x, s, over, a, hasAbove)
			}
		}
	}
}
