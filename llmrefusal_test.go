package slidingratelimit

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/llmtest"
)

// sdkGateway is a gateway with a day's budget of tokens and a burst zone
// of one call in 2 s per key, in front of upstream.
func sdkGateway(t *testing.T, upstream, errorRoutes string) {
	t.Helper()
	startCaddy(t, siteBlock(":9080", uniquePrefix(t), `
route {
	sliding_ratelimit {
		key {http.request.header.Authorization}
		zone day 1d 100000 {
			cost llm 4096
			settle llm
		}
		zone burst 2s 1
	}
	reverse_proxy `+upstream+` {
		header_up -Accept-Encoding
	}
}
`+errorRoutes))
}

// TestLLMRefusalSDKs: the official SDKs at their default retries, through
// Caddy: a key over its day budget stops at once with each SDK's own
// rate-limit error, a short wait is slept out and retried, and admitted
// calls carry the limit headers of their vendor.
func TestLLMRefusalSDKs(t *testing.T) {
	needSDKs(t)
	api := llmtest.Start(t)
	sdkGateway(t, api.Addr(), "")
	base := strings.TrimSuffix(site, "/")

	t.Run("a spent day budget stops every SDK at once", func(t *testing.T) {
		spend := sdkCall{API: "chat", BaseURL: base, APIKey: "sk-day", MaxTokens: 1000, Content: "Use the tools",
			Headers: map[string]string{llmtest.HeaderUsage: "12,150000"}}
		if r := runOne(t, spend); r.Status != 200 {
			t.Fatalf("spending the budget: status %d (%s %s)", r.Status, r.Error, r.Message)
		}
		// Bedrock's and Gemini's clients send the key as the others do
		// (Gemini's in its header as well): one key for them all.
		bearer := map[string]string{"Authorization": "Bearer sk-day"}
		calls := []sdkCall{
			{API: "chat", DefaultRetries: true},
			{API: "responses", DefaultRetries: true},
			{API: "messages", DefaultRetries: true, MaxTokens: 100},
			{API: "gemini", Headers: bearer},
			{API: "ollama-chat"},
			{API: "converse"},
		}
		for i := range calls {
			calls[i].BaseURL, calls[i].APIKey, calls[i].Content, calls[i].WithinMs = base, "sk-day", "hi", 20000
		}
		want := []struct{ class, errorType, inMessage string }{
			{"RateLimitError", "insufficient_quota/insufficient_quota", "Budget spent"},
			{"RateLimitError", "insufficient_quota/insufficient_quota", "Budget spent"},
			{"RateLimitError", "rate_limit_error", "Budget spent"},
			{"ApiError", "", "RESOURCE_EXHAUSTED"},
			{"ResponseError", "", "Budget spent"},
			{"ThrottlingException", "", "Budget spent"},
		}
		for i, r := range runSDK(t, calls, false) {
			w := want[i]
			if r.Status != 429 || r.Error != w.class || r.ErrorType != w.errorType || !strings.Contains(r.Message, w.inMessage) {
				t.Errorf("%s: status %d, %s %q (%s); want 429, %s %q with %q", calls[i].API, r.Status, r.Error, r.ErrorType, r.Message, w.class, w.errorType, w.inMessage)
			}
			t.Logf("%s: %d %s after %d ms", calls[i].API, r.Status, r.Error, r.Ms)
			if r.Ms > 10000 {
				t.Errorf("%s: the SDK answered after %d ms, want at once", calls[i].API, r.Ms)
			}
			if calls[i].DefaultRetries && r.SDKHeaders["x-should-retry"] != "false" {
				t.Errorf("%s: x-should-retry %q, want false", calls[i].API, r.SDKHeaders["x-should-retry"])
			}
			if ms, _ := strconv.ParseInt(r.SDKHeaders["retry-after-ms"], 10, 64); calls[i].DefaultRetries && ms <= int64(sdkSleepBound/time.Millisecond) {
				t.Errorf("%s: retry-after-ms %q, want the day's wait", calls[i].API, r.SDKHeaders["retry-after-ms"])
			}
		}
		if n := api.CallCount("Bearer sk-day"); n != 1 {
			t.Errorf("the upstream was called %d times, want once (the spending call)", n)
		}
	})

	t.Run("a short wait is slept out and retried", func(t *testing.T) {
		for _, kind := range []string{"chat", "messages"} {
			key := "sk-burst-" + kind
			calls := []sdkCall{
				{API: kind, BaseURL: base, APIKey: key, MaxTokens: 100, Content: "hi"},
				{API: kind, BaseURL: base, APIKey: key, MaxTokens: 100, Content: "hi again", DefaultRetries: true, WithinMs: 20000},
			}
			rs := runSDK(t, calls, false)
			if rs[0].Status != 200 || rs[1].Status != 200 || rs[1].Ms < 1000 || rs[1].Ms > 10000 {
				t.Errorf("%s: statuses %d, %d, the second after %d ms (%s %s); want both served, the second after the burst's wait",
					kind, rs[0].Status, rs[1].Status, rs[1].Ms, rs[1].Error, rs[1].Message)
			}
			if n := api.CallCount("Bearer " + key); n != 2 {
				t.Errorf("%s: the upstream was called %d times, want 2", kind, n)
			}
		}
	})

	t.Run("admitted calls carry their vendor's limit headers", func(t *testing.T) {
		rs := runSDK(t, []sdkCall{
			{API: "chat", BaseURL: base, APIKey: "sk-headers-openai", MaxTokens: 100, Content: "hi"},
			{API: "messages", BaseURL: base, APIKey: "sk-headers-anthropic", MaxTokens: 100, Content: "hi"},
		}, false)
		openai, anthropic := rs[0].SDKHeaders, rs[1].SDKHeaders
		for name, want := range map[string]string{
			"x-ratelimit-limit-requests": "1", "x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "2s",
			"x-ratelimit-limit-tokens": "100000", "x-ratelimit-reset-tokens": "24h0m0s",
		} {
			if openai[name] != want {
				t.Errorf("OpenAI's %s: %q, want %q (all: %v)", name, openai[name], want, openai)
			}
		}
		// The reservation: the bound and the body's bytes.
		if left, _ := strconv.Atoi(openai["x-ratelimit-remaining-tokens"]); left <= 100000-4096 || left >= 100000-100 {
			t.Errorf("OpenAI's x-ratelimit-remaining-tokens %q, want 100,000 less the call's reservation", openai["x-ratelimit-remaining-tokens"])
		}
		if !strings.Contains(rs[0].RateLimit, `"day";r=`+openai["x-ratelimit-remaining-tokens"]+";") {
			t.Errorf("RateLimit %q and x-ratelimit-remaining-tokens %q disagree", rs[0].RateLimit, openai["x-ratelimit-remaining-tokens"])
		}
		for kind, within := range map[string]time.Duration{"requests": 2 * time.Second, "tokens": 24 * time.Hour} {
			if got := anthropic["anthropic-ratelimit-"+kind+"-limit"]; got != map[string]string{"requests": "1", "tokens": "100000"}[kind] {
				t.Errorf("anthropic-ratelimit-%s-limit %q", kind, got)
			}
			reset, err := time.Parse(time.RFC3339, anthropic["anthropic-ratelimit-"+kind+"-reset"])
			if until := time.Until(reset); err != nil || until < within-2*time.Second || until > within+time.Second {
				t.Errorf("anthropic-ratelimit-%s-reset %q (%v), want %v from now", kind, anthropic["anthropic-ratelimit-"+kind+"-reset"], err, within)
			}
		}
		if anthropic["x-ratelimit-limit-tokens"] != "" || openai["anthropic-ratelimit-tokens-limit"] != "" {
			t.Errorf("a vendor's headers on the other's API: %v, %v", openai, anthropic)
		}
	})
}

