package llmtest

import (
	"net/http"
)

// OpenAI's wire formats: chat completions, completions and the Responses
// API, as its API reference and its SDKs' types give them.

// openaiUsage is the usage of a chat completion (CompletionUsage).
func openaiUsage(u usage) obj {
	return o(
		"prompt_tokens", u.prompt(),
		"completion_tokens", u.Output,
		"total_tokens", u.total(),
		"prompt_tokens_details", o("cached_tokens", u.CacheRead, "audio_tokens", u.AudioInput),
		"completion_tokens_details", o("reasoning_tokens", u.Reasoning, "audio_tokens", u.AudioOutput, "accepted_prediction_tokens", 0, "rejected_prediction_tokens", 0),
	)
}

// openaiError is OpenAI's error body.
func openaiError(status int, message string) reply {
	kind := map[int]string{400: "invalid_request_error", 401: "authentication_error", 403: "permission_error", 404: "not_found_error", 429: "rate_limit_exceeded"}[status]
	if kind == "" {
		kind = "server_error"
	}
	return reply{status: status, contentType: "application/json", events: []event{{encode(o(
		"error", o("message", message, "type", kind, "param", nil, "code", nil),
	)), -1}}}
}

// done ends an OpenAI stream.
var done = event{[]byte("data: [DONE]\n\n"), -1}

// chatCompletion answers POST /v1/chat/completions.
func chatCompletion(t turn) reply {
	id := t.id("chatcmpl-", 1, 29)
	fingerprint := t.id("fp_", 2, 10)
	created := t.created.Unix()
	nested := when(t.nested, o("usage", openaiUsage(usage{})))
	if !t.req.Stream {
		var choices []any
		for i := range t.req.Choices {
			choices = append(choices, o(
				"index", i,
				"message", o("role", "assistant", "content", Text, "refusal", nil, "annotations", []any{}),
				"logprobs", nil,
				"finish_reason", "stop",
			))
		}
		return doc("application/json", encode(o(
			"id", id,
			"object", "chat.completion",
			"created", created,
			"model", t.req.Model,
			"choices", choices,
			"usage", openaiUsage(t.shown),
			"debug?", nested,
			"service_tier", t.shown.service("default"),
			"system_fingerprint", fingerprint,
		)), t.shown.total())
	}
	r := reply{status: http.StatusOK, contentType: "text/event-stream; charset=utf-8", stream: true}
	chunk := func(choices []any, seq uint64, usage any, last bool) event {
		members := []any{
			"id", id,
			"object", "chat.completion.chunk",
			"created", created,
			"model", t.req.Model,
			"service_tier", t.shown.service("default"),
			"system_fingerprint", fingerprint,
			"choices", choices,
		}
		if t.req.IncludeUsage {
			members = append(members, "usage", usage)
		}
		if last {
			members = append(members, "debug?", nested)
			return event{sse("", encode(obj(members))), t.shown.total()}
		}
		members = append(members, "obfuscation", t.id("", 100+seq, 1+int(seq%7)))
		return event{sse("", encode(obj(members))), -1}
	}
	choice := func(i int64, delta obj, finish any) []any {
		return []any{o("index", i, "delta", delta, "logprobs", nil, "finish_reason", finish)}
	}
	var seq uint64
	for i := range t.req.Choices {
		seq++
		r.events = append(r.events, chunk(choice(i, o("role", "assistant", "content", "", "refusal", nil), nil), seq, nil, false))
	}
	for _, part := range parts {
		for i := range t.req.Choices {
			seq++
			r.events = append(r.events, chunk(choice(i, o("content", part), nil), seq, nil, false))
		}
	}
	for i := range t.req.Choices {
		seq++
		r.events = append(r.events, chunk(choice(i, o(), "stop"), seq, nil, false))
	}
	if t.req.IncludeUsage {
		r.events = append(r.events, chunk([]any{}, 0, openaiUsage(t.shown), true))
	}
	r.events = append(r.events, done)
	return r
}

