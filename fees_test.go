package slidingratelimit

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/llmprice"
	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/llmtest"
)

// TestFeesReserved: a call whose server tools may search for a fee
// reserves the fees of the most searches its request allows beside its
// tokens, and is refused, whatever the ceiling, when nothing bounds them;
// ceiling model reserves the model's context window once per read of the
// context, its output limit and the fees, at the dearest rates of the price
// table.
func TestFeesReserved(t *testing.T) {
	if err := initMetrics(nil); err != nil {
		t.Fatal(err)
	}
	table, err := llmprice.Load("internal/llmprice/testdata/model_prices.json")
	if err != nil {
		t.Fatal(err)
	}
	lines := newPriceTable("fees-lines", []*Price{
		{Model: "claude-*", Input: "3", CacheWrite: "3.75", Output: "15", WebSearch: "10"},
		{Model: "*", Input: "2.50", Output: "10"},
	}, zap.NewNop())
	file := newPriceTable("fees-table", nil, zap.NewNop())
	file.withTable(table)
	search := func(uses string) string {
		return `{"model":"claude-sonnet-4-5","max_tokens":1000,"messages":[{"role":"user","content":"news?"}],"tools":[{"type":"web_search_20250305","name":"web_search"` + uses + `}]}`
	}
	const anth, resp = "/v1/messages", "/v1/responses"
	for _, c := range []struct {
		what, path, body string
		cost             *CostLLM
		prices           *priceTable
		want             int64  // µ$, or tokens without prices
		refused          string // a part of the refusal; "" when reserved
	}{
		// 50,000 tokens at the dearest price, $15 a million, and 5
		// searches at $10 per 1,000.
		{"max_uses 5, ceiling", anth, search(`,"max_uses":5`), &CostLLM{Ceiling: 50000}, lines, 750_000 + 50_000, ""},
		{"no max_uses, ceiling", anth, search(""), &CostLLM{Ceiling: 50000}, lines, 0, "without max_uses"},
		{"no max_uses, no ceiling", anth, search(""), &CostLLM{}, lines, 0, "the web search tool"},
		// Counting tokens, a search's fee is no concern of the zone.
		{"no max_uses, tokens", anth, search(""), &CostLLM{Ceiling: 50000}, nil, 50000, ""},
		// Searches the model's line does not price: the dearest fee of
		// the zone's lines, $0.01.
		{"Responses, max_tool_calls 2", resp, `{"model":"gpt-4o","input":"news?","max_output_tokens":100,"max_tool_calls":2,"tools":[{"type":"web_search"}]}`,
			&CostLLM{Ceiling: 10000}, lines, 100_000 + 2*10_000, ""},
		{"chat web_search_options", "/v1/chat/completions", `{"model":"gpt-4o-search-preview","messages":[],"web_search_options":{}}`,
			&CostLLM{Ceiling: 10000}, lines, 0, "web_search_options"},
		// ceiling model: claude-sonnet-4-5's window, 200,000 tokens, read
		// once and after each of 3 searches, at its dearest input
		// price ($6 a million: above 200k, and 1-hour cache writes);
		// the call's 1,000 output tokens at its dearest output price
		// ($22.50); 3 searches at $0.01.
		{"ceiling model, max_uses 3", anth, search(`,"max_uses":3`), &CostLLM{CeilingModel: true}, file, 800_000*6 + 1000*225/10 + 30_000, ""},
		// gpt-4o's window, 128,000 tokens, read once, at $4.25 a million
		// (priority), and the model's output limit, 16,384 tokens, at
		// $17: the call names no bound.
		{"ceiling model, a previous response", resp, `{"model":"gpt-4o","input":"and then?","previous_response_id":"resp_1"}`,
			&CostLLM{CeilingModel: true}, file, 128_000*425/100 + 16_384*17, ""},
		{"ceiling model, no max_uses", anth, search(""), &CostLLM{CeilingModel: true}, file, 0, "without max_uses"},
		{"ceiling model, a model the table lacks", resp, `{"model":"my-model","input":"x","previous_response_id":"resp_1"}`,
			&CostLLM{CeilingModel: true}, file, 0, `no context window and output limit for the model "my-model"`},
		{"ceiling model, a server tool that runs rounds", anth, `{"model":"claude-sonnet-4-5","max_tokens":10,"messages":[],"tools":[{"type":"web_fetch_20250910","name":"f","max_uses":1}]}`,
			&CostLLM{CeilingModel: true}, file, 0, "more often than the request bounds"},
	} {
		r, err := http.NewRequest(http.MethodPost, "http://x"+c.path, strings.NewReader(c.body))
		if err != nil {
			t.Fatal(err)
		}
		n, _, err := c.cost.of(r, 1<<40, c.prices)
		switch {
		case c.refused != "" && (err == nil || !strings.Contains(err.Error(), c.refused)):
			t.Errorf("%s: %d %v, want a refusal saying %q", c.what, n, err, c.refused)
		case c.refused == "" && (err != nil || n != c.want):
			t.Errorf("%s: %d %v, want %d", c.what, n, err, c.want)
		}
	}
}

