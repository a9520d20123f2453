package llmapi

import (
	"math/rand"
	"strings"
	"testing"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/strictnum"
)

const (
	sse    = "text/event-stream; charset=utf-8"
	jsonCT = "application/json"
	ndjson = "application/x-ndjson"
)

// TestUsageReader: the usage each API's response reports, read only where
// the API puts it, whatever the pieces the body comes in.
func TestUsageReader(t *testing.T) {
	chatUsage := `"usage": {"prompt_tokens": 100, "completion_tokens": 50, "total_tokens": 150, "prompt_tokens_details": {"cached_tokens": 40}, "completion_tokens_details": {"reasoning_tokens": 30}}`
	chat := Usage{Input: 60, Cached: 40, Output: 50, Reported: 150}
	cases := []struct {
		name        string
		api         API
		contentType string
		body        string
		want        Usage
		why         string
	}{
		{"chat: parts are never added twice", OpenAIChat, jsonCT, `{"id": "x", ` + chatUsage + `}`, chat, ""},
		{"chat: a usage in choices is ignored", OpenAIChat, jsonCT,
			`{"choices": [{"message": {"content": "hi"}, "usage": {"total_tokens": 0, "prompt_tokens": 0}}], ` + chatUsage + `}`, chat, ""},
		{"chat: a late zero usage nested is ignored", OpenAIChat, jsonCT,
			`{` + chatUsage + `, "choices": [{"message": {"usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}}}], "metadata": {"usage": {"total_tokens": 0}}}`, chat, ""},
		{"chat: a usage in the content text is text", OpenAIChat, jsonCT,
			`{"choices": [{"message": {"content": "{\"usage\": {\"total_tokens\": 0}}"}}], ` + chatUsage + `}`, chat, ""},
		{"chat: a tool call's arguments", OpenAIChat, jsonCT,
			`{"choices": [{"message": {"tool_calls": [{"function": {"name": "f", "arguments": "{\"usage\": {\"total_tokens\": 1}}"}}]}}], ` + chatUsage + `}`, chat, ""},
		{"chat: the stream's usage chunk", OpenAIChat, sse,
			"data: {\"choices\": [{\"delta\": {\"content\": \"usage\"}}], \"usage\": null}\n\n" +
				"data: {\"choices\": [], " + chatUsage + "}\n\n" +
				"data: {\"choices\": [{\"delta\": {\"usage\": {\"prompt_tokens\": 0, \"total_tokens\": 0}}}], \"usage\": null}\n\n" +
				"data: [DONE]\n\n", chat, ""},
		{"chat: a skipped value's strings and brackets are read", OpenAIChat, jsonCT,
			`{"choices": [{"delta": {"content": "]}\\\"]} \u00e9\n"}, "x": [[], {}, true, null, -1.5e3]}], ` + chatUsage + `}`, chat, ""},
		{"chat: a skipped value may lack a comma", OpenAIChat, jsonCT, `{"choices": [1 2], ` + chatUsage + `}`, chat, ""},
		{"chat: a skipped value with a byte not JSON's stops its document", OpenAIChat, jsonCT,
			`{"choices": [{"delta": {}} @], ` + chatUsage + `}`, Usage{}, strictnum.Missing},
		{"chat: a skipped value's brackets must match", OpenAIChat, jsonCT,
			`{"choices": [{"delta": 1]], ` + chatUsage + `}`, Usage{}, strictnum.Missing},
		{"chat: a skipped value's control character", OpenAIChat, jsonCT,
			"{\"choices\": [\"a\x01\"], " + chatUsage + "}", Usage{}, strictnum.Missing},
		{"chat: a skipped value's bad escape", OpenAIChat, jsonCT,
			`{"choices": ["\x"], ` + chatUsage + `}`, Usage{}, strictnum.Missing},
		{"chat: a skipped value's bad \\u escape", OpenAIChat, jsonCT,
			`{"choices": ["\u12g4"], ` + chatUsage + `}`, Usage{}, strictnum.Missing},
		{"chat: a skipped value nested too deep", OpenAIChat, jsonCT,
			`{"choices": ` + strings.Repeat("[", MaxDepth) + strings.Repeat("]", MaxDepth) + `, ` + chatUsage + `}`, Usage{}, strictnum.Missing},
		{"chat: a skipped value nested as deep as allowed", OpenAIChat, jsonCT,
			`{"choices": ` + strings.Repeat("[", MaxDepth-1) + strings.Repeat("]", MaxDepth-1) + `, ` + chatUsage + `}`, chat, ""},
		{"chat: events typed as JSON", OpenAIChat, jsonCT,
			"data: {\"choices\": [], " + chatUsage + "}\n\ndata: [DONE]\n\n", chat, ""},
		{"chat: events without a type", OpenAIChat, "",
			"data:{\"choices\": [], " + chatUsage + "}\r\n\r\n", chat, ""},
		{"chat: a document typed as events", OpenAIChat, sse, `{` + chatUsage + `}`, chat, ""},
		{"chat: the last document wins whole", OpenAIChat, ndjson,
			"{\"usage\": {\"prompt_tokens\": 5, \"completion_tokens\": 5, \"total_tokens\": 10, \"prompt_tokens_details\": {\"cached_tokens\": 5}}}\n{" + chatUsage + "}\n", chat, ""},
		{"chat: a stream cut short", OpenAIChat, sse,
			"data: {\"choices\": [], \"usage\": {\"prompt_tokens\": 100, \"total_tokens\": 150", Usage{}, strictnum.Missing},
		{"chat: an event cut short counts for nothing", OpenAIChat, sse,
			"data: {\"choices\": [], " + chatUsage + "}\n\ndata: {\"usage\": {\"prompt_tokens\": 1, \"total_tokens\": 1", chat, ""},
		{"chat: no usage", OpenAIChat, sse, "data: {\"choices\": [{\"delta\": {\"content\": \"hi\"}}], \"usage\": null}\n\ndata: [DONE]\n\n", Usage{}, strictnum.Missing},
		{"chat: not a whole number", OpenAIChat, jsonCT, `{"usage": {"prompt_tokens": 1.5, "total_tokens": 3}}`, Usage{}, strictnum.NotWhole},
		{"chat: negative", OpenAIChat, jsonCT, `{"usage": {"total_tokens": -3}}`, Usage{}, strictnum.NotWhole},
		{"chat: a string is no number", OpenAIChat, jsonCT, `{"usage": {"total_tokens": "3", "prompt_tokens": 2}}`, Usage{Input: 2}, ""},
		{"chat: huge saturates", OpenAIChat, jsonCT, `{"usage": {"total_tokens": 99999999999999999999}}`, Usage{Reported: strictnum.Max}, ""},
		{"chat: a total larger than its parts", OpenAIChat, jsonCT, `{"usage": {"prompt_tokens": 758, "completion_tokens": 102, "total_tokens": 1725}}`, Usage{Input: 758, Output: 102, Reported: 1725}, ""},
		{"chat: an escaped key is no vendor's", OpenAIChat, jsonCT, `{"usage": {"total\u005ftokens": 5}}`, Usage{}, strictnum.Missing},
		{"chat: too deep", OpenAIChat, jsonCT, strings.Repeat(`{"a": `, 70) + `{"usage": {"total_tokens": 1}}` + strings.Repeat("}", 70), Usage{}, strictnum.Missing},
		{"responses: the terminal event", OpenAIResponses, sse,
			"event: response.in_progress\ndata: {\"type\": \"response.in_progress\", \"response\": {\"usage\": {\"input_tokens\": 0, \"output_tokens\": 0, \"total_tokens\": 0}}}\n\n" +
				"event: response.completed\ndata: {\"response\": {\"output\": [{\"content\": [{\"text\": \"x\", \"usage\": {\"total_tokens\": 0}}]}], \"usage\": {\"input_tokens\": 20, \"input_tokens_details\": {\"cached_tokens\": 5}, \"output_tokens\": 30, \"output_tokens_details\": {\"reasoning_tokens\": 10}, \"total_tokens\": 50}}, \"type\": \"response.completed\"}\n\n",
			Usage{Input: 15, Cached: 5, Output: 30, Reported: 50}, ""},
		{"responses: incomplete", OpenAIResponses, sse,
			"data: {\"type\": \"response.incomplete\", \"response\": {\"usage\": {\"input_tokens\": 20, \"output_tokens\": 30, \"total_tokens\": 50}}}\n\n", Usage{Input: 20, Output: 30, Reported: 50}, ""},
		{"responses: failed", OpenAIResponses, sse,
			"data: {\"type\": \"response.failed\", \"response\": {\"usage\": {\"input_tokens\": 20, \"output_tokens\": 0, \"total_tokens\": 20}}}\n\n", Usage{Input: 20, Reported: 20}, ""},
		{"responses: another event's usage is ignored", OpenAIResponses, sse,
			"data: {\"type\": \"response.output_item.done\", \"response\": {\"usage\": {\"input_tokens\": 20, \"total_tokens\": 20}}}\n\n", Usage{}, strictnum.Missing},
		{"responses: a type escaped is no type", OpenAIResponses, sse,
			"data: {\"type\": \"response.complete\\u0064\", \"response\": {\"usage\": {\"input_tokens\": 20, \"total_tokens\": 20}}}\n\n", Usage{}, strictnum.Missing},
		{"responses: a nested type is no type", OpenAIResponses, sse,
			"data: {\"x\": {\"type\": \"response.completed\"}, \"response\": {\"usage\": {\"input_tokens\": 20, \"total_tokens\": 20}}}\n\n", Usage{}, strictnum.Missing},
		{"anthropic: the four parts", AnthropicMessages, jsonCT,
			`{"type": "message", "usage": {"input_tokens": 21, "cache_creation_input_tokens": 188086, "cache_read_input_tokens": 7, "output_tokens": 393}}`,
			Usage{Input: 21, CacheWrite: 188086, Cached: 7, Output: 393}, ""},
		{"anthropic: a tool's input is ignored", AnthropicMessages, jsonCT,
			`{"usage": {"input_tokens": 10, "output_tokens": 20}, "content": [{"type": "tool_use", "input": {"usage": {"input_tokens": 0, "output_tokens": 0}}}]}`,
			Usage{Input: 10, Output: 20}, ""},
		{"anthropic: cumulative fields, each its last", AnthropicMessages, sse,
			"event: message_start\r\ndata: {\"type\": \"message_start\", \"message\": {\"usage\": {\"input_tokens\": 10, \"cache_read_input_tokens\": 3, \"output_tokens\": 1}}}\r\n\r\n" +
				"event: message_delta\r\ndata: {\"type\": \"message_delta\", \"usage\": {\"output_tokens\": 15}}\r\n\r\n" +
				"event: message_delta\r\ndata: {\"type\": \"message_delta\", \"delta\": {\"usage\": {\"output_tokens\": 0}}, \"usage\": {\"input_tokens\": 10, \"cache_read_input_tokens\": 3, \"output_tokens\": 40}}\r\n\r\n" +
				"event: message_stop\r\ndata: {\"type\": \"message_stop\"}\r\n\r\n",
			Usage{Input: 10, Cached: 3, Output: 40}, ""},
		{"anthropic: null is no value", AnthropicMessages, sse,
			"data: {\"type\": \"message_start\", \"message\": {\"usage\": {\"input_tokens\": 10, \"output_tokens\": 1}}}\n\n" +
				"data: {\"type\": \"message_delta\", \"usage\": {\"input_tokens\": null, \"output_tokens\": 6}}\n\n",
			Usage{Input: 10, Output: 6}, ""},
		{"anthropic: message.usage of another event", AnthropicMessages, sse,
			"data: {\"type\": \"content_block_delta\", \"message\": {\"usage\": {\"input_tokens\": 1}}}\n\n", Usage{}, strictnum.Missing},
		{"anthropic: count_tokens reports none", AnthropicCountTokens, jsonCT, `{"input_tokens": 2095}`, Usage{}, strictnum.Missing},
		{"gemini: running totals, the last", Gemini, sse,
			"data: {\"candidates\": [{\"content\": {\"parts\": [{\"text\": \"a\"}]}}], \"usageMetadata\": {\"promptTokenCount\": 8, \"candidatesTokenCount\": 1, \"totalTokenCount\": 9}}\n\n" +
				"data: {\"candidates\": [{\"content\": {\"parts\": [{\"functionCall\": {\"name\": \"f\", \"args\": {\"usageMetadata\": {\"totalTokenCount\": 0}}}}]}}], \"usageMetadata\": {\"promptTokenCount\": 8, \"cachedContentTokenCount\": 2, \"candidatesTokenCount\": 50, \"thoughtsTokenCount\": 20, \"toolUsePromptTokenCount\": 4, \"totalTokenCount\": 82}}\n\n",
			Usage{Input: 10, Cached: 2, Output: 70, Reported: 82}, ""},
		{"gemini: a JSON array of responses", Gemini, jsonCT,
			"[{\"usageMetadata\": {\"promptTokenCount\": 8, \"candidatesTokenCount\": 1, \"totalTokenCount\": 9}}\n,\r\n{\"usageMetadata\": {\"promptTokenCount\": 8, \"candidatesTokenCount\": 50, \"totalTokenCount\": 58}}\n]",
			Usage{Input: 8, Output: 50, Reported: 58}, ""},
		{"gemini: an array cut short keeps its whole elements", Gemini, jsonCT,
			"[{\"usageMetadata\": {\"promptTokenCount\": 8, \"totalTokenCount\": 9}},\n{\"usageMetadata\": {\"promptTokenCount\": 8, \"totalTokenCount\": 58}",
			Usage{Input: 8, Reported: 9}, ""},
		{"gemini: arrays within elements are no documents", Gemini, jsonCT,
			"[[{\"usageMetadata\": {\"totalTokenCount\": 9}}]]", Usage{}, strictnum.Missing},
		{"ollama: the final document", Ollama, ndjson,
			"{\"message\": {\"content\": \"a\"}, \"done\": false}\n{\"message\": {\"content\": \"\", \"tool_calls\": [{\"function\": {\"arguments\": {\"eval_count\": 0}}}]}, \"done\": true, \"prompt_eval_count\": 26, \"eval_count\": 282}\n",
			Usage{Input: 26, Output: 282}, ""},
		{"ollama: a nested count is ignored", Ollama, jsonCT,
			`{"done": true, "prompt_eval_count": 26, "eval_count": 282, "message": {"eval_count": 0}}`, Usage{Input: 26, Output: 282}, ""},
		{"bedrock: the cache apart from input", BedrockConverse, jsonCT,
			`{"usage": {"inputTokens": 12, "outputTokens": 300, "totalTokens": 312, "cacheReadInputTokens": 1500, "cacheWriteInputTokens": 100}}`,
			Usage{Input: 12, Cached: 1500, CacheWrite: 100, Output: 300, Reported: 312}, ""},
		{"unknown: every table's places", Unknown, sse,
			"data: {\"type\": \"message_start\", \"message\": {\"usage\": {\"input_tokens\": 10, \"output_tokens\": 1}}}\n\n" +
				"data: {\"type\": \"message_delta\", \"usage\": {\"input_tokens\": 10, \"output_tokens\": 30}}\n\n",
			Usage{Input: 10, Output: 30}, ""},
		{"unknown: OpenAI's parts", Unknown, jsonCT, `{` + chatUsage + `}`, chat, ""},
		{"unknown: Gemini's", Unknown, jsonCT, `{"usageMetadata": {"promptTokenCount": 8, "candidatesTokenCount": 50, "totalTokenCount": 58}}`, Usage{Input: 8, Output: 50, Reported: 58}, ""},
		{"unknown: a nested usage is ignored", Unknown, jsonCT, `{"data": {"usage": {"total_tokens": 5}}}`, Usage{}, strictnum.Missing},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for seed := range int64(20) {
				got, why := readUsage(c.api, c.contentType, c.body, rand.New(rand.NewSource(seed)))
				if got != c.want || why != c.why {
					t.Fatalf("seed %d: %+v %q, want %+v %q", seed, got, why, c.want, c.why)
				}
			}
			if got, why := readUsageBytes(c.api, c.contentType, c.body); got != c.want || why != c.why {
				t.Errorf("1-byte writes: %+v %q, want %+v %q", got, why, c.want, c.why)
			}
		})
	}
}

