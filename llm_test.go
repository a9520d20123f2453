package slidingratelimit

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"image"
	"image/png"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/llmtest"
	"go.uber.org/zap"
)

// pngData is a w x h PNG, base64.
func pngData(t *testing.T, w, h int) string {
	var b bytes.Buffer
	if err := png.Encode(&b, image.NewGray(image.Rect(0, 0, w, h))); err != nil {
		t.Fatal(err)
	}
	return base64.StdEncoding.EncodeToString(b.Bytes())
}

// imageParts are n content parts of chat, each the image at url.
func imageParts(kind, url string, n int) []any {
	parts := []any{map[string]any{"type": "text", "text": "What is in these?"}}
	for range n {
		switch kind {
		case "chat":
			parts = append(parts, map[string]any{"type": "image_url", "image_url": map[string]any{"url": url}})
		case "responses":
			parts = append(parts, map[string]any{"type": "input_image", "image_url": url})
		case "messages":
			parts = append(parts, map[string]any{"type": "image", "source": map[string]any{"type": "url", "url": url}})
		}
	}
	if kind == "responses" {
		parts[0] = map[string]any{"type": "input_text", "text": "What is in these?"}
	}
	return parts
}

// postRaw sends the JSON body to path of base with key, and returns the
// answer (its body closed) and its body.
func postRaw(t *testing.T, base, path, key, body string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, base+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res, string(b)
}

