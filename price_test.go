package slidingratelimit

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/adminapi"
	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/llmapi"
	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/llmtest"
	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/strictnum"
)

func TestParseDollars(t *testing.T) {
	for _, c := range []struct {
		in   string
		pico int64
		err  string
	}{
		{"2.50", 2_500_000, ""},
		{"10", 10_000_000, ""},
		{"10.00", 10_000_000, ""},
		{"0", 0, ""},
		{".5", 500_000, ""},
		{"0.075", 75_000, ""},
		{"0.000001", 1, ""},
		{"1000000", 1_000_000_000_000, ""},
		{"1000000.000001", 0, "above 1000000 dollars"},
		{"99999999999999999999", 0, "above 1000000 dollars"},
		{"-1", 0, "negative"},
		{"-0.5", 0, "negative"},
		{"abc", 0, "not a number"},
		{"1e3", 0, "not a number"},
		{"+1", 0, "not a number"},
		{"1.", 0, "not a number"},
		{"", 0, "not a number"},
		{".", 0, "not a number"},
		{"1,5", 0, "not a number"},
		{"2.5000001", 0, "more than 6 decimals"},
	} {
		got, err := parseDollars(c.in)
		switch {
		case c.err == "" && (err != nil || got != c.pico):
			t.Errorf("parseDollars(%q) = %d, %v; want %d", c.in, got, err, c.pico)
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("parseDollars(%q) = %d, %v; want an error saying %q", c.in, got, err, c.err)
		}
	}
}

// gpt4o are the recipe's example prices of gpt-4o*, in pico-dollars per
// token.
var gpt4o = rates{input: 2_500_000, cached: 1_250_000, cacheWrite: 2_500_000, output: 10_000_000}

func TestRatesCharge(t *testing.T) {
	claude := rates{input: 3_000_000, cached: 300_000, cacheWrite: 3_750_000, output: 15_000_000}
	for _, c := range []struct {
		what  string
		r     rates
		usage llmapi.Usage
		want  int64
	}{
		{"each kind at its own price", gpt4o, llmapi.Usage{Input: 1000, Cached: 3000, Output: 500, Reported: 4500}, 2500 + 3750 + 5000},
		{"cache writes", claude, llmapi.Usage{Input: 100, Cached: 19000, CacheWrite: 1000, Output: 200}, 300 + 5700 + 3750 + 3000},
		{"a fraction of a µ$ rounds up", rates{input: 150_000, output: 600_000}, llmapi.Usage{Input: 1}, 1},
		{"exact µ$ stay exact", rates{input: 1_000_000}, llmapi.Usage{Input: 7}, 7},
		{"nothing used costs nothing", gpt4o, llmapi.Usage{}, 0},
		{"a total above its parts: the rest at the dearest", gpt4o, llmapi.Usage{Input: 1000, Output: 500, Reported: 2000}, 2500 + 5000 + 500*10},
		{"no overflow at the largest usage", rates{output: 1_000_000_000_000}, llmapi.Usage{Output: strictnum.Max}, strictnum.Max},
	} {
		if got, _ := c.r.charge(c.usage, 0); got != c.want {
			t.Errorf("%s: charge(%+v) = %d µ$, want %d", c.what, c.usage, got, c.want)
		}
	}
	if got := (rates{input: 150_000, output: 600_000}).reserve(1, 1); got != 1 {
		t.Errorf("a reservation of 0.75 µ$: %d, want 1 (rounded up)", got)
	}
	// The reservation prices the input bound at the dearest input kind.
	if got, want := claude.reserve(1000, 4096), int64(1000*3.75+4096*15); got != want {
		t.Errorf("reserve = %d µ$, want %d (the input at cache_write's 3.75, the output at 15)", got, want)
	}
}

