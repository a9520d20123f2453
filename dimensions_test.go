package slidingratelimit

import (
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/llmapi"
	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/llmprice"
	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/llmtest"
)

// vendorBill is what a call the stand-in served costs as its vendor's
// price page bills it, in µ$ rounded up: rates in dollars per million
// tokens (pico-dollars per token), a fee per search.
type vendorBill struct {
	input, audioInput, cacheWrite, cacheWrite1h, output, audioOutput, search int64
}

func (b vendorBill) of(c llmtest.Call) int64 {
	var s llmprice.Sum
	s.Add(c.InputTokens-c.CacheRead-c.CacheWrite-c.Dims.AudioInput, b.input)
	s.Add(c.Dims.AudioInput, b.audioInput)
	s.Add(c.CacheWrite-c.Dims.CacheWrite1h, b.cacheWrite)
	s.Add(c.Dims.CacheWrite1h, b.cacheWrite1h)
	s.Add(c.OutputTokens-c.Dims.AudioOutput, b.output)
	s.Add(c.Dims.AudioOutput, b.audioOutput)
	s.Add(c.Dims.WebSearches, b.search)
	return s.Micros()
}

// tableRecipe are the edits that make the money recipe price from the
// fixture's price table file, with no price lines.
func tableRecipe(t *testing.T) []string {
	file, err := filepath.Abs("internal/llmprice/testdata/model_prices.json")
	if err != nil {
		t.Fatal(err)
	}
	lines := "price gpt-4o-mini* input 0.15 cached 0.075 output 0.60\n" +
		"\t\t\t\tprice gpt-4o* input 2.50 cached 1.25 output 10.00\n" +
		"\t\t\t\tprice claude-* input 3.00 cache_write 3.75 cached 0.30 output 15.00\n" +
		"\t\t\t\tprice * input 15 output 75"
	return []string{lines, "price_table " + file}
}

// TestDimensionsBilled runs the money recipe from the price table file,
// with no price lines, on two instances, once per row of the issue's
// table of what the client chose: the stand-in reports each dimension in
// its vendor's usage, and each call is charged what the vendor's price
// page bills for it (never less).
func TestDimensionsBilled(t *testing.T) {
	needSDKs(t)
	api := llmtest.Start(t)
	instances := startSpendRecipe(t, api.Addr(), 9580, tableRecipe(t)...)

	cases := []struct {
		what, api, model, dims, usage string
		bill                          vendorBill
	}{
		// platform.openai.com/docs/pricing: gpt-4o-mini-audio-preview,
		// text $0.15 and $0.60, audio $10 and $20 a million.
		{"audio output", "chat", "gpt-4o-mini-audio-preview", "audio_output=4600,audio_input=500", "",
			vendorBill{input: 150_000, audioInput: 10_000_000, output: 600_000, audioOutput: 20_000_000}},
		// docs.anthropic.com pricing: Claude Sonnet 4.5 $3 and $15, a web
		// search $10 per 1,000.
		{"web searches", "messages", "claude-sonnet-4-5", "web_searches=7", "",
			vendorBill{input: 3_000_000, output: 15_000_000, search: 10_000_000_000}},
		// 1-hour cache writes at 2x the input price, $6 a million (5
		// minutes: 1.25x, $3.75).
		{"1-hour cache writes", "messages", "claude-sonnet-4-5", "cache_write_1h=20000", "",
			vendorBill{input: 3_000_000, cacheWrite1h: 6_000_000, output: 15_000_000}},
		// OpenAI's priority processing: gpt-4o $4.25 and $17 a million.
		{"priority", "chat", "gpt-4o", "service_tier=priority", "",
			vendorBill{input: 4_250_000, output: 17_000_000}},
		// The default tier: $2.50 and $10.
		{"default tier", "chat", "gpt-4o", "", "",
			vendorBill{input: 2_500_000, output: 10_000_000}},
		// A flex tier the table has no price for: the standard price is
		// never below flex's.
		{"flex", "responses", "gpt-4o", "service_tier=flex", "",
			vendorBill{input: 2_500_000, output: 10_000_000}},
		// OpenAI's long context: a prompt above 272k tokens bills the
		// whole call at $5 and $22.50 a million (else $2.50 and $15).
		{"long context", "chat", "gpt-5.4", "", "272001,1000",
			vendorBill{input: 5_000_000, output: 22_500_000}},
		{"short context", "responses", "gpt-5.4", "", "272000,1000",
			vendorBill{input: 2_500_000, output: 15_000_000}},
	}
	for i, c := range cases {
		for j, stream := range []bool{false, true} {
			call := sdkCall{API: c.api, BaseURL: instances[(i+j)%2], APIKey: fmt.Sprintf("sk-acme-dims-%s-%v", c.what, stream), Model: c.model,
				Stream: stream, IncludeUsage: stream, MaxTokens: 5000, Content: "hi",
				Headers: map[string]string{llmtest.HeaderDimensions: c.dims}}
			if c.usage != "" {
				call.Headers[llmtest.HeaderUsage] = c.usage
			}
			if r := runOne(t, call); r.Status != 200 {
				t.Fatalf("%s: status %d (%s %s)", c.what, r.Status, r.Error, r.Message)
			}
			served := api.Calls("Bearer " + call.APIKey)
			if len(served) != 1 {
				t.Fatalf("%s: %d calls served", c.what, len(served))
			}
			call0 := served[0]
			if c.usage != "" {
				// The usage reported, not the tokens used, is the bill.
				in, out, _ := strings.Cut(c.usage, ",")
				call0.InputTokens, _ = strconv.ParseInt(in, 10, 64)
				call0.OutputTokens, _ = strconv.ParseInt(out, 10, 64)
			}
			bill := c.bill.of(call0)
			if got := unitsUsed(t, "spend", "Bearer "+call.APIKey, bill); got < bill || got > bill+1 {
				t.Errorf("%s (%s) stream=%v: %d µ$ charged, the vendor bills %d", c.what, c.model, stream, got, bill)
			}
		}
	}
}

