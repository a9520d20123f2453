package llmtest

import (
	"strings"
	"testing"
)

// TestReadRequest: what the stand-in generates for a body, as a lenient
// server reads it.
func TestReadRequest(t *testing.T) {
	const kelvin = "max_to\u212aens" // KELVIN SIGN folds to k
	for _, c := range []struct {
		name, api, body string
		// bound and output: per generation and in all; choices and
		// generations.
		bound, output, choices, generations int64
		stream, includeUsage                bool
		input                               int64
	}{
		{"chat max_tokens", Chat, `{"messages":[{"role":"user","content":"hello"}],"max_tokens":30}`, 30, 30, 1, 1, false, false, 5},
		{"chat none named", Chat, `{"messages":[{"content":"hi"}]}`, DefaultMaxTokens, DefaultMaxTokens, 1, 1, false, false, 2},
		{"chat the larger of the two", Chat, `{"max_tokens":30,"max_completion_tokens":300}`, 300, 300, 1, 1, false, false, 0},
		{"chat the larger of the two, other way", Chat, `{"max_tokens":3000,"max_completion_tokens":300}`, 3000, 3000, 1, 1, false, false, 0},
		{"case folded", Chat, `{"max_tokens":1,"Max_Tokens":50000}`, 50000, 50000, 1, 1, false, false, 0},
		{"upper case", Chat, `{"MAX_TOKENS":50000}`, 50000, 50000, 1, 1, false, false, 0},
		{"kelvin sign", Chat, `{"max_tokens":1,"` + kelvin + `":50000}`, 50000, 50000, 1, 1, false, false, 0},
		{"kelvin sign escaped", Chat, `{"max_tokens":1,"max_to\u212aens":50000}`, 50000, 50000, 1, 1, false, false, 0},
		{"duplicates: the last", Chat, `{"max_tokens":50000,"max_tokens":1}`, 1, 1, 1, 1, false, false, 0},
		{"folded duplicates: the last", Chat, `{"Max_Tokens":50000,"max_tokens":1}`, 1, 1, 1, 1, false, false, 0},
		{"null unsets", Chat, `{"max_tokens":1,"max_tokens":null}`, DefaultMaxTokens, DefaultMaxTokens, 1, 1, false, false, 0},
		{"zero is none", Chat, `{"max_tokens":0}`, DefaultMaxTokens, DefaultMaxTokens, 1, 1, false, false, 0},
		{"negative is none", Chat, `{"max_tokens":-5}`, DefaultMaxTokens, DefaultMaxTokens, 1, 1, false, false, 0},
		{"exponent", Chat, `{"max_tokens":1e4}`, 10000, 10000, 1, 1, false, false, 0},
		{"fraction of zero", Chat, `{"max_tokens":10000.0}`, 10000, 10000, 1, 1, false, false, 0},
		{"string", Chat, `{"max_tokens":"10000"}`, 10000, 10000, 1, 1, false, false, 0},
		{"huge saturates", Chat, `{"max_tokens":1e300}`, MaxCount, MaxCount, 1, 1, false, false, 0},
		{"nested max_tokens is not the top level's", Chat, `{"messages":[{"content":"x","max_tokens":1}],"metadata":{"max_tokens":1}}`, DefaultMaxTokens, DefaultMaxTokens, 1, 1, false, false, 1},
		{"n", Chat, `{"max_tokens":100,"n":3}`, 100, 300, 3, 3, false, false, 0},
		{"n folded and last", Chat, `{"max_tokens":100,"n":1,"N":4}`, 100, 400, 4, 4, false, false, 0},
		{"stream with usage", Chat, `{"stream":true,"stream_options":{"include_usage":true}}`, DefaultMaxTokens, DefaultMaxTokens, 1, 1, true, true, 0},
		{"stream as a string", Chat, `{"Stream":"true","Stream_Options":{"Include_Usage":1}}`, DefaultMaxTokens, DefaultMaxTokens, 1, 1, true, true, 0},
		{"stream false last", Chat, `{"stream":true,"stream":false}`, DefaultMaxTokens, DefaultMaxTokens, 1, 1, false, false, 0},
		{"content parts", Chat, `{"messages":[{"content":[{"type":"text","text":"abc"},{"type":"text","text":"de"}]},{"content":"fg"}]}`, DefaultMaxTokens, DefaultMaxTokens, 1, 1, false, false, 7},

		{"completions best_of", Completions, `{"prompt":"abc","max_tokens":10,"best_of":3}`, 10, 30, 1, 3, false, false, 3},
		{"completions n and best_of", Completions, `{"prompt":"abc","max_tokens":10,"n":2,"best_of":5}`, 10, 50, 2, 5, false, false, 3},
		{"completions best_of below n", Completions, `{"prompt":"abc","max_tokens":10,"n":4,"best_of":2}`, 10, 40, 4, 4, false, false, 3},
		{"completions prompts", Completions, `{"prompt":["ab","cd","ef"],"max_tokens":10,"n":2}`, 10, 60, 6, 6, false, false, 6},
		{"completions token ids", Completions, `{"prompt":[1,2,3],"max_tokens":10}`, 10, 10, 1, 1, false, false, 3},
		{"completions stream", Completions, `{"prompt":"x","Best_Of":2,"STREAM":true}`, DefaultMaxTokens, 2 * DefaultMaxTokens, 1, 2, true, false, 1},

		{"responses", Responses, `{"input":"hello","instructions":"be brief","max_output_tokens":64,"stream":true}`, 64, 64, 1, 1, true, false, 13},
		{"responses folded", Responses, `{"max_output_tokens":1,"MAX_OUTPUT_TOKENS":640}`, 640, 640, 1, 1, false, false, 0},
		{"responses input items", Responses, `{"input":[{"role":"user","content":[{"type":"input_text","text":"hey"}]}]}`, DefaultMaxTokens, DefaultMaxTokens, 1, 1, false, false, 3},

		{"messages", Messages, `{"system":"sys","messages":[{"role":"user","content":"hello"}],"max_tokens":1024}`, 1024, 1024, 1, 1, false, false, 8},
		{"messages kelvin", Messages, `{"max_tokens":1,"` + kelvin + `":4096,"stream":true}`, 4096, 4096, 1, 1, true, false, 0},
		{"messages system blocks", Messages, `{"system":[{"type":"text","text":"abcd"}],"messages":[{"content":[{"type":"text","text":"ef"}]}]}`, DefaultMaxTokens, DefaultMaxTokens, 1, 1, false, false, 6},

		{"gemini", Gemini, `{"contents":[{"role":"user","parts":[{"text":"hello"}]}],"generationConfig":{"maxOutputTokens":200,"candidateCount":2}}`, 200, 400, 2, 2, false, false, 5},
		{"gemini proto names", Gemini, `{"generation_config":{"max_output_tokens":300,"candidate_count":3}}`, 300, 900, 3, 3, false, false, 0},
		{"gemini the larger spelling", Gemini, `{"generationConfig":{"maxOutputTokens":10},"generation_config":{"max_output_tokens":300}}`, 300, 300, 1, 1, false, false, 0},
		{"gemini folded", Gemini, `{"GenerationConfig":{"maxOutputTokens":1,"MAXOUTPUTTOKENS":700}}`, 700, 700, 1, 1, false, false, 0},
		{"gemini system", Gemini, `{"systemInstruction":{"parts":[{"text":"abc"}]},"contents":[{"parts":[{"text":"d"}]}]}`, DefaultMaxTokens, DefaultMaxTokens, 1, 1, false, false, 4},
		{"gemini stream", GeminiStream, `{}`, DefaultMaxTokens, DefaultMaxTokens, 1, 1, true, false, 0},

		{"ollama chat streams by default", OllamaChat, `{"messages":[{"role":"user","content":"hi"}]}`, DefaultMaxTokens, DefaultMaxTokens, 1, 1, true, false, 2},
		{"ollama stream false", OllamaChat, `{"stream":false,"options":{"num_predict":42}}`, 42, 42, 1, 1, false, false, 0},
		{"ollama num_predict -1", OllamaGenerate, `{"prompt":"abc","options":{"num_predict":-1}}`, DefaultMaxTokens, DefaultMaxTokens, 1, 1, true, false, 3},
		{"ollama num_predict -2", OllamaGenerate, `{"prompt":"abc","system":"de","options":{"num_predict":-2}}`, DefaultMaxTokens, DefaultMaxTokens, 1, 1, true, false, 5},
		{"ollama num_predict folded, last", OllamaGenerate, `{"options":{"num_predict":1,"Num_Predict":900}}`, 900, 900, 1, 1, true, false, 0},
		{"ollama num_predict unset", OllamaGenerate, `{"options":{}}`, DefaultMaxTokens, DefaultMaxTokens, 1, 1, true, false, 0},

		{"converse", Converse, `{"system":[{"text":"sys"}],"messages":[{"role":"user","content":[{"text":"hello"}]}],"inferenceConfig":{"maxTokens":512}}`, 512, 512, 1, 1, false, false, 8},
		{"converse stream folded", ConverseStream, `{"inferenceConfig":{"maxTokens":1,"MaxTokens":2048}}`, 2048, 2048, 1, 1, true, false, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			r, err := ReadRequest(c.api, "", []byte(c.body))
			if err != nil {
				t.Fatalf("%s: %v", c.body, err)
			}
			if r.Bound != c.bound || r.Output != c.output || r.Choices != c.choices || r.Generations != c.generations ||
				r.Stream != c.stream || r.IncludeUsage != c.includeUsage || r.Input != c.input {
				t.Errorf("%s: %+v, want bound %d, output %d, %d choices, %d generations, stream %v, include_usage %v, input %d",
					c.body, r, c.bound, c.output, c.choices, c.generations, c.stream, c.includeUsage, c.input)
			}
			if r.Input > int64(len(c.body)) {
				t.Errorf("%s: %d input tokens, more than the body's %d bytes", c.body, r.Input, len(c.body))
			}
		})
	}
}

