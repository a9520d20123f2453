package llmtest

import (
	"net/http"
)

// Bedrock's Converse and ConverseStream, as its API reference gives them:
// inputTokens without the cache reads and writes, totalTokens with them;
// a stream is event stream messages (eventstream.go) whose payloads carry
// a "p" member of padding, as Bedrock's do.

// bedrockUsage is a TokenUsage.
func bedrockUsage(u usage) obj {
	return o(
		"inputTokens", u.Input,
		"outputTokens", u.Output,
		"totalTokens", u.total(),
		"cacheReadInputTokens?", when(u.CacheRead > 0, u.CacheRead),
		"cacheWriteInputTokens?", when(u.CacheWrite > 0, u.CacheWrite),
	)
}

// bedrockErrorType is the error type of Bedrock's errors for an HTTP
// status.
var bedrockErrorType = map[int]string{400: "ValidationException", 403: "AccessDeniedException", 404: "ResourceNotFoundException", 408: "ModelTimeoutException", 424: "ModelErrorException", 429: "ThrottlingException", 500: "InternalServerException", 503: "ServiceUnavailableException"}

// bedrockError is Bedrock's error: its type in X-Amzn-ErrorType and a
// message.
func bedrockError(status int, message string) reply {
	kind := bedrockErrorType[status]
	if kind == "" {
		kind = "InternalServerException"
	}
	return reply{status: status, contentType: "application/json", header: http.Header{"X-Amzn-Errortype": {kind + ":http://internal.amazon.com/coral/com.amazon.bedrock/"}},
		events: []event{{encode(o("message", message)), -1}}}
}

// converse answers POST /model/{modelId}/converse and converse-stream.
func converse(t turn) reply {
	latency := o("latencyMs", max(t.took.Milliseconds(), 1))
	nested := when(t.nested, o("usage", bedrockUsage(usage{})))
	if !t.req.Stream {
		return doc("application/json", encode(o(
			"metrics", latency,
			"output", o("message", o("content", []any{o("text", Text)}, "role", "assistant")),
			"stopReason", "end_turn",
			"usage", bedrockUsage(t.shown),
			"debug?", nested,
		)), t.shown.total())
	}
	r := reply{status: http.StatusOK, contentType: "application/vnd.amazon.eventstream", stream: true}
	pad := 0
	p := func() string {
		pad++
		return t.id("", uint64(200+pad), 1+pad*5%37)
	}
	add := func(name string, reported int64, payload obj) {
		r.events = append(r.events, event{bedrockEvent(name, encode(payload)), reported})
	}
	add("messageStart", -1, o("p", p(), "role", "assistant"))
	for _, part := range parts {
		add("contentBlockDelta", -1, o("contentBlockIndex", 0, "delta", o("text", part), "p", p()))
	}
	add("contentBlockStop", -1, o("contentBlockIndex", 0, "p", p()))
	add("messageStop", -1, o("p", p(), "stopReason", "end_turn"))
	add("metadata", t.shown.total(), o("metrics", latency, "p", p(), "usage", bedrockUsage(t.shown), "debug?", nested))
	return r
}