// TestLLMRefusalBodies: each API's denial, as its vendor documents its own
// 429; a route that shapes 429s in handle_errors keeps its own body, with
// the SDKs' retry headers.
func TestLLMRefusalBodies(t *testing.T) {
	api := llmtest.Start(t)
	sdkGateway(t, api.Addr(), "")
	post := func(t *testing.T, path, key string, body string) (*http.Response, string) {
		t.Helper()
		return postRaw(t, strings.TrimSuffix(site, "/"), path, key, body)
	}
	chat := `{"model":"m","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}`
	if res, _ := post(t, "/v1/chat/completions", "sk-bodies", chat); res.StatusCode != 200 {
		t.Fatalf("first call: status %d", res.StatusCode)
	}
	// The burst zone refuses the next call for 2 s: a short wait.
	for _, c := range []struct {
		path, body string
		want       map[string]any // dotted path: value
	}{
		{"/v1/chat/completions", chat, map[string]any{"error.type": "requests", "error.code": "rate_limit_exceeded", "error.param": nil}},
		{"/v1/messages", chat, map[string]any{"type": "error", "error.type": "rate_limit_error"}},
		{"/v1beta/models/m:generateContent", `{"contents":[]}`, map[string]any{"error.code": 429.0, "error.status": "RESOURCE_EXHAUSTED"}},
		{"/api/chat", `{"model":"m","options":{"num_predict":10},"messages":[{"role":"user","content":"hi"}]}`, map[string]any{}},
		{"/model/m/converse", `{"messages":[]}`, map[string]any{}},
	} {
		res, body := post(t, c.path, "sk-bodies", c.body)
		var doc map[string]any
		if err := json.Unmarshal([]byte(body), &doc); err != nil || res.StatusCode != 429 || res.Header.Get("Content-Type") != "application/json" {
			t.Errorf("%s: status %d, %s %q (%v)", c.path, res.StatusCode, res.Header.Get("Content-Type"), body, err)
			continue
		}
		for path, want := range c.want {
			var got any = doc
			for _, name := range strings.Split(path, ".") {
				got = got.(map[string]any)[name]
			}
			if got != want {
				t.Errorf("%s: %s is %v, want %v (%s)", c.path, path, got, want, body)
			}
		}
		if !strings.Contains(body, `Rate limit reached: zone \"burst\" allows 1 requests per 2s. Try again in `) {
			t.Errorf("%s: %s, want the message of the burst zone", c.path, body)
		}
		if ms, _ := strconv.Atoi(res.Header.Get("Retry-After-Ms")); ms < 1 || ms > 2000 || res.Header.Get("X-Should-Retry") != "" || res.Header.Get("Retry-After") != "2" {
			t.Errorf("%s: Retry-After %q, retry-after-ms %q, x-should-retry %q; want the burst's wait, retried",
				c.path, res.Header.Get("Retry-After"), res.Header.Get("Retry-After-Ms"), res.Header.Get("X-Should-Retry"))
		}
		if c.path == "/model/m/converse" && res.Header.Get("X-Amzn-Errortype") != "ThrottlingException" {
			t.Errorf("bedrock: x-amzn-errortype %q", res.Header.Get("X-Amzn-Errortype"))
		}
	}

	// A path no API of the table names (without a body, which cost llm
	// could not bound there): the bare 429, with the retry headers.
	if res, body := post(t, "/v1/models", "sk-bodies", ""); res.StatusCode != 429 || body != "" || res.Header.Get("Retry-After-Ms") == "" {
		t.Errorf("another path: status %d, body %q, retry-after-ms %q; want a bare 429 with it", res.StatusCode, body, res.Header.Get("Retry-After-Ms"))
	}

	sdkGateway(t, api.Addr(), `handle_errors 429 {
	respond "shaped" 429
}`)
	if res, _ := post(t, "/v1/chat/completions", "sk-shaped", chat); res.StatusCode != 200 {
		t.Fatalf("first call: status %d", res.StatusCode)
	}
	res, body := post(t, "/v1/chat/completions", "sk-shaped", chat)
	if res.StatusCode != 429 || body != "shaped" || res.Header.Get("Retry-After-Ms") == "" {
		t.Errorf("with handle_errors: status %d, body %q, retry-after-ms %q; want handle_errors' body and the retry headers", res.StatusCode, body, res.Header.Get("Retry-After-Ms"))
	}
}