// TestPricedUsageOnce reads each vendor's documented usage with the usage
// readers and prices it: cached tokens at their own price, never also at
// the input price.
func TestPricedUsageOnce(t *testing.T) {
	for _, c := range []struct {
		api  llmapi.API
		body string
		want int64
	}{
		// OpenAI: cached_tokens are within prompt_tokens: 1000 fresh at
		// 2.50 and 3000 cached at 1.25, 500 out at 10.
		{llmapi.OpenAIChat, `{"usage":{"prompt_tokens":4000,"completion_tokens":500,"total_tokens":4500,"prompt_tokens_details":{"cached_tokens":3000},"completion_tokens_details":{"reasoning_tokens":200}}}`, 2500 + 3750 + 5000},
		{llmapi.OpenAIResponses, `{"usage":{"input_tokens":4000,"input_tokens_details":{"cached_tokens":3000},"output_tokens":500,"total_tokens":4500}}`, 2500 + 3750 + 5000},
		// Anthropic: the cache fields are apart from input_tokens.
		{llmapi.AnthropicMessages, `{"usage":{"input_tokens":1000,"cache_read_input_tokens":3000,"cache_creation_input_tokens":2000,"output_tokens":500}}`, 2500 + 3750 + 5000 + 5000},
		// Gemini: cachedContentTokenCount within promptTokenCount, thoughts
		// beside candidates.
		{llmapi.Gemini, `{"usageMetadata":{"promptTokenCount":4000,"cachedContentTokenCount":3000,"candidatesTokenCount":300,"thoughtsTokenCount":200,"totalTokenCount":4500}}`, 2500 + 3750 + 5000},
		{llmapi.BedrockConverse, `{"usage":{"inputTokens":1000,"cacheReadInputTokens":3000,"outputTokens":500,"totalTokens":4500}}`, 2500 + 3750 + 5000},
	} {
		r := llmapi.NewUsageReader(c.api, "application/json", "")
		r.Write([]byte(c.body))
		u, why := r.Usage()
		if why != "" {
			t.Fatalf("%v: %s", c.api, why)
		}
		if got, _ := gpt4o.charge(u, 0); got != c.want {
			t.Errorf("%v: %d µ$ for %+v, want %d", c.api, got, u, c.want)
		}
	}
}

// kinds are the dearest rate of each kind, which a reservation prices.
func (r rates) kinds() [4]int64 { return [4]int64{r.input, r.cached, r.cacheWrite, r.output} }

func TestPriceTable(t *testing.T) {
	if err := initMetrics(nil); err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zap.WarnLevel)
	prices := []*Price{
		{Model: "gpt-4o-mini*", Input: "0.15", Cached: "0.075", Output: "0.60"},
		{Model: "gpt-4o*", Input: "2.50", Cached: "1.25", Output: "10"},
		{Model: "claude-*", Input: "3", CacheWrite: "3.75", Cached: "0.30", Output: "15"},
		{Model: "*-embed", Input: "0.02", Output: "0"},
	}
	if err := checkPrices(prices); err != nil {
		t.Fatal(err)
	}
	table := newPriceTable("spend", prices, zap.New(core))
	for _, c := range []struct {
		model string
		want  rates
		ok    bool
	}{
		{"gpt-4o-mini-2024-07-18", rates{input: 150_000, cached: 75_000, cacheWrite: 150_000, output: 600_000}, true},
		{"GPT-4o-Mini", rates{input: 150_000, cached: 75_000, cacheWrite: 150_000, output: 600_000}, true},
		{"gpt-4o", gpt4o, true},
		{"claude-sonnet-4", rates{input: 3_000_000, cached: 300_000, cacheWrite: 3_750_000, output: 15_000_000}, true},
		{"text-embed", rates{input: 20_000, cached: 20_000, cacheWrite: 20_000, output: 0}, true},
		// No line: the dearest of each kind listed.
		{"o1-pro", rates{input: 3_000_000, cached: 1_250_000, cacheWrite: 3_750_000, output: 15_000_000}, false},
		{"", rates{input: 3_000_000, cached: 1_250_000, cacheWrite: 3_750_000, output: 15_000_000}, false},
	} {
		got, ok := table.lookup(c.model)
		if got.kinds() != c.want.kinds() || ok != c.ok {
			t.Errorf("%q: %+v, %v; want %+v, %v", c.model, got, ok, c.want, c.ok)
		}
	}
	for range 3 {
		table.of("o1-pro")
	}
	table.of("o3")
	if got := logs.FilterMessageSnippet("no price line matches").Len(); got != 2 {
		t.Errorf("%d warnings for two unpriced models called four times, want one each", got)
	}
	withStar := append(prices, &Price{Model: "*", Input: "15", Output: "75"})
	if got, ok := newPriceTable("spend", withStar, zap.NewNop()).lookup("o1-pro"); !ok || got.kinds() != (rates{input: 15_000_000, cached: 15_000_000, cacheWrite: 15_000_000, output: 75_000_000}).kinds() {
		t.Errorf("the * line: %+v, %v", got, ok)
	}
}

func TestGlobMatch(t *testing.T) {
	for _, c := range []struct {
		pattern, s string
		want       bool
	}{
		{"*", "", true},
		{"*", "anything/at:all", true},
		{"gpt-4o*", "gpt-4o", true},
		{"gpt-4o*", "gpt-4o-mini", true},
		{"gpt-4o*", "gpt-4", false},
		{"*claude*", "anthropic.claude-3-5-sonnet-20240620-v1:0", true},
		{"a*b*c", "aXbYc", true},
		{"a*b*c", "aXbY", false},
		{"gpt-4o", "gpt-4o-mini", false},
		{"gpt-?o", "gpt-4o", false},
	} {
		if got := globMatch(c.pattern, c.s); got != c.want {
			t.Errorf("globMatch(%q, %q) = %v", c.pattern, c.s, got)
		}
	}
}

