package slidingratelimit

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/llmtest"
)

// sdkDir holds client.mjs and the official SDKs it runs.
var sdkDir = filepath.Join("testdata", "llmsdk")

type sdkCall = llmtest.SDKCall
type sdkResult = llmtest.SDKResult

// needSDKs makes sure the official SDKs are installed (scripts/ensure-node-sdks.sh):
// missing, they fail the test in CI and skip it elsewhere.
func needSDKs(t *testing.T) { t.Helper(); llmtest.NeedSDKs(t, sdkDir) }

// runSDK runs the plan's calls with the official SDKs, in order or all at
// once.
func runSDK(t *testing.T, calls []sdkCall, parallel bool) []sdkResult {
	t.Helper()
	return llmtest.RunSDKs(t, sdkDir, calls, parallel)
}

// runOnBoth runs the calls of each instance all at once, both instances'
// at the same time.
func runOnBoth(t *testing.T, calls [2][]sdkCall) [2][]sdkResult {
	t.Helper()
	var results [2][]sdkResult
	var wg sync.WaitGroup
	for i := range 2 {
		wg.Go(func() { results[i] = runSDK(t, calls[i], true) })
	}
	wg.Wait()
	return results
}

// fleetAnswers counts a fleet's calls admitted, and refused with a 429
// that says when to come back. The recipes fail closed: on a host so busy
// that Redis itself (a process beside the busy loops) misses the five
// timeouts a decision may wait, a call gets 503 with Retry-After 1, which
// spends nothing and is logged; more than one in ten fails the test, as
// does any other answer.
func fleetAnswers(t *testing.T, results [2][]sdkResult) (admitted, refused int) {
	t.Helper()
	failedClosed, all := 0, 0
	for _, rs := range results {
		for _, r := range rs {
			all++
			switch {
			case r.Status == 200:
				admitted++
			case r.Status == 429 && r.RetryAfter != "" && r.RetryAfter != "0":
				refused++
			case r.Status == 503 && r.RetryAfter == failedClosedRetryAfter && r.RateLimit == "":
				failedClosed++
				t.Logf("failed closed: status %d, Retry-After %q (%s %s)", r.Status, r.RetryAfter, r.Error, r.Message)
			default:
				t.Errorf("status %d, Retry-After %q, RateLimit %q (%s %s)", r.Status, r.RetryAfter, r.RateLimit, r.Error, r.Message)
			}
		}
	}
	if failedClosed*10 > all {
		t.Errorf("%d of %d calls failed closed: Redis did not decide them in time", failedClosed, all)
	}
	return admitted, refused
}

// runOne runs one call.
func runOne(t *testing.T, c sdkCall) sdkResult {
	t.Helper()
	return runSDK(t, []sdkCall{c}, false)[0]
}

// startRecipe runs the caddyfile of docs/ai-gateway.md, with edits, on two
// Caddy instances in front of upstream and on one Redis: real Caddy under
// test at :9080, and a second Caddy process at :port. It returns their
// base URLs.
func startRecipe(t *testing.T, upstream string, port int, edits ...string) [2]string {
	t.Helper()
	prefix := uniquePrefix(t)
	recipe := strings.NewReplacer(edits...).Replace(docCaddyfile(t, "docs/ai-gateway.md", "zone inflight"))
	config := func(host string) string {
		return strings.NewReplacer(
			"llm.example.com", host,
			"{env.REDIS_URL}", sharedRedis.URL()+"\n\t\t\tkey_prefix "+prefix,
			"127.0.0.1:8000", upstream,
		).Replace(recipe)
	}
	startCaddy(t, config(":9080"))
	health := strconv.Itoa(port + 1)
	startCaddyProcess(t, config(":"+strconv.Itoa(port))+"\n:"+health+" {\n\trespond \"ok\"\n}\n", "http://127.0.0.1:"+health+"/")
	return [2]string{strings.TrimSuffix(site, "/"), "http://127.0.0.1:" + strconv.Itoa(port)}
}

// geminiKey is the recipe's key line and header_up for Gemini, as its
// table of keys says.
var geminiKey = []string{
	"key {http.request.header.Authorization}", "key {http.request.header.X-Goog-Api-Key}",
	"header_up -X-Goog-Api-Key", "header_up -Authorization",
}

// recipeAPIs are the APIs of the recipe's table, as client.mjs names them.
var recipeAPIs = []string{"chat", "completions", "responses", "messages", "ollama-chat", "ollama-generate", "converse", "converse-stream"}

