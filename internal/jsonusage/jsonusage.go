// Package jsonusage reads, as a response body passes, the usage numbers
// that a zone's settle json names, in a JSON document or in the events of a
// text/event-stream, without keeping the body.
package jsonusage

import (
	"mime"
	"strings"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/strictnum"
)

// The bounds of the JSON read here, and by cost json.
const (
	// MaxDepth is the deepest a document is read; a deeper one is skipped
	// as if it were not JSON (usage sits a few levels down).
	MaxDepth = 64
	// MaxKey is how much of a key is kept: a longer one matches no path.
	MaxKey = 64
	// MaxNumber is the longest number read: a longer one is not a usage
	// (2^53 has 16 digits).
	MaxNumber = 32
)

// Usage reads, as a response body passes, the usage that settle json
// names: for each path, the last number found at it, in one JSON document
// (or a sequence of them, as newline-delimited JSON streams are), or in the
// data of each server-sent event of a text/event-stream. It keeps no part
// of the body: a streaming scanner holds the keys of the objects it is in
// (at most MaxDepth of them, each cut at MaxKey bytes) and the number it is
// reading (at most MaxNumber bytes), so its memory does not grow with the
// body, and the body goes on as it came.
//
// A document's numbers count once it is whole: a document cut short, or
// that is not JSON (`data: [DONE]`), adds nothing.
type Usage struct {
	paths [][]string
	// found are the numbers of each path, from the documents read whole;
	// pending those of the document being read.
	found, pending []pathNumber
	// off is why the body is not read at all ("" when it is).
	off  string
	sse  bool
	scan jsonScanner
	ev   sseLines
}

// pathNumber is the last number found at a path.
type pathNumber struct {
	seen bool
	// whole is false when that number is not a whole number of at least
	// 0 (-5, 1.5, 1e3, or too long to read).
	whole bool
	n     int64
}

// Why settle json found no usage.
const (
	Encoded = "encoded body"
	Cut     = "response cut short"
)

// New returns a reader of paths (dotted names, split at their dots) for a
// response with the headers contentType and contentEncoding.
func New(paths [][]string, contentType, contentEncoding string) *Usage {
	u := &Usage{paths: paths, found: make([]pathNumber, 2*len(paths))}
	u.found, u.pending = u.found[:len(paths)], u.found[len(paths):]
	if contentEncoding != "" && !strings.EqualFold(contentEncoding, "identity") {
		// A compressed body is not read: its usage would be guessed from
		// bytes that are not the document. The reservation stands.
		u.off = Encoded
		return u
	}
	if mt, _, err := mime.ParseMediaType(contentType); err == nil && mt == "text/event-stream" {
		u.sse = true
	}
	u.scan.reset()
	return u
}

// Write reads the next bytes of the body.
func (u *Usage) Write(b []byte) {
	if u.off != "" {
		return
	}
	if !u.sse {
		u.feed(b)
		return
	}
	for i := 0; i < len(b); i++ {
		if u.ev.state == sseValue {
			// The rest of a data line, at once.
			j := i
			for j < len(b) && b[j] != '\n' && b[j] != '\r' {
				j++
			}
			u.feed(b[i:j])
			if i = j; i == len(b) {
				return
			}
		}
		switch u.ev.next(b[i]) {
		case sseData:
			u.byte(b[i])
		case sseDataEnd:
			// Lines of data join with a newline (whitespace to JSON).
			u.byte('\n')
		case sseDispatch:
			// An event ends: its document, read whole or not, ends with it.
			u.scan.reset()
			clear(u.pending)
		}
	}
}

// feed reads bytes of a document, skipping at once what a string's value
// holds and everything after the scanner stopped.
func (u *Usage) feed(b []byte) {
	s := &u.scan
	for i := 0; i < len(b); i++ {
		switch {
		case s.state == jsBroken:
			return
		case s.state == jsString:
			j := i
			for j < len(b) && b[j] != '"' && b[j] != '\\' && b[j] >= 0x20 {
				j++
			}
			if s.inKey {
				s.keyBytes(b[i:j])
			}
			if i = j; i == len(b) {
				return
			}
		case s.state <= jsAfter && isSpace(b[i]):
			// Whitespace between tokens says nothing.
			continue
		}
		u.byte(b[i])
	}
}

// byte feeds c to the scanner and records what it completes.
func (u *Usage) byte(c byte) {
	r := u.scan.step(c)
	if r == scanNumber {
		u.number()
		r = u.scan.step(c)
	}
	if r == scanDocument {
		for i, p := range u.pending {
			if p.seen {
				u.found[i] = p
			}
		}
		clear(u.pending)
	}
}

