// Package llmapi knows the wire formats of the LLM APIs, so that nothing
// else has to: for each API, the most a request can spend, read from its
// JSON body, and the usage its response reports, read as the body streams
// past.
//
// The contract:
//
//   - [ReadRequest] returns a bound that no server reading the same body can
//     exceed: output bound x every multiplier + the body's bytes (a text
//     prompt never has more tokens than bytes). Keys match as the most
//     lenient server reads them (Unicode simple case folding, escapes
//     decoded; of duplicate keys the largest value), only at the places the
//     API names (never inside messages or tools), and a body that is not one
//     JSON value is an error ([ErrNotJSON]), since some server might read a
//     larger bound from it.
//   - [UsageReader] reports the usage the vendor charges, read only where
//     the API puts it: the top-level object of each JSON document (each
//     element of a top-level array), each server-sent event's data, each
//     NDJSON line, or the payload of an AWS event stream's metadata frame.
//     Fields that are parts of another (cached tokens within the prompt,
//     reasoning within the output) are never added twice; cumulative fields
//     take their last value; a document or event cut short counts for
//     nothing. It keeps no part of the body and allocates nothing per byte.
//
// One file per vendor holds its table: where the output bound is, which
// fields multiply it, where the usage lives, which fields are parts of a
// total, which are cumulative. The readers here are driven by those tables
// and know no vendor. Every number is at most strictnum.Max (2^53).
//
// The types here are not safe for concurrent use; a reader belongs to one
// response.
package llmapi

import (
	"net/url"
	"strings"
)

// String names the API as logs and placeholders show it.
func (a API) String() string {
	if int(a) < len(tables) && tables[a] != nil {
		return tables[a].name
	}
	return "unknown"
}

// Detect tells the API from a request's URL path. It matches the path's
// end, so a prefix (/openai/v1, /api/v1) still matches; a path it does not
// know exactly (a trailing slash, other case, escaped letters) is Unknown,
// which reads every table at once and so never reserves less. Pass the
// escaped path (url.URL.EscapedPath) so that a Bedrock model id keeps its
// escaped slashes.
func Detect(path string) API {
	api, _ := detect(path)
	return api
}

// detect returns the API and, for the APIs that name it in the path, the
// model (unescaped).
func detect(path string) (API, string) {
	switch {
	case strings.HasSuffix(path, "/chat/completions"):
		return OpenAIChat, ""
	case strings.HasSuffix(path, "/completions"):
		return OpenAICompletions, ""
	case strings.HasSuffix(path, "/responses"):
		return OpenAIResponses, ""
	case strings.HasSuffix(path, "/messages/count_tokens"):
		return AnthropicCountTokens, ""
	case strings.HasSuffix(path, "/messages/batches"):
		return AnthropicBatches, ""
	case strings.HasSuffix(path, "/batches"):
		return OpenAIBatches, ""
	case strings.HasSuffix(path, "/embeddings"):
		return OpenAIEmbeddings, ""
	case strings.HasSuffix(path, "/messages"):
		return AnthropicMessages, ""
	case strings.HasSuffix(path, "/api/chat"), strings.HasSuffix(path, "/api/generate"):
		return Ollama, ""
	}
	if model, method, ok := geminiModel(path); ok {
		if method == "batchGenerateContent" {
			return GeminiBatch, model
		}
		return Gemini, model
	}
	if model, ok := bedrockModel(path); ok {
		return BedrockConverse, model
	}
	return Unknown, ""
}

// geminiModel reads .../models/{model}:generateContent (or
// :streamGenerateContent, :batchGenerateContent, the ':' possibly escaped).
func geminiModel(path string) (model, method string, ok bool) {
	i := strings.LastIndex(path, "/models/")
	if i < 0 {
		return "", "", false
	}
	rest := path[i+len("/models/"):]
	for _, method := range [...]string{"generateContent", "streamGenerateContent", "batchGenerateContent"} {
		for _, colon := range [...]string{":", "%3A", "%3a"} {
			if model, ok := strings.CutSuffix(rest, colon+method); ok && model != "" && !strings.Contains(model, "/") {
				return unescape(model), method, true
			}
		}
	}
	return "", "", false
}

// bedrockModel reads /model/{modelId}/converse and /converse-stream. The
// model id is what lies between the first /model/ and the method, so an
// ARN whose slashes were not escaped still reads whole.
func bedrockModel(path string) (string, bool) {
	i := strings.Index(path, "/model/")
	if i < 0 {
		return "", false
	}
	rest := path[i+len("/model/"):]
	for _, method := range [...]string{"/converse", "/converse-stream"} {
		if model, ok := strings.CutSuffix(rest, method); ok && model != "" {
			return unescape(model), true
		}
	}
	return "", false
}

func unescape(s string) string {
	if u, err := url.PathUnescape(s); err == nil {
		return u
	}
	return s
}