// TestPriceLoadErrors: every mistake in prices fails the config at load,
// saying what is wrong and, in a Caddyfile, where.
func TestPriceLoadErrors(t *testing.T) {
	zone := func(lines ...string) string {
		return ":8080 {\n\tsliding_ratelimit {\n\t\tzone spend 1d 10000000 {\n\t\t\tcost llm 4096\n\t\t\tsettle llm\n\t\t\t" +
			strings.Join(lines, "\n\t\t\t") + "\n\t\t}\n\t}\n}\n"
	}
	for _, c := range []struct {
		what, caddyfile string
		want            []string
	}{
		{"a negative price", zone("price gpt-4o* input -2.50 output 10"), []string{"price gpt-4o*: input: \"-2.50\" is negative", "Caddyfile:6"}},
		{"not a number", zone("price gpt-4o* input 2.50 output ten"), []string{"output: \"ten\" is not a number", "Caddyfile:6"}},
		{"a dollar sign", zone("price gpt-4o* input $2.50 output 10"), []string{"\"$2.50\" is not a number"}},
		{"an unknown kind", zone("price claude-* input 3 cache_read 0.30 output 15"), []string{"unknown kind 'cache_read'", "input, cached, cache_write, output", "Caddyfile:6"}},
		{"a kind twice", zone("price gpt-4o* input 2.50 input 3 output 10"), []string{"input is given twice"}},
		{"no output", zone("price gpt-4o* input 2.50"), []string{"price gpt-4o*: needs an output price"}},
		{"no input", zone("price gpt-4o* output 10 cached 1"), []string{"price gpt-4o*: needs an input price"}},
		{"a kind without a price", zone("price gpt-4o* input 2.50 output"), []string{"price takes a model pattern, then kinds and dollars"}},
		{"a line after *", zone("price * input 5 output 15", "price gpt-4o* input 2.50 output 10"), []string{"price gpt-4o* can never match", "price *", "Caddyfile:7"}},
		{"a narrower line after a wider one", zone("price gpt-4o* input 2.50 output 10", "price gpt-4o-mini input 0.15 output 0.60"), []string{"price gpt-4o-mini can never match", "price gpt-4o*"}},
		{"the same pattern twice", zone("price claude-* input 3 output 15", "price Claude-* input 1 output 5"), []string{"price Claude-* can never match"}},
		{"too many decimals", zone("price gpt-4o* input 2.5000001 output 10"), []string{"more than 6 decimals"}},
		{"without settle llm", strings.Replace(zone("price gpt-4o* input 2.50 output 10"), "settle llm", "settle header X-Usage", 1), []string{"zone spend: price needs settle llm", "Caddyfile:6"}},
		{"at the top", ":8080 {\n\tsliding_ratelimit {\n\t\tprice * input 5 output 15\n\t}\n}\n", []string{"price belongs in a zone", "Caddyfile:3"}},
		{"without cost llm", strings.Replace(zone("price gpt-4o* input 2.50 output 10"), "cost llm 4096", "cost json max_tokens 4096", 1), []string{"zone spend: price needs cost llm", "Caddyfile:6"}},
		{"settle llm from the handler, missing", ":8080 {\n\tsliding_ratelimit {\n\t\tcost llm 4096\n\t\tzone spend 1d 10000000 {\n\t\t\tprice * input 5 output 15\n\t\t}\n\t}\n}\n", []string{"zone spend: price needs settle llm", "Caddyfile:5"}},
		{"a price table without a path", zone("price_table"), []string{"price_table takes the path of one price table file", "Caddyfile:6"}},
		{"a price table with two", zone("price_table a.json b.json"), []string{"price_table takes the path of one"}},
		{"a price table without settle llm", strings.Replace(zone("price_table prices.json"), "settle llm", "settle header X-Usage", 1), []string{"zone spend: price needs settle llm", "Caddyfile:6"}},
		{"a price table twice", zone("price_table a.json", "price_table b.json"), []string{"duplicate subdirective 'price_table'"}},
	} {
		_, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(c.caddyfile), nil)
		if err == nil {
			t.Errorf("%s: adapted without error", c.what)
			continue
		}
		for _, want := range c.want {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("%s: error %q does not say %q", c.what, err, want)
			}
		}
	}

	// A zone that takes cost llm and settle llm from the handler adapts,
	// and one that takes neither from anywhere fails to load.
	inherited := ":9080 {\n\tsliding_ratelimit {\n\t\tkey {http.request.header.Authorization}\n\t\tcost llm 4096\n\t\tsettle llm\n\t\tzone spend 1d 10000000 {\n\t\t\tprice * input 5 output 15\n\t\t}\n\t}\n\trespond \"ok\"\n}\n"
	startCaddy(t, inherited)
	for _, c := range []struct{ config, want string }{
		{`{"cost_llm": {}, "zones": [{"name": "spend", "window": "24h", "max_requests": 10000000, "prices": [{"model": "*", "input": 5, "output": 15}]}]}`, "zone spend: price needs settle llm"},
		{`{"settle": {"llm": true}, "zones": [{"name": "spend", "window": "24h", "max_requests": 10000000, "prices": [{"model": "*", "input": "5", "output": 15}]}]}`, "zone spend: price needs cost llm"},
		{`{"cost_llm": {}, "settle": {"llm": true}, "zones": [{"name": "spend", "window": "24h", "max_requests": 10000000, "prices": [{"model": "*", "input": -5, "output": 15}]}]}`, `zone spend: price *: input: "-5" is negative`},
		{`{"cost_llm": {}, "settle": {"llm": true}, "zones": [{"name": "spend", "window": "24h", "max_requests": 10000000, "prices": [{"input": 5, "output": 15}]}]}`, "price needs a model pattern"},
		{`{"cost_llm": {}, "settle": {"llm": true}, "zones": [{"name": "spend", "window": "24h", "max_requests": 10000000, "price_table": "/nonexistent/prices.json"}]}`, "zone spend: price_table: reading the price table: open /nonexistent/prices.json"},
		{`{"cost_llm": {}, "settle": {"llm": true}, "zones": [{"name": "spend", "window": "24h", "max_requests": 10000000, "price_table": "internal/llmprice/testdata/../../../go.mod"}]}`, "not a JSON object of models"},
		{`{"cost_llm": {}, "zones": [{"name": "spend", "window": "24h", "max_requests": 10000000, "price_table": "internal/llmprice/testdata/model_prices.json"}]}`, "zone spend: price needs settle llm"},
	} {
		if err := provisionError(t, c.config); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error saying %q", c.config, err, c.want)
		}
	}
}

