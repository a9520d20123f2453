package llmprice_test

import (
	"slices"
	"testing"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/llmprice"
)

// usage builds a Usage of tokens by dimension name.
func usage(prompt int64, service llmprice.Service, kinds ...any) llmprice.Usage {
	u := llmprice.Usage{Prompt: prompt, Service: service}
	for i := 0; i+1 < len(kinds); i += 2 {
		name, n := kinds[i].(string), int64(kinds[i+1].(int))
		if name == "web_search" {
			u.WebSearches = n
			continue
		}
		d := slices.Index(llmprice.DimNames[:], name)
		u.Tokens[d] = n
	}
	return u
}

// TestCharge: each dimension at its vendor's published rate, as the
// fixture's LiteLLM entries give them; what they do not price at the
// model's dearest rate, and said.
func TestCharge(t *testing.T) {
	table, err := llmprice.Load("testdata/model_prices.json")
	if err != nil {
		t.Fatal(err)
	}
	const searchFee = 35_000_000_000
	cases := []struct {
		what, model string
		u           llmprice.Usage
		want        int64
		missed      []string
	}{
		// gpt-4o-mini-audio-preview: text $0.15 and $0.60, audio $10 and
		// $20 a million.
		{"audio", "gpt-4o-mini-audio-preview", usage(1500, llmprice.Standard, "input", 1000, "audio_input", 500, "output", 100, "audio_output", 1000),
			150 + 5000 + 60 + 20000, nil},
		// gpt-4o-mini lists no audio: its dearest rate, $0.60, and said.
		{"audio unpriced", "gpt-4o-mini", usage(0, llmprice.Standard, "audio_output", 1000),
			600, []string{"audio_output"}},
		// OpenAI's priority tier: $4.25, $2.125 cached, $17.
		{"priority", "gpt-4o", usage(2000, llmprice.Priority, "input", 1000, "cached", 1000, "output", 1000),
			4250 + 2125 + 17000, nil},
		{"default", "gpt-4o", usage(2000, llmprice.Standard, "input", 1000, "cached", 1000, "output", 1000),
			2500 + 1250 + 10000, nil},
		// A response that names no tier pays the dearest listed.
		{"tier unreported", "gpt-4o", usage(1000, llmprice.Unreported, "input", 1000),
			4250, nil},
		// Priority on a model with no priority price: its dearest rate.
		{"priority unpriced", "gpt-4o-mini", usage(1000, llmprice.Priority, "input", 1000),
			600, []string{"service_tier"}},
		{"tier unknown", "gpt-4o", usage(1000, llmprice.OtherService, "input", 1000),
			17000, []string{"service_tier"}},
		// Flex at its own rates where listed ($0.55, $2.20), and batch at
		// the standard ones.
		{"flex", "o4-mini", usage(1000, llmprice.Flex, "input", 1000, "output", 1000), 550 + 2200, nil},
		{"flex unlisted", "gpt-4o", usage(1000, llmprice.Flex, "input", 1000), 2500, nil},
		{"batch", "o4-mini", usage(1000, llmprice.Batch, "input", 1000, "output", 1000), 1100 + 4400, nil},
		// Anthropic's cache writes: 5 minutes $3.75, an hour $6; a search
		// $10 per 1,000.
		{"cache writes", "claude-sonnet-4-5", usage(3000, llmprice.Standard, "cache_write", 1000, "cache_write_1h", 1000, "output", 0),
			3750 + 6000, nil},
		{"web search", "claude-sonnet-4-5", usage(0, llmprice.Standard, "web_search", 3), 30_000, nil},
		{"web search unpriced", "gpt-4o", usage(0, llmprice.Standard, "web_search", 2), 70_000, []string{"web_search"}},
		// A 1-hour write on a model that lists none: its dearest rate.
		{"1-hour write unpriced", "gemini-2.5-pro", usage(1000, llmprice.Standard, "cache_write_1h", 1000), 15_000, []string{"cache_write_1h"}},
		// Gemini 2.5 Pro: a prompt above 200k reprices the whole call.
		{"gemini at 200k", "gemini-2.5-pro", usage(200_000, llmprice.Unreported, "input", 200_000, "output", 1000),
			250_000 + 10_000, nil},
		{"gemini above 200k", "gemini-2.5-pro", usage(200_001, llmprice.Unreported, "input", 200_000, "cached", 1, "output", 1000),
			500_000 + 1 + 15_000, nil},
		// OpenAI's long context: above 272k input, $5, $0.50 cached, $22.50.
		{"gpt-5.4 at 272k", "gpt-5.4", usage(272_000, llmprice.Standard, "input", 272_000, "output", 1000), 680_000 + 15_000, nil},
		{"gpt-5.4 above 272k", "gpt-5.4", usage(272_001, llmprice.Standard, "input", 262_001, "cached", 10_000, "output", 1000),
			1_310_005 + 5000 + 22_500, nil},
	}
	for _, c := range cases {
		t.Run(c.what, func(t *testing.T) {
			m, ok := table.Lookup(c.model)
			if !ok {
				t.Fatalf("%s not in the table", c.model)
			}
			got, missed := m.Prices.Charge(c.u, searchFee)
			if got != c.want || !slices.Equal(missed.Names(), c.missed) {
				t.Errorf("%d µ$, missed %v; want %d, %v", got, missed.Names(), c.want, c.missed)
			}
		})
	}
}

// TestChargeUnknownTokens: tokens the usage reports in its total but in
// no dimension pay the dearest rate, and a charge rounds up.
func TestChargeUnknownTokens(t *testing.T) {
	table, err := llmprice.Load("testdata/model_prices.json")
	if err != nil {
		t.Fatal(err)
	}
	m, _ := table.Lookup("gpt-4o-mini")
	if got, missed := m.Prices.Charge(llmprice.Usage{Unknown: 10, Service: llmprice.Standard}, 0); got != 6 || missed != 0 {
		t.Errorf("10 unknown tokens: %d µ$, missed %v; want 6 (at $0.60)", got, missed.Names())
	}
	if got, _ := m.Prices.Charge(llmprice.Usage{Tokens: llmprice.Sheet{llmprice.Input: 1}, Service: llmprice.Standard}, 0); got != 1 {
		t.Errorf("a token at $0.15 a million: %d µ$, want 1 (rounded up)", got)
	}
}

// TestLists: a model's prices list the dimensions its entry prices, in
// any tier, and no other.
func TestLists(t *testing.T) {
	table, err := llmprice.Load("testdata/model_prices.json")
	if err != nil {
		t.Fatal(err)
	}
	for model, want := range map[string][]llmprice.Dim{
		"claude-sonnet-4-5": {llmprice.Input, llmprice.Cached, llmprice.CacheWrite, llmprice.CacheWrite1h, llmprice.Output},
		"gpt-4o-mini":       {llmprice.Input, llmprice.Cached, llmprice.Output},
	} {
		m, ok := table.Lookup(model)
		if !ok {
			t.Fatalf("%s not in the table", model)
		}
		for d := range llmprice.NumDims {
			if got := m.Prices.Lists(d); got != slices.Contains(want, d) {
				t.Errorf("%s lists %s: %v", model, llmprice.DimNames[d], got)
			}
		}
	}
}
