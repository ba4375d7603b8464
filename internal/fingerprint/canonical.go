package fingerprint

import (
	"bytes"
	"errors"
	"slices"
	"sort"
	"strconv"
	"unsafe"
)

// The canonical form of a JSON body is built in one streaming pass over its bytes, never by
// decoding it into maps and interfaces, which costs tens of times the body (docs/api.md:
// fingerprinting uses memory of the order of the body). Values are written in their canonical
// encoding, in input order, to one buffer; an object whose keys arrive out of order (or twice)
// is noted with its members' spans in sorted order and put in order only when the text is
// assembled, so reordering copies each byte once however deep the nesting. The result is the
// text encoding/json gives for the body decoded into any (keys sorted, numbers as written,
// strings re-escaped), which FuzzFingerprint checks.

// maxNesting is encoding/json's own limit: deeper input was never canonicalised.
const maxNesting = 10000

var (
	errNotCanonical = errors.New("not canonicalisable JSON")
	// errTooCostly: the body's shape (a great many members or objects out of order) would need
	// bookkeeping of a multiple of the body to canonicalise; it is fingerprinted as written.
	errTooCostly = errors.New("canonicalising would cost a multiple of the body")
)

// minBookkeeping is the bookkeeping every body may use, however small.
const minBookkeeping = 64 << 10

// Sizes of the bookkeeping records, for its bound.
const (
	memberSize    = int(unsafe.Sizeof(member{}))
	reorderedSize = int(unsafe.Sizeof(reordered{}))
	spanSize      = int(unsafe.Sizeof(byteRange{}))
)

// pointer is a parsed fingerprint_ignore pointer: each reference token as a member name and,
// when it reads as one (strconv.Atoi, as before), as an array index.
type pointer []pointerToken

type pointerToken struct {
	name  string
	index int // -1: not an index
}

func pointerOf(tokens []string) pointer {
	p := make(pointer, len(tokens))
	for i, t := range tokens {
		p[i] = pointerToken{name: t, index: -1}
		if n, err := strconv.Atoi(t); err == nil && n >= 0 {
			p[i].index = n
		}
	}
	return p
}

// pathStep is where a value sits in its parent: a member name, or an array index.
type pathStep struct {
	name  []byte
	index int // -1 in an object
}

// reordered is an object whose members are written in another order than they arrived.
type reordered struct {
	start, end int         // the object's text in out, braces included
	members    []byteRange // its members' text in out, in canonical order, duplicates dropped
}

// byteRange is a stretch of a buffer.
type byteRange struct{ from, to int }

// member is an object member being read: its text in out and its decoded name in names.
type member struct{ text, name byteRange }

// canonicaliser reads JSON by hand, with the grammar encoding/json accepts, so that scalars are
// copied or re-escaped straight into out without a token or an allocation each.
type canonicaliser struct {
	in      []byte
	pos     int
	ignore  []pointer
	out     []byte
	moved   []reordered
	path    []pathStep
	names   []byte   // decoded member names of the open objects
	members []member // members of the open objects
	scratch []byte   // a decoded string
	// bookkeeping bounds the bytes of members and moved (half the body), so that canonicalising
	// a hostile shape (millions of small objects out of order) costs of the order of the body
	// (docs/api.md), not twenty times it; spans counts the spans held in moved.
	bookkeeping int
	spans       int
}

// overBudget reports whether the bookkeeping passed its bound.
func (c *canonicaliser) overBudget() bool {
	return cap(c.members)*memberSize+cap(c.moved)*reorderedSize+c.spans*spanSize > c.bookkeeping
}

func (c *canonicaliser) skipSpace() {
	for c.pos < len(c.in) {
		switch c.in[c.pos] {
		case ' ', '\t', '\n', '\r':
			c.pos++
		default:
			return
		}
	}
}

// next returns the next byte that is not white space, without taking it; 0 at the end (a NUL
// byte, never valid there, reads the same).
func (c *canonicaliser) next() byte {
	c.skipSpace()
	if c.pos == len(c.in) {
		return 0
	}
	return c.in[c.pos]
}

