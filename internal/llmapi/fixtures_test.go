package llmapi

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/strictnum"
)

// The vendors' documented payloads (testdata/), and what each must give.
// The requests are the API references' examples (some with a bound or a
// multiplier set); the responses the references' and the official SDKs'
// examples and test streams.

var requestFixtures = []struct {
	file   string
	path   string
	output int64 // with a default of 4096
	named  bool
	model  string
}{
	{"openai_chat.request.json", "/v1/chat/completions", 2000, true, "gpt-4.1"},
	{"openai_completions.request.json", "/v1/completions", 21, true, "gpt-3.5-turbo-instruct"},
	{"openai_responses.request.json", "/v1/responses", 2048, true, "gpt-4.1"},
	{"anthropic.request.json", "/v1/messages", 1024, true, "claude-sonnet-4-20250514"},
	{"anthropic_count_tokens.request.json", "/v1/messages/count_tokens", 0, true, "claude-3-7-sonnet-20250219"},
	{"gemini.request.json", "/v1beta/models/gemini-2.0-flash:generateContent", 800, true, "gemini-2.0-flash"},
	{"gemini_thinking.request.json", "/v1beta/models/gemini-2.5-flash:generateContent", 4096 + 1024, false, "gemini-2.5-flash"},
	{"ollama.request.json", "/api/generate", 100, true, "llama3.2"},
	{"bedrock.request.json", "/model/anthropic.claude-3-haiku-20240307-v1%3A0/converse", 512, true, "anthropic.claude-3-haiku-20240307-v1:0"},
}

func TestRequestFixtures(t *testing.T) {
	for _, f := range requestFixtures {
		t.Run(f.file, func(t *testing.T) {
			body := []byte(readFixture(t, f.file))
			r, err := ReadRequest(f.path, body, 4096)
			if err != nil {
				t.Fatal(err)
			}
			want := Request{API: Detect(f.path), Model: f.model, Named: f.named, Output: f.output, Input: int64(len(body)), Reserve: f.output + int64(len(body)), Passes: 1}
			// The parts of Output are TestBounds's.
			want.Bound, want.Completions, want.Batch = r.Bound, r.Completions, r.Batch
			if r != want {
				t.Errorf("%+v, want %+v", r, want)
			}
		})
	}
}