// TestFeesCostLLMErrors: ceiling model is refused beside a ceiling in
// tokens, a cap, or without a price table, saying so.
func TestFeesCostLLMErrors(t *testing.T) {
	zone := func(cost, table string) string {
		return ":8080 {\n\tsliding_ratelimit {\n\t\tzone spend 1d 10000000 {\n\t\t\t" + cost + "\n\t\t\tsettle llm\n\t\t\t" + table + "\n\t\t}\n\t}\n}\n"
	}
	const file = "price_table internal/llmprice/testdata/model_prices.json"
	for _, c := range []struct{ what, caddyfile, want string }{
		{"a ceiling twice", zone("cost llm 4096 ceiling model ceiling 2000", file), "cost llm: ceiling is given twice, at Caddyfile:4"},
		{"a ceiling of a word", zone("cost llm 4096 ceiling window", file), `cost llm: the ceiling must be a whole number of at least 1 (cost llm 4096 ceiling 200000), or model (its context window), got "window", at Caddyfile:4`},
	} {
		_, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(c.caddyfile), nil)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", c.what, err, c.want)
		}
	}
	for _, c := range []struct{ config, want string }{
		{`{"cost_llm": {"ceiling_model": true, "cap": 32000}, "settle": {"llm": true}, "zones": [{"name": "spend", "window": "24h", "max_requests": 10000000, "price_table": "internal/llmprice/testdata/model_prices.json"}]}`, "give ceiling model or cap"},
		{`{"cost_llm": {"ceiling_model": true}, "settle": {"llm": true}, "zones": [{"name": "spend", "window": "24h", "max_requests": 10000000, "prices": [{"model": "*", "input": 5, "output": 15}]}]}`, "zone spend: cost llm: ceiling model reserves a model's context window, which only a price_table gives"},
	} {
		if err := provisionError(t, c.config); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error saying %q", c.config, err, c.want)
		}
	}
}

// ceilingModelRecipe is the money recipe priced from the price table file,
// with ceiling model.
func ceilingModelRecipe(t *testing.T, edits ...string) []string {
	return append(append(tableRecipe(t), "cost llm 4096", "cost llm 4096 ceiling model"), edits...)
}

// webSearch is Anthropic's web search tool, with max_uses when uses > 0.
func webSearch(uses int) map[string]any {
	tool := map[string]any{"type": "web_search_20250305", "name": "web_search"}
	if uses > 0 {
		tool["max_uses"] = uses
	}
	return map[string]any{"tools": []any{tool}}
}

