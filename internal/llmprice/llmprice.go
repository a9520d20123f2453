// Package llmprice reads a table of LLM prices and limits from a file in
// the format of LiteLLM's model_prices_and_context_window.json: the table
// most gateways and cost trackers keep (LiteLLM, Langfuse, Helicone and
// others read it), updated within days of a vendor's change, with each
// model's prices per token of each kind, their tiers, and its context
// window and output limit. An operator downloads it, points the zone at
// it, and refreshes it with a config reload.
//
// The contract: a model's price of each kind is never below any price the
// file gives for tokens of that kind (tiers above a context length,
// priority service, audio, reasoning, 1-hour cache writes), since the usage
// the APIs report does not always say which applied; and a model the file
// does not name is priced by the caller, never at zero.
package llmprice

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"strings"
)

// Rates are one model's prices, in pico-dollars per token (a millionth of
// a dollar per million tokens): $2.50 per million is 2,500,000.
type Rates struct {
	// Input is fresh input; Cached, input read from a cache; CacheWrite,
	// input written to one; Output, output with reasoning.
	Input, Cached, CacheWrite, Output int64
}

// Model is what the table says of one model.
type Model struct {
	// Rates are the dearest of each kind: what a reservation prices.
	Rates
	// Prices are the rate of each dimension: what a settle prices.
	Prices Prices
	// MaxInput is its context window for input, MaxOutput the most it
	// generates in one call; 0 when the table does not say.
	MaxInput, MaxOutput int64
}

// Table is a price table, read once; it is safe for concurrent use.
type Table struct {
	models  map[string]Model
	dearest Rates
	// search is the dearest web search fee of any model, Unlisted when
	// none has one.
	search int64
}

// Load reads the table at path.
func Load(path string) (*Table, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading the price table: %w", err)
	}
	t, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("price table %s: %w", path, err)
	}
	return t, nil
}

// Parse reads a table: a JSON object of model names, each an object of its
// prices (dollars per token) and limits. Entries without token prices
// (images priced per image, speech per character) are left out; a price
// that is not a number from 0 to a dollar a token is an error naming it.
func Parse(data []byte) (*Table, error) {
	var raw map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	if err := dec.Decode(&raw); err != nil {
		return nil, fmt.Errorf("not a JSON object of models: %w", err)
	}
	t := &Table{models: make(map[string]Model, len(raw)), search: Unlisted}
	for name, entry := range raw {
		if name == "sample_spec" {
			continue
		}
		var fields map[string]any
		d := json.NewDecoder(bytes.NewReader(entry))
		d.UseNumber()
		if d.Decode(&fields) != nil {
			continue // not a model: the file's other members
		}
		m, ok, err := readModel(fields)
		if err != nil {
			return nil, fmt.Errorf("model %q: %w", name, err)
		}
		if !ok {
			continue
		}
		t.models[strings.ToLower(name)] = m
		t.dearest = Rates{
			Input:      max(t.dearest.Input, m.Input),
			Cached:     max(t.dearest.Cached, m.Cached),
			CacheWrite: max(t.dearest.CacheWrite, m.CacheWrite),
			Output:     max(t.dearest.Output, m.Output),
		}
		t.search = max(t.search, m.Prices.WebSearch)
	}
	if len(t.models) == 0 {
		return nil, fmt.Errorf("no model with a price per token (input_cost_per_token, output_cost_per_token)")
	}
	return t, nil
}

// kindOf tells which kind of token a field prices: the LiteLLM names
// input_cost_per_token and its variants (_above_200k_tokens, _priority,
// input_cost_per_audio_token), output_cost_per_token and its variants
// (output_cost_per_reasoning_token), cache_read_input_token_cost and
// cache_creation_input_token_cost (_above_1hr) and theirs. Prices per
// token of a cheaper service (flex, batches) are left out: the dearest
// counts.
func kindOf(field string) (kind int, ok bool) {
	if !strings.Contains(field, "token") || strings.Contains(field, "per_1k") ||
		strings.HasSuffix(field, "_flex") || strings.HasSuffix(field, "_batches") {
		return 0, false
	}
	switch {
	case strings.HasPrefix(field, "input_cost_per_"):
		return 0, true
	case strings.HasPrefix(field, "cache_read_input_"):
		return 1, true
	case strings.HasPrefix(field, "cache_creation_input_"):
		return 2, true
	case strings.HasPrefix(field, "output_cost_per_"):
		return 3, true
	}
	return 0, false
}

// readModel reads one entry; ok is false for one without the price of an
// input and an output token.
func readModel(fields map[string]any) (Model, bool, error) {
	var r [4]int64
	var seen [4]bool
	prices := Prices{WebSearch: Unlisted}
	for field, v := range fields {
		if fee, ok := searchFee(v); ok && field == "search_context_cost_per_query" {
			prices.WebSearch = fee
		}
		kind, isKind := kindOf(field)
		d, s, above, isDim := fieldRate(field)
		if !isKind && !isDim {
			continue
		}
		n, isNum := v.(json.Number)
		if !isNum {
			continue // a note, a tiered object: not a price per token
		}
		p, err := pico(n)
		if err != nil {
			return Model{}, false, fmt.Errorf("%s: %w", field, err)
		}
		if isKind {
			r[kind], seen[kind] = max(r[kind], p), true
		}
		if isDim {
			prices.set(d, s, above, p)
		}
	}
	if !seen[0] || !seen[3] {
		return Model{}, false, nil
	}
	// A cache the table does not price costs what fresh input does, at
	// least: never less.
	for _, k := range []int{1, 2} {
		if !seen[k] {
			r[k] = r[0]
		}
	}
	m := Model{Rates: Rates{Input: r[0], Cached: r[1], CacheWrite: r[2], Output: r[3]}, Prices: prices}
	m.MaxInput = limit(fields["max_input_tokens"])
	m.MaxOutput = limit(fields["max_output_tokens"])
	if m.MaxOutput == 0 {
		// LiteLLM's legacy field: the output limit where the provider
		// gives one.
		m.MaxOutput = limit(fields["max_tokens"])
	}
	return m, true, nil
}

// limit reads a token limit: a whole number of at least 1, else 0.
func limit(v any) int64 {
	n, ok := v.(json.Number)
	if !ok {
		return 0
	}
	i, err := n.Int64()
	if err != nil || i < 1 {
		return 0
	}
	return i
}

// Lookup returns the model of that name, matched whole, case aside.
func (t *Table) Lookup(model string) (Model, bool) {
	m, ok := t.models[strings.ToLower(model)]
	return m, ok
}

// Dearest is the dearest price of each kind in the table: what a model it
// does not name can cost at most, as far as it knows.
func (t *Table) Dearest() Rates { return t.dearest }

// DearestSearch is the dearest fee of a web search any model has, in
// pico-dollars; Unlisted when none has one.
func (t *Table) DearestSearch() int64 { return t.search }

// Len is how many models the table prices.
func (t *Table) Len() int { return len(t.models) }