// TestCostLLMUnbounded: through the recipe of docs/ai-gateway.md on two
// instances, every class of call whose cost its body does not carry is
// either bounded by what its parts can bill (images by URL and inline,
// prompt lists, batches) and charged at least what it used, or refused
// before the upstream with words that say what could not be bounded (input
// by reference, hosted tools, batches in files, paths of no API), with the
// official SDKs where they send the shape.
func TestCostLLMUnbounded(t *testing.T) {
	needSDKs(t)
	api := llmtest.Start(t)
	instances := startRecipe(t, api.Addr(), 9580)
	tiny := pngData(t, 1, 1)

	t.Run("refused before the upstream", func(t *testing.T) {
		calls := []struct {
			what string
			call sdkCall
			want string
		}{
			{"an Anthropic document by file id", sdkCall{API: "messages", MaxTokens: 100, Parts: []any{
				map[string]any{"type": "document", "source": map[string]any{"type": "file", "file_id": "file_011"}},
				map[string]any{"type": "text", "text": "Summarise"}}}, "file id"},
			{"an Anthropic PDF inline", sdkCall{API: "messages", MaxTokens: 100, Parts: []any{
				map[string]any{"type": "document", "source": map[string]any{"type": "base64", "media_type": "application/pdf", "data": "JVBERi0xLjQ="}}}}, "PDF"},
			{"Anthropic's web search", sdkCall{API: "messages", MaxTokens: 100, Content: "Search",
				Params: map[string]any{"tools": []any{map[string]any{"type": "web_search_20250305", "name": "web_search"}}}}, "the web search tool"},
			{"a previous response", sdkCall{API: "responses", MaxTokens: 100, Content: "And then?",
				Params: map[string]any{"previous_response_id": "resp_1"}}, "previous_response_id"},
			{"a conversation", sdkCall{API: "responses", MaxTokens: 100, Content: "And then?",
				Params: map[string]any{"conversation": "conv_1"}}, "conversation"},
			{"a Responses file", sdkCall{API: "responses", MaxTokens: 100, Parts: []any{
				map[string]any{"type": "input_file", "file_id": "file-1"}}}, "input_file"},
			{"a chat file", sdkCall{API: "chat", MaxTokens: 100, Parts: []any{
				map[string]any{"type": "file", "file": map[string]any{"file_id": "file-1"}}}}, "file part"},
			{"an OpenAI batch", sdkCall{API: "openai-batch", Params: map[string]any{"input_file_id": "file-batch"}}, "input_file_id"},
			{"a part type nobody wrote a rule for", sdkCall{API: "chat", MaxTokens: 100, Parts: []any{
				map[string]any{"type": "video_url", "video_url": map[string]any{"url": "https://example.com/v.mp4"}}}}, "video_url"},
		}
		var plan []sdkCall
		for i, c := range calls {
			c.call.BaseURL, c.call.APIKey = instances[i%2], fmt.Sprintf("sk-refused-%d", i)
			plan = append(plan, c.call)
		}
		for i, r := range runSDK(t, plan, true) {
			c := calls[i]
			if r.Status != http.StatusBadRequest || !strings.Contains(r.Message, c.want) {
				t.Errorf("%s: status %d, %s %q; want 400 naming %q", c.what, r.Status, r.Error, r.Message, c.want)
			}
			if n := api.CallCount("Bearer " + plan[i].APIKey); n != 0 {
				t.Errorf("%s: %d calls reached the upstream", c.what, n)
			}
		}
		for i, c := range []struct{ path, body, want string }{
			{"/v1beta/models/gemini-2.5-flash:generateContent", `{"contents":[{"parts":[{"text":"hi"}]}],"cachedContent":"cachedContents/1"}`, "cachedContent"},
			{"/v1beta/models/gemini-2.5-flash:generateContent", `{"contents":[{"parts":[{"file_data":{"file_uri":"files/1","mime_type":"application/pdf"}}]}]}`, "fileData"},
			{"/v1beta/models/gemini-2.5-flash:batchGenerateContent", `{"batch":{"input_config":{"file_name":"files/requests"}}}`, "fileName"},
			{"/v1/chat/completions/", `{"model":"m","messages":[]}`, "no API"},
		} {
			key := fmt.Sprintf("sk-raw-%d", i)
			res, body := postRaw(t, instances[i%2], c.path, key, c.body)
			if status := res.StatusCode; status != http.StatusBadRequest || !strings.Contains(body, c.want) || api.CallCount("Bearer "+key) != 0 {
				t.Errorf("%s %s: status %d %q, %d upstream calls; want 400 naming %q and none", c.path, c.body, res.StatusCode, body, api.CallCount("Bearer "+key), c.want)
			}
		}
	})

	t.Run("images and prompt lists are charged at least what they bill", func(t *testing.T) {
		calls := []sdkCall{
			{API: "chat", Model: "gpt-4o", MaxTokens: 50, Parts: imageParts("chat", "https://example.com/a.png", 5)},
			{API: "chat", Model: "gpt-4o-mini", MaxTokens: 50, Parts: imageParts("chat", "data:image/png;base64,"+tiny, 1)},
			{API: "chat", Model: "gpt-4o", MaxTokens: 50, Stream: true, Parts: imageParts("chat", "data:image/png;base64,"+pngData(t, 2000, 1000), 2)},
			{API: "responses", Model: "gpt-4o", MaxTokens: 50, Parts: imageParts("responses", "https://example.com/a.png", 3)},
			{API: "messages", Model: "claude-sonnet-4-5", MaxTokens: 50, Stream: true, Parts: imageParts("messages", "https://example.com/a.png", 4)},
			{API: "completions", MaxTokens: 300, N: 2, Parts: []any{"one", "two", "three", "four", "five"}},
		}
		for i := range calls {
			calls[i].BaseURL, calls[i].APIKey = instances[i%2], fmt.Sprintf("sk-media-%d", i)
		}
		for i, r := range runSDK(t, calls, true) {
			key := "Bearer " + calls[i].APIKey
			used := api.Used(key)
			if r.Status != 200 {
				t.Fatalf("%s %s: status %d (%s %s)", calls[i].API, calls[i].Model, r.Status, r.Error, r.Message)
			}
			if charged := unitsUsed(t, "tokens", key, used); charged < used || used < 1000 {
				t.Errorf("%s %s: %d tokens charged for %d used", calls[i].API, calls[i].Model, charged, used)
			}
		}
	})

	t.Run("a batch reserves its requests", func(t *testing.T) {
		request := func(maxTokens int) map[string]any {
			return map[string]any{"custom_id": "r", "params": map[string]any{"model": "claude-sonnet-4-5", "max_tokens": maxTokens,
				"messages": []any{map[string]any{"role": "user", "content": "Write"}}}}
		}
		var big, small []any
		for range 500 {
			big = append(big, request(4000))
		}
		for range 3 {
			small = append(small, request(1000))
		}
		rs := runSDK(t, []sdkCall{
			{API: "messages-batch", BaseURL: instances[0], APIKey: "sk-batch-big", Parts: big},
			{API: "messages-batch", BaseURL: instances[1], APIKey: "sk-batch-small", Parts: small},
		}, false)
		if rs[0].Status != 429 || api.CallCount("Bearer sk-batch-big") != 0 {
			t.Errorf("a batch of 500 x 4,000 tokens: status %d (%s), %d upstream calls; want 429, none", rs[0].Status, rs[0].Message, api.CallCount("Bearer sk-batch-big"))
		}
		// The stand-in serves no batches: the answer, without usage,
		// leaves the reservation charged.
		if charged := adminState(t, "tokens", "Bearer sk-batch-small").Count; rs[1].Status == 429 || charged < 3000 {
			t.Errorf("a batch of 3 x 1,000 tokens: status %d, %d charged; want it admitted and charged its reservation", rs[1].Status, charged)
		}
	})
}

