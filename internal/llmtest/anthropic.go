package llmtest

import (
	"net/http"
)

// Anthropic's Messages API, as its API reference and its SDK's types give
// it.

// anthropicUsage is the usage of a message (Usage); start is the usage of
// message_start, where the output so far is 1 token.
func anthropicUsage(u usage, start bool) obj {
	output := u.Output
	if start {
		output = min(output, 1)
	}
	return o(
		"input_tokens", u.Input,
		"cache_creation_input_tokens", u.CacheWrite,
		"cache_read_input_tokens", u.CacheRead,
		"cache_creation", o("ephemeral_5m_input_tokens", u.CacheWrite-u.CacheWrite1h, "ephemeral_1h_input_tokens", u.CacheWrite1h),
		"output_tokens", output,
		"output_tokens_details?", when(u.Reasoning > 0 && !start, o("thinking_tokens", u.Reasoning)),
		"server_tool_use?", when(u.WebSearches > 0 && !start, o("web_search_requests", u.WebSearches)),
		"service_tier", u.service("standard"),
	)
}

// anthropicDeltaUsage is the cumulative usage of message_delta
// (MessageDeltaUsage).
func anthropicDeltaUsage(u usage) obj {
	return o(
		"input_tokens", u.Input,
		"cache_creation_input_tokens", u.CacheWrite,
		"cache_read_input_tokens", u.CacheRead,
		"output_tokens", u.Output,
		"output_tokens_details?", when(u.Reasoning > 0, o("thinking_tokens", u.Reasoning)),
		"server_tool_use?", when(u.WebSearches > 0, o("web_search_requests", u.WebSearches)),
	)
}

// anthropicError is Anthropic's error body.
func anthropicError(t turn, status int, message string) reply {
	kind := map[int]string{400: "invalid_request_error", 401: "authentication_error", 403: "permission_error", 404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 529: "overloaded_error"}[status]
	if kind == "" {
		kind = "api_error"
	}
	return reply{status: status, contentType: "application/json", events: []event{{encode(o(
		"type", "error",
		"error", o("type", kind, "message", message),
		"request_id", t.id("req_", 9, 24),
	)), -1}}}
}

// message answers POST /v1/messages.
func message(t turn) reply {
	id := t.id("msg_01", 1, 22)
	msg := func(content []any, stopReason any, u obj, nested any) obj {
		return o(
			"id", id,
			"type", "message",
			"role", "assistant",
			"model", t.req.Model,
			"content", content,
			"stop_reason", stopReason,
			"stop_sequence", nil,
			"usage", u,
			"debug?", nested,
		)
	}
	block := func(s string) obj { return o("type", "text", "text", s) }
	nested := when(t.nested, o("usage", anthropicUsage(usage{}, false)))
	if !t.req.Stream {
		return doc("application/json", encode(msg([]any{block(Text)}, "end_turn", anthropicUsage(t.shown, false), nested)), t.shown.total())
	}
	r := reply{status: http.StatusOK, contentType: "text/event-stream; charset=utf-8", stream: true}
	add := func(name string, reported int64, members ...any) {
		r.events = append(r.events, event{sse(name, encode(append(obj{"type", name}, members...))), reported})
	}
	start := t.shown
	start.Output = min(start.Output, 1)
	add("message_start", start.total(), "message", msg([]any{}, nil, anthropicUsage(t.shown, true), when(t.nested, o("usage", anthropicUsage(usage{}, true)))))
	add("content_block_start", -1, "index", 0, "content_block", block(""))
	add("ping", -1)
	for _, part := range parts {
		add("content_block_delta", -1, "index", 0, "delta", o("type", "text_delta", "text", part))
	}
	add("content_block_stop", -1, "index", 0)
	add("message_delta", t.shown.total(), "delta", o("stop_reason", "end_turn", "stop_sequence", nil), "usage", anthropicDeltaUsage(t.shown),
		"debug?", when(t.nested, o("usage", anthropicDeltaUsage(usage{}))))
	add("message_stop", -1)
	return r
}