// document canonicalises the whole input: one value and nothing after it.
func (c *canonicaliser) document() error {
	if err := c.value(); err != nil {
		return err
	}
	if c.skipSpace(); c.pos != len(c.in) {
		return errNotCanonical // trailing data: not a single JSON value
	}
	return nil
}

// value writes the next value in canonical form.
func (c *canonicaliser) value() error {
	switch c.next() {
	case '{', '[':
		if len(c.path) >= maxNesting {
			return errNotCanonical
		}
		if c.in[c.pos] == '{' {
			return c.object()
		}
		return c.array()
	case '"':
		var err error
		if c.scratch, err = c.str(c.scratch[:0]); err != nil {
			return err
		}
		c.out = appendJSONString(c.out, c.scratch)
		return nil
	case 't':
		return c.literal("true")
	case 'f':
		return c.literal("false")
	case 'n':
		return c.literal("null")
	}
	return c.number()
}

func (c *canonicaliser) literal(word string) error {
	if !bytes.HasPrefix(c.in[c.pos:], []byte(word)) {
		return errNotCanonical
	}
	c.pos += len(word)
	c.out = append(c.out, word...)
	return nil
}

// number copies a number as written, after checking it has JSON's grammar.
func (c *canonicaliser) number() error {
	start := c.pos
	c.accept('-')
	switch {
	case c.accept('0'):
	case c.pos < len(c.in) && c.in[c.pos] >= '1' && c.in[c.pos] <= '9':
		c.digits()
	default:
		return errNotCanonical
	}
	if c.accept('.') && c.digits() == 0 {
		return errNotCanonical
	}
	if c.accept('e') || c.accept('E') {
		if !c.accept('+') {
			c.accept('-')
		}
		if c.digits() == 0 {
			return errNotCanonical
		}
	}
	c.out = append(c.out, c.in[start:c.pos]...)
	return nil
}

func (c *canonicaliser) accept(b byte) bool {
	if c.pos < len(c.in) && c.in[c.pos] == b {
		c.pos++
		return true
	}
	return false
}

func (c *canonicaliser) digits() int {
	n := 0
	for c.pos < len(c.in) && c.in[c.pos] >= '0' && c.in[c.pos] <= '9' {
		c.pos++
		n++
	}
	return n
}

// object writes the object at pos, members in input order, and notes it in moved when its
// names are not already in strictly increasing order.
func (c *canonicaliser) object() error {
	start, namesBase, membersBase := len(c.out), len(c.names), len(c.members)
	defer func() { c.names, c.members = c.names[:namesBase], c.members[:membersBase] }()
	c.pos++
	c.out = append(c.out, '{')
	ordered, written := true, 0
	for i := 0; ; i++ {
		if i == 0 && c.next() == '}' {
			break
		}
		if c.next() != '"' {
			return errNotCanonical
		}
		from := len(c.names)
		names, err := c.str(c.names)
		if err != nil {
			return err
		}
		c.names = names
		name := byteRange{from, len(c.names)}
		if c.next() != ':' {
			return errNotCanonical
		}
		c.pos++
		c.path = append(c.path, pathStep{name: c.names[name.from:name.to], index: -1})
		if c.ignored() {
			err = c.skip()
		} else {
			if written > 0 {
				c.out = append(c.out, ',')
			}
			text := len(c.out)
			c.out = append(appendJSONString(c.out, c.names[name.from:name.to]), ':')
			err = c.value()
			if n := len(c.members); n > membersBase {
				prev := c.members[n-1].name
				if bytes.Compare(c.names[name.from:name.to], c.names[prev.from:prev.to]) <= 0 {
					ordered = false
				}
			}
			c.members = append(c.members, member{text: byteRange{text, len(c.out)}, name: name})
			written++
			if err == nil && c.overBudget() {
				err = errTooCostly
			}
		}
		c.path = c.path[:len(c.path)-1]
		if err != nil {
			return err
		}
		if sep := c.next(); sep == '}' {
			break
		} else if sep != ',' {
			return errNotCanonical
		}
		c.pos++
	}
	c.pos++ // the closing brace
	c.out = append(c.out, '}')
	if !ordered {
		c.moved = append(c.moved, reordered{start: start, end: len(c.out), members: c.sorted(c.members[membersBase:])})
		if c.spans += len(c.moved[len(c.moved)-1].members); c.overBudget() {
			return errTooCostly
		}
	}
	return nil
}

