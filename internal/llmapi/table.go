package llmapi

import "strings"

// API is one LLM API's wire format, as told by the request's URL path.
type API uint8

// The APIs this package knows. Unknown's responses are read with every
// table at once; its requests cannot be bounded.
const (
	Unknown              API = iota
	OpenAIChat               // .../chat/completions (OpenAI, vLLM, llama.cpp, Ollama's /v1)
	OpenAICompletions        // .../completions
	OpenAIResponses          // .../responses
	AnthropicMessages        // .../messages
	AnthropicCountTokens     // .../messages/count_tokens: generates nothing
	Gemini                   // .../models/{model}:generateContent and :streamGenerateContent
	Ollama                   // /api/chat and /api/generate
	BedrockConverse          // /model/{modelId}/converse and /converse-stream
	OpenAIEmbeddings         // .../embeddings: generates nothing
	OpenAIBatches            // .../batches: its requests are in a file
	AnthropicBatches         // .../messages/batches: its requests added up
	GeminiBatch              // .../models/{model}:batchGenerateContent: its requests added up
)

// A table is what this package knows of one API: a vendor file fills one
// in, and the readers here do the rest.
type table struct {
	api  API
	name string

	// Of the request body (dotted paths from its top; every spelling a
	// server accepts listed):
	// output are the fields that bound the output of one completion: the
	// largest named counts, the default when none is.
	output []reqPath
	// multipliers each make the server generate that many completions:
	// the largest counts.
	multipliers []reqPath
	// addends are added to the output bound when positive (budgets that
	// may be spent beside it).
	addends []reqPath
	// generatesNothing is set for an API whose call has no output.
	generatesNothing bool
	// modelInPath is set when the model is named by the URL path rather
	// than by the body's top-level "model".
	modelInPath bool
	// toolCalls is the top-level field that bounds the calls of all the
	// request's built-in tools together, searches included ("" : none).
	toolCalls string
	// body is the shape of the request body: every key, part type and
	// reference the API takes, and what each costs beyond its bytes
	// (shape.go). nil: no body can be bounded.
	body *shape

	// Of the response:
	// usageAt are the places of the usage object (dotted, from the top of
	// a document or event; "" is the top-level object itself).
	usageAt []usageAt
	// usage are the usage object's fields and what each counts.
	usage []usageField
	// perField is set when a stream's usage fields are cumulative one by
	// one (each takes its last value, across events); otherwise the last
	// document with usage carries it all (running totals).
	perField bool
	// parts are the tables whose usage places this one reads (the generic
	// reading); nil for a vendor's table.
	parts []*table
}

// usageAt is one place of a usage object.
type usageAt struct {
	path string
	// when lists the values of the document's top-level "type" for which
	// the place counts; nil: any document.
	when []string
	// partial is set when a usage here is an early figure that a later
	// event's usage at another place replaces (Anthropic's message_start):
	// until one of those comes, the response has not reported its final
	// usage, and an ending there is charged as a cut one.
	partial bool
}

// usageField is one field of a usage object.
type usageField struct {
	name string // dotted, from the usage object
	kind kind
}

// kind is what a usage field counts.
type kind uint8

const (
	// input tokens, as the vendor counts them: the fields of kind
	// inputCached are within them, those of kind cached and cacheWrite
	// are not.
	input kind = iota
	// inputCached are cache reads counted within input: moved from Input
	// to Cached, never added twice.
	inputCached
	// cached are cache reads counted apart from input.
	cached
	// cacheWrite are input tokens written to a cache, apart from input.
	cacheWrite
	// output tokens, reasoning and thinking included.
	output
	// part is a part of another field (reasoning within output), listed so
	// that the table matches the vendor's reference; it is never read.
	part
	// audioIn and audioOut are the audio tokens within input and output;
	// cacheWrite1h the cache writes of an hour's TTL within cacheWrite.
	audioIn
	audioOut
	cacheWrite1h
	// webSearches counts the web searches a server tool made (a fee
	// each), not tokens.
	webSearches
	// serviceTier is a string: the service tier that served the call.
	// It counts only beside usage in the same document. A name starting
	// with "../" is the usage object's sibling, not its member.
	serviceTier
	// total is the vendor's own whole.
	total
	// sum is a number that settle json names: the numbers are summed.
	sum
)

