package llmapi

import (
	"bytes"
	"errors"
	"math"
	"math/bits"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/strictnum"
)

// The bounds of the JSON read here.
const (
	// MaxDepth is how deeply containers may nest: a request body nested
	// deeper is ErrNotJSON, a response document nested deeper is skipped.
	MaxDepth = 64
	// MaxKey is the longest key a path may name, in bytes.
	MaxKey = 64
	// MaxNumber is the longest number a response's usage is read from (2^53
	// has 16 digits): a longer one is not a whole number.
	MaxNumber = 32
)

// ErrNotJSON is returned for a request body that is not one JSON value
// (RFC 8259: trailing bytes, NaN, comments, a value cut short) or that
// nests deeper than MaxDepth. Refuse such a request: a lenient server might
// read a larger bound from it than this package can.
var ErrNotJSON = errors.New("request body is not one JSON value")

// Value is what a request body holds at one path.
type Value struct {
	// N is the largest number found at the path (a number, or a string
	// holding one), rounded up, at most strictnum.Max.
	N int64
	// Found is true when a number was found at the path.
	Found bool
	// Odd is true when something else was found there as well: a negative
	// number, a word, a bool, an object or an array. null counts as absent.
	Odd bool
}

// role is what a place of a request body holds.
type role uint8

const (
	rolePath role = iota
	roleOutput
	roleMultiplier
	roleAddend
	roleModel
)

// place is a path of a request body to read, each segment with its
// spellings.
type place struct {
	path [][][]byte
	role role
}

// walker validates one JSON value (RFC 8259) held whole in data, and
// records what it finds at its places. It allocates nothing but the
// model's name: keys and strings are compared and decoded in place or in
// its buffers.
type walker struct {
	data   []byte
	i      int
	places []place
	vals   [64]Value
	// model is the last string at a place of roleModel; modelMixed is set
	// when two differ.
	model      string
	modelMixed bool
	modelSeen  bool
	// buf holds a decoded key or string value.
	buf [maxKeySpelling]byte
}

// maxKeySpelling is the longest a key can be, escaped, and still fold to a
// name of MaxKey bytes: a rune each, each at most 12 bytes (a surrogate
// pair of \u escapes).
const maxKeySpelling = 12 * MaxKey

func (w *walker) walk() error {
	w.space()
	if w.i == len(w.data) {
		return nil
	}
	all := uint64(1)<<len(w.places) - 1
	if len(w.places) == 64 {
		all = math.MaxUint64
	}
	if err := w.value(1, all, 0); err != nil {
		return err
	}
	if w.space(); w.i != len(w.data) {
		return ErrNotJSON
	}
	return nil
}

// value reads the value at w.i, at nesting depth (of the containers it
// would open); cand are the places whose first level segments match the
// keys above it.
func (w *walker) value(depth int, cand uint64, level int) error {
	var ends uint64
	for m := cand; m != 0; m &= m - 1 {
		if b := bits.TrailingZeros64(m); len(w.places[b].path) == level {
			ends |= 1 << b
		}
	}
	if w.i >= len(w.data) {
		return ErrNotJSON
	}
	switch c := w.data[w.i]; {
	case c == '{':
		w.odd(ends)
		return w.object(depth, cand&^ends, level)
	case c == '[':
		w.odd(ends)
		return w.array(depth)
	case c == '"':
		if ends == 0 {
			return w.skipString()
		}
		return w.stringAt(ends)
	case c == '-' || c >= '0' && c <= '9':
		start := w.i
		if err := w.skipNumber(); err != nil {
			return err
		}
		if ends != 0 {
			n, ok := count(w.data[start:w.i])
			w.record(ends, n, ok)
		}
		return nil
	case c == 't':
		w.odd(ends)
		return w.literal("true")
	case c == 'f':
		w.odd(ends)
		return w.literal("false")
	case c == 'n':
		return w.literal("null")
	}
	return ErrNotJSON
}

func (w *walker) object(depth int, cand uint64, level int) error {
	if depth > MaxDepth {
		return ErrNotJSON
	}
	if w.enter('}') {
		return nil
	}
	for {
		if w.space(); w.i >= len(w.data) || w.data[w.i] != '"' {
			return ErrNotJSON
		}
		var next uint64
		if cand == 0 {
			if err := w.skipString(); err != nil {
				return err
			}
		} else {
			key, err := w.readKey()
			if err != nil {
				return err
			}
			next = w.match(cand, level, key)
		}
		if err := w.colon(); err != nil {
			return err
		}
		if err := w.value(depth+1, next, level+1); err != nil {
			return err
		}
		if more, err := w.more('}'); !more {
			return err
		}
	}
}

// array reads an array: paths do not go through arrays, so nothing in it
// is at a place.
func (w *walker) array(depth int) error {
	if depth > MaxDepth {
		return ErrNotJSON
	}
	if w.enter(']') {
		return nil
	}
	for {
		w.space()
		if err := w.value(depth+1, 0, 0); err != nil {
			return err
		}
		if more, err := w.more(']'); !more {
			return err
		}
	}
}

