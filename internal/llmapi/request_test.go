package llmapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/strictnum"
)

func TestDetect(t *testing.T) {
	cases := []struct {
		path  string
		api   API
		model string
	}{
		{"/v1/chat/completions", OpenAIChat, ""},
		{"/openai/v1/chat/completions", OpenAIChat, ""},
		{"/api/v1/chat/completions", OpenAIChat, ""},
		{"/v1/completions", OpenAICompletions, ""},
		{"/v1/responses", OpenAIResponses, ""},
		{"/v1/messages", AnthropicMessages, ""},
		{"/anthropic/v1/messages/count_tokens", AnthropicCountTokens, ""},
		{"/v1beta/models/gemini-2.0-flash:generateContent", Gemini, "gemini-2.0-flash"},
		{"/v1/models/gemini-2.5-pro:streamGenerateContent", Gemini, "gemini-2.5-pro"},
		{"/v1beta/models/gemini-2.0-flash%3AstreamGenerateContent", Gemini, "gemini-2.0-flash"},
		{"/v1/projects/p/locations/us-central1/publishers/google/models/gemini-2.0-flash:generateContent", Gemini, "gemini-2.0-flash"},
		{"/api/chat", Ollama, ""},
		{"/ollama/api/generate", Ollama, ""},
		{"/model/anthropic.claude-3-haiku-20240307-v1%3A0/converse", BedrockConverse, "anthropic.claude-3-haiku-20240307-v1:0"},
		{"/model/arn%3Aaws%3Abedrock%3Aus-east-1%3A123456789012%3Ainference-profile%2Fus.anthropic.claude-3-7-sonnet-20250219-v1%3A0/converse-stream", BedrockConverse,
			"arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.anthropic.claude-3-7-sonnet-20250219-v1:0"},
		{"/model/arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.meta.llama3-2-1b-instruct-v1:0/converse", BedrockConverse,
			"arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.meta.llama3-2-1b-instruct-v1:0"},
		// What no table claims exactly is read with every table.
		{"/v1/chat/completions/", Unknown, ""},
		{"/v1/Chat/Completions", Unknown, ""},
		{"/v1/embeddings", OpenAIEmbeddings, ""},
		{"/v1/batches", OpenAIBatches, ""},
		{"/v1/messages/batches", AnthropicBatches, ""},
		{"/v1beta/models/gemini-2.5-flash:batchGenerateContent", GeminiBatch, "gemini-2.5-flash"},
		{"/v1/rerank", Unknown, ""},
		{"/v1beta/models/gemini-2.0-flash:countTokens", Unknown, ""},
		{"", Unknown, ""},
	}
	for _, c := range cases {
		t.Run(c.path, func(t *testing.T) {
			api, model := detect(c.path)
			if api != c.api || model != c.model {
				t.Errorf("detect(%q) = %v %q, want %v %q", c.path, api, model, c.api, c.model)
			}
		})
	}
}

