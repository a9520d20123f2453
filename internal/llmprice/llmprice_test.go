package llmprice_test

import (
	"strings"
	"testing"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/llmprice"
)

// TestLoad: each model at the dearest price of each kind the table gives
// (tiers, priority, audio, 1-hour cache writes), never a cheaper service's;
// its limits; entries without token prices left out.
func TestLoad(t *testing.T) {
	table, err := llmprice.Load("testdata/model_prices.json")
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		model               string
		want                llmprice.Rates
		maxInput, maxOutput int64
	}{
		// Priority's prices, not the batches' half.
		{"gpt-4o", llmprice.Rates{Input: 4_250_000, Cached: 2_125_000, CacheWrite: 4_250_000, Output: 17_000_000}, 128000, 16384},
		{"GPT-4o-Mini", llmprice.Rates{Input: 150_000, Cached: 75_000, CacheWrite: 150_000, Output: 600_000}, 128000, 16384},
		// Audio tokens, which the usage reports within the totals.
		{"gpt-4o-mini-audio-preview", llmprice.Rates{Input: 10_000_000, Cached: 10_000_000, CacheWrite: 10_000_000, Output: 20_000_000}, 128000, 16384},
		// Above 200k tokens, and 1-hour cache writes.
		{"claude-sonnet-4-5", llmprice.Rates{Input: 6_000_000, Cached: 300_000, CacheWrite: 6_000_000, Output: 22_500_000}, 200000, 64000},
		{"gemini-2.5-pro", llmprice.Rates{Input: 2_500_000, Cached: 125_000, CacheWrite: 2_500_000, Output: 15_000_000}, 1048576, 65535},
		// max_tokens, the legacy field, is the output limit.
		{"legacy-model", llmprice.Rates{Input: 1_000_000, Cached: 1_000_000, CacheWrite: 1_000_000, Output: 2_000_000}, 0, 4096},
	}
	for _, c := range cases {
		m, ok := table.Lookup(c.model)
		if !ok || m.Rates != c.want || m.MaxInput != c.maxInput || m.MaxOutput != c.maxOutput {
			t.Errorf("%s: %+v %v, want %+v, limits %d %d", c.model, m, ok, c.want, c.maxInput, c.maxOutput)
		}
	}
	for _, absent := range []string{"dall-e-3", "sample_spec", "gpt-4o-2024-08-06", "gpt-4"} {
		if _, ok := table.Lookup(absent); ok {
			t.Errorf("%s found", absent)
		}
	}
	if got, want := table.Dearest(), (llmprice.Rates{Input: 10_000_000, Cached: 10_000_000, CacheWrite: 10_000_000, Output: 22_500_000}); got != want {
		t.Errorf("Dearest = %+v, want %+v", got, want)
	}
	if table.Len() != 8 {
		t.Errorf("Len = %d, want 8", table.Len())
	}
}

// TestParseErrors: a table that cannot be read says what and where.
func TestParseErrors(t *testing.T) {
	for _, c := range []struct{ doc, want string }{
		{`[1, 2]`, "not a JSON object of models"},
		{`{"m": {"input_cost_per_token": -1e-06, "output_cost_per_token": 1e-06}}`, `model "m": input_cost_per_token: -1e-06 is not a price`},
		{`{"m": {"input_cost_per_token": 2, "output_cost_per_token": 1e-06}}`, "above a dollar"},
		{`{"dall-e-3": {"output_cost_per_image": 0.04}}`, "no model with a price per token"},
	} {
		_, err := llmprice.Parse([]byte(c.doc))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error with %q", c.doc, err, c.want)
		}
	}
	if _, err := llmprice.Load("testdata/none.json"); err == nil || !strings.Contains(err.Error(), "reading the price table") {
		t.Errorf("a missing file: %v", err)
	}
}

// TestPriceRoundsUp: a price finer than a pico-dollar a token is rounded
// up, never down.
func TestPriceRoundsUp(t *testing.T) {
	table, err := llmprice.Parse([]byte(`{"m": {"input_cost_per_token": 1.0000000000001e-06, "output_cost_per_token": 3e-13}}`))
	if err != nil {
		t.Fatal(err)
	}
	if m, _ := table.Lookup("m"); m.Input != 1_000_001 || m.Output != 1 {
		t.Errorf("%+v", m)
	}
}