// enter steps into the container at w.i and reports whether it is empty
// (closed at once by end, which it steps over).
func (w *walker) enter(end byte) bool {
	w.i++
	if w.space(); w.i < len(w.data) && w.data[w.i] == end {
		w.i++
		return true
	}
	return false
}

// more steps over what follows a container's member: a comma (true: a
// member follows) or end (false: the container is closed).
func (w *walker) more(end byte) (bool, error) {
	if w.space(); w.i < len(w.data) {
		switch w.data[w.i] {
		case ',':
			w.i++
			return true, nil
		case end:
			w.i++
			return false, nil
		}
	}
	return false, ErrNotJSON
}

// colon steps over the colon after a key, and the space around it.
func (w *walker) colon() error {
	if w.space(); w.i >= len(w.data) || w.data[w.i] != ':' {
		return ErrNotJSON
	}
	w.i++
	w.space()
	return nil
}

// match returns the places of cand whose segment at level is key, folded.
// A key longer than any name (nil) matches none.
func (w *walker) match(cand uint64, level int, key []byte) uint64 {
	var next uint64
	for m := cand; m != 0 && key != nil; m &= m - 1 {
		b := bits.TrailingZeros64(m)
		for _, name := range w.places[b].path[level] {
			if bytes.EqualFold(key, name) {
				next |= 1 << b
				break
			}
		}
	}
	return next
}

// stringAt reads a string value at the places ends.
func (w *walker) stringAt(ends uint64) error {
	start := w.i
	if err := w.skipString(); err != nil {
		return err
	}
	for m := ends; m != 0; m &= m - 1 {
		if b := bits.TrailingZeros64(m); w.places[b].role == roleModel {
			w.setModel(start)
			ends &^= 1 << b
		}
	}
	if ends != 0 {
		s := w.data[start+1 : w.i-1]
		if bytes.IndexByte(s, '\\') >= 0 {
			s = decodeString(w.buf[:0], s)
		}
		n, ok := count(bytes.TrimSpace(s))
		w.record(ends, n, ok)
	}
	return nil
}

// setModel records the string that starts at start as the model.
func (w *walker) setModel(start int) {
	var m string
	if raw := w.data[start+1 : w.i-1]; bytes.IndexByte(raw, '\\') < 0 {
		m = string(raw)
	} else {
		m = string(decodeString(nil, raw))
	}
	if w.modelSeen && m != w.model {
		w.modelMixed = true
	}
	w.model, w.modelSeen = m, true
}

func (w *walker) record(ends uint64, n int64, ok bool) {
	for m := ends; m != 0; m &= m - 1 {
		v := &w.vals[bits.TrailingZeros64(m)]
		if ok {
			v.N, v.Found = max(v.N, n), true
		} else {
			v.Odd = true
		}
	}
}

func (w *walker) odd(ends uint64) {
	for m := ends; m != 0; m &= m - 1 {
		w.vals[bits.TrailingZeros64(m)].Odd = true
	}
}

// count reads a number (JSON's, or a string's) as a count: rounded up, at
// most strictnum.Max; ok is false for a negative number or none.
func count(s []byte) (int64, bool) {
	if n, ok := strictnum.Parse(string(s)); ok {
		return n, true
	}
	f, err := strconv.ParseFloat(string(s), 64)
	switch {
	case err != nil && !errors.Is(err, strconv.ErrRange), math.IsNaN(f), f < 0:
		return 0, false
	case f >= strictnum.Max:
		return strictnum.Max, true
	}
	return int64(math.Ceil(f)), true
}

func (w *walker) space() {
	for w.i < len(w.data) {
		switch w.data[w.i] {
		case ' ', '\t', '\n', '\r':
			w.i++
		default:
			return
		}
	}
}

func (w *walker) literal(lit string) error {
	if len(w.data)-w.i < len(lit) || string(w.data[w.i:w.i+len(lit)]) != lit {
		return ErrNotJSON
	}
	w.i += len(lit)
	return nil
}

// skipNumber reads a number as RFC 8259 writes it.
func (w *walker) skipNumber() error {
	d, i := w.data, w.i
	if i < len(d) && d[i] == '-' {
		i++
	}
	switch {
	case i < len(d) && d[i] == '0':
		i++
	case i < len(d) && d[i] >= '1' && d[i] <= '9':
		i = digits(d, i)
	default:
		return ErrNotJSON
	}
	if i < len(d) && d[i] == '.' {
		if j := digits(d, i+1); j > i+1 {
			i = j
		} else {
			return ErrNotJSON
		}
	}
	if i < len(d) && (d[i] == 'e' || d[i] == 'E') {
		i++
		if i < len(d) && (d[i] == '+' || d[i] == '-') {
			i++
		}
		if j := digits(d, i); j > i {
			i = j
		} else {
			return ErrNotJSON
		}
	}
	w.i = i
	return nil
}