// TestCostLLMFleetWithImages: dozens of calls with images and prompt lists
// at once over two instances, without the in-flight zone: the tokens the
// upstream billed in any window never exceed the budget, and no key is
// charged less than it used.
func TestCostLLMFleetWithImages(t *testing.T) {
	needSDKs(t)
	api := llmtest.Start(t)
	instances := startRecipe(t, api.Addr(), 9680, "concurrent 2", "concurrent 60")
	tiny := pngData(t, 1, 1)
	var calls [2][]sdkCall
	for i := range 30 {
		c := sdkCall{BaseURL: instances[i%2], APIKey: "sk-fleet-media", MaxTokens: 200, Headers: map[string]string{llmtest.HeaderPause: "20ms"}}
		switch i % 3 {
		case 0:
			c.API, c.Model, c.Parts = "chat", "gpt-4o-mini", imageParts("chat", "data:image/png;base64,"+tiny, 1)
		case 1:
			c.API, c.Model, c.Stream, c.Parts = "messages", "claude-sonnet-4-5", true, imageParts("messages", "https://example.com/a.png", 5)
		default:
			c.API, c.N, c.Parts = "completions", 3, []any{"a", "b", "c", "d"}
		}
		calls[i%2] = append(calls[i%2], c)
	}
	results := runOnBoth(t, calls)
	admitted, refused := 0, 0
	for _, rs := range results {
		for _, r := range rs {
			switch r.Status {
			case 200:
				admitted++
			case 429:
				refused++
			default:
				t.Errorf("status %d (%s %s)", r.Status, r.Error, r.Message)
			}
		}
	}
	const key = "Bearer sk-fleet-media"
	if most := api.MostInWindow(key, time.Minute); most > 100000 {
		t.Errorf("the API billed %d tokens in one window: want at most the budget, 100,000", most)
	}
	used := api.Used(key)
	if charged := unitsUsed(t, "tokens", key, used); charged < used {
		t.Errorf("%d tokens charged for %d used", charged, used)
	}
	if admitted < 2 || refused == 0 {
		t.Errorf("%d admitted, %d refused: want the budget to run out", admitted, refused)
	}
	t.Logf("%d admitted, %d refused, %d tokens used", admitted, refused, used)
}

