package llmapi

// skipState is where the scanner is in a skipped object or array.
type skipState struct {
	// depth counts the containers open, the skipped one included; bit i of
	// arrays is set when the i-th of them (0: the skipped one) is an array.
	depth  uint8
	arrays uint64
	// inString: in a string; escape: after its backslash, hex: the digits
	// left of a \\u escape.
	inString, escape bool
	hex              uint8
}

// Classes of the bytes of a skipped value outside its strings.
const (
	skipOther uint8 = iota // not JSON's outside a string
	skipToken              // whitespace, a number's or a literal's, ',' or ':'
	skipQuote              // a string begins
	skipOpen               // '{' or '['
	skipClose              // '}' or ']'
)

var skipClass = func() (t [256]uint8) {
	for _, c := range []byte(" \t\r\n,:0123456789+-.eEtrufalsn") {
		t[c] = skipToken
	}
	t['"'] = skipQuote
	t['{'], t['['] = skipOpen, skipOpen
	t['}'], t[']'] = skipClose, skipClose
	return t
}()

func boolBit(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}

// skipBytes reads b in a skipped value, and returns how many bytes it read:
// all of b, or up to the byte that closes the value (the scanner is then
// jsAfter, and the caller ends the value) or that is not JSON (jsBroken).
func (s *jsonScanner) skipBytes(b []byte) int {
	k := &s.skip
	for i := 0; i < len(b); i++ {
		c := b[i]
		if k.inString {
			switch {
			case k.hex > 0:
				if !isHex(c) {
					s.state = jsBroken
					return i
				}
				k.hex--
			case k.escape:
				switch c {
				case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				case 'u':
					k.hex = 4
				default:
					s.state = jsBroken
					return i
				}
				k.escape = false
			default:
				for i < len(b) && plain[b[i]] {
					i++
				}
				switch {
				case i == len(b):
					return i
				case b[i] == '"':
					k.inString = false
				case b[i] == '\\':
					k.escape = true
				default: // a control character
					s.state = jsBroken
					return i
				}
			}
			continue
		}
		switch skipClass[c] {
		case skipToken:
		case skipQuote:
			k.inString = true
		case skipOpen:
			if len(s.frames)+int(k.depth) == MaxDepth {
				s.state = jsBroken
				return i
			}
			k.arrays |= boolBit(c == '[') << k.depth
			k.depth++
		case skipClose:
			k.depth--
			if k.arrays>>k.depth&1 != boolBit(c == ']') {
				s.state = jsBroken
				return i
			}
			k.arrays &^= 1 << k.depth
			if k.depth == 0 {
				s.state = jsAfter
				return i + 1
			}
		default:
			s.state = jsBroken
			return i
		}
	}
	return len(b)
}