// reqPath is a dotted path of a request body, each segment with every
// spelling a server accepts.
type reqPath [][]string

// paths returns plain dotted paths, one spelling each (case folding covers
// the rest).
func paths(dotted ...string) []reqPath {
	out := make([]reqPath, len(dotted))
	for i, d := range dotted {
		for _, seg := range strings.Split(d, ".") {
			out[i] = append(out[i], []string{seg})
		}
	}
	return out
}

// protoPaths returns paths in proto JSON, which accepts each field by its
// JSON (lowerCamel) name and by its proto (snake_case) name, segment by
// segment.
func protoPaths(dotted ...string) []reqPath {
	out := paths(dotted...)
	for _, p := range out {
		for i, seg := range p {
			if snake := snakeCase(seg[0]); snake != seg[0] {
				p[i] = append(seg, snake)
			}
		}
	}
	return out
}

func snakeCase(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 'A' && c <= 'Z' {
			b.WriteByte('_')
			c += 'a' - 'A'
		}
		b.WriteByte(c)
	}
	return b.String()
}

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

	// tags are the spellings of the key whose string value chooses the
	// variant (kind tagged);
	// variants are tried in order, a name ending in '*' matching by prefix.
	// A value without the tag takes the variant named "".
	tags     []string
	variants []variant

	// why is what cannot be bounded (kind unbounded).
	why string
	// repeats is set for a value that may have the context read more than
	// once (a server tool's rounds, a batch's requests): not one call's
	// context window (Request.Passes).
	repeats bool

	// media is what the value counts as beyond its bytes.
	media media
	// adds are tokens the value adds beyond its bytes wherever it is (a
	// vendor's tool-use system prompt).
	adds int64

	// api is the API of a request nested in a batch (kind request).
	api API

	// Of a server tool that bills a fee per search (kind searchTool):
	// count is the tool's field that bounds its searches; byToolCalls is
	// set when the request's toolCalls field bounds them instead; with
	// neither, countWhy says that nothing does.
	count       string
	byToolCalls bool
	countWhy    string
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
	// searchTool is a server tool that searches the web for a fee per
	// search: its results are input the body does not carry (why), and
	// its searches are bounded by a field, or by nothing (searching).
	searchTool
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
	s := &shape{kind: tagged, name: name, tags: []string{tag}}
	for i := 0; i < len(kv); i += 2 {
		s.variants = append(s.variants, variant{value: kv[i].(string), shape: kv[i+1].(*shape)})
	}
	return s
}

// cannot returns a shape that cannot be bounded, saying why: input that
// one read of the context holds (by reference, pages of a document).
func cannot(why string) *shape { return &shape{kind: unbounded, why: why} }

// repeating is cannot of a value that may have the context read more than
// once: a server tool that runs rounds, requests in a file.
func repeating(why string) *shape { return &shape{kind: unbounded, why: why, repeats: true} }

// searching returns a search tool whose results are input the body does
// not carry (why) and whose searches its field count bounds; with count
// "", nothing does (countWhy says so).
func searching(why, count, countWhy string) *shape {
	return &shape{kind: searchTool, why: why, count: count, countWhy: countWhy}
}

// searchingByToolCalls is searching, the request's toolCalls field
// bounding the searches of all its tools together.
func searchingByToolCalls(why, countWhy string) *shape {
	return &shape{kind: searchTool, why: why, byToolCalls: true, countWhy: countWhy}
}

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
			if snake := snakeCase(s.tags[0]); snake != s.tags[0] {
				s.tags = append(s.tags, snake)
			}
		}
	}
	walk(s)
	return s
}

// media is what a part of a request counts as beyond its bytes: the
// vendors bill an image by its pixels, not by the bytes that carry it (a
// 1x1 PNG of 70 bytes is 2,833 input tokens on gpt-4o-mini), and by the
// same rule whether it comes inline or by URL.
type media uint8

const (
	noMedia media = iota
	// anImage is an image billed at most imageBound(api, model) tokens,
	// wherever it comes from: the vendor scales every image down to a
	// largest size first.
	anImage
	// imageData is an inline image (base64) billed by its size in
	// tiles that the vendor does not cap (Gemini): the bound reads the
	// size from the image's header; an image whose size cannot be read
	// cannot be bounded.
	imageData
)