// completion answers POST /v1/completions (the legacy completions API),
// whose usage has no details.
func completion(t turn) reply {
	id := t.id("cmpl-", 1, 29)
	fingerprint := t.id("fp_", 2, 10)
	created := t.created.Unix()
	usageOf := func(u usage) obj {
		return o("prompt_tokens", u.prompt(), "completion_tokens", u.Output, "total_tokens", u.total())
	}
	nested := when(t.nested, o("usage", usageOf(usage{})))
	if !t.req.Stream {
		var choices []any
		for i := range t.req.Choices {
			choices = append(choices, o("text", Text, "index", i, "logprobs", nil, "finish_reason", "stop"))
		}
		return doc("application/json", encode(o(
			"id", id,
			"object", "text_completion",
			"created", created,
			"model", t.req.Model,
			"system_fingerprint", fingerprint,
			"choices", choices,
			"usage", usageOf(t.shown),
			"debug?", nested,
		)), t.shown.total())
	}
	r := reply{status: http.StatusOK, contentType: "text/event-stream; charset=utf-8", stream: true}
	chunk := func(choices []any, usage any, last bool) event {
		members := []any{
			"id", id,
			"object", "text_completion",
			"created", created,
			"model", t.req.Model,
			"system_fingerprint", fingerprint,
			"choices", choices,
		}
		if t.req.IncludeUsage {
			members = append(members, "usage", usage)
		}
		if last {
			members = append(members, "debug?", nested)
			return event{sse("", encode(obj(members))), t.shown.total()}
		}
		return event{sse("", encode(obj(members))), -1}
	}
	for _, part := range parts {
		for i := range t.req.Choices {
			r.events = append(r.events, chunk([]any{o("text", part, "index", i, "logprobs", nil, "finish_reason", nil)}, nil, false))
		}
	}
	for i := range t.req.Choices {
		r.events = append(r.events, chunk([]any{o("text", "", "index", i, "logprobs", nil, "finish_reason", "stop")}, nil, false))
	}
	if t.req.IncludeUsage {
		r.events = append(r.events, chunk([]any{}, usageOf(t.shown), true))
	}
	r.events = append(r.events, done)
	return r
}

// response answers POST /v1/responses.
func response(t turn) reply {
	id := t.id("resp_", 1, 48)
	itemID := t.id("msg_", 2, 48)
	usageOf := func(u usage) obj {
		return o(
			"input_tokens", u.prompt(),
			"input_tokens_details", o("cached_tokens", u.CacheRead),
			"output_tokens", u.Output,
			"output_tokens_details", o("reasoning_tokens", u.Reasoning),
			"total_tokens", u.total(),
		)
	}
	var maxOutput any
	if t.req.Named {
		maxOutput = t.req.Bound
	}
	outputText := func(s string) obj {
		return o("type", "output_text", "annotations", []any{}, "logprobs", []any{}, "text", s)
	}
	item := func(status string, content []any) obj {
		return o("id", itemID, "type", "message", "status", status, "content", content, "role", "assistant")
	}
	whole := item("completed", []any{outputText(Text)})
	resp := func(status string, output []any, u any, nested any) obj {
		return o(
			"id", id,
			"object", "response",
			"created_at", t.created.Unix(),
			"status", status,
			"background", false,
			"error", nil,
			"incomplete_details", nil,
			"instructions", nil,
			"max_output_tokens", maxOutput,
			"max_tool_calls", nil,
			"model", t.req.Model,
			"output", output,
			"parallel_tool_calls", true,
			"previous_response_id", nil,
			"prompt_cache_key", nil,
			"reasoning", o("effort", nil, "summary", nil),
			"safety_identifier", nil,
			"service_tier", t.shown.service("default"),
			"store", true,
			"temperature", 1.0,
			"text", o("format", o("type", "text"), "verbosity", "medium"),
			"tool_choice", "auto",
			"tools", []any{},
			"top_logprobs", 0,
			"top_p", 1.0,
			"truncation", "disabled",
			"usage", u,
			"debug?", nested,
			"user", nil,
			"metadata", o(),
		)
	}
	nested := when(t.nested, o("usage", usageOf(usage{})))
	if !t.req.Stream {
		return doc("application/json", encode(resp("completed", []any{whole}, usageOf(t.shown), nested)), t.shown.total())
	}
	r := reply{status: http.StatusOK, contentType: "text/event-stream; charset=utf-8", stream: true}
	seq := 0
	add := func(name string, reported int64, members ...any) {
		data := append(obj{"type", name, "sequence_number", seq}, members...)
		seq++
		r.events = append(r.events, event{sse(name, encode(data)), reported})
	}
	add("response.created", -1, "response", resp("in_progress", []any{}, nil, nil))
	add("response.in_progress", -1, "response", resp("in_progress", []any{}, nil, nil))
	add("response.output_item.added", -1, "output_index", 0, "item", item("in_progress", []any{}))
	add("response.content_part.added", -1, "item_id", itemID, "output_index", 0, "content_index", 0, "part", outputText(""))
	for i, part := range parts {
		add("response.output_text.delta", -1, "item_id", itemID, "output_index", 0, "content_index", 0, "delta", part, "logprobs", []any{}, "obfuscation", t.id("", uint64(100+i), 2+i))
	}
	add("response.output_text.done", -1, "item_id", itemID, "output_index", 0, "content_index", 0, "text", Text, "logprobs", []any{})
	add("response.content_part.done", -1, "item_id", itemID, "output_index", 0, "content_index", 0, "part", outputText(Text))
	add("response.output_item.done", -1, "output_index", 0, "item", whole)
	add("response.completed", t.shown.total(), "response", resp("completed", []any{whole}, usageOf(t.shown), nested))
	return r
}