// TestReadRequest: the bound an attacker cannot lower by spelling, and the
// reservation it makes.
func TestReadRequest(t *testing.T) {
	const def = 4096
	chat, resp, anth, gem, oll, bed, unk := "/v1/chat/completions", "/v1/responses", "/v1/messages", "/v1beta/models/gemini-2.0-flash:generateContent", "/api/chat", "/model/m/converse", "/v1/whatever"
	cases := []struct {
		name   string
		path   string
		body   string
		output int64
		named  bool
	}{
		{"default when none named", chat, `{"model": "gpt-4o", "messages": []}`, def, false},
		{"max_tokens", chat, `{"max_tokens": 100}`, 100, true},
		{"max_completion_tokens", chat, `{"max_completion_tokens": 100}`, 100, true},
		{"the larger of both", chat, `{"max_tokens": 100, "max_completion_tokens": 300}`, 300, true},
		{"llama.cpp's n_predict", chat, `{"max_tokens": 1, "n_predict": 9000}`, 9000, true},
		{"case folded", chat, `{"max_tokens":1,"Max_Tokens":50000}`, 50000, true},
		{"the Kelvin sign folds to k", chat, "{\"max_tokens\":1,\"max_to\u212aens\":50000}", 50000, true},
		{"the Kelvin sign escaped", chat, `{"max_tokens":1,"max_to\u212aens":50000}`, 50000, true},
		{"the long s folds to s", chat, "{\"max_token\u017f\":7000}", 7000, true},
		{"an escaped key", chat, `{"max_tokens":1,"max\u005ftokens":6000}`, 6000, true},
		{"every letter escaped", chat, `{"\u006d\u0061\u0078\u005f\u0074\u006f\u006b\u0065\u006e\u0073": 6001}`, 6001, true},
		{"duplicates: the largest, first", chat, `{"max_tokens": 99999, "max_tokens": 1}`, 99999, true},
		{"duplicates: the largest, last", chat, `{"max_tokens": 1, "max_tokens": 99999}`, 99999, true},
		{"n multiplies", chat, `{"max_tokens": 1000, "n": 8}`, 8000, true},
		{"n multiplies the default", chat, `{"n": 3}`, 3 * def, false},
		{"n as a string", chat, `{"max_tokens": 1000, "n": "8"}`, 8000, true},
		{"n as a fraction rounds up", chat, `{"max_tokens": 1000, "n": 2.5}`, 3000, true},
		{"n 0 counts as 1", chat, `{"max_tokens": 1000, "n": 0}`, 1000, true},
		{"n negative counts as 1", chat, `{"max_tokens": 1000, "n": -4}`, 1000, true},
		{"n a word counts as 1", chat, `{"max_tokens": 1000, "n": "many"}`, 1000, true},
		{"n an object counts as 1", chat, `{"max_tokens": 1000, "n": {"n": 8}}`, 1000, true},
		{"n duplicated, folded", chat, `{"max_tokens": 1000, "n": 1, "N": 5}`, 5000, true},
		{"vLLM's best_of on chat", chat, `{"max_tokens": 1000, "n": 2, "best_of": 6}`, 6000, true},
		{"best_of on completions", "/v1/completions", `{"max_tokens": 10, "n": 2, "best_of": 5}`, 50, true},
		{"n above best_of on completions", "/v1/completions", `{"max_tokens": 10, "n": 7, "best_of": 5}`, 70, true},
		{"1e4", chat, `{"max_tokens": 1e4}`, 10000, true},
		{"1000.0", chat, `{"max_tokens": 1000.0}`, 1000, true},
		{"a fraction rounds up", chat, `{"max_tokens": 10.2}`, 11, true},
		{"a string", chat, `{"max_tokens": "1000"}`, 1000, true},
		{"a string with spaces", chat, `{"max_tokens": " 1000 "}`, 1000, true},
		{"a string escaped", chat, `{"max_tokens": "\u0031\u0030\u0030"}`, 100, true},
		{"huge saturates", chat, `{"max_tokens": 99999999999999999999999}`, strictnum.Max, true},
		{"1e300 saturates", chat, `{"max_tokens": 1e300}`, strictnum.Max, true},
		{"1e999 saturates", chat, `{"max_tokens": 1e999}`, strictnum.Max, true},
		{"2^62 x 2^62 saturates", chat, `{"max_tokens": 4611686018427387904, "n": 4611686018427387904}`, strictnum.Max, true},
		{"2^30 x 2^30 saturates", chat, `{"max_tokens": 1073741824, "n": 1073741824}`, strictnum.Max, true},
		{"0 is not named", chat, `{"max_tokens": 0}`, def, false},
		{"negative is not named", chat, `{"max_tokens": -5}`, def, false},
		{"null is not named", chat, `{"max_tokens": null}`, def, false},
		{"a word is not named", chat, `{"max_tokens": "lots"}`, def, false},
		{"a bool is not named", chat, `{"max_tokens": true}`, def, false},
		{"an array is not named", chat, `{"max_tokens": [50000]}`, def, false},
		{"an object is not named", chat, `{"max_tokens": {"max_tokens": 50000}}`, def, false},
		{"a word beside a number", chat, `{"max_tokens": "lots", "max_tokens": 20}`, 20, true},
		{"nested in messages: ignored", chat, `{"messages": [{"role": "user", "content": "x", "max_tokens": 50000}], "max_tokens": 10}`, 10, true},
		{"nested in tools: ignored", chat, `{"tools": [{"function": {"parameters": {"max_tokens": 50000, "n": 9}}}], "max_tokens": 10}`, 10, true},
		{"nested in an object: ignored", chat, `{"metadata": {"max_tokens": 50000}, "max_tokens": 10}`, 10, true},
		{"in a string: ignored", chat, `{"messages": [{"content": "\"max_tokens\": 50000"}], "max_tokens": 10}`, 10, true},
		{"responses", resp, `{"max_output_tokens": 500, "n": 4}`, 500, true},
		{"responses ignores max_tokens", resp, `{"max_tokens": 50000}`, def, false},
		{"anthropic", anth, `{"max_tokens": 1024, "thinking": {"type": "enabled", "budget_tokens": 1000}}`, 1024, true},
		{"anthropic count_tokens generates nothing", "/v1/messages/count_tokens", `{"max_tokens": 1024}`, 0, true},
		{"gemini", gem, `{"generationConfig": {"maxOutputTokens": 800}}`, 800, true},
		{"gemini snake_case", gem, `{"generation_config": {"max_output_tokens": 800}}`, 800, true},
		{"gemini mixed spellings", gem, `{"generationConfig": {"max_output_tokens": 800}}`, 800, true},
		{"gemini both objects: the largest", gem, `{"generationConfig": {"maxOutputTokens": 1}, "generation_config": {"maxOutputTokens": 900}}`, 900, true},
		{"gemini duplicate parents: the largest", gem, `{"generationConfig": {"maxOutputTokens": 900}, "generationConfig": {"maxOutputTokens": 1}}`, 900, true},
		{"gemini candidateCount", gem, `{"generationConfig": {"maxOutputTokens": 100, "candidateCount": 4}}`, 400, true},
		{"gemini candidate_count folded", gem, `{"generationConfig": {"maxOutputTokens": 100, "Candidate_Count": 4}}`, 400, true},
		{"gemini thinkingBudget adds", gem, `{"generationConfig": {"maxOutputTokens": 100, "thinkingConfig": {"thinkingBudget": 1024}}}`, 1124, true},
		{"gemini thinkingBudget adds to the default", gem, `{"generationConfig": {"thinking_config": {"thinking_budget": 1024}}}`, def + 1024, false},
		{"gemini thinkingBudget -1 adds nothing", gem, `{"generationConfig": {"maxOutputTokens": 100, "thinkingConfig": {"thinkingBudget": -1}}}`, 100, true},
		{"gemini thinking times candidates", gem, `{"generationConfig": {"maxOutputTokens": 100, "candidateCount": 2, "thinkingConfig": {"thinkingBudget": 50}}}`, 300, true},
		{"gemini top-level maxOutputTokens: ignored", gem, `{"maxOutputTokens": 5, "generationConfig": {"temperature": 1}}`, def, false},
		{"ollama num_predict", oll, `{"options": {"num_predict": 100}}`, 100, true},
		{"ollama num_predict -1: the default", oll, `{"options": {"num_predict": -1}}`, def, false},
		{"ollama num_predict -2: the default", oll, `{"options": {"num_predict": -2}}`, def, false},
		{"ollama num_predict folded", oll, `{"Options": {"Num_Predict": 100}}`, 100, true},
		{"bedrock maxTokens", bed, `{"inferenceConfig": {"maxTokens": 512}}`, 512, true},
		{"bedrock Pascal case", bed, `{"InferenceConfig": {"MaxTokens": 512}}`, 512, true},
		{"bedrock additional fields", bed, `{"inferenceConfig": {"maxTokens": 512}, "additionalModelRequestFields": {"max_tokens": 9000}}`, 9000, true},
		{"unknown: every table", unk, `{"max_tokens": 10, "options": {"num_predict": 300}, "generationConfig": {"maxOutputTokens": 200}}`, 300, true},
		{"unknown: every multiplier", unk, `{"max_tokens": 10, "n": 2, "generationConfig": {"candidateCount": 5}}`, 50, true},
		{"unknown: the default", unk, `{"input": "hi"}`, def, false},
		{"empty body", chat, ``, def, false},
		{"whitespace body", chat, " \n\t", def, false},
		{"a top-level array", chat, `[{"max_tokens": 50000}]`, def, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r, err := ReadRequest(c.path, []byte(c.body), def)
			if err != nil {
				t.Fatalf("ReadRequest(%s): %v", c.body, err)
			}
			if r.Output != c.output || r.Named != c.named {
				t.Errorf("ReadRequest(%s): output %d named %v, want %d %v", c.body, r.Output, r.Named, c.output, c.named)
			}
			if want := min(c.output+int64(len(c.body)), strictnum.Max); r.Reserve != want || r.Input != int64(len(c.body)) {
				t.Errorf("ReadRequest(%s): reserve %d input %d, want %d %d", c.body, r.Reserve, r.Input, want, len(c.body))
			}
		})
	}
}

