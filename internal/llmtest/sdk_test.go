package llmtest

import (
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// sdkDir holds client.mjs and the official SDKs it runs.
var sdkDir = filepath.Join("..", "..", "testdata", "llmsdk")

type sdkCall = SDKCall
type sdkResult = SDKResult

func needSDKs(t *testing.T) { t.Helper(); NeedSDKs(t, sdkDir) }

func runSDKs(t *testing.T, calls []sdkCall, parallel bool) []sdkResult {
	t.Helper()
	return RunSDKs(t, sdkDir, calls, parallel)
}

// headerKey counts a request by the header its key came in, named, so
// that a test sees which header each SDK sends.
func headerKey(r *http.Request) string {
	for _, h := range []string{"X-Api-Key", "X-Goog-Api-Key", "Authorization"} {
		if v := r.Header.Get(h); v != "" {
			return strings.ToLower(h) + ": " + v
		}
	}
	return "none"
}

// sdkKey is the key, as headerKey names it, each SDK's call of key comes
// with.
func sdkKey(api, key string) string {
	if api == "gemini" {
		return "x-goog-api-key: " + key
	}
	return "authorization: Bearer " + key
}

// sdkAPIs are the APIs of client.mjs, and whether each streams by its
// stream field (converse and converse-stream are one each).
var sdkAPIs = []struct {
	api     string
	streams []bool
}{
	{"chat", []bool{false, true}},
	{"completions", []bool{false, true}},
	{"responses", []bool{false, true}},
	{"messages", []bool{false, true}},
	{"gemini", []bool{false, true}},
	{"ollama-chat", []bool{false, true}},
	{"ollama-generate", []bool{false, true}},
	{"converse", []bool{false}},
	{"converse-stream", []bool{true}},
}

// TestSDKsParseEveryShape: each official SDK, streamed and not, reads the
// stand-in's answer (status 200, the text, one choice) and sees the usage
// the stand-in recorded it reported, which is all the call used; and each
// sends its key in the header client.mjs says.
func TestSDKsParseEveryShape(t *testing.T) {
	needSDKs(t)
	u := Start(t, WithKey(headerKey))
	var calls []sdkCall
	for _, a := range sdkAPIs {
		for _, stream := range a.streams {
			calls = append(calls, sdkCall{API: a.api, BaseURL: u.URL(), APIKey: fmt.Sprintf("sk-%s-%v", a.api, stream), Stream: stream,
				IncludeUsage: stream, MaxTokens: 300, Content: "Say hello in " + a.api})
		}
	}
	for i, r := range runSDKs(t, calls, false) {
		c := calls[i]
		key := sdkKey(c.API, c.APIKey)
		got := u.Calls(key)
		if len(got) != 1 {
			t.Errorf("%s stream=%v: %d calls under %q (keys: %q): the SDK's key is not in the header client.mjs says (%s: %s)", c.API, c.Stream, len(got), key, u.Keys(), r.Error, r.Message)
			continue
		}
		call := got[0]
		input := int64(len(c.Content))
		if r.Status != 200 || r.Text != Text || r.Choices != 1 || r.Error != "" {
			t.Errorf("%s stream=%v: status %d, text %q, %d choices (%s: %s)", c.API, c.Stream, r.Status, r.Text, r.Choices, r.Error, r.Message)
		}
		if call.Used != input+300 || call.InputTokens != input || call.OutputTokens != 300 || !call.Completed || call.Stream != c.Stream {
			t.Errorf("%s stream=%v: the call used %d (%d in, %d out; completed %v, stream %v), want %d in and 300 out", c.API, c.Stream, call.Used, call.InputTokens, call.OutputTokens, call.Completed, call.Stream, input)
		}
		if r.Tokens != call.Reported || call.Reported != call.Used || !r.Final {
			t.Errorf("%s stream=%v: the SDK saw %d tokens (usage %s, final %v), the stand-in reported %d and the call used %d", c.API, c.Stream, r.Tokens, r.Usage, r.Final, call.Reported, call.Used)
		}
	}
	if n := len(u.Keys()); n != len(calls) {
		t.Errorf("%d keys for %d calls: %q", n, len(calls), u.Keys())
	}

	// Ollama's client sends no key of its own.
	r := runSDKs(t, []sdkCall{{API: "ollama-chat", BaseURL: u.URL(), MaxTokens: 10, Content: "hi"}}, false)[0]
	if r.Status != 200 || u.CallCount("none") != 1 {
		t.Errorf("ollama without a key: status %d (%s), keys %q", r.Status, r.Error, u.Keys())
	}
}

// TestSDKsChoicesAndLenientBodies: the counts of choices (n, best_of,
// candidateCount) multiply what a call generates, and fields that the SDK
// sends and a lenient server reads otherwise (a case-folded or
// Kelvin-sign key after the SDK's, the last of duplicates) set the
// output, through each SDK.
func TestSDKsChoicesAndLenientBodies(t *testing.T) {
	needSDKs(t)
	u := Start(t)
	type check struct {
		call    sdkCall
		output  int64
		choices int
	}
	checks := []check{
		{sdkCall{API: "chat", N: 3, MaxTokens: 300}, 900, 3},
		{sdkCall{API: "chat", Stream: true, IncludeUsage: true, N: 2, MaxTokens: 300}, 600, 2},
		{sdkCall{API: "completions", N: 2, BestOf: 3, MaxTokens: 300}, 900, 2},
		{sdkCall{API: "completions", Stream: true, IncludeUsage: true, N: 2, MaxTokens: 300}, 600, 2},
		{sdkCall{API: "gemini", CandidateCount: 2, MaxTokens: 300}, 600, 2},
		{sdkCall{API: "gemini", Stream: true, CandidateCount: 3, MaxTokens: 300}, 900, 3},
		{sdkCall{API: "chat", MaxTokens: 300, ExtraBody: `{"max_tokens":1,"Max_Tokens":50000}`}, 50000, 1},
		{sdkCall{API: "chat", MaxTokens: 300, ExtraBody: `{"max_completion_tokens":1,"max_completion_to\u212aens":40000}`}, 40000, 1},
		{sdkCall{API: "chat", MaxTokens: 30000, ExtraBody: `{"max_tokens":1}`}, 1, 1},
		{sdkCall{API: "completions", ExtraBody: `{"max_tokens":10,"MAX_TOKENS":1000,"best_of":3}`}, 3000, 1},
		{sdkCall{API: "responses", Stream: true, MaxTokens: 300, ExtraBody: `{"max_output_tokens":1,"Max_Output_Tokens":20000}`}, 20000, 1},
		{sdkCall{API: "messages", MaxTokens: 300, ExtraBody: `{"max_tokens":1,"max_to\u212aens":30000}`}, 30000, 1},
		{sdkCall{API: "messages", Stream: true, MaxTokens: 300, ExtraBody: map[string]any{"MAX_TOKENS": 7000}}, 7000, 1},
		{sdkCall{API: "gemini", CandidateCount: 2, MaxTokens: 300, ExtraBody: `{"generationConfig":{"maxOutputTokens":1,"MaxOutputTokens":9000}}`}, 18000, 2},
		{sdkCall{API: "ollama-chat", ExtraBody: `{"options":{"num_predict":1,"Num_Predict":25000}}`}, 25000, 1},
		{sdkCall{API: "ollama-generate", Stream: true, MaxTokens: -1}, DefaultMaxTokens, 1},
		{sdkCall{API: "converse", MaxTokens: 300, ExtraBody: `{"inferenceConfig":{"maxTokens":1,"MaxTokens":15000}}`}, 15000, 1},
		{sdkCall{API: "converse-stream", Stream: true, ExtraBody: `{"inferenceConfig":{"maxtokens":12000}}`}, 12000, 1},
	}
	var calls []sdkCall
	for i, c := range checks {
		c.call.BaseURL, c.call.APIKey, c.call.Content = u.URL(), fmt.Sprintf("sk-lenient-%d", i), "Count to three"
		calls = append(calls, c.call)
	}
	for i, r := range runSDKs(t, calls, true) {
		c, want := calls[i], checks[i]
		key := "Bearer " + c.APIKey
		if c.API == "gemini" {
			key = c.APIKey
		}
		got := u.Calls(key)
		if r.Status != 200 || len(got) != 1 || r.Choices != want.choices || r.Text != Text {
			t.Errorf("%s %v: status %d, %d calls, %d choices (want %d), text %q (%s: %s)", c.API, c.ExtraBody, r.Status, len(got), r.Choices, want.choices, r.Text, r.Error, r.Message)
			continue
		}
		if got[0].OutputTokens != want.output || r.Tokens != got[0].Used || r.Tokens != got[0].Reported {
			t.Errorf("%s %v: %d output tokens generated, want %d; the SDK saw %d, the stand-in reported %d of %d used", c.API, c.ExtraBody, got[0].OutputTokens, want.output, r.Tokens, got[0].Reported, got[0].Used)
		}
	}
}

// TestSDKsKnobs: the knobs as the SDKs see them: cache and reasoning
// tokens and an override in the usage they read, a decoy usage they do
// not read, a refusal with each vendor's error class, and a stream that
// the client drops, which still uses all it generates.
func TestSDKsKnobs(t *testing.T) {
	needSDKs(t)
	u := Start(t)
	key := func(c sdkCall) string {
		if c.API == "gemini" {
			return c.APIKey
		}
		return "Bearer " + c.APIKey
	}
	t.Run("usage", func(t *testing.T) {
		cache := map[string]string{HeaderCacheRead: "1000", HeaderCacheWrite: "200", HeaderReasoning: "50", HeaderNestedUsage: "1"}
		var calls []sdkCall
		for _, a := range sdkAPIs {
			for _, stream := range a.streams {
				calls = append(calls, sdkCall{API: a.api, BaseURL: u.URL(), APIKey: fmt.Sprintf("sk-cache-%s-%v", a.api, stream), Stream: stream,
					IncludeUsage: stream, MaxTokens: 300, Content: "hi", Headers: cache})
			}
		}
		calls = append(calls,
			sdkCall{API: "chat", BaseURL: u.URL(), APIKey: "sk-override", MaxTokens: 300, Content: "hi", Headers: map[string]string{HeaderUsage: "7,8"}},
			sdkCall{API: "converse-stream", BaseURL: u.URL(), APIKey: "sk-override-bedrock", Stream: true, MaxTokens: 300, Content: "hi", Headers: map[string]string{HeaderUsage: "70,80"}})
		for i, r := range runSDKs(t, calls, true) {
			c := calls[i]
			got := u.Calls(key(c))
			if r.Status != 200 || len(got) != 1 {
				t.Errorf("%s stream=%v: status %d, %d calls (%s: %s)", c.API, c.Stream, r.Status, len(got), r.Error, r.Message)
				continue
			}
			want := int64(2 + 1000 + 200 + 300)
			if c.Headers[HeaderUsage] != "" {
				in, out, _ := strings.Cut(c.Headers[HeaderUsage], ",")
				want = mustInt(t, in) + mustInt(t, out)
				if got[0].Used != 2+300 {
					t.Errorf("%s: used %d, want 302 whatever the usage says", c.API, got[0].Used)
				}
			} else if got[0].Used != want {
				t.Errorf("%s stream=%v: used %d, want %d", c.API, c.Stream, got[0].Used, want)
			}
			if r.Tokens != want || got[0].Reported != want || !r.Final {
				t.Errorf("%s stream=%v: the SDK saw %d tokens (usage %s), the stand-in reported %d, want %d", c.API, c.Stream, r.Tokens, r.Usage, got[0].Reported, want)
			}
		}
	})
	t.Run("refused", func(t *testing.T) {
		want := map[string]string{"chat": "RateLimitError", "completions": "RateLimitError", "responses": "RateLimitError", "messages": "RateLimitError",
			"gemini": "ApiError", "ollama-chat": "ResponseError", "ollama-generate": "ResponseError", "converse": "ThrottlingException", "converse-stream": "ThrottlingException"}
		var calls []sdkCall
		for _, a := range sdkAPIs {
			calls = append(calls, sdkCall{API: a.api, BaseURL: u.URL(), APIKey: "sk-refused-" + a.api, Stream: a.streams[0], MaxTokens: 300, Content: "hi",
				Headers: map[string]string{HeaderStatus: "429"}})
		}
		for i, r := range runSDKs(t, calls, true) {
			c := calls[i]
			if r.Status != 429 || r.Error != want[c.API] || r.Tokens != 0 || r.Final {
				t.Errorf("%s: status %d, error %s (%s), %d tokens; want 429 and %s", c.API, r.Status, r.Error, r.Message, r.Tokens, want[c.API])
			}
			if got := u.Calls(key(c)); len(got) != 1 || got[0].Used != 0 || got[0].Status != 429 {
				t.Errorf("%s: calls %+v, want one refused that used nothing", c.API, got)
			}
		}
	})
	t.Run("dropped", func(t *testing.T) {
		var calls []sdkCall
		for _, a := range sdkAPIs {
			if a.streams[len(a.streams)-1] {
				calls = append(calls, sdkCall{API: a.api, BaseURL: u.URL(), APIKey: "sk-drop-" + a.api, Stream: true, IncludeUsage: true, MaxTokens: 5000,
					Content: "Tell a long story", Drop: true, Headers: map[string]string{HeaderPause: "300ms"}})
			}
		}
		for i, r := range runSDKs(t, calls, true) {
			c := calls[i]
			deadline := time.Now().Add(5 * time.Second)
			for u.Running(key(c)) > 0 && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			got := u.Calls(key(c))
			if r.Status != 200 || len(got) != 1 {
				t.Errorf("%s: status %d, %d calls (%s: %s)", c.API, r.Status, len(got), r.Error, r.Message)
				continue
			}
			if call := got[0]; call.Completed || call.End.IsZero() || call.Used != int64(len(c.Content))+5000 || call.Reported != r.Tokens || call.Reported >= call.Used || r.Final {
				t.Errorf("%s: %+v after a drop (the SDK saw %d tokens, final %v): want an answer cut short that used all it generated and reported what the SDK saw", c.API, call, r.Tokens, r.Final)
			}
		}
	})
}

func mustInt(t *testing.T, s string) int64 {
	t.Helper()
	var n int64
	if _, err := fmt.Sscan(s, &n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestSDKsBedrockAuthAndTransport: Bedrock's client sends its API key as
// a bearer token over HTTP/1.1 and HTTP/2 alike, and with sigv4 a
// signature the stand-in counts by its access key ID.
func TestSDKsBedrockAuthAndTransport(t *testing.T) {
	needSDKs(t)
	var mu sync.Mutex
	var protos []string
	u := Start(t, WithKey(func(r *http.Request) string {
		mu.Lock()
		protos = append(protos, r.Proto)
		mu.Unlock()
		return KeyOf(r)
	}))
	calls := []sdkCall{
		{API: "converse", APIKey: "bedrock-api-key-h1"},
		{API: "converse-stream", Stream: true, APIKey: "bedrock-api-key-h2", HTTP2: true},
		{API: "converse", APIKey: "AKIDEXAMPLE", SigV4: true},
	}
	for i := range calls {
		calls[i].BaseURL, calls[i].MaxTokens, calls[i].Content = u.URL(), 100, "hi"
	}
	results := runSDKs(t, calls, false)
	for i, want := range []string{"Bearer bedrock-api-key-h1", "Bearer bedrock-api-key-h2", "AKIDEXAMPLE"} {
		if r := results[i]; r.Status != 200 || r.Text != Text || u.CallCount(want) != 1 || r.Tokens != u.Reported(want) {
			t.Errorf("%+v: status %d, text %q, %d tokens (%s: %s); calls by key %q", calls[i], r.Status, r.Text, r.Tokens, r.Error, r.Message, u.Keys())
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if strings.Join(protos, " ") != "HTTP/1.1 HTTP/2.0 HTTP/1.1" {
		t.Errorf("protocols %q, want HTTP/1.1, then HTTP/2.0 for http2", protos)
	}
}
