package llmapi

import "github.com/slidingratelimit/caddy-sliding-ratelimit/internal/strictnum"

// What a step of the scanner completed.
const (
	scanNothing  = iota
	scanNumber   // a number, in number
	scanDocument // a document: a top-level value, or an element of a top-level array
	scanString   // a string at one of strings' paths, in str
)

// maxStr is the longest string value kept ("priority" has 8 bytes); a
// longer one is kept as its first maxStr bytes and marked long.
const maxStr = 16

// maxType is the longest top-level "type" kept ("response.incomplete" has
// 19 bytes); a longer one matches no table's condition.
const maxType = 32

// jsonScanner is a JSON tokenizer (RFC 8259) fed a byte at a time, which
// keeps only the keys of the objects it is in (each cut at MaxKey bytes,
// at most MaxDepth of them), the number it reads and its document's
// top-level "type". Anything that is not JSON stops it until reset. The
// documents are the values of a sequence (NDJSON, or JSON values one after
// another) and the elements of a top-level array.
//
// An object or array inside a document that no path of paths can lead
// into (an array, or an object whose keys from the document's top are no
// path's first names) is skipped: read by its strings and brackets alone,
// several times faster than token by token, since it decides nothing (the
// choices of a chat completion chunk are most of its bytes). What it holds
// is checked as far as that reading goes (bytes that are not JSON's, a
// string's bytes and escapes, brackets that match, the depth), not its
// grammar (a missing comma).
type jsonScanner struct {
	state uint8
	// paths are where the numbers wanted are, from the top of a document;
	// strings those of the strings wanted (also in paths).
	paths, strings [][]string
	skip           skipState
	frames         []jsonFrame
	// base is 1 inside a top-level array (its elements are the
	// documents), else 0: the frames of a document are frames[base:].
	base int
	// inKey is true while a string is an object's key.
	inKey bool
	// literal is what is left to read of true, false or null.
	literal string
	// hex counts the digits left of a \u escape.
	hex        uint8
	number     [MaxNumber]byte
	numberLen  uint8
	numberLong bool
	// docType is the document's top-level "type", when typeState is
	// typeRead.
	docType    [maxType]byte
	docTypeLen uint8
	typeState  uint8
	// str is the string being read at one of strings' paths, while
	// strReading.
	str        [maxStr]byte
	strLen     uint8
	strLong    bool
	strReading bool
	frameBuf   [8]jsonFrame
}

// jsonFrame is an object or array the scanner is in; an object's key is the
// one whose value it reads.
type jsonFrame struct {
	object bool
	// odd is true when the key is too long or escaped: it matches nothing.
	odd    bool
	keyLen uint8
	key    [MaxKey]byte
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
	jsSkip // in a skipped object or array
	jsBroken
)

// What is known of the document's top-level "type".
const (
	typeNone uint8 = iota
	typeReading
	typeRead
	typeOdd // escaped or too long: it matches no condition
)

func (s *jsonScanner) reset() {
	if s.frames == nil {
		s.frames = s.frameBuf[:0]
	}
	s.state, s.frames, s.base, s.typeState, s.strReading = jsValue, s.frames[:0], 0, typeNone, false
}