func TestUsageReaderEncoded(t *testing.T) {
	for _, enc := range []string{"gzip", "br", "deflate, identity"} {
		u := NewUsageReader(OpenAIChat, jsonCT, enc)
		u.Write([]byte(`{"usage": {"total_tokens": 6}}`))
		if got, why := u.Usage(); why != Encoded {
			t.Errorf("%s: %+v %q, want %q", enc, got, why, Encoded)
		}
	}
	u := NewUsageReader(OpenAIChat, jsonCT, "Identity")
	u.Write([]byte(`{"usage": {"total_tokens": 6}}`))
	if got, why := u.Usage(); why != "" || got.Total() != 6 {
		t.Errorf("identity: %+v %q", got, why)
	}
}

func TestUsageTotal(t *testing.T) {
	cases := []struct {
		u    Usage
		want int64
	}{
		{Usage{Input: 60, Cached: 40, Output: 50, Reported: 150}, 150},
		{Usage{Input: 21, CacheWrite: 188086, Output: 393}, 188500},
		{Usage{Input: 12, Cached: 1500, Output: 300, Reported: 312}, 1812},
		{Usage{Input: 758, Output: 102, Reported: 1725}, 1725},
		{Usage{Input: strictnum.Max, Output: strictnum.Max}, strictnum.Max},
	}
	for _, c := range cases {
		if got := c.u.Total(); got != c.want {
			t.Errorf("%+v: %d, want %d", c.u, got, c.want)
		}
	}
}

