package llmapi

// skipState reads a skipped object or array: by its strings and brackets
// alone, checking what that reading can (bytes that are not JSON's, a
// string's bytes and escapes, brackets that match, the depth), not its
// grammar.
type skipState struct {
	// depth counts the containers open, the skipped one included; bit i of
	// arrays is set when the i-th of them (0: the skipped one) is an array.
	depth  uint8
	arrays uint64
	// inString: in a string; escape: after its backslash, hex: the digits
	// left of a \u escape.
	inString, escape bool
	hex              uint8
}

// What a skipped value's bytes came to.
const (
	skipGoesOn uint8 = iota // the value goes on past them
	skipClosed              // the last byte read closed it
	skipBad                 // the byte after those read is not JSON
)

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

// start begins the skipped value whose first byte is c, with outer
// containers around it.
func (k *skipState) start(c byte) { *k = skipState{depth: 1, arrays: boolBit(c == '[')} }

// read reads b in the skipped value, which outer containers hold, and
// returns how many bytes it read and what they came to: all of b (the value
// goes on), up to the byte that closes the value, or up to a byte that is
// not JSON (or that nests the value past MaxDepth).
func (k *skipState) read(b []byte, outer int) (int, uint8) {
	for i := 0; i < len(b); i++ {
		c := b[i]
		if k.inString {
			switch {
			case k.hex > 0:
				if !isHex(c) {
					return i, skipBad
				}
				k.hex--
			case k.escape:
				switch c {
				case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				case 'u':
					k.hex = 4
				default:
					return i, skipBad
				}
				k.escape = false
			default:
				for i < len(b) && plain[b[i]] {
					i++
				}
				switch {
				case i == len(b):
					return i, skipGoesOn
				case b[i] == '"':
					k.inString = false
				case b[i] == '\\':
					k.escape = true
				default: // a control character
					return i, skipBad
				}
			}
			continue
		}
		switch skipClass[c] {
		case skipToken:
		case skipQuote:
			k.inString = true
		case skipOpen:
			if outer+int(k.depth) == MaxDepth {
				return i, skipBad
			}
			k.arrays |= boolBit(c == '[') << k.depth
			k.depth++
		case skipClose:
			k.depth--
			if k.arrays>>k.depth&1 != boolBit(c == ']') {
				return i, skipBad
			}
			k.arrays &^= 1 << k.depth
			if k.depth == 0 {
				return i + 1, skipClosed
			}
		default:
			return i, skipBad
		}
	}
	return len(b), skipGoesOn
}