// number records the number the scanner just read, at each path that ends
// where it stands.
func (u *Usage) number() {
	s := &u.scan
	for i, path := range u.paths {
		if !s.at(path) {
			continue
		}
		p := pathNumber{seen: true}
		if !s.numberLong {
			p.n, p.whole = strictnum.Parse(string(s.number))
		}
		u.pending[i] = p
	}
}

// Total is the sum of the numbers found, and "" or why there is none to
// charge: no path found, or one whose last number is not whole.
func (u *Usage) Total() (int64, string) {
	if u.off != "" {
		return 0, u.off
	}
	var sum int64
	seen := false
	for _, p := range u.found {
		if !p.seen {
			continue
		}
		if !p.whole {
			return 0, strictnum.NotWhole
		}
		seen = true
		sum = min(sum+p.n, strictnum.Max)
	}
	if !seen {
		return 0, strictnum.Missing
	}
	return sum, ""
}

// What a byte of an event stream is.
const (
	sseOther    = iota // a field name, another field, a comment
	sseData            // a byte of a data field's value
	sseDataEnd         // the end of a data line
	sseDispatch        // the blank line that ends an event
)

// sseLines splits an event stream (WHATWG HTML, server-sent events) into
// its data and the ends of its events, keeping nothing but the field name
// being read (at most 5 bytes: only "data" matters).
type sseLines struct {
	state     uint8
	name      [5]byte
	nameLen   uint8
	afterCR   bool
	lineStart bool
	started   bool
}

const (
	sseName uint8 = iota
	sseSpace
	sseValue
	sseIgnore
)

// next says what byte c of the stream is.
func (l *sseLines) next(c byte) int {
	if !l.started {
		l.started, l.lineStart = true, true
	}
	if c == '\n' && l.afterCR {
		// The \n of a \r\n: the line ended at the \r.
		l.afterCR = false
		return sseOther
	}
	l.afterCR = c == '\r'
	if c == '\r' || c == '\n' {
		was, data := l.lineStart, l.state == sseValue || l.state == sseSpace || l.state == sseName && l.isData()
		l.state, l.nameLen, l.lineStart = sseName, 0, true
		switch {
		case was:
			return sseDispatch
		case data:
			return sseDataEnd
		}
		return sseOther
	}
	l.lineStart = false
	switch l.state {
	case sseName:
		if c == ':' {
			l.state = sseIgnore
			if l.isData() {
				l.state = sseSpace
			}
			return sseOther
		}
		if l.nameLen < uint8(len(l.name)) {
			l.name[l.nameLen] = c
		}
		l.nameLen++
		if l.nameLen > uint8(len(l.name)) {
			l.state = sseIgnore
		}
		return sseOther
	case sseSpace:
		l.state = sseValue
		if c == ' ' {
			return sseOther
		}
		return sseData
	case sseValue:
		return sseData
	}
	return sseOther
}

func (l *sseLines) isData() bool {
	return l.nameLen == 4 && string(l.name[:4]) == "data"
}

// What a step of the scanner completed.
const (
	scanNothing  = iota
	scanNumber   // a number, in number
	scanDocument // a top-level value
)

// jsonScanner is a JSON tokenizer (RFC 8259) fed a byte at a time, which
// keeps only the keys of the objects it is in and the number it reads.
// Anything that is not JSON stops it until reset.
type jsonScanner struct {
	state  uint8
	frames []jsonFrame
	// inKey is true while a string is an object's key.
	inKey bool
	// literal is what is left to read of true, false or null.
	literal string
	// hex counts the digits left of a \u escape.
	hex        uint8
	number     []byte
	numberLong bool
	frameBuf   [8]jsonFrame
	numberBuf  [MaxNumber]byte
}

// jsonFrame is an object or array the scanner is in; an object's key is the
// one whose value it reads.
type jsonFrame struct {
	object bool
	// odd is true when the key is too long or escaped: it matches nothing.
	odd bool
	key []byte
}

const (
	jsValue      uint8 = iota // a value is next
	jsFirstKey                // a key or } is next
	jsKey                     // a key is next
	jsColon                   // : is next
	jsFirstValue              // a value or ] is next
	jsAfter                   // , or the end of the container is next
	jsString
	jsEscape
	jsNumber
	jsLiteral
	jsBroken
)