func digits(d []byte, i int) int {
	for i < len(d) && d[i] >= '0' && d[i] <= '9' {
		i++
	}
	return i
}

// plain marks the bytes a string holds as they are: not a quote, a
// backslash or a control character.
var plain = func() (p [256]bool) {
	for c := 0x20; c < 256; c++ {
		p[c] = c != '"' && c != '\\'
	}
	return p
}()

// skipString reads a string, checking its escapes.
func (w *walker) skipString() error {
	d, i := w.data, w.i+1
	for {
		for i < len(d) && plain[d[i]] {
			i++
		}
		switch {
		case i >= len(d) || d[i] < 0x20:
			return ErrNotJSON
		case d[i] == '"':
			w.i = i + 1
			return nil
		}
		n := escapeLen(d[i:])
		if n == 0 {
			return ErrNotJSON
		}
		i += n
	}
}

// readKey reads a key and returns what it holds, decoded (in the data
// when it has no escape, else in w.buf); nil when it is too long to fold
// to any name.
func (w *walker) readKey() ([]byte, error) {
	start := w.i
	if err := w.skipString(); err != nil {
		return nil, err
	}
	raw := w.data[start+1 : w.i-1]
	switch {
	case bytes.IndexByte(raw, '\\') < 0:
		return raw, nil
	case len(raw) > maxKeySpelling:
		return nil, nil
	}
	// Decoded, a string is never longer than escaped.
	return decodeString(w.buf[:0], raw), nil
}

// escapeLen is the length of the escape at the start of b (a backslash
// and what follows), 0 if it is not one.
func escapeLen(b []byte) int {
	if len(b) < 2 {
		return 0
	}
	switch b[1] {
	case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
		return 2
	case 'u':
		if len(b) >= 6 && isHex(b[2]) && isHex(b[3]) && isHex(b[4]) && isHex(b[5]) {
			return 6
		}
	}
	return 0
}

// decodeString appends to dst what the string body raw (checked by
// skipString) holds, as encoding/json decodes it: a lone surrogate is
// U+FFFD.
func decodeString(dst, raw []byte) []byte {
	for i := 0; i < len(raw); {
		c := raw[i]
		if c != '\\' {
			dst = append(dst, c)
			i++
			continue
		}
		switch raw[i+1] {
		case 'b':
			dst = append(dst, '\b')
		case 'f':
			dst = append(dst, '\f')
		case 'n':
			dst = append(dst, '\n')
		case 'r':
			dst = append(dst, '\r')
		case 't':
			dst = append(dst, '\t')
		case 'u':
			r := hex4(raw[i+2:])
			i += 6
			if utf16.IsSurrogate(r) {
				if i+6 <= len(raw) && raw[i] == '\\' && raw[i+1] == 'u' {
					if r2 := utf16.DecodeRune(r, hex4(raw[i+2:])); r2 != utf8.RuneError {
						r = r2
						i += 6
					} else {
						r = utf8.RuneError
					}
				} else {
					r = utf8.RuneError
				}
			}
			dst = utf8.AppendRune(dst, r)
			continue
		default: // '"', '\\', '/'
			dst = append(dst, raw[i+1])
		}
		i += 2
	}
	return dst
}

func hex4(b []byte) rune {
	var r rune
	for _, c := range b[:4] {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c -= 'a' - 10
		default:
			c -= 'A' - 10
		}
		r = r<<4 | rune(c)
	}
	return r
}

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

// addSat and mulSat add and multiply counts (0 to strictnum.Max), at most
// strictnum.Max.
func addSat(a, b int64) int64 { return min(a+b, strictnum.Max) }

func mulSat(a, b int64) int64 {
	if a != 0 && b > strictnum.Max/a {
		return strictnum.Max
	}
	return min(a*b, strictnum.Max)
}

// ReadPaths reads, for each path (the names of nested objects' keys, from
// the body's top level; arrays are never entered), what the JSON body holds
// there, keys matching as ReadRequest matches them: Unicode simple case
// folding, escapes decoded, every duplicate counted. It returns ErrNotJSON
// as ReadRequest does; an empty body finds nothing.
func ReadPaths(body []byte, paths [][]string) ([]Value, error) {
	vals := make([]Value, len(paths))
	// A walk matches at most 64 places at once (a bit each).
	for start := 0; ; start += 64 {
		group := paths[start:min(start+64, len(paths))]
		places := make([]place, len(group))
		for i, p := range group {
			places[i].path = make([][][]byte, len(p))
			for j, name := range p {
				places[i].path[j] = [][]byte{[]byte(name)}
			}
		}
		w := walker{data: body, places: places}
		if err := w.walk(); err != nil {
			return nil, err
		}
		copy(vals[start:], w.vals[:len(group)])
		if start+64 >= len(paths) {
			return vals, nil
		}
	}
}