// TestReadRequestModel: the model priced later, from the body or the path.
func TestReadRequestModel(t *testing.T) {
	cases := []struct {
		name, path, body, model string
	}{
		{"top-level model", "/v1/chat/completions", `{"model": "gpt-4o", "messages": [{"model": "other"}]}`, "gpt-4o"},
		{"folded key", "/v1/chat/completions", `{"Model": "gpt-4o"}`, "gpt-4o"},
		{"escaped value", "/v1/chat/completions", `{"model": "gpt\u002d4o"}`, "gpt-4o"},
		{"the same twice", "/v1/messages", `{"model": "claude", "MODEL": "claude"}`, "claude"},
		{"two different: unknown", "/v1/messages", `{"model": "claude-haiku", "Model": "claude-opus"}`, ""},
		{"not a string", "/v1/messages", `{"model": 5}`, ""},
		{"none", "/v1/messages", `{}`, ""},
		{"gemini: from the path", "/v1beta/models/gemini-2.0-flash:generateContent", `{"model": "other"}`, "gemini-2.0-flash"},
		{"bedrock: from the path, unescaped", "/model/anthropic.claude-3-haiku-20240307-v1%3A0/converse", `{}`, "anthropic.claude-3-haiku-20240307-v1:0"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r, err := ReadRequest(c.path, []byte(c.body), 1)
			if err != nil || r.Model != c.model {
				t.Errorf("ReadRequest(%s): model %q, %v; want %q", c.body, r.Model, err, c.model)
			}
		})
	}
}