// spendAuth is the recipe's auth service: it names the tenant of a key by
// the key's second part (sk-acme-... is tenant acme).
func spendAuth(t *testing.T) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// A connection per check, so that forward_auth waits for its own
		// dial. With keep-alive, a dial that loses to a connection come
		// free reads the request's vars while the reverse_proxy after
		// forward_auth writes them: a race in Caddy, which the race
		// detector reports under many calls at once.
		w.Header().Set("Connection", "close")
		key := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
		if key == "" {
			key = r.Header.Get("X-Goog-Api-Key")
		}
		if parts := strings.Split(key, "-"); len(parts) > 2 {
			w.Header().Set("X-Tenant", parts[1])
		}
	}))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

// startSpendRecipe runs the spend recipe of docs/ai-gateway.md, with edits,
// on two Caddy instances in front of upstream, as startRecipe does.
func startSpendRecipe(t *testing.T, upstream string, port int, edits ...string) [2]string {
	t.Helper()
	prefix := uniquePrefix(t)
	recipe := strings.NewReplacer(edits...).Replace(docCaddyfile(t, "docs/ai-gateway.md", "zone tenant_spend"))
	auth := spendAuth(t)
	config := func(host string) string {
		return strings.NewReplacer(
			"llm.example.com", host,
			"{env.REDIS_URL}", sharedRedis.URL()+"\n\t\t\tkey_prefix "+prefix,
			"127.0.0.1:8000", upstream,
			"127.0.0.1:9091", auth,
		).Replace(recipe)
	}
	startCaddy(t, config(":9080"))
	health := strconv.Itoa(port + 1)
	startCaddyProcess(t, config(":"+strconv.Itoa(port))+"\n:"+health+" {\n\trespond \"ok\"\n}\n", "http://127.0.0.1:"+health+"/")
	return [2]string{strings.TrimSuffix(site, "/"), "http://127.0.0.1:" + strconv.Itoa(port)}
}

// recipeRates are the recipe's example prices by model pattern, in
// pico-dollars per token, as its lines give them.
func recipeRates(model string) rates {
	switch {
	case strings.HasPrefix(model, "gpt-4o-mini"):
		return rates{input: 150_000, cached: 75_000, cacheWrite: 150_000, output: 600_000}
	case strings.HasPrefix(model, "gpt-4o"):
		return gpt4o
	case strings.HasPrefix(model, "claude-"):
		return rates{input: 3_000_000, cached: 300_000, cacheWrite: 3_750_000, output: 15_000_000}
	}
	return rates{input: 15_000_000, cached: 15_000_000, cacheWrite: 15_000_000, output: 75_000_000}
}

