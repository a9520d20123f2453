package llmprice

import (
	"encoding/json"
	"fmt"
	"math/big"
	"strconv"
	"strings"
)

// LiteLLM's names of a rate per token: a base name, then the conditions
// under which it applies, in this order, each optional:
//
//	<base>[_above_1hr][_above_<N>k_tokens][_priority|_flex|_batches]
//
//	input_cost_per_token                 Input
//	input_cost_per_audio_token           AudioInput
//	cache_read_input_token_cost          Cached
//	cache_creation_input_token_cost      CacheWrite; with _above_1hr, CacheWrite1h
//	output_cost_per_token                Output
//	output_cost_per_reasoning_token      Output (the dearer of both)
//	output_cost_per_audio_token          AudioOutput
//	_above_<N>k_tokens                   a prompt above N×1000 tokens: the whole call
//	_priority, _flex                     the service tier the response names
//	_batches                             not read: the standard rate is never below it
//
// Any other rate per token of these prefixes (cached audio, image tokens,
// a condition not listed) counts only toward the model's dearest rate of
// its kind (Model.Rates).
var baseDims = map[string]Dim{
	"input_cost_per_token":            Input,
	"input_cost_per_audio_token":      AudioInput,
	"cache_read_input_token_cost":     Cached,
	"cache_creation_input_token_cost": CacheWrite,
	"output_cost_per_token":           Output,
	"output_cost_per_reasoning_token": Output,
	"output_cost_per_audio_token":     AudioOutput,
}

// fieldRate says where a field's rate goes in a model's Prices; ok is
// false for a field that is none of them.
func fieldRate(field string) (d Dim, s Service, above int64, ok bool) {
	s = Standard
	switch {
	case strings.HasSuffix(field, "_batches"):
		return 0, 0, 0, false
	case strings.HasSuffix(field, "_priority"):
		field, s = strings.TrimSuffix(field, "_priority"), Priority
	case strings.HasSuffix(field, "_flex"):
		field, s = strings.TrimSuffix(field, "_flex"), Flex
	}
	if rest, ok := strings.CutSuffix(field, "k_tokens"); ok {
		i := strings.LastIndex(rest, "_above_")
		if i < 0 {
			return 0, 0, 0, false
		}
		k, err := strconv.ParseInt(rest[i+len("_above_"):], 10, 32)
		if err != nil || k < 1 {
			return 0, 0, 0, false
		}
		field, above = rest[:i], k*1000
	}
	oneHour := false
	if f, ok := strings.CutSuffix(field, "_above_1hr"); ok {
		field, oneHour = f, true
	}
	d, ok = baseDims[field]
	switch {
	case !ok:
		return 0, 0, 0, false
	case oneHour && d != CacheWrite:
		return 0, 0, 0, false
	case oneHour:
		d = CacheWrite1h
	}
	return d, s, above, true
}

// set records rate p of d for service s above a threshold, the dearer of
// two that land in one place.
func (ps *Prices) set(d Dim, s Service, above, p int64) {
	for i := range ps.Tiers {
		if t := &ps.Tiers[i]; t.Service == s && t.Above == above {
			t.Sheet[d] = max(t.Sheet[d], p)
			return
		}
	}
	t := Tier{Service: s, Above: above, Sheet: Blank()}
	t.Sheet[d] = p
	ps.Tiers = append(ps.Tiers, t)
}

// searchFee reads LiteLLM's search_context_cost_per_query, an object of
// dollars per search by context size: the dearest, in pico-dollars.
func searchFee(v any) (int64, bool) {
	sizes, ok := v.(map[string]any)
	if !ok {
		return 0, false
	}
	fee, found := Unlisted, false
	for _, x := range sizes {
		if n, isNum := x.(json.Number); !isNum {
			continue
		} else if p, err := pico(n); err == nil {
			fee, found = max(fee, p), true
		}
	}
	return fee, found
}

// maxPico is the largest price a table may give: a dollar a token, far
// above any model's, so that a price with a slipped exponent fails.
const maxPico = 1_000_000_000_000

// pico reads dollars per token (2.5e-06) as pico-dollars per token,
// exactly, rounded up: never cheaper than the table says.
func pico(n json.Number) (int64, error) {
	r, ok := new(big.Rat).SetString(string(n))
	if !ok || r.Sign() < 0 {
		return 0, fmt.Errorf("%s is not a price of at least 0 dollars a token", n)
	}
	r.Mul(r, big.NewRat(maxPico, 1))
	q, m := new(big.Int).QuoRem(r.Num(), r.Denom(), new(big.Int))
	if m.Sign() != 0 {
		q.Add(q, big.NewInt(1))
	}
	if !q.IsInt64() || q.Int64() > maxPico {
		return 0, fmt.Errorf("%s dollars a token is above a dollar: a slipped exponent?", n)
	}
	return q.Int64(), nil
}