// TestGenericUsageNeverLess: the generic reading of every table's
// documents charges at least what the table's own reading does.
func TestGenericUsageNeverLess(t *testing.T) {
	for _, f := range usageFixtures {
		if f.api == Unknown || f.binary {
			continue
		}
		t.Run(f.file, func(t *testing.T) {
			body := readFixture(t, f.file)
			own, why := readUsage(f.api, f.contentType, body, rand.New(rand.NewSource(1)))
			all, whyAll := readUsage(Unknown, f.contentType, body, rand.New(rand.NewSource(1)))
			if why == "" && (whyAll != "" || all.Total() < own.Total()) {
				t.Errorf("generic %+v %q, %v's own %+v", all, whyAll, f.api, own)
			}
		})
	}
}

// TestUsageSpecs: every table's places, one slot per field.
func TestUsageSpecs(t *testing.T) {
	for api, s := range usageSpecs {
		switch API(api) {
		case AnthropicCountTokens, OpenAIBatches, AnthropicBatches, GeminiBatch:
			// Their answers carry no usage: a count, or a batch's receipt.
			continue
		}
		if len(s.places) == 0 {
			t.Errorf("%v: no usage places", API(api))
		}
		for _, p := range s.places {
			if p.slot >= len(s.kinds) {
				t.Errorf("%v: %v has no slot", API(api), p.path)
			}
		}
	}
	if got := len(usageSpecs[AnthropicMessages].kinds); got != 7 {
		t.Errorf("anthropic: %d slots, want 7 (message_start's and message_delta's fields are one)", got)
	}
}