// TestAIGatewayRecipe runs the recipe of docs/ai-gateway.md as written on
// two Caddy instances on one Redis, in front of a stand-in LLM API, with
// the official SDKs of every API as its clients.
func TestAIGatewayRecipe(t *testing.T) {
	needSDKs(t)
	api := llmtest.Start(t)
	instances := startRecipe(t, api.Addr(), 9180)
	// The key the limiter counts, as the admin API names it: the whole
	// Authorization header, which the SDKs send.
	keyOf := func(c sdkCall) string { return "Bearer " + c.APIKey }

	t.Run("every API is charged exactly its reported usage", func(t *testing.T) {
		var calls []sdkCall
		for i, kind := range recipeAPIs {
			for j, stream := range []bool{false, true} {
				if kind == "converse-stream" && !stream || kind == "converse" && stream {
					continue
				}
				calls = append(calls, sdkCall{API: kind, BaseURL: instances[(i+j)%2], APIKey: fmt.Sprintf("sk-shape-%s-%v", kind, stream),
					Stream: stream, IncludeUsage: stream, MaxTokens: 300, Content: "Say hello in " + kind})
			}
		}
		for i, r := range runSDK(t, calls, false) {
			c, key := calls[i], keyOf(calls[i])
			reported, served := api.Usage(key)
			if r.Status != 200 || served != 1 || r.Text != llmtest.Text || r.Tokens != reported || reported != api.Used(key) {
				t.Errorf("%s stream=%v: status %d, %d served, text %q, the SDK saw %d tokens, the API reported %d and used %d (%s %s)",
					c.API, c.Stream, r.Status, served, r.Text, r.Tokens, reported, api.Used(key), r.Error, r.Message)
				continue
			}
			if got := unitsUsed(t, "tokens", key, reported); got != reported {
				t.Errorf("%s stream=%v: %d tokens charged, want the %d reported", c.API, c.Stream, got, reported)
			}
			for _, zone := range []string{`"tokens";r=`, `"calls";r=59;t=60`, `"inflight";r=1`} {
				if !strings.Contains(r.RateLimit, zone) {
					t.Errorf("%s stream=%v: RateLimit %q has no %s", c.API, c.Stream, r.RateLimit, zone)
				}
			}
			if want := `"tokens";q=100000;srl-qu="units";w=60, "calls";q=60;w=60, "inflight";q=2;qu="concurrent-requests"`; r.RateLimitPolicy != want {
				t.Errorf("RateLimit-Policy %q, want %q", r.RateLimitPolicy, want)
			}
		}

		// A chat stream the client did not ask usage of is asked for it
		// (askusage.go) and pays it, the client seeing none.
		c := sdkCall{API: "chat", BaseURL: instances[1], APIKey: "sk-nousage", Stream: true, MaxTokens: 300, Content: "hi"}
		if r := runOne(t, c); r.Status != 200 || r.Tokens != 0 {
			t.Fatalf("a stream without usage: status %d, %d tokens seen (%s)", r.Status, r.Tokens, r.Error)
		}
		want := api.Used(keyOf(c))
		if got := unitsUsed(t, "tokens", keyOf(c), want); got != want {
			t.Errorf("a chat stream without include_usage: %d tokens charged, want the %d it used", got, want)
		}
	})

	t.Run("a client that drops its stream pays its reservation", func(t *testing.T) {
		for i, kind := range []string{"chat", "responses", "messages", "ollama-chat", "converse-stream"} {
			c := sdkCall{API: kind, BaseURL: instances[i%2], APIKey: "sk-drop-" + kind, Stream: true, IncludeUsage: true, MaxTokens: 5000, Drop: true,
				Content: "Tell a long story", Headers: map[string]string{llmtest.HeaderPause: "200ms"}}
			r := runOne(t, c)
			if r.Status != 200 || r.Final {
				t.Fatalf("%s: status %d, final usage seen before hanging up (%s %s)", kind, r.Status, r.Error, r.Message)
			}
			key := keyOf(c)
			want := 5000 + api.BodyBytes(key)
			deadline := time.Now().Add(10 * time.Second)
			got := adminState(t, "tokens", key).Count
			for got != want && time.Now().Before(deadline) {
				time.Sleep(20 * time.Millisecond)
				got = adminState(t, "tokens", key).Count
			}
			if got != want {
				t.Errorf("%s: %d tokens charged, want the reservation %d", kind, got, want)
			}
		}
	})

	t.Run("a client that spends its budget is refused by both instances", func(t *testing.T) {
		// Each call reserves 30,000 and its body, and uses 30,000 and its
		// prompt: three fit in 100,000, the fourth does not.
		var results []sdkResult
		for i := range 6 {
			c := sdkCall{API: []string{"chat", "responses"}[i%2], BaseURL: instances[i%2], APIKey: "sk-spender", MaxTokens: 30000, Content: "Write a lot"}
			results = append(results, runOne(t, c))
		}
		for i, r := range results {
			retry, _ := strconv.Atoi(r.RetryAfter)
			switch {
			case i < 3 && r.Status != 200:
				t.Errorf("call %d: status %d (%s), want 200", i+1, r.Status, r.Error)
			case i == 2 && !strings.Contains(r.RateLimit, `"tokens";r=9`):
				t.Errorf("call 3: RateLimit %q, want the tokens left, about 9,900", r.RateLimit)
			case i >= 3 && (r.Status != 429 || r.Error != "RateLimitError" || retry < 1 || retry > 60 || !strings.HasPrefix(r.RateLimit, `"tokens";r=`)):
				t.Errorf("call %d: status %d (%s), Retry-After %q, RateLimit %q; want a 429 by tokens with Retry-After", i+1, r.Status, r.Error, r.RetryAfter, r.RateLimit)
			}
		}
		if used := api.MostInWindow("Bearer sk-spender", time.Minute); used > 100000 {
			t.Errorf("the API served %d tokens in the window, above the budget 100,000", used)
		}
	})
}