// TestFeesSearchCalls: through the money recipe, priced from the table
// file with ceiling model, on two instances, with the official SDKs: a web
// search call with max_uses is reserved and served, and charged its
// vendor's bill; one without max_uses is refused before the upstream,
// saying so; a call by reference of a model the table knows is reserved at
// its context window and served; a Responses call's web searches, which
// its usage does not report, are charged as many as it allowed.
func TestFeesSearchCalls(t *testing.T) {
	needSDKs(t)
	api := llmtest.Start(t)
	instances := startSpendRecipe(t, api.Addr(), 9780, ceilingModelRecipe(t)...)
	// claude-sonnet-4-5 in the table: $3 and $15 a million, a search
	// $0.01.
	claude := vendorBill{input: 3_000_000, output: 15_000_000, search: 10_000_000_000}
	for i, stream := range []bool{false, true} {
		key := fmt.Sprintf("sk-fees-search-%v", stream)
		call := sdkCall{API: "messages", BaseURL: instances[i], APIKey: key, Model: "claude-sonnet-4-5", Stream: stream, MaxTokens: 1000,
			Content: "What happened today?", Params: webSearch(3), Headers: map[string]string{llmtest.HeaderDimensions: "web_searches=3"}}
		if r := runOne(t, call); r.Status != 200 {
			t.Fatalf("max_uses 3, stream=%v: status %d (%s %s)", stream, r.Status, r.Error, r.Message)
		}
		served := api.Calls("Bearer " + key)
		if len(served) != 1 {
			t.Fatalf("%d calls served", len(served))
		}
		bill := claude.of(served[0])
		if got := unitsUsed(t, "spend", "Bearer "+key, bill); got < bill || got > bill+1 {
			t.Errorf("max_uses 3, stream=%v: %d µ$ charged, the vendor bills %d", stream, got, bill)
		}
	}

	key := "sk-fees-no-max-uses"
	r := runOne(t, sdkCall{API: "messages", BaseURL: instances[1], APIKey: key, Model: "claude-sonnet-4-5", MaxTokens: 1000,
		Content: "What happened today?", Params: webSearch(0)})
	if r.Status != 400 || !strings.Contains(r.Message, "without max_uses") {
		t.Errorf("without max_uses: status %d %q, want 400 saying max_uses is missing", r.Status, r.Message)
	}
	if n := len(api.Calls("Bearer " + key)); n != 0 {
		t.Errorf("without max_uses: %d calls reached the upstream", n)
	}

	// A previous response's input is bounded by gpt-4o's context window:
	// reserved, served, and charged what it used ($2.50 and $10).
	key = "sk-fees-by-reference"
	r = runOne(t, sdkCall{API: "responses", BaseURL: instances[0], APIKey: key, Model: "gpt-4o", MaxTokens: 100, Content: "And then?",
		Params: map[string]any{"previous_response_id": "resp_1"}})
	if r.Status != 200 {
		t.Fatalf("by reference: status %d (%s %s)", r.Status, r.Error, r.Message)
	}
	served := api.Calls("Bearer " + key)
	if len(served) != 1 {
		t.Fatalf("by reference: %d calls served", len(served))
	}
	if bill, got := (vendorBill{input: 2_500_000, output: 10_000_000}).of(served[0]), unitsUsed(t, "spend", "Bearer "+key, 0); got < bill || got > bill+1 {
		t.Errorf("by reference: %d µ$ charged, the vendor bills %d", got, bill)
	}

	// The Responses API reports no searches: a call pays the 2 its
	// max_tool_calls allowed, at the dearest fee of the table ($0.01),
	// beside its tokens.
	key = "sk-fees-responses-search"
	r = runOne(t, sdkCall{API: "responses", BaseURL: instances[1], APIKey: key, Model: "gpt-4o", MaxTokens: 100, Content: "News?",
		Params: map[string]any{"tools": []any{map[string]any{"type": "web_search"}}, "max_tool_calls": 2}})
	if r.Status != 200 {
		t.Fatalf("Responses web search: status %d (%s %s)", r.Status, r.Error, r.Message)
	}
	served = api.Calls("Bearer " + key)
	if len(served) != 1 {
		t.Fatalf("Responses web search: %d calls served", len(served))
	}
	want := (vendorBill{input: 2_500_000, output: 10_000_000}).of(served[0]) + 2*10_000
	if got := unitsUsed(t, "spend", "Bearer "+key, want); got < want || got > want+1 {
		t.Errorf("Responses web search: %d µ$ charged, want the tokens and 2 searches, %d", got, want)
	}
}