// priced is what a call that the stand-in served costs, priced from its
// own record, each kind as the API reports it: OpenAI's chat and Responses
// and Gemini report cache writes within their prompt (fresh input) and
// cache reads as cached; Anthropic and Bedrock each apart; Ollama and
// OpenAI's legacy completions (no details) their whole prompt as input.
func priced(c llmtest.Call, api string, cacheRead, cacheWrite int64) int64 {
	// api is client.mjs's name, which is the stand-in's (llmtest.Chat ...).
	r := recipeRates(c.Model)
	u := llmapi.Usage{Input: c.InputTokens - cacheRead - cacheWrite, Cached: cacheRead, CacheWrite: cacheWrite, Output: c.OutputTokens}
	switch api {
	case "chat", "responses", "gemini":
		u.Input, u.CacheWrite = u.Input+cacheWrite, 0
	case "completions":
		// Its usage has no details: the cache reads are input too.
		u = llmapi.Usage{Input: c.InputTokens, Output: c.OutputTokens}
	case "ollama-chat", "ollama-generate":
		u = llmapi.Usage{Input: c.InputTokens, Output: c.OutputTokens}
	}
	n, _ := r.charge(u, 0)
	return n
}

// TestSpendRecipe runs the spend recipe of docs/ai-gateway.md on two Caddy
// instances on one Redis, with the official SDKs as its clients: each
// API's usage is priced exactly, cached tokens at their own price and
// never twice; the dollars show in the admin API; a key near its budget is
// refused, on both instances, a call whose priced reservation does not fit.
func TestSpendRecipe(t *testing.T) {
	needSDKs(t)
	api := llmtest.Start(t)
	instances := startSpendRecipe(t, api.Addr(), 9680)

	t.Run("each API's usage is priced exactly", func(t *testing.T) {
		models := map[string]string{
			"chat": "gpt-4o-2024-08-06", "completions": "gpt-4o-mini-instruct", "responses": "gpt-4o-mini",
			"messages": "claude-sonnet-4", "ollama-chat": "llama3.1", "ollama-generate": "llama3.1",
			"converse": "claude-3-5-haiku", "converse-stream": "claude-3-5-haiku",
		}
		var calls []sdkCall
		for i, kind := range recipeAPIs {
			for j, stream := range []bool{false, true} {
				if kind == "converse-stream" && !stream || kind == "converse" && stream {
					continue
				}
				calls = append(calls, sdkCall{API: kind, BaseURL: instances[(i+j)%2], APIKey: fmt.Sprintf("sk-acme-%s-%v", kind, stream), Model: models[kind],
					Stream: stream, IncludeUsage: stream, MaxTokens: 300, Content: "Say hello in " + kind,
					Headers: map[string]string{llmtest.HeaderCacheRead: "3000", llmtest.HeaderCacheWrite: "1000", llmtest.HeaderReasoning: "50"}})
			}
		}
		var tenant int64
		for i, r := range runSDK(t, calls, false) {
			c, key := calls[i], "Bearer "+calls[i].APIKey
			served := api.Calls(key)
			if r.Status != 200 || len(served) != 1 || r.Tokens != served[0].Reported {
				t.Errorf("%s stream=%v: status %d, %d served, the SDK saw %d tokens (%s %s)", c.API, c.Stream, r.Status, len(served), r.Tokens, r.Error, r.Message)
				continue
			}
			want := priced(served[0], c.API, 3000, 1000)
			tenant += want
			if got := unitsUsed(t, "spend", key, want); got != want {
				t.Errorf("%s stream=%v (%s): %d µ$ charged, want %d", c.API, c.Stream, c.Model, got, want)
			}
			if want := `"spend";q=10000000;srl-qu="usd-micros";w=86400, "tenant_spend";q=500000000;srl-qu="usd-micros";w=` + monthSeconds(t, "America/New_York"); r.RateLimitPolicy != want {
				t.Errorf("RateLimit-Policy %q, want %q", r.RateLimitPolicy, want)
			}
		}
		if got := unitsUsed(t, "tenant_spend", "acme", tenant); got != tenant {
			t.Errorf("the tenant was charged %d µ$, want the %d of its keys together", got, tenant)
		}
	})

	t.Run("the admin API shows dollars", func(t *testing.T) {
		c := sdkCall{API: "messages", BaseURL: instances[0], APIKey: "sk-acme-dollars", Model: "claude-sonnet-4", MaxTokens: 100, Content: "hi",
			Headers: map[string]string{llmtest.HeaderUsage: "1000000,100000"}}
		if r := runOne(t, c); r.Status != 200 {
			t.Fatalf("status %d (%s %s)", r.Status, r.Error, r.Message)
		}
		// 1,000,000 input tokens at $3 and 100,000 output at $15: $4.50.
		unitsUsed(t, "spend", "Bearer sk-acme-dollars", 4_500_000)
		s := adminState(t, "spend", "Bearer%20sk-acme-dollars")
		if s.Unit != unitUSDMicros || s.Count != 4_500_000 || s.SpentUSD != "4.5" || s.LeftUSD != "5.5" || s.LimitUSD != "10" {
			t.Errorf("admin state %+v: want 4,500,000 usd-micros, $4.5 spent and $5.5 left of $10", s)
		}
	})

	t.Run("a key near its budget is refused a call that does not fit", func(t *testing.T) {
		key := "sk-acme-near"
		spend := sdkCall{API: "messages", BaseURL: instances[0], APIKey: key, Model: "claude-sonnet-4", MaxTokens: 100, Content: "hi",
			Headers: map[string]string{llmtest.HeaderUsage: "0,600000"}}
		if r := runOne(t, spend); r.Status != 200 {
			t.Fatalf("status %d (%s %s)", r.Status, r.Error, r.Message)
		}
		// $9 of output spent: $1 left, less a few µ$ of the prompt.
		left := 10_000_000 - unitsUsed(t, "spend", "Bearer "+key, 9_000_000)
		if left > 1_000_000 || left < 900_000 {
			t.Fatalf("%d µ$ left, want about $1", left)
		}
		// 100,000 output tokens at $15 reserve $1.50: refused on either
		// instance before the upstream; 20,000 ($0.30) fit.
		before := api.CallCount("Bearer " + key)
		for i := range 2 {
			c := sdkCall{API: []string{"messages", "converse"}[i], BaseURL: instances[i], APIKey: key, Model: "claude-sonnet-4", MaxTokens: 100000, Content: "Write a book"}
			r := runOne(t, c)
			if retry, _ := strconv.Atoi(r.RetryAfter); r.Status != 429 || retry < 1 || !strings.HasPrefix(r.RateLimit, `"spend";r=`) {
				t.Errorf("instance %d: status %d, Retry-After %q, RateLimit %q: want a 429 by spend", i, r.Status, r.RetryAfter, r.RateLimit)
			}
		}
		if got := api.CallCount("Bearer " + key); got != before {
			t.Errorf("%d refused calls reached the upstream", got-before)
		}
		r := runOne(t, sdkCall{API: "chat", BaseURL: instances[1], APIKey: key, Model: "claude-sonnet-4", MaxTokens: 20000, Content: "Write a page"})
		if r.Status != 200 {
			t.Errorf("a call that fits: status %d (%s %s)", r.Status, r.Error, r.Message)
		}
	})
}

