package llmapi

import "strings"

// API is one LLM API's wire format, as told by the request's URL path.
type API uint8

// The APIs this package knows. Unknown is read with every table at once.
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