// TestReadRequestRefuses: the bodies a lenient server refuses, which the
// stand-in answers with a 400.
func TestReadRequestRefuses(t *testing.T) {
	for _, c := range []struct{ api, body string }{
		{Chat, `not json`},
		{Chat, `[1, 2]`},
		{Chat, `{"max_tokens":1.5}`},
		{Chat, `{"max_tokens":"1.5"}`},
		{Chat, `{"max_tokens":"Infinity"}`},
		{Chat, `{"max_tokens":"0x10"}`},
		{Chat, `{"max_tokens":"lots"}`},
		{Chat, `{"max_tokens":true}`},
		{Chat, `{"stream":"yes"}`},
		{Chat, `{"messages":"hi"}`},
		{Chat, `{"model":5}`},
		{Chat, `{"n":129}`},
		{Completions, `{"best_of":21}`},
		{Gemini, `{"generationConfig":{"candidateCount":9}}`},
		{Gemini, `{"generation_config":{"candidate_count":9}}`},
		{OllamaChat, `{"options":{"num_predict":"many"}}`},
		{"embeddings", `{}`},
	} {
		if r, err := ReadRequest(c.api, "", []byte(c.body)); err == nil {
			t.Errorf("%s %s: read as %+v, want it refused", c.api, c.body, r)
		}
	}
}