// TestFeesFleet: dozens of concurrent web search calls of one key over two
// instances, with ceiling model, each billed the most its request allows
// (its context window read once and after each of its 4 searches, at the
// dearer tier, its output bound, and 4 searches): $6.0625 each, against a
// budget of 3 such calls less 1 µ$. The vendor's bill for the calls the
// upstream served stays within the budget: 2 calls, and the rest refused.
// Were the fees not reserved, 3 calls would fit, billed above the budget.
func TestFeesFleet(t *testing.T) {
	needSDKs(t)
	api := llmtest.Start(t)
	const each = 200_000*5*6 + 1000*225/10 + 4*10_000
	budget := int64(3*each - 1)
	instances := startSpendRecipe(t, api.Addr(), 9880, ceilingModelRecipe(t, "zone spend 1d 10000000", "zone spend 1d "+strconv.FormatInt(budget, 10))...)
	key := "sk-fleet-fees"
	var calls [2][]sdkCall
	for i := range 30 {
		c := sdkCall{API: "messages", BaseURL: instances[i%2], APIKey: key, Model: "claude-sonnet-4-5", Stream: true, MaxTokens: 1000,
			Content: fmt.Sprintf("Search %d", i), Params: webSearch(4),
			Headers: map[string]string{llmtest.HeaderPause: "20ms", llmtest.HeaderDimensions: "web_searches=4", llmtest.HeaderUsage: "1000000,1000"}}
		calls[i%2] = append(calls[i%2], c)
	}
	admitted, refused := fleetAnswers(t, runOnBoth(t, calls))
	// The usage reported, a prompt above 200k tokens: $6 and $22.50 a
	// million, and $0.01 a search.
	var billed int64
	for _, c := range api.Calls("Bearer " + key) {
		c.InputTokens, c.OutputTokens = 1_000_000, 1000
		billed += vendorBill{input: 6_000_000, output: 22_500_000, search: 10_000_000_000}.of(c)
	}
	if billed > budget {
		t.Errorf("the vendor bills %d µ$ for the upstream's calls: want at most the budget, %d", billed, budget)
	}
	if admitted != 2 || refused != 28 {
		t.Errorf("%d calls admitted, %d refused: want 2 and 28", admitted, refused)
	}
	if charged := unitsUsed(t, "spend", "Bearer "+key, billed); charged < billed {
		t.Errorf("%d µ$ charged for a bill of %d", charged, billed)
	}
	t.Logf("%d calls admitted, %d refused, %d µ$ billed of %d", admitted, refused, billed, budget)
}

// TestPriceLineHidesTable: a price line that names a model whole prices it
// in the table's place; when it lacks what the table prices for that model
// (1-hour cache writes, searches, a dearer context tier), the load says
// so, once per line.
func TestPriceLineHidesTable(t *testing.T) {
	if err := initMetrics(nil); err != nil {
		t.Fatal(err)
	}
	table, err := llmprice.Load("internal/llmprice/testdata/model_prices.json")
	if err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zap.WarnLevel)
	prices := newPriceTable("hides-"+t.Name(), []*Price{
		{Model: "claude-sonnet-4-5", Input: "3", Output: "15"},
		{Model: "gpt-4o-mini", Input: "0.15", Cached: "0.075", Output: "0.60"},
		{Model: "claude-*", Input: "3", Output: "15"},
	}, zap.New(core))
	prices.withTable(table)
	warned := logs.FilterMessageSnippet("lacks prices the table gives for it").All()
	if len(warned) != 1 {
		t.Fatalf("%d warnings, want 1 (claude-sonnet-4-5's line)", len(warned))
	}
	fields := warned[0].ContextMap()
	if got := fmt.Sprintf("%v %v", fields["model"], fields["dimensions"]); got != "claude-sonnet-4-5 [cache_write_1h web_search a prompt above 200000 tokens]" {
		t.Errorf("warned of %s", got)
	}
}