// TestReadRequestNotJSON: what some server might read otherwise is refused.
func TestReadRequestNotJSON(t *testing.T) {
	cases := []struct{ name, body string }{
		{"trailing garbage", `{"max_tokens": 5} x`},
		{"two documents", `{"max_tokens": 5} {"max_tokens": 90000}`},
		{"NaN", `{"max_tokens": NaN}`},
		{"Infinity", `{"max_tokens": Infinity}`},
		{"a comment", `{"max_tokens": 5 /* or 90000 */}`},
		{"a line comment", "{\"max_tokens\": 5 // 90000\n}"},
		{"truncated", `{"max_tokens": 5`},
		{"truncated string", `{"messages": "abc`},
		{"a trailing comma", `{"max_tokens": 5,}`},
		{"single quotes", `{'max_tokens': 5}`},
		{"a bare key", `{max_tokens: 5}`},
		{"a leading zero", `{"max_tokens": 0123}`},
		{"a plus sign", `{"max_tokens": +5}`},
		{"hex", `{"max_tokens": 0x10}`},
		{"a bad escape", `{"max_tokens": "\x31"}`},
		{"a short unicode escape", `{"max_tokens": "\u31"}`},
		{"a control character", "{\"messages\": \"a\x01b\"}"},
		{"a bare word", `max_tokens=5`},
		{"a bad literal", `{"stream": tru}`},
		{"too deep", strings.Repeat("[", 65) + strings.Repeat("]", 65)},
		{"too deep objects", strings.Repeat(`{"a":`, 65) + "1" + strings.Repeat("}", 65)},
		{"deep unclosed", strings.Repeat("[", 100000)},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if _, err := ReadRequest("/v1/chat/completions", []byte(c.body), 1); !errors.Is(err, ErrNotJSON) {
				t.Errorf("ReadRequest(%q): %v, want ErrNotJSON", c.body, err)
			}
		})
	}
	ok := strings.Repeat("[", 64) + strings.Repeat("]", 64)
	if _, err := ReadRequest("/v1/chat/completions", []byte(ok), 1); err != nil {
		t.Errorf("64 levels: %v, want none", err)
	}
}

