package slidingratelimit

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// sdkCall is one call of testdata/llmsdk/client.mjs's plan, and sdkResult
// what it got.
type sdkCall struct {
	API          string            `json:"api"`
	BaseURL      string            `json:"baseURL"`
	APIKey       string            `json:"apiKey"`
	Stream       bool              `json:"stream"`
	IncludeUsage bool              `json:"includeUsage"`
	MaxTokens    int64             `json:"maxTokens"`
	Content      string            `json:"content"`
	Drop         bool              `json:"drop"`
	Headers      map[string]string `json:"headers,omitempty"`
}

type sdkResult struct {
	Status          int    `json:"status"`
	RetryAfter      string `json:"retryAfter"`
	RateLimit       string `json:"rateLimit"`
	RateLimitPolicy string `json:"rateLimitPolicy"`
	Tokens          int64  `json:"tokens"`
	Text            string `json:"text"`
	Error           string `json:"error"`
}

// needSDKs makes sure the official SDKs are installed (npm ci, as
// scripts/ensure-node-sdks.sh does), and skips the test, saying why, only
// when npm cannot install them.
func needSDKs(t *testing.T) {
	t.Helper()
	dir := filepath.Join("testdata", "llmsdk")
	if _, err := exec.LookPath("node"); err != nil {
		t.Skip("node is not installed: run scripts/ensure-node-sdks.sh (make test does)")
	}
	for _, pkg := range []string{"openai", "@anthropic-ai/sdk"} {
		if _, err := os.Stat(filepath.Join(dir, "node_modules", pkg, "package.json")); err == nil {
			continue
		}
		cmd := exec.Command("npm", "ci", "--no-audit", "--no-fund", "--loglevel=error")
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Skipf("the OpenAI and Anthropic SDKs are not installed and npm could not install them (run scripts/ensure-node-sdks.sh where the npm registry is reachable): %v\n%s", err, out)
		}
		break
	}
}