// TestDimensionsGeminiLongContext: a Gemini 2.5 Pro prompt above 200k
// tokens is billed at the dearer tier for the whole call, input and
// output ($2.50 and $15 a million, against $1.25 and $10).
func TestDimensionsGeminiLongContext(t *testing.T) {
	needSDKs(t)
	api := llmtest.Start(t)
	instances := startSpendRecipe(t, api.Addr(), 9580, append(tableRecipe(t), geminiKey...)...)
	for i, c := range []struct {
		usage  string
		stream bool
		want   int64
	}{
		{"200000,1000", false, 200_000*1_250_000/1_000_000 + 1000*10},
		{"200001,1000", false, (200_001*2_500_000+999_999)/1_000_000 + 1000*15},
		{"200001,1000", true, (200_001*2_500_000+999_999)/1_000_000 + 1000*15},
	} {
		call := sdkCall{API: "gemini", BaseURL: instances[i%2], APIKey: fmt.Sprintf("gk-acme-long-%s-%v", c.usage, c.stream), Model: "gemini-2.5-pro",
			Stream: c.stream, MaxTokens: 100, Content: "hi", Headers: map[string]string{llmtest.HeaderUsage: c.usage}}
		if r := runOne(t, call); r.Status != 200 {
			t.Fatalf("%s: status %d (%s %s)", c.usage, r.Status, r.Error, r.Message)
		}
		if got := unitsUsed(t, "spend", call.APIKey, c.want); got != c.want {
			t.Errorf("usage %s: %d µ$ charged, want %d", c.usage, got, c.want)
		}
	}
}