// TestReadRequestAgreesWithEncodingJSON: of the bodies encoding/json reads
// (it folds keys as this package does, and takes the last duplicate), the
// bound read here is never smaller than its.
func TestReadRequestAgreesWithEncodingJSON(t *testing.T) {
	bodies := []string{
		`{"max_tokens": 5, "MAX_TOKENS": 900}`,
		`{"MAX_TOKENS": 900, "max_tokens": 5}`,
		`{"max_to\u212aens": 777}`,
		`{"max\u005ftokens": 42}`,
		`{"messages": [{"max_tokens": 5}], "max_tokens": 3}`,
	}
	for _, b := range bodies {
		var v struct {
			MaxTokens int64 `json:"max_tokens"`
		}
		if err := json.Unmarshal([]byte(b), &v); err != nil {
			t.Fatal(err)
		}
		r, err := ReadRequest("/v1/messages", []byte(b), 1)
		if err != nil || r.Output < v.MaxTokens {
			t.Errorf("%s: bound %d (%v), encoding/json reads %d", b, r.Output, err, v.MaxTokens)
		}
	}
}

// TestReadPaths: cost json's paths, with the same folding and duplicates.
func TestReadPaths(t *testing.T) {
	paths := [][]string{{"max_tokens"}, {"generation_config", "max_output_tokens"}}
	cases := []struct {
		name string
		body string
		want []Value
	}{
		{"found", `{"max_tokens": 100, "generation_config": {"max_output_tokens": 50}}`, []Value{{N: 100, Found: true}, {N: 50, Found: true}}},
		{"folded, largest", `{"max_tokens": 1, "Max_Tokens": 99999}`, []Value{{N: 99999, Found: true}, {}}},
		{"nested ignored", `{"messages": [{"max_tokens": 1}], "x": {"max_tokens": 2}}`, []Value{{}, {}}},
		{"numbers however written", `{"max_tokens": "1e3", "generation_config": {"max_output_tokens": 10.5}}`, []Value{{N: 1000, Found: true}, {N: 11, Found: true}}},
		{"zero", `{"max_tokens": 0}`, []Value{{Found: true}, {}}},
		{"null", `{"max_tokens": null}`, []Value{{}, {}}},
		{"odd", `{"max_tokens": -5, "generation_config": {"max_output_tokens": true}}`, []Value{{Odd: true}, {Odd: true}}},
		{"odd beside a number", `{"max_tokens": [1], "max_tokens": 7}`, []Value{{N: 7, Found: true, Odd: true}, {}}},
		{"an object at a path", `{"max_tokens": {"n": 5}}`, []Value{{Odd: true}, {}}},
		{"empty", ``, []Value{{}, {}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := ReadPaths([]byte(c.body), paths)
			if err != nil {
				t.Fatal(err)
			}
			for i := range c.want {
				if got[i] != c.want[i] {
					t.Errorf("%s: path %v: %+v, want %+v", c.body, paths[i], got[i], c.want[i])
				}
			}
		})
	}
	if _, err := ReadPaths([]byte(`{"max_tokens": 5} {"max_tokens": 1}`), paths); !errors.Is(err, ErrNotJSON) {
		t.Errorf("two documents: %v, want ErrNotJSON", err)
	}
	if _, err := ReadPaths([]byte(`{"a": 1} x`), nil); !errors.Is(err, ErrNotJSON) {
		t.Errorf("no paths, trailing garbage: %v, want ErrNotJSON", err)
	}
	// More paths than one walk matches at once.
	var many [][]string
	body := "{"
	for i := range 130 {
		name := "k" + strings.Repeat("x", i)
		many = append(many, []string{name})
		if i > 0 {
			body += ","
		}
		body += `"` + name + `": ` + strings.Repeat("1", 1+i%5)
	}
	got, err := ReadPaths([]byte(body+"}"), many)
	if err != nil || len(got) != 130 || got[129].N != 11111 || got[64].N != 11111 || got[0].N != 1 {
		t.Errorf("130 paths: %v, %d values", err, len(got))
	}
}