// TestAIGatewayRecipeGemini runs the recipe with Gemini's key line, as its
// table of keys says, with the official Gemini SDK.
func TestAIGatewayRecipeGemini(t *testing.T) {
	needSDKs(t)
	api := llmtest.Start(t)
	instances := startRecipe(t, api.Addr(), 9380, geminiKey...)
	for i, stream := range []bool{false, true} {
		c := sdkCall{API: "gemini", BaseURL: instances[i], APIKey: fmt.Sprintf("gk-%v", stream), Stream: stream, MaxTokens: 300, CandidateCount: 2, Content: "hi"}
		r := runOne(t, c)
		reported, served := api.Usage(c.APIKey)
		if r.Status != 200 || served != 1 || r.Tokens != reported || reported != api.Used(c.APIKey) || r.Choices != 2 {
			t.Fatalf("gemini stream=%v: status %d, %d served, the SDK saw %d tokens in %d candidates, the API reported %d and used %d (%s %s)",
				stream, r.Status, served, r.Tokens, r.Choices, reported, api.Used(c.APIKey), r.Error, r.Message)
		}
		if got := unitsUsed(t, "tokens", c.APIKey, reported); got != reported {
			t.Errorf("gemini stream=%v: %d tokens charged, want the %d reported", stream, got, reported)
		}
	}
}