// TestSpendRecipeGemini runs the spend recipe with Gemini's key line, as
// the recipe's table of keys says, with the official Gemini SDK: cached
// content, within the prompt, is charged once; thoughts as output.
func TestSpendRecipeGemini(t *testing.T) {
	needSDKs(t)
	api := llmtest.Start(t)
	gemini := startSpendRecipe(t, api.Addr(), 9780, geminiKey...)
	for i, stream := range []bool{false, true} {
		c := sdkCall{API: "gemini", BaseURL: gemini[i], APIKey: fmt.Sprintf("gk-acme-%v", stream), Model: "gemini-2.5-flash", Stream: stream, MaxTokens: 300, Content: "hi",
			Headers: map[string]string{llmtest.HeaderCacheRead: "3000", llmtest.HeaderReasoning: "50"}}
		r := runOne(t, c)
		served := api.Calls(c.APIKey)
		if r.Status != 200 || len(served) != 1 {
			t.Fatalf("gemini stream=%v: status %d, %d served (%s %s)", stream, r.Status, len(served), r.Error, r.Message)
		}
		want := priced(served[0], "gemini", 3000, 0)
		if got := unitsUsed(t, "spend", c.APIKey, want); got != want {
			t.Errorf("gemini stream=%v: %d µ$ charged, want %d", stream, got, want)
		}
	}
}

// TestSpendFleet: dozens of concurrent streams of one key over two
// instances of the spend recipe, its daily budget lowered to $1: what the
// upstream's calls cost, priced from its own records, never exceeds the
// budget, each admitted call pays at least that, and the rest are refused.
func TestSpendFleet(t *testing.T) {
	needSDKs(t)
	api := llmtest.Start(t)
	instances := startSpendRecipe(t, api.Addr(), 9880, "zone spend 1d 10000000", "zone spend 1d 1000000")
	key := "sk-fleet-key"
	var calls [2][]sdkCall
	for i := range 40 {
		c := sdkCall{API: []string{"chat", "messages", "responses", "converse-stream"}[i%4], BaseURL: instances[i%2], APIKey: key,
			Model: []string{"gpt-4o", "claude-sonnet-4"}[i%2], Stream: true, IncludeUsage: true, MaxTokens: 4000, Content: fmt.Sprintf("Story %d", i),
			Headers: map[string]string{llmtest.HeaderPause: "20ms", llmtest.HeaderCacheRead: "500"}}
		calls[i%2] = append(calls[i%2], c)
	}
	results := runOnBoth(t, calls)
	admitted, refused := fleetAnswers(t, results)
	var spent int64
	for _, c := range api.Calls("Bearer " + key) {
		spent += priced(c, c.API, 500, 0)
	}
	if spent > 1_000_000 {
		t.Errorf("the upstream's calls cost %d µ$: want at most the budget, $1", spent)
	}
	if refused == 0 || admitted < 3 {
		t.Errorf("%d calls admitted, %d refused: want the budget to run out", admitted, refused)
	}
	if charged := unitsUsed(t, "spend", "Bearer "+key, spent); charged < spent {
		t.Errorf("%d µ$ charged for %d spent", charged, spent)
	}
	t.Logf("%d calls admitted, %d refused, %d µ$ spent of 1,000,000", admitted, refused, spent)
}

