package llmtest

import (
	"net/http"
	"time"
)

// Ollama's /api/chat and /api/generate, as its API documentation gives
// them: a stream of newline-delimited JSON objects unless "stream":
// false, the last with done true and the counts and durations.

// ollamaError is Ollama's error body.
func ollamaError(status int, message string) reply {
	return reply{status: status, contentType: "application/json; charset=utf-8", events: []event{{encode(o("error", message)), -1}}}
}

// ollama answers POST /api/chat (chat) and /api/generate.
func ollama(t turn, chat bool) reply {
	created := t.created.UTC()
	total := max(t.took, time.Millisecond)
	load, promptEval := total/20, total/10
	piece := func(s string, at time.Time) obj {
		m := o("model", t.req.Model, "created_at", at.Format(time.RFC3339Nano))
		if chat {
			return append(m, "message", o("role", "assistant", "content", s))
		}
		return append(m, "response", s)
	}
	final := func(s string, at time.Time) obj {
		m := piece(s, at)
		if chat {
			m = append(m, "done_reason", "stop", "done", true)
		} else {
			m = append(m, "done", true, "done_reason", "stop", "context", []any{128006, 882, 128007, 271, 9906, 1070})
		}
		return append(m,
			"total_duration", total.Nanoseconds(),
			"load_duration", load.Nanoseconds(),
			"prompt_eval_count", t.shown.prompt(),
			"prompt_eval_duration", promptEval.Nanoseconds(),
			"eval_count", t.shown.Output,
			"eval_duration", (total - load - promptEval).Nanoseconds(),
			"debug?", when(t.nested, o("prompt_eval_count", 0, "eval_count", 0)),
		)
	}
	if !t.req.Stream {
		return doc("application/json; charset=utf-8", encode(final(Text, created.Add(total))), t.shown.total())
	}
	r := reply{status: http.StatusOK, contentType: "application/x-ndjson", stream: true}
	line := func(m obj, reported int64) event { return event{append(encode(m), '\n'), reported} }
	for i, part := range parts {
		r.events = append(r.events, line(append(piece(part, created.Add(total*time.Duration(i+1)/time.Duration(len(parts)+1))), "done", false), -1))
	}
	r.events = append(r.events, line(final("", created.Add(total)), t.shown.total()))
	return r
}