// TestReadRequestAllocates: a body is read without an allocation per byte
// (only the model's name is copied).
func TestReadRequestAllocates(t *testing.T) {
	body := bigBody(1 << 20)
	allocs := testing.AllocsPerRun(5, func() {
		if _, err := ReadRequest("/v1/chat/completions", body, 4096); err != nil {
			t.Fatal(err)
		}
	})
	if allocs > 2 {
		t.Errorf("%v allocations reading 1 MiB, want at most 2", allocs)
	}
}

// FuzzReadRequest: no body panics the reader, and it refuses exactly the
// bodies encoding/json refuses (and those nested deeper than MaxDepth).
func FuzzReadRequest(f *testing.F) {
	f.Add([]byte(`{"max_tokens": 5, "n": 2}`))
	f.Add([]byte(`{"max_to\u212aens": 1e4, "messages": [{"content": "x"}]}`))
	f.Add([]byte(`{"generationConfig": {"maxOutputTokens": "7"}} x`))
	f.Fuzz(func(t *testing.T, body []byte) {
		r, err := ReadRequest("/v1/whatever", body, 100)
		empty := len(bytes.TrimLeft(body, " \t\r\n")) == 0
		if valid := json.Valid(body) && nesting(body) <= MaxDepth || empty; valid != (err == nil) {
			t.Errorf("%q: %v; encoding/json finds it valid: %v", body, err, valid)
		}
		if err == nil && (r.Reserve < r.Output || r.Reserve > strictnum.Max || r.Output < 1) {
			t.Errorf("%q: %+v", body, r)
		}
	})
}

// nesting is how deeply the containers of a valid JSON value nest.
func nesting(body []byte) int {
	depth, deepest := 0, 0
	dec := json.NewDecoder(bytes.NewReader(body))
	for {
		tok, err := dec.Token()
		if err != nil {
			return deepest
		}
		switch tok {
		case json.Delim('{'), json.Delim('['):
			depth++
			deepest = max(deepest, depth)
		case json.Delim('}'), json.Delim(']'):
			depth--
		}
	}
}

// bigBody is a chat request of about size bytes, mostly long messages.
func bigBody(size int) []byte {
	msg := `{"role": "user", "content": "` + strings.Repeat("All work and no play makes Jack a dull boy. ", 20) + `\n\u00e9\"quoted\""}`
	var b strings.Builder
	b.WriteString(`{"model": "gpt-4o", "max_tokens": 1000, "n": 2, "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"max_tokens": {"type": "integer"}}}}}], "messages": [`)
	for b.Len() < size-len(msg) {
		b.WriteString(msg)
		b.WriteString(", ")
	}
	b.WriteString(msg + `], "stream": true, "temperature": 0.7}`)
	return []byte(b.String())
}

func BenchmarkReadRequest(b *testing.B) {
	for _, size := range []struct {
		name string
		n    int
	}{{"64KiB", 64 << 10}, {"1MiB", 1 << 20}} {
		body := bigBody(size.n)
		b.Run(size.name, func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				if r, err := ReadRequest("/v1/chat/completions", body, 4096); err != nil || r.Output != 2000 {
					b.Fatal(r, err)
				}
			}
		})
	}
}
