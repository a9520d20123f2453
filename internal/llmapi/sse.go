package llmapi

// What a byte of an event stream is.
const (
	sseOther    = iota // a field name, another field, a comment
	sseData            // a byte of a data field's value
	sseDataEnd         // the end of a data line
	sseDispatch        // the blank line that ends an event
)

// sseLines splits an event stream (WHATWG HTML, server-sent events) into
// its data and the ends of its events, keeping nothing but the field name
// being read (at most 5 bytes: only "data" matters). Lines end at \r\n,
// \n or \r; the lines of an event's data join with a newline.
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