// TestUsageReaderKeepsLittle: a reader of a 4 MiB document and of 10,000
// events allocates a few kilobytes, whatever the body's size, and nothing
// per write once warm.
func TestUsageReaderKeepsLittle(t *testing.T) {
	doc := `{"choices": [{"message": {"content": "` + strings.Repeat("x", 4<<20) + `"}}], "items": [` + strings.Repeat(`{"a": [1, 2, {"b": "c"}]}, `, 1000) + `0], "usage": {"total_tokens": 5}}`
	events := strings.Repeat("data: {\"choices\": [{\"delta\": {\"content\": \"hello\"}}]}\n\n", 10000) + "data: {\"usage\": {\"total_tokens\": 5}}\n\n"
	for _, c := range []struct{ contentType, body string }{{jsonCT, doc}, {sse, events}} {
		var u *UsageReader
		body := []byte(c.body) // converted once: the reader's allocations are counted, not the test's
		allocs := testing.AllocsPerRun(3, func() {
			u = NewUsageReader(OpenAIChat, c.contentType, "")
			for i := 0; i < len(body); i += 4096 {
				u.Write(body[i:min(i+4096, len(body))])
			}
		})
		if got, why := u.Usage(); got.Total() != 5 || why != "" {
			t.Errorf("%s: %+v %q, want 5", c.contentType, got, why)
		}
		if allocs > 10 {
			t.Errorf("%s: %v allocations reading %d bytes, want a handful", c.contentType, allocs, len(c.body))
		}
	}
	u := NewUsageReader(Unknown, sse, "")
	chunk := []byte(strings.Repeat("data: {\"choices\": [{\"index\": 0, \"delta\": {\"content\": \"hello\"}}], \"usage\": {\"prompt_tokens\": 1}}\n\n", 4))
	u.Write(chunk)
	if allocs := testing.AllocsPerRun(100, func() { u.Write(chunk) }); allocs != 0 {
		t.Errorf("%v allocations per write once warm, want 0", allocs)
	}
}