// runSDK runs the plan's calls with the official SDKs, in order or all at
// once.
func runSDK(t *testing.T, calls []sdkCall, parallel bool) []sdkResult {
	t.Helper()
	plan, err := json.Marshal(map[string]any{"calls": calls, "parallel": parallel})
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("node", filepath.Join("testdata", "llmsdk", "client.mjs"), string(plan))
	out, err := cmd.Output()
	if err != nil {
		var stderr []byte
		if e, ok := err.(*exec.ExitError); ok {
			stderr = e.Stderr
		}
		t.Fatalf("node client.mjs: %v\n%s", err, stderr)
	}
	var results []sdkResult
	if err := json.Unmarshal(out, &results); err != nil || len(results) != len(calls) {
		t.Fatalf("node client.mjs answered %q: %v", out, err)
	}
	return results
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

// TestAIGatewayRecipe runs the recipe of docs/ai-gateway.md as written on
// two Caddy instances on one Redis, in front of a stand-in LLM API, with
// the official OpenAI and Anthropic SDKs as its clients.
func TestAIGatewayRecipe(t *testing.T) {
	needSDKs(t)
	api, upstream := newLLMAPI(t)
	instances := startRecipe(t, upstream, 9180)
	// The key the limiter counts, as the admin API names it: the whole
	// Authorization header, which both SDKs send.
	keyOf := func(c sdkCall) string { return "Bearer " + c.APIKey }
	// reserved is what a call of key reserves: its max_tokens and the
	// bytes of its body, as the API received them.
	reserved := func(maxTokens int64, key string) int64 { return maxTokens + api.bodyBytes(key) }

	t.Run("every shape is charged what the API reported", func(t *testing.T) {
		var calls []sdkCall
		for i, kind := range []string{"chat", "responses", "messages"} {
			for j, stream := range []bool{false, true} {
				calls = append(calls, sdkCall{API: kind, BaseURL: instances[(i+j)%2], APIKey: fmt.Sprintf("sk-shape-%s-%v", kind, stream),
					Stream: stream, IncludeUsage: stream, MaxTokens: 300, Content: "Say hello in " + kind})
			}
		}
		for i, r := range runSDK(t, calls, false) {
			c, key := calls[i], keyOf(calls[i])
			reported, served := api.usage(key)
			if r.Status != 200 || served != 1 || r.Text != "Hello there" || r.Tokens != reported {
				t.Errorf("%s stream=%v: status %d, %d served, text %q, the SDK saw %d tokens and the API reported %d (%s)",
					c.API, c.Stream, r.Status, served, r.Text, r.Tokens, reported, r.Error)
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

		// A chat stream the client did not ask usage of pays its
		// reservation.
		c := sdkCall{API: "chat", BaseURL: instances[1], APIKey: "sk-nousage", Stream: true, MaxTokens: 300, Content: "hi"}
		if r := runSDK(t, []sdkCall{c}, false)[0]; r.Status != 200 || r.Tokens != 0 {
			t.Fatalf("a stream without usage: status %d, %d tokens seen (%s)", r.Status, r.Tokens, r.Error)
		}
		want := reserved(300, keyOf(c))
		if got := unitsUsed(t, "tokens", keyOf(c), want); got != want {
			t.Errorf("a chat stream without include_usage: %d tokens charged, want its reservation %d", got, want)
		}
	})

	t.Run("a client that drops its stream pays its reservation", func(t *testing.T) {
		for i, kind := range []string{"chat", "responses", "messages"} {
			c := sdkCall{API: kind, BaseURL: instances[i%2], APIKey: "sk-drop-" + kind, Stream: true, IncludeUsage: true, MaxTokens: 5000, Drop: true,
				Content: "Tell a long story", Headers: map[string]string{"X-Test-Pause": "200ms"}}
			r := runSDK(t, []sdkCall{c}, false)[0]
			if r.Status != 200 || r.Tokens != 0 {
				t.Fatalf("%s: status %d, %d tokens seen before hanging up (%s)", kind, r.Status, r.Tokens, r.Error)
			}
			key := keyOf(c)
			want := reserved(5000, key)
			deadline := time.Now().Add(10 * time.Second)
			got := adminState(t, "tokens", key).Count
			for got != want && time.Now().Before(deadline) {
				time.Sleep(20 * time.Millisecond)
				got = adminState(t, "tokens", key).Count
			}
			if reported, _ := api.usage(key); got != want || reported != 0 {
				t.Errorf("%s: %d tokens charged, want the reservation %d (the API reported %d)", kind, got, want, reported)
			}
		}
	})

	t.Run("a client that spends its budget is refused by both instances", func(t *testing.T) {
		// Each call reserves 30,000 and its body, and uses 29,999 and its
		// prompt: three fit in 100,000, the fourth does not.
		var results []sdkResult
		for i := range 6 {
			c := sdkCall{API: []string{"chat", "responses"}[i%2], BaseURL: instances[i%2], APIKey: "sk-spender", MaxTokens: 30000, Content: "Write a lot"}
			results = append(results, runSDK(t, []sdkCall{c}, false)[0])
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
		if served, _ := api.usage("Bearer sk-spender"); served > 100000 {
			t.Errorf("the API served %d tokens in the window, above the budget 100,000", served)
		}
	})
}

// TestAIGatewayRecipeUnderLoad: 30 streams of one key at once, 15 through
// each instance, of the recipe with its in-flight limit raised to 30, so
// that the tokens zone alone holds them: the API never serves more than the
// budget, every call admitted pays what the API reported, and the rest are
// refused with Retry-After.
func TestAIGatewayRecipeUnderLoad(t *testing.T) {
	needSDKs(t)
	api, upstream := newLLMAPI(t)
	instances := startRecipe(t, upstream, 9280, "concurrent 2", "concurrent 30")
	const maxTokens = 9000
	var calls [2][]sdkCall
	for i := range 30 {
		calls[i%2] = append(calls[i%2], sdkCall{API: []string{"chat", "responses", "messages"}[i%3], BaseURL: instances[i%2], APIKey: "sk-fleet",
			Stream: true, IncludeUsage: true, MaxTokens: maxTokens, Content: fmt.Sprintf("Story %d", i), Headers: map[string]string{"X-Test-Pause": "20ms"}})
	}
	var results [2][]sdkResult
	var wg sync.WaitGroup
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = runSDK(t, calls[i], true)
		}()
	}
	wg.Wait()
	var seen int64
	admitted, refused := 0, 0
	for _, rs := range results {
		for _, r := range rs {
			switch {
			case r.Status == 200:
				admitted++
				seen += r.Tokens
			case r.Status == 429 && r.RetryAfter != "" && r.RetryAfter != "0":
				refused++
			default:
				t.Errorf("status %d, Retry-After %q, RateLimit %q (%s)", r.Status, r.RetryAfter, r.RateLimit, r.Error)
			}
		}
	}
	served, _ := api.usage("Bearer sk-fleet")
	if served > 100000 || served != seen {
		t.Errorf("the API served %d tokens (the SDKs saw %d) in one window: want at most the budget, 100,000", served, seen)
	}
	if refused == 0 || admitted < 5 {
		t.Errorf("%d streams admitted, %d refused: want the budget to run out (30 x %d reserved)", admitted, refused, maxTokens)
	}
	if charged := unitsUsed(t, "tokens", "Bearer sk-fleet", served); charged != served {
		t.Errorf("%d tokens charged, want the %d the API reported", charged, served)
	}
	t.Logf("%d streams admitted, %d refused, %d tokens served and charged", admitted, refused, served)
}