// TestCommandShowsDollars: the admin API and `caddy sliding-ratelimit`
// show a priced zone's µ$ as dollars, to the µ$: used, reserved, spent,
// left and the budget.
func TestCommandShowsDollars(t *testing.T) {
	startCaddy(t, siteBlock(":9080", uniquePrefix(t), `
	sliding_ratelimit {
		key {http.request.header.X-Client}
		zone cmd_spend 1d 10000000 {
			cost llm 4096
			settle llm
			price gpt-4o* input 2.50 cached 1.25 output 10
		}
	}
	respond `+"`"+`{"usage": {"prompt_tokens": 1000, "completion_tokens": 501, "total_tokens": 1501, "prompt_tokens_details": {"cached_tokens": 200}}}`+"`"))
	res := send(t, site+"v1/chat/completions", withMethod(http.MethodPost), withHeader("X-Client", "alice"),
		withBody("application/json", `{"model": "gpt-4o", "max_tokens": 100}`))
	if res.status != http.StatusOK || !strings.Contains(res.header.Get("RateLimit-Policy"), `"cmd_spend";q=10000000;srl-qu="usd-micros";w=86400`) {
		t.Fatalf("status %d, RateLimit-Policy %q", res.status, res.header.Get("RateLimit-Policy"))
	}
	// 800 fresh at $2.50, 200 cached at $1.25, 501 out at $10 per million:
	// 2,000 + 250 + 5,010 µ$.
	if got := unitsUsed(t, "cmd_spend", "alice", 7260); got != 7260 {
		t.Fatalf("%d µ$ charged, want 7,260", got)
	}
	out, err := runCommand(t, "status", "--zone", "cmd_spend", "--key", "alice", "--address", "localhost:2999")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if row := strings.Join(strings.Fields(lines[1]), " "); len(lines) != 4 || !strings.HasPrefix(row, "cmd_spend ") ||
		!strings.Contains(row, " =alice 7260 9992740 usd-micros ") ||
		lines[3] != "used $0.007260 of $10.000000: $0.000000 reserved by calls running on this instance, $0.007260 spent; $9.992740 left" {
		t.Errorf("status printed:\n%s", out)
	}
	out, err = runCommand(t, "zones", "--address", "localhost:2999")
	if err != nil || !strings.Contains(out, "10000000 ($10)") || !strings.Contains(out, "usd-micros") {
		t.Errorf("zones printed (%v):\n%s", err, out)
	}
	if z := commandJSON[adminapi.ZonesAnswer](t, "zones"); len(z.Zones) != 1 || z.Zones[0].LimitUSD != "10" || z.Zones[0].Unit != "usd-micros" {
		t.Errorf("zones --json: %+v", z)
	}
}

// TestSpendKeyStaysSmall: a key of a month's spend budget stays within the
// ring's bound however many calls it makes, and merging its admissions
// loses no µ$ of what they cost.
func TestSpendKeyStaysSmall(t *testing.T) {
	zone := uniqueZone("month")
	startCaddy(t, siteBlock(":9080", uniquePrefix(t), `
	sliding_ratelimit {
		key {http.request.header.X-Client}
		zone `+zone+` 30d 500000000 {
			cost llm 100
			settle llm
			price gpt-4o* input 2.50 cached 1.25 output 10
		}
	}
	respond `+"`"+`{"usage": {"prompt_tokens": 30, "completion_tokens": 7, "total_tokens": 37, "prompt_tokens_details": {"cached_tokens": 10}}}`+"`"))
	const calls = 3000
	for i := range calls {
		res := send(t, site+"v1/chat/completions", withMethod(http.MethodPost), withHeader("X-Client", "monthly"),
			withBody("application/json", `{"model": "gpt-4o", "max_tokens": 10}`))
		if res.status != http.StatusOK {
			t.Fatalf("call %d: %d", i+1, res.status)
		}
	}
	// 20 fresh at $2.50, 10 cached at $1.25 and 7 out at $10 a million:
	// 50 + 12.5 + 70 = 132.5 µ$, rounded up per call.
	const perCall = 133
	if got := unitsUsed(t, zone, "monthly", calls*perCall); got != calls*perCall {
		t.Errorf("%d µ$ charged for %d calls, want %d", got, calls, calls*perCall)
	}
	state := adminState(t, zone, "monthly")
	hs, zones := withZone(zone)
	if len(hs) != 1 || hs[0].backend.redis == nil {
		t.Fatalf("%d handlers with zone %s, or none on Redis", len(hs), zone)
	}
	key := hs[0].backend.redis.Key(zones[0].identity, state.Key)
	size, err := sharedRedis.Client(t).MemoryUsage(context.Background(), key, 0).Result()
	if err != nil {
		t.Fatalf("MEMORY USAGE %s: %v", key, err)
	}
	t.Logf("%d calls in a 30-day window: MEMORY USAGE %d bytes", calls, size)
	if size > 16<<10 {
		t.Errorf("one key of a 30-day window takes %d bytes after %d calls, want at most 16 KB", size, calls)
	}
}