// TestAIGatewayHoles: each way a paying client could spend more than it is
// charged, through the recipe as written and the official SDKs, against an
// upstream that reads requests as leniently as Go's encoding/json and
// generates all it is allowed: each call is charged at least what it used,
// or refused before the upstream is called.
func TestAIGatewayHoles(t *testing.T) {
	needSDKs(t)
	api := llmtest.Start(t)
	instances := startRecipe(t, api.Addr(), 9480)
	// atLeastUsed checks that key was charged at least what the upstream
	// generated for it, and returns the charge.
	atLeastUsed := func(t *testing.T, what, key string) int64 {
		t.Helper()
		used := api.Used(key)
		charged := unitsUsed(t, "tokens", key, used)
		if charged < used || used == 0 {
			t.Errorf("%s: %d tokens charged for %d used", what, charged, used)
		}
		return charged
	}

	t.Run("n multiplies the reservation", func(t *testing.T) {
		for _, c := range []sdkCall{
			{API: "chat", Stream: true, MaxTokens: 1000, N: 8},
			{API: "completions", Stream: true, MaxTokens: 1000, N: 2, BestOf: 6},
		} {
			c.BaseURL, c.APIKey, c.Content = instances[0], "sk-n-"+c.API, "Write"
			if r := runOne(t, c); r.Status != 200 {
				t.Fatalf("%s n=%d best_of=%d: status %d (%s %s)", c.API, c.N, c.BestOf, r.Status, r.Error, r.Message)
			}
			atLeastUsed(t, fmt.Sprintf("%s n=%d best_of=%d, no usage in the stream", c.API, c.N, c.BestOf), "Bearer "+c.APIKey)
		}
	})

	t.Run("no spelling reserves less than the upstream reads", func(t *testing.T) {
		for i, extra := range []string{`{"max_tokens":1,"Max_Tokens":50000}`, `{"max_tokens":1,"max_to\u212aens":50000}`, "{\"max_tokens\":1,\"max_to\u212aens\":50000}", `{"max_tokens":1,"MAX_TOKENS":40000}`} {
			c := sdkCall{API: "chat", BaseURL: instances[i%2], APIKey: fmt.Sprintf("sk-spell-%d", i), Stream: true, Content: "Write", ExtraBody: extra}
			if r := runOne(t, c); r.Status != 200 {
				t.Fatalf("%s: status %d (%s %s)", extra, r.Status, r.Error, r.Message)
			}
			if used := api.Used("Bearer " + c.APIKey); used < 40000 {
				t.Fatalf("%s: the upstream used %d: it did not read the other spelling", extra, used)
			}
			atLeastUsed(t, extra, "Bearer "+c.APIKey)
		}
	})

	t.Run("a trickled body is refused before the upstream", func(t *testing.T) {
		conn, err := net.Dial("tcp", strings.TrimPrefix(instances[0], "http://"))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		body := `{"model": "m", "stream": true, "max_tokens": 90000, "messages": [{"role": "user", "content": "hi"}]}`
		fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-slow\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body[:20])
		conn.SetReadDeadline(time.Now().Add(30 * time.Second))
		res, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatalf("no answer: %v", err)
		}
		res.Body.Close()
		if res.StatusCode != http.StatusRequestTimeout || api.CallCount("Bearer sk-slow") != 0 {
			t.Errorf("a body trickled past its time: status %d, %d calls reached the upstream; want 408 and none", res.StatusCode, api.CallCount("Bearer sk-slow"))
		}
	})

	t.Run("cache tokens are charged", func(t *testing.T) {
		for i, stream := range []bool{false, true} {
			c := sdkCall{API: "messages", BaseURL: instances[i], APIKey: fmt.Sprintf("sk-cache-%v", stream), Stream: stream, MaxTokens: 1500, Content: "Summarise",
				Headers: map[string]string{llmtest.HeaderCacheRead: "19000", llmtest.HeaderCacheWrite: "1000"}}
			r := runOne(t, c)
			key := "Bearer " + c.APIKey
			if r.Status != 200 || r.Tokens < 21500 {
				t.Fatalf("stream=%v: status %d, %d tokens seen (%s)", stream, r.Status, r.Tokens, r.Error)
			}
			if got := unitsUsed(t, "tokens", key, r.Tokens); got != r.Tokens || got != api.Used(key) {
				t.Errorf("stream=%v: %d tokens charged, want the %d reported with the cache reads and writes (%d used)", stream, got, r.Tokens, api.Used(key))
			}
		}
	})

	t.Run("a usage above the budget is charged in full", func(t *testing.T) {
		c := sdkCall{API: "chat", BaseURL: instances[0], APIKey: "sk-over", MaxTokens: 1000, Content: "Use the tools",
			Headers: map[string]string{llmtest.HeaderUsage: "12,150000"}}
		if r := runOne(t, c); r.Status != 200 || r.Tokens != 150012 {
			t.Fatalf("status %d, %d tokens seen (%s)", r.Status, r.Tokens, r.Error)
		}
		if got := unitsUsed(t, "tokens", "Bearer sk-over", 150012); got != 150012 {
			t.Errorf("%d tokens charged, want all 150,012 reported, above the budget", got)
		}
		r := runOne(t, sdkCall{API: "chat", BaseURL: instances[1], APIKey: "sk-over", MaxTokens: 10, Content: "hi"})
		if retry, _ := strconv.Atoi(r.RetryAfter); r.Status != 429 || retry < 55 || retry > 60 {
			t.Errorf("after a charge above the budget: status %d, Retry-After %q; want 429 until it ages out", r.Status, r.RetryAfter)
		}
	})

	t.Run("a late nested zero usage changes nothing", func(t *testing.T) {
		var calls []sdkCall
		for _, kind := range recipeAPIs {
			calls = append(calls, sdkCall{API: kind, BaseURL: instances[1], APIKey: "sk-nested-" + kind, Stream: kind != "converse", IncludeUsage: true,
				MaxTokens: 200, Content: "hi", Headers: map[string]string{llmtest.HeaderNestedUsage: "1"}})
		}
		for i, r := range runSDK(t, calls, false) {
			key := "Bearer " + calls[i].APIKey
			reported, _ := api.Usage(key)
			if r.Status != 200 || reported == 0 {
				t.Fatalf("%s: status %d, %d reported (%s %s)", calls[i].API, r.Status, reported, r.Error, r.Message)
			}
			if got := unitsUsed(t, "tokens", key, reported); got != reported {
				t.Errorf("%s with a zero usage nested after the real one: %d tokens charged, want %d", calls[i].API, got, reported)
			}
		}
	})
}