var usageFixtures = []struct {
	file        string
	api         API
	contentType string
	want        Usage
	charge      int64 // Total(); 0 with why
	why         string
	binary      bool // built by the test (frames)
}{
	{"openai_chat.response.json", OpenAIChat, jsonCT, Usage{Input: 19, Output: 10, Reported: 29, Service: "default"}, 29, "", false},
	{"openai_chat_audio.response.json", OpenAIChat, jsonCT, Usage{Input: 17, Output: 575, Reported: 592, AudioOutput: 460, Service: "default"}, 592, "", false},
	{"openai_chat_priority.stream.sse", OpenAIChat, sse, Usage{Input: 9, Output: 2, Reported: 11, Service: "priority"}, 11, "", false},
	{"openai_chat_cached.response.json", OpenAIChat, jsonCT, Usage{Input: 86, Cached: 1920, Output: 300, Reported: 2306}, 2306, "", false},
	{"openai_chat_reasoning.response.json", OpenAIChat, jsonCT, Usage{Input: 78, Cached: 1408, Output: 651, Reported: 2137}, 2137, "", false},
	{"openai_chat.stream.sse", OpenAIChat, sse, Usage{Input: 9, Output: 2, Reported: 11}, 11, "", false},
	{"openai_completions.response.json", OpenAICompletions, jsonCT, Usage{Input: 5, Output: 7, Reported: 12}, 12, "", false},
	{"openai_responses.response.json", OpenAIResponses, jsonCT, Usage{Input: 36, Output: 87, Reported: 123}, 123, "", false},
	{"openai_responses.stream.sse", OpenAIResponses, sse, Usage{Input: 37, Output: 11, Reported: 48}, 48, "", false},
	{"anthropic.response.json", AnthropicMessages, jsonCT, Usage{Input: 2095, Output: 503}, 2598, "", false},
	{"anthropic_cache.response.json", AnthropicMessages, jsonCT, Usage{Input: 21, CacheWrite: 188086, Output: 393}, 188500, "", false},
	{"anthropic.stream.sse", AnthropicMessages, sse, Usage{Input: 25, Output: 15}, 40, "", false},
	{"anthropic_tool.stream.sse", AnthropicMessages, sse, Usage{Input: 472, Output: 89}, 561, "", false},
	{"anthropic_sdk.stream.sse", AnthropicMessages, sse, Usage{Input: 10, Output: 6, Service: "standard"}, 16, "", false},
	{"anthropic_search.response.json", AnthropicMessages, jsonCT, Usage{Input: 6039, CacheWrite: 1500, Output: 931, CacheWrite1h: 1000, WebSearches: 1, Service: "standard"}, 8470, "", false},
	{"anthropic_count_tokens.response.json", AnthropicCountTokens, jsonCT, Usage{}, 0, strictnum.Missing, false},
	{"gemini.response.json", Gemini, jsonCT, Usage{Input: 4, Output: 215, Reported: 219}, 219, "", false},
	{"gemini_thoughts.response.json", Gemini, jsonCT, Usage{Input: 3, Output: 26, Reported: 29}, 29, "", false},
	{"gemini.stream.sse", Gemini, sse, Usage{Input: 8, Output: 120, Reported: 128}, 128, "", false},
	{"gemini.stream.json", Gemini, jsonCT, Usage{Input: 8, Output: 120, Reported: 128}, 128, "", false},
	{"ollama_chat.response.json", Ollama, jsonCT, Usage{Input: 26, Output: 298}, 324, "", false},
	{"ollama_chat.stream.ndjson", Ollama, ndjson, Usage{Input: 26, Output: 282}, 308, "", false},
	{"ollama_generate.response.json", Ollama, jsonCT, Usage{Input: 26, Output: 237}, 263, "", false},
	{"bedrock.response.json", BedrockConverse, jsonCT, Usage{Input: 21, Output: 24, Reported: 45}, 45, "", false},
	{"bedrock_cache.response.json", BedrockConverse, jsonCT, Usage{Input: 12, Cached: 1500, Output: 300, Reported: 1812}, 1812, "", false},
	{"bedrock_stream.events.json", BedrockConverse, eventStream, Usage{Input: 21, Output: 24, Reported: 45}, 45, "", true},
}

func TestUsageFixtures(t *testing.T) {
	for _, f := range usageFixtures {
		t.Run(f.file, func(t *testing.T) {
			body := readFixture(t, f.file)
			if f.binary {
				body = string(framesOf(t, body))
			}
			u := NewUsageReader(f.api, f.contentType, "")
			u.Write([]byte(body))
			got, why := u.Usage()
			if got != f.want || why != f.why || got.Total() != f.charge {
				t.Errorf("%+v (total %d) %q, want %+v (total %d) %q", got, got.Total(), why, f.want, f.charge, f.why)
			}
			if b, whyB := readUsageBytes(f.api, f.contentType, body); b != got || whyB != why {
				t.Errorf("in 1-byte writes: %+v %q, in one: %+v %q", b, whyB, got, why)
			}
		})
	}
}

// framesOf encodes a list of ConverseStream events as event stream frames.
func framesOf(t *testing.T, events string) []byte {
	var list []struct {
		Event   string          `json:"event"`
		Payload json.RawMessage `json:"payload"`
	}
	if err := json.Unmarshal([]byte(events), &list); err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	for _, e := range list {
		b.Write(frame(e.Event, string(e.Payload)))
	}
	return b.Bytes()
}

func readFixture(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