// sorted orders members by name (as encoding/json sorts a map's keys); of a name given twice
// the last one counts, as when decoding into a map.
func (c *canonicaliser) sorted(ms []member) []byteRange {
	order := slices.Clone(ms)
	name := func(m member) []byte { return c.names[m.name.from:m.name.to] }
	slices.SortStableFunc(order, func(a, b member) int { return bytes.Compare(name(a), name(b)) })
	out := make([]byteRange, 0, len(order))
	for i, m := range order {
		if i+1 < len(order) && bytes.Equal(name(order[i+1]), name(m)) {
			continue // a later duplicate follows
		}
		out = append(out, m.text)
	}
	return out
}

func (c *canonicaliser) array() error {
	c.pos++
	c.out = append(c.out, '[')
	for i := 0; ; i++ {
		if i == 0 && c.next() == ']' {
			break
		}
		if i > 0 {
			c.out = append(c.out, ',')
		}
		c.path = append(c.path, pathStep{index: i})
		var err error
		if c.ignored() {
			c.out = append(c.out, "null"...) // the other indices keep their meaning
			err = c.skip()
		} else {
			err = c.value()
		}
		c.path = c.path[:len(c.path)-1]
		if err != nil {
			return err
		}
		if sep := c.next(); sep == ']' {
			break
		} else if sep != ',' {
			return errNotCanonical
		}
		c.pos++
	}
	c.pos++ // the closing bracket
	c.out = append(c.out, ']')
	return nil
}

// skip reads past the next value, still checking it, and writes nothing of it.
func (c *canonicaliser) skip() error {
	mark, moved := len(c.out), len(c.moved)
	err := c.value()
	for _, m := range c.moved[moved:] {
		c.spans -= len(m.members)
	}
	c.out, c.moved = c.out[:mark], c.moved[:moved]
	return err
}

// ignored reports whether the current path is one of the fingerprint_ignore pointers.
func (c *canonicaliser) ignored() bool {
	for _, p := range c.ignore {
		if len(p) == len(c.path) && p.matches(c.path) {
			return true
		}
	}
	return false
}

func (p pointer) matches(path []pathStep) bool {
	for i, step := range path {
		if step.index < 0 && p[i].name != string(step.name) || step.index >= 0 && p[i].index != step.index {
			return false
		}
	}
	return true
}

// text assembles the canonical text, with encoding/json's trailing newline.
func (c *canonicaliser) text() []byte {
	if len(c.moved) == 0 {
		return append(c.out, '\n')
	}
	slices.SortFunc(c.moved, func(a, b reordered) int { return a.start - b.start })
	buf := make([]byte, 0, len(c.out)+1)
	buf = c.region(buf, 0, len(c.out))
	return append(buf, '\n')
}

// region appends out[from:to], writing every reordered object in it in its canonical order.
func (c *canonicaliser) region(buf []byte, from, to int) []byte {
	for from < to {
		i := sort.Search(len(c.moved), func(i int) bool { return c.moved[i].start >= from })
		if i == len(c.moved) || c.moved[i].start >= to {
			break
		}
		m := c.moved[i]
		buf = append(buf, c.out[from:m.start]...)
		buf = append(buf, '{')
		for j, s := range m.members {
			if j > 0 {
				buf = append(buf, ',')
			}
			buf = c.region(buf, s.from, s.to)
		}
		buf = append(buf, '}')
		from = m.end
	}
	return append(buf, c.out[from:to]...)
}
