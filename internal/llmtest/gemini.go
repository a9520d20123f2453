package llmtest

import (
	"net/http"
)

// Gemini's generateContent and streamGenerateContent, as its API
// reference gives them and as its API sends them: members of value 0 left
// out (thoughtsTokenCount, cachedContentTokenCount), and in a stream
// every chunk with the usage so far.

// geminiUsage is a usageMetadata: the prompt's, the thoughts' (all of
// them from the first chunk on, since they come before the answer) and
// candidates tokens of the answer so far.
func geminiUsage(u usage, candidates int64) obj {
	prompt := u.prompt()
	return o(
		"promptTokenCount", prompt,
		"candidatesTokenCount", candidates,
		"totalTokenCount", prompt+candidates+u.Reasoning,
		"cachedContentTokenCount?", when(u.CacheRead > 0, u.CacheRead),
		"promptTokensDetails", []any{o("modality", "TEXT", "tokenCount", prompt)},
		"cacheTokensDetails?", when(u.CacheRead > 0, []any{o("modality", "TEXT", "tokenCount", u.CacheRead)}),
		"thoughtsTokenCount?", when(u.Reasoning > 0, u.Reasoning),
	)
}

// geminiStatus is the status name of Gemini's errors for an HTTP status.
var geminiStatus = map[int]string{400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "NOT_FOUND", 429: "RESOURCE_EXHAUSTED", 499: "CANCELLED", 500: "INTERNAL", 503: "UNAVAILABLE", 504: "DEADLINE_EXCEEDED"}

// geminiError is Gemini's error body.
func geminiError(status int, message string) reply {
	name := geminiStatus[status]
	if name == "" {
		name = "UNKNOWN"
	}
	return reply{status: status, contentType: "application/json; charset=UTF-8", events: []event{{encode(o(
		"error", o("code", status, "message", message, "status", name),
	)), -1}}}
}

// generateContent answers POST /v1beta/models/{model}:generateContent, and
// :streamGenerateContent as server-sent events (?alt=sse, separated by
// CRLF pairs as Gemini sends them) or as a JSON array sent element by
// element (without alt=sse).
func generateContent(t turn, sse bool) reply {
	id := t.id("", 1, 23)
	candidatesTokens := t.shown.Output - t.shown.Reasoning
	chunk := func(s string, last bool, candidates int64) obj {
		var cs []any
		for i := range t.req.Choices {
			cs = append(cs, o(
				"content", o("parts", []any{o("text", s)}, "role", "model"),
				"finishReason?", when(last, "STOP"),
				"index", i,
			))
		}
		return o(
			"candidates", cs,
			"usageMetadata", geminiUsage(t.shown, candidates),
			"debug?", when(t.nested, o("usageMetadata", geminiUsage(usage{}, 0))),
			"modelVersion", t.req.Model,
			"responseId", id,
		)
	}
	if !t.req.Stream {
		return doc("application/json; charset=UTF-8", encode(chunk(Text, true, candidatesTokens)), t.shown.total())
	}
	r := reply{status: http.StatusOK, stream: true, contentType: "application/json; charset=UTF-8"}
	if sse {
		r.contentType = "text/event-stream"
	}
	for i, part := range parts {
		candidates := candidatesTokens * int64(i+1) / int64(len(parts))
		data := encode(chunk(part, i == len(parts)-1, candidates))
		var b []byte
		switch {
		case sse:
			b = append(append([]byte("data: "), data...), "\r\n\r\n"...)
		case i == 0:
			b = append([]byte("["), data...)
		default:
			b = append([]byte("\n,\r\n"), data...)
		}
		if !sse && i == len(parts)-1 {
			b = append(b, "\n]"...)
		}
		r.events = append(r.events, event{b, t.shown.prompt() + candidates + t.shown.Reasoning})
	}
	return r
}
