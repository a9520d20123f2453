// Package jsonusage reads, as a response body passes, the usage numbers
// that a zone's settle json names, without keeping the body.
//
// A path is matched from the top of each document only: the top-level
// object of a JSON document (of each element of a top-level array, as
// Gemini streams its responses; of each NDJSON line), or of a server-sent
// event's data. So usage.total_tokens is the document's own top-level
// usage.total_tokens, never response.usage.total_tokens nor
// choices[0].usage.total_tokens: a usage object inside content, tool input
// or any deeper object never changes the charge. The scanner is llmapi's,
// which also knows the vendors' own usage (settle llm).
package jsonusage

import "github.com/slidingratelimit/caddy-sliding-ratelimit/internal/llmapi"

// The bounds of the JSON read here, and by cost json.
const (
	// MaxDepth is the deepest a document is read; a deeper one is skipped
	// as if it were not JSON (usage sits a few levels down).
	MaxDepth = llmapi.MaxDepth
	// MaxKey is how much of a key is kept: a longer one matches no path.
	MaxKey = llmapi.MaxKey
	// MaxNumber is the longest number read: a longer one is not a usage
	// (2^53 has 16 digits).
	MaxNumber = llmapi.MaxNumber
)

// Usage reads, as a response body passes, the usage that settle json
// names: for each path, the last number found at it from the top of a
// document, in one JSON document (or a sequence of them, as
// newline-delimited JSON streams are, or the elements of a top-level
// array), or in the data of each server-sent event. Whether the body is
// events or JSON is told by its first byte ('{' or '[': JSON), since
// OpenAI-compatible servers send events under other types. It keeps no
// part of the body: its memory does not grow with the body, and the body
// goes on as it came.
//
// A document's numbers count once it is whole: a document cut short, or
// that is not JSON (`data: [DONE]`), adds nothing.
type Usage struct {
	r *llmapi.PathReader
}

// Why settle json found no usage.
const (
	Encoded = llmapi.Encoded
	Cut     = "response cut short"
)

// New returns a reader of paths (dotted names, split at their dots) for a
// response with the headers contentType and contentEncoding. A body with a
// Content-Encoding other than identity is not read (Encoded).
func New(paths [][]string, contentType, contentEncoding string) *Usage {
	return &Usage{r: llmapi.NewPathReader(paths, contentType, contentEncoding)}
}

// Write reads the next bytes of the body.
func (u *Usage) Write(b []byte) { u.r.Write(b) }

// Total is the sum of the numbers found, and "" or why there is none to
// charge: no path found (strictnum.Missing), one whose last number is not
// whole (strictnum.NotWhole), an encoded body (Encoded).
func (u *Usage) Total() (int64, string) { return u.r.Sum() }
