package llmapi

import (
	"math/rand"
	"strings"
	"testing"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/strictnum"
)

// TestUsageSoFar: a response cut after any of its events has reported, in
// Usage, what it used up to there (Anthropic's message_start, Gemini's
// running totals), says in Final whether its final usage came, and counts
// in After at least the bytes that followed the last usage, whatever the
// pieces the body comes in.
func TestUsageSoFar(t *testing.T) {
	type step struct {
		event string
		usage Usage
		final bool
	}
	anthropicStart := "event: message_start\ndata: {\"type\": \"message_start\", \"message\": {\"type\": \"message\", \"content\": [], \"usage\": {\"input_tokens\": 50125, \"cache_read_input_tokens\": 7, \"cache_creation_input_tokens\": 3, \"output_tokens\": 1}}}\n\n"
	start := Usage{Input: 50125, Cached: 7, CacheWrite: 3, Output: 1}
	delta := "event: content_block_delta\ndata: {\"type\": \"content_block_delta\", \"index\": 0, \"delta\": {\"type\": \"text_delta\", \"text\": \"Hello, world\"}}\n\n"
	cases := []struct {
		name        string
		api         API
		contentType string
		steps       []step
	}{
		{"anthropic: message_start is partial, message_delta final", AnthropicMessages, sse, []step{
			{anthropicStart, start, false},
			{"event: content_block_start\ndata: {\"type\": \"content_block_start\", \"index\": 0, \"content_block\": {\"type\": \"text\", \"text\": \"\"}}\n\n", start, false},
			{delta, start, false},
			{"event: content_block_stop\ndata: {\"type\": \"content_block_stop\", \"index\": 0}\n\n", start, false},
			{"event: message_delta\ndata: {\"type\": \"message_delta\", \"delta\": {\"stop_reason\": \"end_turn\"}, \"usage\": {\"output_tokens\": 12}}\n\n",
				Usage{Input: 50125, Cached: 7, CacheWrite: 3, Output: 12}, true},
			{"event: message_stop\ndata: {\"type\": \"message_stop\"}\n\n", Usage{Input: 50125, Cached: 7, CacheWrite: 3, Output: 12}, true},
		}},
		{"anthropic: the message document is final", AnthropicMessages, jsonCT, []step{
			{`{"type": "message", "usage": {"input_tokens": 10, "output_tokens": 20}}`, Usage{Input: 10, Output: 20}, true},
		}},
		{"unknown path: message_start is partial there too", Unknown, sse, []step{
			{anthropicStart, start, false},
			{delta, start, false},
		}},
		{"gemini: running totals, each final when the body ends there", Gemini, sse, []step{
			{"data: {\"candidates\": [{\"content\": {\"parts\": [{\"text\": \"a\"}]}}], \"usageMetadata\": {\"promptTokenCount\": 9000, \"candidatesTokenCount\": 1, \"totalTokenCount\": 9001}}\r\n\r\n",
				Usage{Input: 9000, Output: 1, Reported: 9001}, true},
			{"data: {\"candidates\": [{\"content\": {\"parts\": [{\"text\": \"bcd\"}]}}], \"usageMetadata\": {\"promptTokenCount\": 9000, \"candidatesTokenCount\": 4, \"totalTokenCount\": 9004}}\r\n\r\n",
				Usage{Input: 9000, Output: 4, Reported: 9004}, true},
		}},
		{"openai chat: no usage until its chunk", OpenAIChat, sse, []step{
			{"data: {\"choices\": [{\"delta\": {\"content\": \"hi\"}}], \"usage\": null}\n\n", Usage{}, false},
			{"data: {\"choices\": [], \"usage\": {\"prompt_tokens\": 5, \"completion_tokens\": 1, \"total_tokens\": 6}}\n\n", Usage{Input: 5, Output: 1, Reported: 6}, true},
			{"data: [DONE]\n\n", Usage{Input: 5, Output: 1, Reported: 6}, true},
		}},
		{"responses: created and in_progress carry no usage", OpenAIResponses, sse, []step{
			{"event: response.created\ndata: {\"type\": \"response.created\", \"response\": {\"status\": \"in_progress\", \"usage\": null}}\n\n", Usage{}, false},
			{"event: response.in_progress\ndata: {\"type\": \"response.in_progress\", \"response\": {\"usage\": null}}\n\n", Usage{}, false},
			{"event: response.output_text.delta\ndata: {\"type\": \"response.output_text.delta\", \"delta\": \"hi\"}\n\n", Usage{}, false},
			{"event: response.completed\ndata: {\"type\": \"response.completed\", \"response\": {\"usage\": {\"input_tokens\": 5, \"output_tokens\": 1, \"total_tokens\": 6}}}\n\n", Usage{Input: 5, Output: 1, Reported: 6}, true},
		}},
		{"ollama: the done document", Ollama, ndjson, []step{
			{"{\"message\": {\"content\": \"a\"}, \"done\": false}\n", Usage{}, false},
			{"{\"done\": true, \"prompt_eval_count\": 26, \"eval_count\": 2}\n", Usage{Input: 26, Output: 2}, true},
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for cut := range c.steps {
				// after: the bytes of the events after the last that
				// changed the usage (none of these repeats one).
				var body strings.Builder
				after, prev := 0, Usage{}
				for _, s := range c.steps[:cut+1] {
					body.WriteString(s.event)
					if after += len(s.event); s.usage != prev {
						after = 0
					}
					prev = s.usage
				}
				want := c.steps[cut]
				wantWhy := ""
				if want.usage == (Usage{}) {
					wantWhy = strictnum.Missing
				}
				for seed := range int64(20) {
					u := NewUsageReader(c.api, c.contentType, "")
					rng := rand.New(rand.NewSource(seed))
					for rest := []byte(body.String()); len(rest) > 0; {
						n := min(len(rest), 1+rng.Intn(40))
						u.Write(rest[:n])
						rest = rest[n:]
					}
					got, why := u.Usage()
					if got != want.usage || why != wantWhy || u.Final() != want.final {
						t.Fatalf("cut after event %d, seed %d: %+v %q final %v, want %+v %q final %v", cut, seed, got, why, u.Final(), want.usage, wantWhy, want.final)
					}
					if u.After() < int64(after) || u.After() > int64(body.Len()) {
						t.Fatalf("cut after event %d, seed %d: %d bytes after the last usage, want from %d to %d", cut, seed, u.After(), after, body.Len())
					}
				}
			}
		})
	}
}
