package llmapi

// A shape is what a request body may hold at one place, and what each value
// there costs beyond its bytes. The vendor files describe each API's request
// as shapes: a closed world, in which a key, a part type or a reference that
// no shape names cannot be bounded (Request.Unbounded), so that a feature a
// vendor adds tomorrow is never free.
type shape struct {
	kind shapeKind
	// name says where the shape is, in words ("a message's content part"),
	// for the reason a value cannot be bounded.
	name string

	// fields are an object's keys (kind object): each name with every
	// spelling a server accepts (case folding covers the rest).
	fields []field
	// open is set for an object whose other keys cost their bytes alone (a
	// JSON schema, metadata).
	open bool

	// elem is an array's element (kind list); a string in its place is one
	// text, bounded by its bytes.
	elem *shape

	// tag is the key whose string value chooses the variant (kind tagged);
	// variants are tried in order, a name ending in '*' matching by prefix.
	// A value without the tag takes the variant named "".
	tag      string
	variants []variant

	// why is what cannot be bounded (kind unbounded).
	why string

	// media is what the value counts as beyond its bytes.
	media media
	// adds are tokens the value adds beyond its bytes wherever it is (a
	// vendor's tool-use system prompt).
	adds int64

	// api is the API of a request nested in a batch (kind request).
	api API
}

type shapeKind uint8

const (
	// anyJSON is any value, bounded by its bytes: text, numbers, a schema.
	anyJSON shapeKind = iota
	// object is an object of known keys.
	object
	// list is an array of elem, or a string.
	list
	// tagged is an object whose shape its tag's value chooses.
	tagged
	// unbounded is a value that cannot be bounded when present and not
	// null: input by reference, a hosted tool, a feature the limiter does
	// not know.
	unbounded
	// prompts is OpenAI Completions' prompt: a string, an array of token
	// ids (one prompt), or an array of strings or of token arrays (a
	// prompt each, every one generating n completions).
	prompts
	// request is a whole request of api, nested in a batch: its bound is
	// added to the batch's.
	request
)

// field is one key of an object shape.
type field struct {
	names []string
	shape *shape
}

// variant is one shape of a tagged object.
type variant struct {
	value string
	shape *shape
}

// free is a value bounded by its bytes.
var free = &shape{kind: anyJSON}

// obj returns an object shape of the fields, each named by a "name" or
// "name|spelling" string and followed by its shape.
func obj(name string, kv ...any) *shape {
	s := &shape{kind: object, name: name}
	for i := 0; i < len(kv); i += 2 {
		s.fields = append(s.fields, field{names: splitNames(kv[i].(string)), shape: kv[i+1].(*shape)})
	}
	return s
}

// openObj is obj whose other keys are bounded by their bytes.
func openObj(name string, kv ...any) *shape {
	s := obj(name, kv...)
	s.open = true
	return s
}

// listOf returns an array (or string) of elem.
func listOf(elem *shape) *shape { return &shape{kind: list, elem: elem} }

// byTag returns a tagged shape: tag's value, then a shape, pairs.
func byTag(name, tag string, kv ...any) *shape {
	s := &shape{kind: tagged, name: name, tag: tag}
	for i := 0; i < len(kv); i += 2 {
		s.variants = append(s.variants, variant{value: kv[i].(string), shape: kv[i+1].(*shape)})
	}
	return s
}

// cannot returns a shape that cannot be bounded, saying why.
func cannot(why string) *shape { return &shape{kind: unbounded, why: why} }

// counted returns s counting as m beyond its bytes.
func counted(s *shape, m media) *shape {
	c := *s
	c.media = m
	return &c
}

// adding returns s adding n tokens beyond its bytes.
func adding(s *shape, n int64) *shape {
	c := *s
	c.adds = n
	return &c
}

// nested returns the shape of a whole request of api inside a batch.
func nested(api API) *shape { return &shape{kind: request, api: api} }

func splitNames(s string) []string {
	var out []string
	for start, i := 0, 0; i <= len(s); i++ {
		if i == len(s) || s[i] == '|' {
			out = append(out, s[start:i])
			start = i + 1
		}
	}
	return out
}

// protoFields adds, to every field of s and of the shapes within it, its
// proto (snake_case) spelling: proto JSON accepts both.
func protoFields(s *shape) *shape {
	seen := map[*shape]bool{}
	var walk func(*shape)
	walk = func(s *shape) {
		if s == nil || seen[s] {
			return
		}
		seen[s] = true
		for i, f := range s.fields {
			if snake := snakeCase(f.names[0]); snake != f.names[0] {
				s.fields[i].names = append(f.names, snake)
			}
			walk(f.shape)
		}
		walk(s.elem)
		for _, v := range s.variants {
			walk(v.shape)
		}
		if s.kind == tagged {
			if snake := snakeCase(s.tag); snake != s.tag {
				s.tag += "|" + snake
			}
		}
	}
	walk(s)
	return s
}