// TestPriceTableFile runs the money recipe with a price table file in
// place of its price lines (one line kept, which overrides the table for
// its model), on two instances: a model the table names is priced at its
// price of each kind for the tier the response names, a line naming a model whole wins over the
// table, a model neither names pays the dearest of both, and a call that
// names no output bound reserves the model's output limit.
func TestPriceTableFile(t *testing.T) {
	needSDKs(t)
	api := llmtest.Start(t)
	file, err := filepath.Abs("internal/llmprice/testdata/model_prices.json")
	if err != nil {
		t.Fatal(err)
	}
	lines := "price gpt-4o-mini* input 0.15 cached 0.075 output 0.60\n" +
		"\t\t\t\tprice gpt-4o* input 2.50 cached 1.25 output 10.00\n" +
		"\t\t\t\tprice claude-* input 3.00 cache_write 3.75 cached 0.30 output 15.00\n" +
		"\t\t\t\tprice * input 15 output 75"
	instances := startSpendRecipe(t, api.Addr(), 9780, lines, "price_table "+file+"\n\t\t\t\tprice claude-sonnet-4-5 input 1 output 1")

	cases := []struct {
		model string
		usage string // input,output
		want  int64  // µ$
	}{
		// The table's prices of the default tier, which the answer
		// names: $2.50 and $10 a million (priority's are $4.25 and $17).
		{"gpt-4o", "1000000,100000", 2_500_000 + 1_000_000},
		// The line that names the model whole: $1 and $1.
		{"claude-sonnet-4-5", "1000000,0", 1_000_000},
		// Neither: the dearest input of both, the table's $10 a million
		// (an audio token's), above the line's $1.
		{"my-own-model", "100000,0", 1_000_000},
	}
	for i, c := range cases {
		call := sdkCall{API: "chat", BaseURL: instances[i%2], APIKey: "sk-acme-table-" + c.model, Model: c.model, MaxTokens: 100, Content: "hi",
			Headers: map[string]string{llmtest.HeaderUsage: c.usage}}
		if r := runOne(t, call); r.Status != 200 {
			t.Fatalf("%s: status %d (%s %s)", c.model, r.Status, r.Error, r.Message)
		}
		if got := unitsUsed(t, "spend", "Bearer "+call.APIKey, c.want); got != c.want {
			t.Errorf("%s, usage %s: %d µ$ charged, want %d", c.model, c.usage, got, c.want)
		}
	}

	// No max_tokens on gpt-4o-mini: 16,384 output tokens at $0.60 a
	// million reserve 9,831 µ$ (the recipe's default, 4,096, would be
	// 2,458), beside the prompt's bytes.
	r := runOne(t, sdkCall{API: "chat", BaseURL: instances[1], APIKey: "sk-acme-table-nobound", Model: "gpt-4o-mini", Content: "hi",
		Headers: map[string]string{llmtest.HeaderPause: "300ms"}})
	remaining := rateLimitRemaining(t, r.RateLimit, "spend")
	if reserved := 10_000_000 - remaining; r.Status != 200 || reserved < 9_831 || reserved > 11_000 {
		t.Errorf("a call without max_tokens reserved %d µ$ (status %d, RateLimit %q): want its model's output limit's, about 9,900", reserved, r.Status, r.RateLimit)
	}
}

// rateLimitRemaining reads r of zone's item of a RateLimit header.
func rateLimitRemaining(t *testing.T, header, zone string) int64 {
	t.Helper()
	for _, item := range strings.Split(header, ",") {
		item = strings.TrimSpace(item)
		if !strings.HasPrefix(item, `"`+zone+`";`) {
			continue
		}
		for _, p := range strings.Split(item, ";") {
			if v, ok := strings.CutPrefix(p, "r="); ok {
				n, err := strconv.ParseInt(v, 10, 64)
				if err != nil {
					t.Fatalf("RateLimit %q: %v", header, err)
				}
				return n
			}
		}
	}
	t.Fatalf("RateLimit %q has no item of %s", header, zone)
	return 0
}