// FuzzUsageReader: no body makes the reader panic, and the pieces a body
// comes in never change what it reads.
func FuzzUsageReader(f *testing.F) {
	f.Add([]byte(`{"usage": {"total_tokens": 42}}`), uint8(0), uint8(3))
	f.Add([]byte("data: {\"type\": \"response.completed\", \"response\": {\"usage\": {\"total_tokens\": 6}}}\r\n\r\ndata: [DONE]\n\n"), uint8(1), uint8(1))
	f.Add([]byte(`[{"usageMetadata": {"totalTokenCount": 7}}, {"a": [{"usage": {"total_tokens": 1e3}}]}]`), uint8(2), uint8(5))
	f.Add(frame("metadata", `{"usage": {"inputTokens": 1, "outputTokens": 2, "totalTokens": 3}}`), uint8(3), uint8(7))
	types := []string{jsonCT, sse, ndjson, "application/vnd.amazon.eventstream"}
	f.Fuzz(func(t *testing.T, body []byte, typ, piece uint8) {
		ct := types[int(typ)%len(types)]
		for api := range API(len(tables)) {
			whole := NewUsageReader(api, ct, "")
			whole.Write(body)
			u1, why1 := whole.Usage()
			step := int(piece%16) + 1
			pieces := NewUsageReader(api, ct, "")
			for i := 0; i < len(body); i += step {
				pieces.Write(body[i:min(i+step, len(body))])
			}
			if u2, why2 := pieces.Usage(); u1 != u2 || why1 != why2 || whole.Final() != pieces.Final() {
				t.Errorf("%v %q whole: %+v %q final %v; in pieces of %d: %+v %q final %v", api, body, u1, why1, whole.Final(), step, u2, why2, pieces.Final())
			}
			// The bytes after the last usage are counted by whole Writes:
			// never fewer than a byte at a time counts (exactly those
			// after the byte that ended the usage), never more than the
			// body.
			bytewise := NewUsageReader(api, ct, "")
			for i := range body {
				bytewise.Write(body[i : i+1])
			}
			exact := bytewise.After()
			if a1, a2 := whole.After(), pieces.After(); a1 > int64(len(body)) || a2 > int64(len(body)) || a1 < exact || a2 < exact {
				t.Errorf("%v %q: %d bytes after the usage whole, %d in pieces of %d, %d a byte at a time", api, body, a1, a2, step, exact)
			}
		}
	})
}