// TestReadRequestModel: the model of the path (Gemini, Bedrock) is the
// call's; the others' come from the body.
func TestReadRequestModel(t *testing.T) {
	if r, _ := ReadRequest(Converse, "vendor.text-model-v1:0", []byte(`{"model":"x"}`)); r.Model != "vendor.text-model-v1:0" {
		t.Errorf("converse model %q", r.Model)
	}
	if r, _ := ReadRequest(Chat, "", []byte(`{"Model":"chat-model"}`)); r.Model != "chat-model" {
		t.Errorf("chat model %q", r.Model)
	}
}

// TestTextBytes: the input counted is the text of a prompt, never more
// than its JSON.
func TestTextBytes(t *testing.T) {
	for raw, want := range map[string]int64{
		`"hello"`:          5,
		`"h\u00e9llo"`:     6,
		`"a\nb"`:           3,
		`["ab","cd"]`:      4,
		`[{"text":"abc"}]`: 3,
		`{"parts":[{"text":"xy"},{"inline_data":{"data":"AAAA"}}]}`: 2 + int64(len(`{"inline_data":{"data":"AAAA"}}`)),
		`{"image":"zzz"}`:     int64(len(`{"image":"zzz"}`)),
		`null`:                0,
		`12345`:               5,
		`[{"content":"abc"}]`: 3,
	} {
		if got := textBytes([]byte(raw)); got != want || got > int64(len(raw)) {
			t.Errorf("textBytes(%s) = %d, want %d", raw, got, want)
		}
	}
	if got := textBytes([]byte(`"` + strings.Repeat("x", 100) + `"`)); got != 100 {
		t.Errorf("100 x: %d", got)
	}
}
