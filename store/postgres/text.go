package postgres

import (
	"sort"
	"unicode/utf8"
)

// PostgreSQL's text holds valid UTF-8 without NUL, but the ids and cursors callers pass come
// from URLs and may hold any bytes. Sent as they are, the server refuses them and a lookup of
// an id that cannot exist would read as a storage outage (503) instead of not found.

// storable reports whether s fits a text column: no row can have an id that does not.
func storable(s string) bool { return badByte(s) < 0 }

// badByte is the offset of s's first byte that a text column cannot hold (NUL, or not UTF-8),
// -1 when there is none.
func badByte(s string) int {
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == 0 || (r == utf8.RuneError && size == 1) {
			return i
		}
		i += size
	}
	return -1
}

// ceiling is the least storable string that does not sort below s byte-wise; ok is false when
// every storable string sorts below s. For every storable id, id < s exactly when id < ceiling:
// a cursor that cannot be stored pages as its bytes say (as on Badger).
func ceiling(s string) (string, bool) {
	i := badByte(s)
	if i < 0 {
		return s, true
	}
	head, rest := s[:i], s[i:]
	// No character's encoding is a prefix of rest, so each sorts wholly above or below it; UTF-8
	// sorts as code points do, so the least one above it is found by bisection.
	if n := sort.Search(runeCount, func(n int) bool { return string(nthRune(n)) > rest }); n < runeCount {
		return head + string(nthRune(n)), true
	}
	// No character sorts above rest: the least string above everything starting with head.
	for head != "" {
		c, size := utf8.DecodeLastRuneInString(head)
		head = head[:len(head)-size]
		if c < utf8.MaxRune {
			return head + string(nthRune(runeIndex(c)+1)), true
		}
	}
	return "", false
}

// above is the least storable string that sorts above s: ids > s are the ids >= above(s).
func above(s string) (string, bool) {
	if storable(s) {
		return s + "\x01", true // NUL cannot be stored: \x01 is the least character
	}
	return ceiling(s)
}

// The storable characters U+0001..U+10FFFF without the surrogates, numbered in order.
const (
	surrogates = 0xE000 - 0xD800
	runeCount  = utf8.MaxRune - surrogates
)

func nthRune(n int) rune {
	r := rune(n + 1)
	if r >= 0xD800 {
		r += surrogates
	}
	return r
}

func runeIndex(r rune) int {
	if r >= 0xE000 {
		r -= surrogates
	}
	return int(r) - 1
}

// storableIDs splits ids into those that fit a text column and those that cannot exist.
func storableIDs(ids []string) (ok, never []string) {
	for _, id := range ids {
		if storable(id) {
			ok = append(ok, id)
		} else {
			never = append(never, id)
		}
	}
	return ok, never
}