func (s *jsonScanner) reset() {
	if s.frames == nil {
		s.frames = s.frameBuf[:0]
	}
	s.state, s.frames = jsValue, s.frames[:0]
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

// step reads c.
func (s *jsonScanner) step(c byte) int {
	switch s.state {
	case jsValue:
		return s.value(c)
	case jsFirstKey, jsKey:
		switch {
		case isSpace(c):
		case c == '"':
			top := &s.frames[len(s.frames)-1]
			top.key, top.odd = top.key[:0], false
			s.state, s.inKey = jsString, true
		case c == '}' && s.state == jsFirstKey:
			return s.pop()
		default:
			s.state = jsBroken
		}
	case jsColon:
		switch {
		case isSpace(c):
		case c == ':':
			s.state = jsValue
		default:
			s.state = jsBroken
		}
	case jsFirstValue:
		if c == ']' {
			return s.pop()
		}
		return s.value(c)
	case jsAfter:
		return s.after(c)
	case jsString:
		switch {
		case c == '"':
			if s.inKey {
				s.state = jsColon
				return scanNothing
			}
			return s.done()
		case c == '\\':
			s.state = jsEscape
		case c < 0x20:
			s.state = jsBroken
		case s.inKey:
			s.keyBytes([]byte{c})
		}
	case jsEscape:
		if s.hex > 0 {
			if !isHex(c) {
				s.state = jsBroken
				return scanNothing
			}
			if s.hex--; s.hex == 0 {
				s.state = jsString
			}
			return scanNothing
		}
		if strings.IndexByte(`"\/bfnrtu`, c) < 0 {
			s.state = jsBroken
			return scanNothing
		}
		if s.inKey {
			// An escaped key is no path's: paths are plain names.
			s.frames[len(s.frames)-1].odd = true
		}
		s.state = jsString
		if c == 'u' {
			s.hex, s.state = 4, jsEscape
		}
	case jsNumber:
		if c >= '0' && c <= '9' || c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-' {
			if len(s.number) < MaxNumber {
				s.number = append(s.number, c)
			} else {
				s.numberLong = true
			}
			return scanNothing
		}
		if len(s.frames) == 0 {
			// A number alone is a document, and no usage.
			s.state = jsValue
			return s.value(c)
		}
		// c is not read: the caller records the number where it stands,
		// then steps c again.
		s.state = jsAfter
		return scanNumber
	case jsLiteral:
		if c != s.literal[0] {
			s.state = jsBroken
			return scanNothing
		}
		if s.literal = s.literal[1:]; s.literal == "" {
			return s.done()
		}
	}
	return scanNothing
}

// keyBytes adds b to the key being read, up to MaxKey bytes: a longer
// key matches nothing.
func (s *jsonScanner) keyBytes(b []byte) {
	top := &s.frames[len(s.frames)-1]
	if top.odd || len(top.key)+len(b) > MaxKey {
		top.odd = true
		return
	}
	top.key = append(top.key, b...)
}

// value reads the first byte of a value.
func (s *jsonScanner) value(c byte) int {
	switch {
	case isSpace(c):
	case c == '{' || c == '[':
		if len(s.frames) == MaxDepth {
			s.state = jsBroken
			return scanNothing
		}
		// A frame popped keeps its key's buffer for the next one.
		if len(s.frames) < cap(s.frames) {
			s.frames = s.frames[:len(s.frames)+1]
		} else {
			s.frames = append(s.frames, jsonFrame{})
		}
		f := &s.frames[len(s.frames)-1]
		f.object, f.odd, f.key = c == '{', false, f.key[:0]
		s.state = jsFirstValue
		if c == '{' {
			s.state = jsFirstKey
		}
	case c == '"':
		s.state, s.inKey = jsString, false
	case c == '-' || c >= '0' && c <= '9':
		if s.number == nil {
			s.number = s.numberBuf[:0]
		}
		s.number, s.numberLong = append(s.number[:0], c), false
		s.state = jsNumber
	case c == 't':
		s.state, s.literal = jsLiteral, "rue"
	case c == 'f':
		s.state, s.literal = jsLiteral, "alse"
	case c == 'n':
		s.state, s.literal = jsLiteral, "ull"
	default:
		s.state = jsBroken
	}
	return scanNothing
}

// after reads what follows a value in a container.
func (s *jsonScanner) after(c byte) int {
	top := &s.frames[len(s.frames)-1]
	switch {
	case isSpace(c):
	case c == ',' && top.object:
		s.state = jsKey
	case c == ',':
		s.state = jsValue
	case c == '}' && top.object, c == ']' && !top.object:
		return s.pop()
	default:
		s.state = jsBroken
	}
	return scanNothing
}

// pop ends the innermost container.
func (s *jsonScanner) pop() int {
	s.frames = s.frames[:len(s.frames)-1]
	return s.done()
}

// done ends a value: the document's, when it is at the top.
func (s *jsonScanner) done() int {
	if len(s.frames) == 0 {
		s.state = jsValue
		return scanDocument
	}
	s.state = jsAfter
	return scanNothing
}

// at reports whether the number just read is at path: the keys of the
// innermost objects, consecutive, are the path's names.
func (s *jsonScanner) at(path []string) bool {
	if len(path) > len(s.frames) {
		return false
	}
	frames := s.frames[len(s.frames)-len(path):]
	for i, name := range path {
		f := &frames[i]
		if !f.object || f.odd || string(f.key) != name {
			return false
		}
	}
	return true
}

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}
