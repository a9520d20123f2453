package llmapi

import (
	"bytes"
	"fmt"
)

// bounder walks a request body (one JSON value, checked by the places'
// walk) by its API's shapes: it counts what the body's bytes do not bound
// (media parts, prompts, tokens a vendor adds, the requests of a batch,
// the searches its server tools may bill) and names the first value it
// cannot bound. It reads on past such a value, skipping it, so that every
// search tool of the body is counted whatever comes before it.
type bounder struct {
	w     walker
	api   API
	model string
	// defaultOutput is the output bound of a nested request that names
	// none.
	defaultOutput int64

	images  int64
	adds    int64
	prompts int64
	// batch are the requests nested in a batch, for the caller to bound.
	batch []nestedRequest
	// why names the first value that cannot be bounded; "" when none.
	why string
	// searches are the searches the body's tools may bill (searchTool);
	// searchWhy names the first tool whose searches nothing bounds, and
	// searchToolsWithout counts the tools whose searches only the
	// request's max_tool_calls bounds.
	searches           int64
	searchWhy          string
	searchToolsWithout int64
	// repeats is set when the body holds what may have the context read
	// more than once, or what the reader does not know (which may).
	repeats bool
}

// nestedRequest is a whole request of api inside a batch, at
// data[start:end].
type nestedRequest struct {
	api        API
	start, end int
}

// walk reads the body by s; b.why then names the first value that cannot
// be bounded, if any.
func (b *bounder) walk(s *shape) error {
	b.w.space()
	if b.w.i == len(b.w.data) {
		return nil
	}
	return b.value(s, 1)
}

// cannot notes why a value cannot be bounded, the first one only.
func (b *bounder) cannot(why string) {
	if b.why == "" {
		b.why = why
	}
}

// skip notes why the value at b.w.i cannot be bounded and reads past it.
func (b *bounder) skip(why string, depth int) error {
	b.cannot(why)
	return b.w.value(depth, 0, 0)
}

// value reads the value at b.w.i by s, at nesting depth.
func (b *bounder) value(s *shape, depth int) error {
	w := &b.w
	if depth > MaxDepth {
		return ErrNotJSON
	}
	c := w.data[w.i]
	if c == 'n' {
		return w.literal("null")
	}
	if c == '[' && s.kind == unbounded && b.emptyArray() {
		return w.value(depth, 0, 0)
	}
	if s.adds > 0 {
		b.adds = addSat(b.adds, s.adds)
	}
	if s.media == anImage {
		b.images++
	}
	switch s.kind {
	case unbounded:
		b.repeats = b.repeats || s.repeats
		return b.skip(s.why, depth)
	case searchTool:
		return b.searchTool(s, depth)
	case prompts:
		return b.prompts1(depth)
	case request:
		return b.nested(depth, s.api)
	}
	if s.media == imageData {
		return b.imageData(s, depth)
	}
	switch {
	case c == '[' && s.kind == list:
		return b.array(s.elem, depth)
	case c == '[' && (s.kind == object || s.kind == tagged):
		b.repeats = true
		return b.skip(s.name+": a list where one object goes", depth)
	case c == '{' && s.kind == list:
		// One object where a list goes: read as its only element.
		return b.value(s.elem, depth)
	case c == '{' && s.kind == object:
		return b.object(s, depth)
	case c == '{' && s.kind == tagged:
		return b.tagged(s, depth)
	}
	// A scalar, or any value of a free shape: its bytes bound it.
	return w.value(depth, 0, 0)
}

// imageData reads an inline image (base64 text) and adds what its size
// bills.
func (b *bounder) imageData(s *shape, depth int) error {
	w := &b.w
	if w.data[w.i] != '"' {
		return b.skip(s.name+": an inline image that is not base64 text", depth)
	}
	start := w.i
	if err := w.skipString(); err != nil {
		return err
	}
	raw := w.data[start+1 : w.i-1]
	if bytes.IndexByte(raw, '\\') >= 0 {
		raw = decodeString(nil, raw)
	}
	n, ok := geminiImageTokens(raw)
	if !ok {
		b.cannot(s.name + ": an inline image whose size cannot be read (PNG, JPEG, GIF and WebP can be)")
		return nil
	}
	b.adds = addSat(b.adds, n)
	return nil
}

// emptyArray reports whether the array at b.w.i holds nothing.
func (b *bounder) emptyArray() bool {
	d := b.w.data[b.w.i+1:]
	return len(bytes.TrimLeft(d, " \t\r\n")) > 0 && bytes.TrimLeft(d, " \t\r\n")[0] == ']'
}

func (b *bounder) array(elem *shape, depth int) error {
	w := &b.w
	if w.enter(']') {
		return nil
	}
	for {
		w.space()
		if err := b.value(elem, depth+1); err != nil {
			return err
		}
		if more, err := w.more(']'); !more {
			return err
		}
	}
}

// object reads an object of s's fields; a key no field names cannot be
// bounded, unless s is open.
func (b *bounder) object(s *shape, depth int) error {
	w := &b.w
	if w.enter('}') {
		return nil
	}
	for {
		w.space()
		key, err := w.readKey()
		if err != nil {
			return err
		}
		f := s.field(key)
		if f == nil && !s.open {
			b.repeats = true
			b.cannot(fmt.Sprintf("%s: the field %q, which the limiter does not know", s.name, clip(key)))
		}
		if err := w.colon(); err != nil {
			return err
		}
		if f == nil {
			err = w.value(depth+1, 0, 0)
		} else {
			err = b.value(f, depth+1)
		}
		if err != nil {
			return err
		}
		if more, err := w.more('}'); !more {
			return err
		}
	}
}