// broken reports whether the scanner stopped at something not JSON.
func (s *jsonScanner) broken() bool { return s.state == jsBroken }

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
			top.keyLen, top.odd = 0, false
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
			if s.typeState == typeReading {
				s.typeState = typeRead
			}
			if s.strReading {
				s.strReading = false
				s.done()
				return scanString
			}
			return s.done()
		case c == '\\':
			s.state = jsEscape
		case c < 0x20:
			s.state = jsBroken
		default:
			s.stringBytes([]byte{c})
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
		switch c {
		case '"', '\\', '/', 'b', 'f', 'n', 'r', 't', 'u':
		default:
			s.state = jsBroken
			return scanNothing
		}
		// An escaped key is no place's (vendors write their keys plain), nor
		// an escaped type any condition's.
		if s.inKey {
			s.frames[len(s.frames)-1].odd = true
		} else if s.typeState == typeReading {
			s.typeState = typeOdd
		}
		s.strLong = true // an escaped value is no known one
		s.state = jsString
		if c == 'u' {
			s.hex, s.state = 4, jsEscape
		}
	case jsNumber:
		if c >= '0' && c <= '9' || c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-' {
			if s.numberLen < MaxNumber {
				s.number[s.numberLen] = c
				s.numberLen++
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
	case jsSkip:
		_, end := s.skip.read([]byte{c}, len(s.frames))
		return s.skipped(end)
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

// stringBytes reads b, plain bytes of the string being read: of a key, up
// to MaxKey bytes (a longer key matches nothing); of the document's "type",
// up to maxType.
func (s *jsonScanner) stringBytes(b []byte) {
	switch {
	case s.inKey:
		top := &s.frames[len(s.frames)-1]
		if top.odd || int(top.keyLen)+len(b) > MaxKey {
			top.odd = true
			return
		}
		top.keyLen += uint8(copy(top.key[top.keyLen:], b))
	case s.typeState == typeReading:
		if int(s.docTypeLen)+len(b) > maxType {
			s.typeState = typeOdd
			return
		}
		s.docTypeLen += uint8(copy(s.docType[s.docTypeLen:], b))
	case s.strReading:
		n := copy(s.str[s.strLen:], b)
		s.strLen += uint8(n)
		s.strLong = s.strLong || n < len(b)
	}
}

// value reads the first byte of a value.
func (s *jsonScanner) value(c byte) int {
	if isSpace(c) {
		return scanNothing
	}
	if len(s.frames) == s.base {
		// A document begins.
		s.typeState = typeNone
	}
	switch {
	case c == '{' || c == '[':
		if len(s.frames) == MaxDepth {
			s.state = jsBroken
			return scanNothing
		}
		if len(s.frames) > s.base && !s.leadsToPath() {
			s.state = jsSkip
			s.skip.start(c)
			return scanNothing
		}
		if len(s.frames) == 0 && c == '[' {
			s.base = 1
		}
		if len(s.frames) < cap(s.frames) {
			s.frames = s.frames[:len(s.frames)+1]
		} else {
			s.frames = append(s.frames, jsonFrame{})
		}
		f := &s.frames[len(s.frames)-1]
		f.object, f.odd, f.keyLen = c == '{', false, 0
		s.state = jsFirstValue
		if c == '{' {
			s.state = jsFirstKey
		}
	case c == '"':
		s.state, s.inKey = jsString, false
		if s.atKey("type") {
			s.typeState, s.docTypeLen = typeReading, 0
		}
		for _, p := range s.strings {
			if s.at(p) {
				s.strReading, s.strLen, s.strLong = true, 0, false
				break
			}
		}
	case c == '-' || c >= '0' && c <= '9':
		s.number[0], s.numberLen, s.numberLong = c, 1, false
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

// atKey reports whether the value being read is the document's top-level
// key name.
func (s *jsonScanner) atKey(name string) bool {
	if len(s.frames) != s.base+1 {
		return false
	}
	f := &s.frames[len(s.frames)-1]
	return f.object && !f.odd && string(f.key[:f.keyLen]) == name
}

// skipped moves on from what bytes of a skipped value came to: the value
// ends when they closed it, the document when one was not JSON.
func (s *jsonScanner) skipped(end uint8) int {
	switch end {
	case skipClosed:
		return s.done()
	case skipBad:
		s.state = jsBroken
	}
	return scanNothing
}

// leadsToPath reports whether a container that begins now can hold a path's
// number: the objects it is in, from the document's top, have the first
// names of a longer path as keys.
func (s *jsonScanner) leadsToPath() bool {
	frames := s.frames[s.base:]
	for _, path := range s.paths {
		if len(path) <= len(frames) {
			continue
		}
		i := 0
		for i < len(frames) && frames[i].object && !frames[i].odd && string(frames[i].key[:frames[i].keyLen]) == path[i] {
			i++
		}
		if i == len(frames) {
			return true
		}
	}
	return false
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
	if len(s.frames) == 0 && s.base == 1 {
		// The top-level array ends: its elements were the documents.
		s.base, s.state = 0, jsValue
		return scanNothing
	}
	return s.done()
}

// done ends a value: a document's, when it is at the documents' level.
func (s *jsonScanner) done() int {
	s.state = jsAfter
	if len(s.frames) == 0 {
		s.state = jsValue
	}
	if len(s.frames) == s.base {
		return scanDocument
	}
	return scanNothing
}

// at reports whether the number just read is at path from the top of its
// document: the document's objects, nested without an array between, have
// the path's names as keys.
func (s *jsonScanner) at(path []string) bool {
	frames := s.frames[s.base:]
	if len(path) != len(frames) {
		return false
	}
	for i, name := range path {
		f := &frames[i]
		if !f.object || f.odd || string(f.key[:f.keyLen]) != name {
			return false
		}
	}
	return true
}

// typeIs reports whether the document's top-level "type" is one of names.
func (s *jsonScanner) typeIs(names []string) bool {
	if s.typeState != typeRead {
		return false
	}
	for _, n := range names {
		if string(s.docType[:s.docTypeLen]) == n {
			return true
		}
	}
	return false
}

// text is the string just read at one of strings' paths; long when it was
// cut or escaped.
func (s *jsonScanner) text() (b []byte, long bool) { return s.str[:s.strLen], s.strLong }

// whole reads the number just read as a whole number of at least 0 (digits
// only), at most strictnum.Max.
func (s *jsonScanner) whole() (int64, bool) {
	if s.numberLong {
		return 0, false
	}
	return parseWhole(s.number[:s.numberLen])
}

// parseWhole reads digits as a whole number, at most strictnum.Max.
func parseWhole(b []byte) (int64, bool) {
	if len(b) == 0 {
		return 0, false
	}
	var n int64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		if n < strictnum.Max {
			n = n*10 + int64(c-'0')
		}
	}
	return min(n, strictnum.Max), true
}