// TestDimensionsFleet: dozens of concurrent streams of one key over two
// instances of the money recipe, priced from the table file, its daily
// budget lowered to $1, each call billed in a dimension of its own (audio
// output, 1-hour cache writes within a long prompt, priority service):
// what the vendors bill for the upstream's calls never exceeds the
// budget, each admitted call pays at least its bill, and the rest are
// refused.
func TestDimensionsFleet(t *testing.T) {
	needSDKs(t)
	api := llmtest.Start(t)
	instances := startSpendRecipe(t, api.Addr(), 9880, append(tableRecipe(t), "zone spend 1d 10000000", "zone spend 1d 1000000")...)
	kinds := []struct {
		api, model, dims string
		bill             vendorBill
	}{
		{"chat", "gpt-4o-mini-audio-preview", "audio_output=3000", vendorBill{input: 150_000, output: 600_000, audioOutput: 20_000_000}},
		{"messages", "claude-sonnet-4-5", "cache_write_1h=1000", vendorBill{input: 3_000_000, cacheWrite1h: 6_000_000, output: 15_000_000}},
		{"chat", "gpt-4o", "service_tier=priority", vendorBill{input: 4_250_000, output: 17_000_000}},
	}
	key := "sk-fleet-dims"
	// The prompt holds the cache writes (the stand-in counts them beyond
	// its text, as a cached prefix the body does not show).
	prompt := strings.Repeat("a ", 2000)
	var calls [2][]sdkCall
	for i := range 42 {
		k := kinds[i%3]
		c := sdkCall{API: k.api, BaseURL: instances[i%2], APIKey: key, Model: k.model, Stream: true, IncludeUsage: true, MaxTokens: 4000,
			Content: fmt.Sprintf("Story %d %s", i, prompt), Headers: map[string]string{llmtest.HeaderPause: "20ms", llmtest.HeaderDimensions: k.dims}}
		calls[i%2] = append(calls[i%2], c)
	}
	results := runOnBoth(t, calls)
	admitted, refused := fleetAnswers(t, results)
	var billed int64
	for _, c := range api.Calls("Bearer " + key) {
		for _, k := range kinds {
			if k.model == c.Model {
				billed += k.bill.of(c)
			}
		}
	}
	if billed > 1_000_000 {
		t.Errorf("the vendors bill %d µ$ for the upstream's calls: want at most the budget, $1", billed)
	}
	if refused == 0 || admitted < 3 {
		t.Errorf("%d calls admitted, %d refused: want the budget to run out", admitted, refused)
	}
	if charged := unitsUsed(t, "spend", "Bearer "+key, billed); charged < billed {
		t.Errorf("%d µ$ charged for a bill of %d", charged, billed)
	}
	t.Logf("%d calls admitted, %d refused, %d µ$ billed of 1,000,000", admitted, refused, billed)
}

// TestPriceLineDimensions: a price line's audio, 1-hour cache write and
// web search prices price what the usage reports of them; a line without
// one charges that usage at the line's dearest price (a search at the
// dearest fee of the zone's lines), counts it by kind and warns once per
// model and kind.
func TestPriceLineDimensions(t *testing.T) {
	if err := initMetrics(nil); err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zap.WarnLevel)
	prices := []*Price{
		{Model: "gpt-4o-audio*", Input: "2.50", Output: "10", AudioInput: "40", AudioOutput: "80"},
		{Model: "claude-*", Input: "3", CacheWrite: "3.75", CacheWrite1h: "6", Output: "15", WebSearch: "10"},
		{Model: "*", Input: "1", Output: "2"},
	}
	if err := checkPrices(prices); err != nil {
		t.Fatal(err)
	}
	zone := "dims-" + t.Name()
	table := newPriceTable(zone, prices, zap.New(core))
	for _, c := range []struct {
		model string
		u     llmapi.Usage
		want  int64
	}{
		// 1,000 input tokens of which 500 audio, 1,000 output of which
		// 900 audio: 500 at $2.50 and 500 at $40, 100 at $10 and 900 at
		// $80.
		{"gpt-4o-audio-preview", llmapi.Usage{Input: 1000, AudioInput: 500, Output: 1000, AudioOutput: 900, Service: "default"},
			1250 + 20_000 + 1000 + 72_000},
		// 2,000 cache writes, 1,500 of an hour: 500 at $3.75, 1,500 at
		// $6; 4 searches at $10 per 1,000.
		{"claude-sonnet-4", llmapi.Usage{CacheWrite: 2000, CacheWrite1h: 1500, WebSearches: 4, Service: "standard"},
			1875 + 9000 + 40_000},
		// The * line lists no audio nor 1-hour writes: its dearest, $2;
		// nor searches: the lines' dearest fee, $10 per 1,000.
		{"llama", llmapi.Usage{Output: 1000, AudioOutput: 1000, CacheWrite: 1000, CacheWrite1h: 1000, WebSearches: 1}, 2000 + 2000 + 10_000},
		{"llama", llmapi.Usage{Output: 1000, AudioOutput: 1000}, 2000},
	} {
		if got := table.charge(c.model, c.u); got != c.want {
			t.Errorf("%s %+v: %d µ$, want %d", c.model, c.u, got, c.want)
		}
	}
	for kind, want := range map[string]float64{"audio_output": 2, "cache_write_1h": 1, "web_search": 1, "audio_input": 0} {
		if got := testutil.ToFloat64(limiterMetrics.unpricedUsage.WithLabelValues(zone, kind)); got != want {
			t.Errorf("unpriced_usage_total{kind=%q} = %v, want %v", kind, got, want)
		}
	}
	if got := logs.FilterMessageSnippet("usage its model's prices do not price").Len(); got != 3 {
		t.Errorf("%d warnings, want one for each of the 3 kinds of llama's", got)
	}
}