// field returns the shape of the key (folded as servers fold it), nil when
// no field names it; a key too long to be a name (nil) names none.
func (s *shape) field(key []byte) *shape {
	if key == nil {
		return nil
	}
	for _, f := range s.fields {
		for _, name := range f.names {
			if bytes.EqualFold(key, []byte(name)) {
				return f.shape
			}
		}
	}
	return nil
}

// tagged reads an object whose tag's value chooses its shape: the object
// is read twice, for its tag, then by the variant's shape.
func (b *bounder) tagged(s *shape, depth int) error {
	w := &b.w
	start := w.i
	tag, ok, err := b.tagOf(s, depth)
	if err != nil {
		return err
	}
	// The object has been read whole: one that cannot be bounded is
	// passed. What it is is not known, so it may repeat.
	if !ok {
		b.cannot(s.name + ": a type given twice, differently")
		b.repeats = true
		return nil
	}
	v := s.variant(tag)
	if v == nil {
		b.repeats = true
		if len(tag) == 0 {
			b.cannot(s.name + " without a type")
		} else {
			b.cannot(fmt.Sprintf("%s of type %q, which the limiter cannot bound", s.name, clip(tag)))
		}
		return nil
	}
	w.i = start
	return b.value(v, depth)
}

// tagOf reads the object at b.w.i for its tag's string value: "" when it
// has none, ok false when it has two that differ or one that is no string.
func (b *bounder) tagOf(s *shape, depth int) (tag []byte, ok bool, err error) {
	w := &b.w
	if w.enter('}') {
		return nil, true, nil
	}
	seen := false
	ok = true
	for {
		w.space()
		key, err := w.readKey()
		if err != nil {
			return nil, false, err
		}
		isTag := false
		for _, n := range s.tags {
			isTag = isTag || key != nil && bytes.EqualFold(key, []byte(n))
		}
		if err := w.colon(); err != nil {
			return nil, false, err
		}
		switch {
		case isTag && w.data[w.i] == '"':
			start := w.i
			if err := w.skipString(); err != nil {
				return nil, false, err
			}
			v := w.data[start+1 : w.i-1]
			if bytes.IndexByte(v, '\\') >= 0 {
				v = decodeString(nil, v)
			}
			if seen && !bytes.Equal(v, tag) {
				ok = false
			}
			tag, seen = v, true
		case isTag && w.data[w.i] == 'n':
			err = w.literal("null")
		default:
			if isTag {
				ok = false
			}
			err = w.value(depth+1, 0, 0)
		}
		if err != nil {
			return nil, false, err
		}
		if more, err := w.more('}'); err != nil {
			return nil, false, err
		} else if !more {
			return tag, ok, nil
		}
	}
}

// variant returns the shape of the tag's value: an exact match (vendors
// match types exactly), or a pattern ending in '*' by prefix.
func (s *shape) variant(tag []byte) *shape {
	for _, v := range s.variants {
		if p, ok := cutStar(v.value); ok {
			if len(tag) > 0 && len(tag) >= len(p) && string(tag[:len(p)]) == p {
				return v.shape
			}
		} else if string(tag) == v.value {
			return v.shape
		}
	}
	return nil
}

func cutStar(s string) (string, bool) {
	if n := len(s); n > 0 && s[n-1] == '*' {
		return s[:n-1], true
	}
	return s, false
}

// prompts1 reads Completions' prompt: a string or an array of token ids is
// one prompt; an array of strings or of token arrays is a prompt each.
func (b *bounder) prompts1(depth int) error {
	w := &b.w
	if w.data[w.i] != '[' {
		b.prompts = max(b.prompts, 1)
		return w.value(depth, 0, 0)
	}
	var n int64
	for more := !w.enter(']'); more; {
		w.space()
		if c := w.data[w.i]; c == '"' || c == '[' {
			n++
		}
		if err := w.value(depth+1, 0, 0); err != nil {
			return err
		}
		var err error
		if more, err = w.more(']'); err != nil {
			return err
		}
	}
	b.prompts = max(b.prompts, n, 1)
	return nil
}

// nested reads a whole request of api inside a batch, which the caller
// bounds (its bytes are the batch's already).
func (b *bounder) nested(depth int, api API) error {
	w := &b.w
	start := w.i
	if err := w.value(depth, 0, 0); err != nil {
		return err
	}
	b.batch = append(b.batch, nestedRequest{api: api, start: start, end: w.i})
	return nil
}

// searchTool reads a server tool that bills a fee per search: its results
// cannot be bounded, and its searches are counted, by its own field, by
// the request's tool calls, or by nothing (b.searchWhy).
func (b *bounder) searchTool(s *shape, depth int) error {
	start := b.w.i
	if err := b.skip(s.why, depth); err != nil {
		return err
	}
	switch {
	case s.byToolCalls:
		b.searchToolsWithout++
		return nil
	case s.count != "":
		// Any value but a positive number (a -1 a server may read as no
		// limit, a word) leaves the searches unbounded.
		v, err := ReadPaths(b.w.data[start:b.w.i], [][]string{{s.count}})
		if err == nil && v[0].Found && v[0].N > 0 && !v[0].Odd {
			b.searches = addSat(b.searches, v[0].N)
			return nil
		}
	}
	if b.searchWhy == "" {
		b.searchWhy = s.countWhy
	}
	return nil
}

// clip shortens a key for a message: it is the client's.
func clip(key []byte) string {
	if len(key) > MaxKey {
		return string(key[:MaxKey]) + "..."
	}
	return string(key)
}