// BenchmarkUsageReader reads a chat completion stream of 60 chunks and its
// usage (about 14 KB), as an OpenAI-compatible server streams it.
func BenchmarkUsageReader(b *testing.B) {
	body := strings.Repeat(`data: {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [{"index": 0, "delta": {"content": " token"}, "finish_reason": null}], "usage": null}`+"\n\n", 60) +
		`data: {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [], "usage": {"prompt_tokens": 20, "completion_tokens": 60, "total_tokens": 80}}` + "\n\ndata: [DONE]\n\n"
	chunks := strings.SplitAfter(body, "\n\n")
	for _, api := range []API{OpenAIChat, Unknown} {
		b.Run(api.String(), func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				u := NewUsageReader(api, "text/event-stream", "")
				for _, c := range chunks {
					u.Write([]byte(c))
				}
				if got, _ := u.Usage(); got.Total() != 80 {
					b.Fatal(got)
				}
			}
		})
	}
}

// BenchmarkUsageReaderWrite is one write of a chunk to a warm reader: what
// each piece of a stream costs.
func BenchmarkUsageReaderWrite(b *testing.B) {
	chunk := []byte(`data: {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [{"index": 0, "delta": {"content": " token"}, "finish_reason": null}], "usage": null}` + "\n\n")
	u := NewUsageReader(OpenAIChat, "text/event-stream", "")
	u.Write(chunk)
	b.SetBytes(int64(len(chunk)))
	b.ReportAllocs()
	for b.Loop() {
		u.Write(chunk)
	}
}