// TestAIGatewayLongStreams: streams longer than the window keep their
// reservations until they end, so calls at the window's edge cannot take
// their room: the tokens used in any window stay within the budget.
func TestAIGatewayLongStreams(t *testing.T) {
	needSDKs(t)
	api := llmtest.Start(t)
	const window, budget = 3 * time.Second, 20000
	instances := startRecipe(t, api.Addr(), 9580, "zone tokens 1m 100000", "zone tokens 3s 20000", "concurrent 2", "concurrent 50")
	key := "sk-long"
	var long []sdkCall
	for i := range 8 {
		long = append(long, sdkCall{API: []string{"chat", "messages"}[i%2], BaseURL: instances[i%2], APIKey: key, Stream: true, IncludeUsage: true,
			MaxTokens: 2000, Content: "A long story", Headers: map[string]string{llmtest.HeaderDuration: "4s"}})
	}
	var fast []sdkCall
	for i := range 8 {
		fast = append(fast, sdkCall{API: "chat", BaseURL: instances[i%2], APIKey: key, MaxTokens: 2000, Content: "Quick"})
	}
	var longResults []sdkResult
	done := make(chan struct{})
	go func() {
		defer close(done)
		longResults = runSDK(t, long, true)
	}()
	// Past the window of the long streams' admissions, before they end.
	time.Sleep(window + 300*time.Millisecond)
	fastResults := runSDK(t, fast, true)
	<-done
	admitted := 0
	for _, r := range append(longResults, fastResults...) {
		if r.Status == 200 {
			admitted++
		}
	}
	if most := api.MostInWindow("Bearer "+key, window); most > budget {
		t.Errorf("%d tokens used in one window of %v, above the budget %d (%d calls admitted)", most, window, budget, admitted)
	}
	if refused := len(long) + len(fast) - admitted; refused == 0 {
		t.Errorf("no call refused: the budget never ran out")
	}
}

// TestAIGatewayFleet: dozens of concurrent streams of one key, with n > 1,
// over two instances of the recipe (its in-flight limit raised, so that the
// tokens zone alone holds them): the tokens the upstream generated in any
// window never exceed the budget, each admitted call pays at least what it
// used, and the rest are refused with Retry-After.
func TestAIGatewayFleet(t *testing.T) {
	needSDKs(t)
	api := llmtest.Start(t)
	instances := startRecipe(t, api.Addr(), 9280, "concurrent 2", "concurrent 60")
	var calls [2][]sdkCall
	for i := range 40 {
		c := sdkCall{API: []string{"chat", "completions", "responses", "messages", "ollama-chat"}[i%5], BaseURL: instances[i%2], APIKey: "sk-fleet",
			Stream: true, IncludeUsage: i%3 != 0, MaxTokens: 1500, Content: fmt.Sprintf("Story %d", i),
			Headers: map[string]string{llmtest.HeaderPause: "20ms"}}
		if c.API == "chat" || c.API == "completions" {
			c.N = int64(2 + i%3)
		}
		calls[i%2] = append(calls[i%2], c)
	}
	results := runOnBoth(t, calls)
	admitted, refused := fleetAnswers(t, results)
	used := api.Used("Bearer sk-fleet")
	if most := api.MostInWindow("Bearer sk-fleet", time.Minute); most > 100000 {
		t.Errorf("the API generated %d tokens in one window: want at most the budget, 100,000", most)
	}
	if refused == 0 || admitted < 5 {
		t.Errorf("%d streams admitted, %d refused: want the budget to run out", admitted, refused)
	}
	if charged := unitsUsed(t, "tokens", "Bearer sk-fleet", used); charged < used {
		t.Errorf("%d tokens charged for %d used", charged, used)
	}
	t.Logf("%d streams admitted, %d refused, %d tokens used", admitted, refused, used)
}