// TestCostLLMCeiling: a call the reader cannot bound is refused without a
// ceiling, and reserves the ceiling with one (priced at the dearest rate).
func TestCostLLMCeiling(t *testing.T) {
	const body = `{"model":"gpt-4o","input":"and then?","max_output_tokens":100,"previous_response_id":"resp_1"}`
	call := func(c *CostLLM, prices *priceTable) (int64, string, error) {
		r, err := http.NewRequest(http.MethodPost, "http://x/v1/responses", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		return c.of(r, 1000000, prices)
	}
	if _, _, err := call(&CostLLM{}, nil); err == nil || !strings.Contains(err.Error(), "previous_response_id") {
		t.Errorf("without a ceiling: %v, want a refusal naming previous_response_id", err)
	}
	n, why, err := call(&CostLLM{Ceiling: 50000}, nil)
	if err != nil || n != 50000 || !strings.Contains(why, "previous_response_id") {
		t.Errorf("with ceiling 50000: %d %q %v, want 50000 and why", n, why, err)
	}
	if err := initMetrics(nil); err != nil {
		t.Fatal(err)
	}
	prices := newPriceTable("spend", []*Price{{Model: "*", Input: "1", Output: "4"}}, zap.NewNop())
	// 50,000 tokens at $4 per million, the dearest: 200,000 µ$.
	if n, _, err := call(&CostLLM{Ceiling: 50000}, prices); err != nil || n != 200000 {
		t.Errorf("with prices: %d µ$ %v, want 200000", n, err)
	}
}

// TestModelPlaceholder: a zone keyed by the model a call names keeps a
// budget per model: a key that spent its budget on one model still calls
// another, and a call that names none has a budget of its own.
func TestModelPlaceholder(t *testing.T) {
	needSDKs(t)
	api := llmtest.Start(t)
	startCaddy(t, `:9080 {
	route {
		sliding_ratelimit {
			key {http.request.header.Authorization}
			zone per_model 1m 5000 {
				key {http.request.header.Authorization}/{http.sliding_ratelimit.model}
				cost llm 100
				settle llm
			}
			redis `+sharedRedis.URL()+`
			key_prefix `+uniquePrefix(t)+`
		}
		reverse_proxy `+api.Addr()+` {
			header_up -Accept-Encoding
		}
	}
}`)
	base := strings.TrimSuffix(site, "/")
	call := func(model string, maxTokens int64) sdkResult {
		return runOne(t, sdkCall{API: "chat", BaseURL: base, APIKey: "sk-models", Model: model, MaxTokens: maxTokens, Content: "hi",
			Headers: map[string]string{llmtest.HeaderUsage: fmt.Sprintf("10,%d", maxTokens)}})
	}
	if r := call("gpt-4o", 4000); r.Status != 200 {
		t.Fatalf("the first gpt-4o call: status %d (%s %s)", r.Status, r.Error, r.Message)
	}
	if r := call("gpt-4o", 4000); r.Status != 429 {
		t.Errorf("a second gpt-4o call past its budget: status %d, want 429", r.Status)
	}
	if r := call("gpt-4o-mini", 4000); r.Status != 200 {
		t.Errorf("another model: status %d (%s %s), want its own budget", r.Status, r.Error, r.Message)
	}
	// No model: a budget of its own.
	res, body := postRaw(t, base, "/v1/chat/completions", "sk-models", `{"messages":[{"role":"user","content":"hi"}],"max_tokens":4000}`)
	if res.StatusCode == 429 {
		t.Errorf("a call that names no model: status %d %q, want a budget of its own", res.StatusCode, body)
	}
	if got := adminState(t, "per_model", "Bearer sk-models/gpt-4o").Count; got < 4000 {
		t.Errorf("gpt-4o's budget holds %d, want its call's 4,010", got)
	}
	if got := adminState(t, "per_model", "Bearer sk-models/(none)").Count; got < 4000 {
		t.Errorf("the no-model budget holds %d, want its call's", got)
	}
}

// TestCostLLMCap: a call's reservation stays within the cap, however much
// it asks for; a smaller one is reserved as it is.
func TestCostLLMCap(t *testing.T) {
	reserve := func(body string, c *CostLLM) int64 {
		r, err := http.NewRequest(http.MethodPost, "http://x/v1/messages", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		n, _, err := c.of(r, 1000000, nil)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	agent := `{"model":"claude-sonnet-4-5","max_tokens":128000,"messages":[{"role":"user","content":"Fix the bug"}]}`
	if got := reserve(agent, &CostLLM{Cap: 32000}); got != 32000 {
		t.Errorf("an agent's 128k call under cap 32000 reserved %d", got)
	}
	if got := reserve(agent, &CostLLM{}); got < 128000 {
		t.Errorf("without a cap it reserved %d, want its bound", got)
	}
	small := `{"model":"claude-sonnet-4-5","max_tokens":100,"messages":[]}`
	if got, want := reserve(small, &CostLLM{Cap: 32000}), int64(100+len(small)); got != want {
		t.Errorf("a small call under the cap reserved %d, want %d", got, want)
	}
}