// readUsage feeds body to a reader in pieces of random sizes (1 byte
// included).
func readUsage(api API, contentType, body string, rng *rand.Rand) (Usage, string) {
	u := NewUsageReader(api, contentType, "")
	for rest := []byte(body); len(rest) > 0; {
		n := min(len(rest), 1+rng.Intn(7))
		if rng.Intn(3) == 0 {
			n = len(rest)
		}
		u.Write(rest[:n])
		rest = rest[n:]
	}
	return u.Usage()
}

// readUsageBytes feeds body to a reader a byte at a time.
func readUsageBytes(api API, contentType, body string) (Usage, string) {
	u := NewUsageReader(api, contentType, "")
	for i := 0; i < len(body); i++ {
		u.Write([]byte{body[i]})
	}
	return u.Usage()
}

// TestServiceTierAloneIsNoUsage: a chunk that says its service tier but
// carries no usage is no usage, nor the final one: a stream cut there is
// charged as a cut one.
func TestServiceTierAloneIsNoUsage(t *testing.T) {
	u := NewUsageReader(OpenAIChat, "text/event-stream", "")
	u.Write([]byte(`data: {"object":"chat.completion.chunk","service_tier":"priority","choices":[],"usage":null}` + "\n\n"))
	if got, why := u.Usage(); why != strictnum.Missing || u.Final() || got.Service != "" {
		t.Errorf("%+v %q final=%v: want no usage", got, why, u.Final())
	}
	u.Write([]byte(`data: {"service_tier":"pr\u0069ority","usage":{"prompt_tokens":1,"completion_tokens":1}}` + "\n\n"))
	if got, _ := u.Usage(); got.Service != "other" {
		t.Errorf("an escaped tier read as %q, want other (the dearest)", got.Service)
	}
}
