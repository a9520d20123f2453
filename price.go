package slidingratelimit

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/llmapi"
	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/llmprice"
	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/strictnum"
)

// A zone with prices counts money: each call's tokens, of each kind, at its
// model's price, in millionths of a dollar (µ$), so that max_requests
// 10000000 is $10. The reservation prices the most a call can spend (cost
// llm's bounds) at the model's dearest input kind and its output price; the
// settle prices each kind of the usage the API reports at its own price.
// All of it is integer arithmetic on exact decimals: a price is read as
// micro-dollars per million tokens, which is pico-dollars per token, and a
// call's charge is rounded up to the µ$.

// unitUSDMicros is what a priced zone counts in: millionths of a US dollar.
const unitUSDMicros = "usd-micros"

// Price is one line of a zone's prices: what a million tokens of each kind
// cost, in dollars, for the models its pattern matches. The prices are
// decimal numbers, read exactly (at most 6 decimals, at most 1,000,000): in
// JSON a number or a string holding one, as 2.50 or "2.50".
type Price struct {
	// Model is the pattern of the model names the line prices: the model
	// the request names (its JSON "model"; Gemini's and Bedrock's model
	// in the URL path). "*" matches any run of characters, "/" and ":"
	// included, and nothing else is special; case does not count
	// ("gpt-4o*" prices GPT-4o-mini). The first line that matches wins,
	// so put "*" last. Required.
	Model string `json:"model,omitempty"`

	// Input is the price of fresh input tokens: neither read from a cache
	// nor written to one. Required.
	Input json.Number `json:"input,omitempty"`

	// Cached is the price of input tokens read from a cache: OpenAI's
	// cached_tokens (which are within its prompt_tokens: they are priced
	// here, the rest at Input), Anthropic's cache_read_input_tokens,
	// Gemini's cachedContentTokenCount, Bedrock's cacheReadInputTokens.
	// Default: Input.
	Cached json.Number `json:"cached,omitempty"`

	// CacheWrite is the price of input tokens written to a cache:
	// Anthropic's cache_creation_input_tokens, Bedrock's
	// cacheWriteInputTokens. Default: Input.
	CacheWrite json.Number `json:"cache_write,omitempty"`

	// Output is the price of output tokens, reasoning and thinking tokens
	// included. Required (0 for a model that generates nothing, such as
	// embeddings).
	Output json.Number `json:"output,omitempty"`

	// CacheWrite1h is the price of input tokens written to a cache that
	// keeps them an hour: Anthropic's
	// cache_creation.ephemeral_1h_input_tokens. Default: none, so that a
	// call that reports them pays the line's dearest price for them (and
	// is counted in unpriced_usage_total).
	CacheWrite1h json.Number `json:"cache_write_1h,omitempty"`

	// AudioInput and AudioOutput are the prices of audio tokens: OpenAI's
	// prompt_tokens_details.audio_tokens and
	// completion_tokens_details.audio_tokens. Default: none, as for
	// CacheWrite1h.
	AudioInput  json.Number `json:"audio_input,omitempty"`
	AudioOutput json.Number `json:"audio_output,omitempty"`

	// WebSearch is the fee of 1,000 web searches a server tool made, in
	// dollars, as the vendors publish it (10 for Anthropic's $10 per
	// 1,000): server_tool_use.web_search_requests. Default: none, so that
	// a call that reports searches pays the dearest fee of the zone's
	// price table, else of its lines, else $0.035 each (the dearest
	// published, Gemini's grounding), and is counted.
	WebSearch json.Number `json:"web_search,omitempty"`
}

// priceKinds are the kinds of token a line prices, as the Caddyfile and the
// JSON name them, each with its field of Price.
type priceKind struct {
	name  string
	field func(*Price) *json.Number
}

var priceKinds = []priceKind{
	{"input", func(p *Price) *json.Number { return &p.Input }},
	{"cached", func(p *Price) *json.Number { return &p.Cached }},
	{"cache_write", func(p *Price) *json.Number { return &p.CacheWrite }},
	{"output", func(p *Price) *json.Number { return &p.Output }},
	{"cache_write_1h", func(p *Price) *json.Number { return &p.CacheWrite1h }},
	{"audio_input", func(p *Price) *json.Number { return &p.AudioInput }},
	{"audio_output", func(p *Price) *json.Number { return &p.AudioOutput }},
	{"web_search", func(p *Price) *json.Number { return &p.WebSearch }},
}

// priceKindNames lists the kinds for errors and the syntax.
func priceKindNames() []string {
	names := make([]string, len(priceKinds))
	for i, k := range priceKinds {
		names[i] = k.name
	}
	return names
}

// Limits of a price, in dollars per million tokens.
const (
	// priceDecimals is how many decimals a price may have: a millionth of
	// a dollar per million tokens is a pico-dollar per token.
	priceDecimals = 6
	// maxPriceDollars is the largest price: a dollar a token, far above
	// any model's, so that a price with a slipped decimal point fails.
	maxPriceDollars = 1_000_000
)

// parseDollars reads a price in dollars per million tokens as pico-dollars
// per token, exactly: "2.50" is 2,500,000.
func parseDollars(s string) (int64, error) {
	whole, frac, dot := strings.Cut(s, ".")
	switch {
	case strings.HasPrefix(s, "-"):
		return 0, fmt.Errorf("%q is negative: a price is what a million tokens cost, in dollars", s)
	case whole == "" && frac == "", dot && frac == "", !digitsOnly(whole) || !digitsOnly(frac):
		return 0, fmt.Errorf("%q is not a number of dollars such as 2.50", s)
	case len(frac) > priceDecimals:
		return 0, fmt.Errorf("%q has more than %d decimals: the least a price can say is a millionth of a dollar per million tokens", s, priceDecimals)
	}
	w := int64(0)
	if whole != "" {
		var err error
		if w, err = strconv.ParseInt(whole, 10, 64); err != nil || w > maxPriceDollars {
			return 0, fmt.Errorf("%q is above %d dollars per million tokens (a dollar a token): a slipped decimal point?", s, maxPriceDollars)
		}
	}
	f := int64(0)
	if frac != "" {
		f, _ = strconv.ParseInt(frac+strings.Repeat("0", priceDecimals-len(frac)), 10, 64)
	}
	n := w*1_000_000 + f
	if n > maxPriceDollars*1_000_000 {
		return 0, fmt.Errorf("%q is above %d dollars per million tokens (a dollar a token): a slipped decimal point?", s, maxPriceDollars)
	}
	return n, nil
}

func digitsOnly(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// rates are one model's prices, in pico-dollars per token of each kind:
// the dearest of each kind, which a reservation prices, and the rate of
// each dimension, which a settle prices.
type rates struct {
	input, cached, cacheWrite, output int64
	// dims are the rates of each dimension; nil: the four above, at the
	// standard service tier.
	dims *llmprice.Prices
}

// dearestInput is the most an input token of the model can cost, whatever
// the cache does with it: what a reservation prices its input bound at.
func (r rates) dearestInput() int64 { return max(r.input, r.cached, r.cacheWrite) }

// prices are the rates of each dimension.
func (r rates) prices() *llmprice.Prices {
	if r.dims != nil {
		return r.dims
	}
	s := llmprice.Blank()
	s[llmprice.Input], s[llmprice.Cached], s[llmprice.CacheWrite], s[llmprice.Output] = r.input, r.cached, r.cacheWrite, r.output
	return &llmprice.Prices{Tiers: []llmprice.Tier{{Service: llmprice.Standard, Sheet: s}}, WebSearch: llmprice.Unlisted}
}

// dearest is the most any token of the model can cost.
func (r rates) dearest() int64 { return max(r.dearestInput(), r.output) }

// reserve is, in µ$ rounded up, what a call of input and output bounds
// (tokens) may spend at most.
func (r rates) reserve(input, output int64) int64 {
	var s llmprice.Sum
	s.Add(input, r.dearestInput())
	s.Add(output, r.output)
	return s.Micros()
}

// reserveDearest is, in µ$ rounded up, tokens of a call that could not be
// bounded, each priced at the dearest kind.
func (r rates) reserveDearest(tokens int64) int64 {
	var s llmprice.Sum
	s.Add(tokens, r.dearest())
	return s.Micros()
}

// charge is, in µ$ rounded up, what usage u cost: each dimension at its
// own rate, each token once, and what the rates could not price
// (charged at their dearest rate, or searches at searchFee each). Tokens
// of the vendor's own total that none of the kinds holds (a total above
// the sum of its parts) are priced at the dearest rate, since what they
// are is not known.
func (r rates) charge(u llmapi.Usage, searchFee int64) (int64, llmprice.Missed) {
	var p llmprice.Usage
	p.Tokens[llmprice.Input] = u.Input - u.AudioInput
	p.Tokens[llmprice.AudioInput] = u.AudioInput
	p.Tokens[llmprice.Cached] = u.Cached
	p.Tokens[llmprice.CacheWrite] = u.CacheWrite - u.CacheWrite1h
	p.Tokens[llmprice.CacheWrite1h] = u.CacheWrite1h
	p.Tokens[llmprice.Output] = u.Output - u.AudioOutput
	p.Tokens[llmprice.AudioOutput] = u.AudioOutput
	kinds := min(u.Input+u.Cached+u.CacheWrite+u.Output, strictnum.Max)
	if u.Reported > kinds {
		p.Unknown = u.Reported - kinds
	}
	p.Prompt = min(u.Input+u.Cached+u.CacheWrite, strictnum.Max)
	p.WebSearches = u.WebSearches
	p.Service = serviceOf(u.Service)
	return r.prices().Charge(p, searchFee)
}

// serviceOf reads the service tier a response names.
func serviceOf(name string) llmprice.Service {
	switch name {
	case "":
		return llmprice.Unreported
	case "default", "auto", "standard":
		return llmprice.Standard
	case "priority":
		return llmprice.Priority
	case "flex":
		return llmprice.Flex
	case "batch":
		return llmprice.Batch
	}
	return llmprice.OtherService
}

// priceLine is one Price, read.
type priceLine struct {
	pattern string // lower case
	rates   rates
}

// priceTable is a zone's prices, read: the lines in order and what a model
// none of them matches pays. Safe for concurrent use.
type priceTable struct {
	lines []priceLine
	// file is the zone's price table, nil without one.
	file *llmprice.Table
	// unmatched prices a model no line matches: with no "*" line, the
	// dearest price listed of each kind.
	unmatched rates
	// unpriced counts the calls priced at unmatched, and warned logs each
	// such model once (up to maxUnpricedWarnings models).
	unpriced prometheus.Counter
	logger   *zap.Logger
	zone     string
	mu       sync.Mutex
	warned   map[string]bool
	// spent counts the µ$ the zone's calls settled to.
	spent prometheus.Counter
	// searchFee is what a web search costs where the prices do not say,
	// in pico-dollars: the dearest fee listed, else fallbackSearchFee.
	searchFee int64
	// unpricedUsage counts, by dimension, the calls that reported usage
	// their prices did not price; warnedUsage logs each model and
	// dimension once.
	unpricedUsage *prometheus.CounterVec
	warnedUsage   map[string]bool
}

// fallbackSearchFee is a web search's fee when no price names one: $0.035,
// the dearest a vendor publishes (Gemini's grounding with Google Search,
// $35 per 1,000), in pico-dollars.
const fallbackSearchFee = 35_000_000_000

// maxUnpricedWarnings bounds the models a zone warns of: a client may name
// any model, so that the log cannot be flooded.
const maxUnpricedWarnings = 100

// newPriceTable reads prices, which checkPrices has accepted.
func newPriceTable(zone string, prices []*Price, logger *zap.Logger) *priceTable {
	t := &priceTable{logger: logger, zone: zone, warned: make(map[string]bool),
		unpriced:      limiterMetrics.unpricedModels.WithLabelValues(zone),
		spent:         limiterMetrics.spentMicros.WithLabelValues(zone),
		unpricedUsage: limiterMetrics.unpricedUsage, warnedUsage: make(map[string]bool),
		searchFee: fallbackSearchFee,
	}
	lineFee := llmprice.Unlisted
	for _, p := range prices {
		r, err := p.rates()
		if err == nil {
			lineFee = max(lineFee, r.dims.WebSearch)
		}
		t.lines = append(t.lines, priceLine{pattern: strings.ToLower(p.Model), rates: r})
		t.unmatched = rates{
			input:      max(t.unmatched.input, r.input),
			cached:     max(t.unmatched.cached, r.cached),
			cacheWrite: max(t.unmatched.cacheWrite, r.cacheWrite),
			output:     max(t.unmatched.output, r.output),
		}
	}
	if lineFee != llmprice.Unlisted {
		t.searchFee = lineFee
	}
	return t
}

// withTable adds a price table file: a model it names is priced by it
// unless a line names that model whole, and a model neither names pays the
// dearest of both.
func (t *priceTable) withTable(file *llmprice.Table) {
	if file == nil {
		return
	}
	t.file = file
	d := file.Dearest()
	if len(t.lines) == 0 {
		t.unmatched = rates{}
	}
	t.unmatched = rates{
		input:      max(t.unmatched.input, d.Input),
		cached:     max(t.unmatched.cached, d.Cached),
		cacheWrite: max(t.unmatched.cacheWrite, d.CacheWrite),
		output:     max(t.unmatched.output, d.Output),
	}
	if fee := file.DearestSearch(); fee != llmprice.Unlisted {
		t.searchFee = fee
	}
	t.warnHidden(file)
}

// warnHidden warns, at load, of each line that names a model whole, and so
// prices it in the table's place, but lacks a dimension the table prices
// for it: such usage would be charged at the line's dearest rate. What a
// model no line names whole lacks can only be told at its first use (the
// model is the client's choice): charge warns of it then.
func (t *priceTable) warnHidden(file *llmprice.Table) {
	for _, l := range t.lines {
		m, ok := file.Lookup(l.pattern)
		if strings.Contains(l.pattern, "*") || !ok || l.rates.dims == nil {
			continue
		}
		var lacks []string
		for d := range llmprice.NumDims {
			if m.Prices.Lists(d) && !l.rates.dims.Lists(d) {
				lacks = append(lacks, llmprice.DimNames[d])
			}
		}
		if m.Prices.WebSearch != llmprice.Unlisted && l.rates.dims.WebSearch == llmprice.Unlisted {
			lacks = append(lacks, "web_search")
		}
		for _, tier := range m.Prices.Tiers {
			if tier.Above > 0 {
				// A line has no context tiers: its rates price every
				// prompt, the table's dearer one above the threshold
				// included.
				lacks = append(lacks, fmt.Sprintf("a prompt above %d tokens", tier.Above))
				break
			}
		}
		if len(lacks) > 0 {
			t.logger.Warn("a price line names a model whole, so it prices it in the price table's place, but lacks prices the table gives for it: such usage is charged at the line's dearest rate; add them to the line",
				zap.String("zone", t.zone), zap.String("model", l.pattern), zap.Strings("dimensions", lacks))
		}
	}
}

// lookup returns the rates of model: a line that names it whole, the
// table's price of it, the first line whose pattern matches it, or the
// dearest prices listed and false. (A line naming a model whole never
// follows a pattern that matches it: checkPrices refuses it.)
func (t *priceTable) lookup(model string) (rates, bool) {
	lower := strings.ToLower(model)
	for _, l := range t.lines {
		if !strings.Contains(l.pattern, "*") && l.pattern == lower {
			return l.rates, true
		}
	}
	if t.file != nil {
		if m, ok := t.file.Lookup(model); ok {
			return rates{input: m.Input, cached: m.Cached, cacheWrite: m.CacheWrite, output: m.Output, dims: &m.Prices}, true
		}
	}
	for _, l := range t.lines {
		if globMatch(l.pattern, lower) {
			return l.rates, true
		}
	}
	return t.unmatched, false
}

// outputLimit is the most the model generates in one call, as the price
// table says; false when it does not.
func (t *priceTable) outputLimit(model string) (int64, bool) {
	if t == nil || t.file == nil {
		return 0, false
	}
	m, ok := t.file.Lookup(model)
	return m.MaxOutput, ok && m.MaxOutput > 0
}

// searchFeeOf is the fee of one web search of model, in pico-dollars: its
// prices', else the dearest fee listed (searchFee), as a settle charges it.
func (t *priceTable) searchFeeOf(model string) int64 {
	if r, _ := t.lookup(model); r.dims != nil && r.dims.WebSearch != llmprice.Unlisted {
		return r.dims.WebSearch
	}
	return t.searchFee
}

// window is the model's context window (input) and output limit, as the
// price table says; false when it does not give both.
func (t *priceTable) window(model string) (input, output int64, ok bool) {
	if t == nil || t.file == nil {
		return 0, 0, false
	}
	m, ok := t.file.Lookup(model)
	return m.MaxInput, m.MaxOutput, ok && m.MaxInput > 0 && m.MaxOutput > 0
}

// of is lookup for a call's reservation: a model no line matches is
// counted, and warned of once.
func (t *priceTable) of(model string) rates {
	r, ok := t.lookup(model)
	if ok {
		return r
	}
	t.unpriced.Inc()
	if t.firstWarning(t.warned, model) {
		t.logger.Warn("a model that no price line matches is priced at the dearest price of each kind listed; add a line for it, or a last line price * ...",
			zap.String("zone", t.zone), zap.String("model", model))
	}
	return r
}

// firstWarning reports whether key is new to warned (one of t's sets),
// and notes it, while warned holds fewer than maxUnpricedWarnings: each
// warning is logged once, and a client naming new models cannot grow the
// set without bound.
func (t *priceTable) firstWarning(warned map[string]bool, key string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if warned[key] || len(warned) >= maxUnpricedWarnings {
		return false
	}
	warned[key] = true
	return true
}

// charge is what a call of model that reported usage u cost, in µ$; the
// usage its prices could not price is counted by dimension, and warned of
// once per model and dimension (up to maxUnpricedWarnings).
func (t *priceTable) charge(model string, u llmapi.Usage) int64 {
	r, _ := t.lookup(model)
	n, missed := r.charge(u, t.searchFee)
	if missed == 0 {
		return n
	}
	for _, kind := range missed.Names() {
		if t.unpricedUsage != nil {
			t.unpricedUsage.WithLabelValues(t.zone, kind).Inc()
		}
		if t.firstWarning(t.warnedUsage, model+"\x00"+kind) {
			t.logger.Warn("a call reported usage its model's prices do not price: charged at the model's dearest rate (a web search at the dearest fee listed); add the price to the price line or table",
				zap.String("zone", t.zone), zap.String("model", model), zap.String("dimension", kind))
		}
	}
	return n
}

// rates reads the line's prices (defaults applied), or the first error.
func (p *Price) rates() (rates, error) {
	var r [8]int64
	for i, k := range priceKinds {
		v := *k.field(p)
		switch {
		case v != "":
			n, err := parseDollars(string(v))
			if err != nil {
				return rates{}, fmt.Errorf("%s: %w", k.name, err)
			}
			r[i] = n
		case i < 4 && (k.name == "cached" || k.name == "cache_write"):
			r[i] = -2 // the input price, below
		case i < 4:
			return rates{}, fmt.Errorf("needs an %s price (dollars per million tokens; 0 for none)", k.name)
		default:
			r[i] = llmprice.Unlisted
		}
	}
	for _, i := range []int{1, 2} {
		if r[i] == -2 {
			r[i] = r[0]
		}
	}
	sheet := llmprice.Blank()
	sheet[llmprice.Input], sheet[llmprice.Cached], sheet[llmprice.CacheWrite], sheet[llmprice.Output] = r[0], r[1], r[2], r[3]
	sheet[llmprice.CacheWrite1h], sheet[llmprice.AudioInput], sheet[llmprice.AudioOutput] = r[4], r[5], r[6]
	search := r[7]
	if search != llmprice.Unlisted {
		// Dollars per 1,000 searches, read as per million: pico-dollars
		// per 1,000 searches, a thousandth of that per search.
		search *= 1000
	}
	return rates{
		input: max(r[0], r[5]), cached: r[1], cacheWrite: max(r[2], r[4]), output: max(r[3], r[6]),
		dims: &llmprice.Prices{Tiers: []llmprice.Tier{{Service: llmprice.Standard, Sheet: sheet}}, WebSearch: search},
	}, nil
}

// globMatch reports whether s matches pattern, in which '*' matches any run
// of bytes and every other byte itself.
func globMatch(pattern, s string) bool {
	p, i := 0, 0
	star, mark := -1, 0
	for i < len(s) {
		switch {
		case p < len(pattern) && pattern[p] == '*':
			star, mark = p, i
			p++
		case p < len(pattern) && pattern[p] == s[i]:
			p++
			i++
		case star >= 0:
			p, mark = star+1, mark+1
			i = mark
		default:
			return false
		}
	}
	for p < len(pattern) && pattern[p] == '*' {
		p++
	}
	return p == len(pattern)
}

// shadows reports whether every model that later matches also matches
// earlier, as far as can be told simply: earlier is "*", or it matches
// later's text when later has no '*', or earlier is a prefix and '*' and
// later starts with that prefix. Such a later line could never match.
func shadows(earlier, later string) bool {
	earlier, later = strings.ToLower(earlier), strings.ToLower(later)
	if !strings.Contains(later, "*") {
		return globMatch(earlier, later)
	}
	prefix, ok := strings.CutSuffix(earlier, "*")
	return ok && !strings.Contains(prefix, "*") && strings.HasPrefix(later, prefix)
}

// The rules of prices, for JSON and the Caddyfile alike.

// checkPrices accepts lines of a pattern and prices of at least 0, none
// that an earlier line keeps from ever matching.
func checkPrices(prices []*Price) error {
	for i, p := range prices {
		if p == nil || p.Model == "" {
			return errors.New("price needs a model pattern and prices: price <model> input <$/M> output <$/M> (price gpt-4o* input 2.50 output 10)")
		}
		if _, err := p.rates(); err != nil {
			return fmt.Errorf("price %s: %w", p.Model, err)
		}
		for _, earlier := range prices[:i] {
			if shadows(earlier.Model, p.Model) {
				return fmt.Errorf("price %s can never match: the line before it, price %s, matches every model it does (the first match wins: put the narrower line first)", p.Model, earlier.Model)
			}
		}
	}
	return nil
}

// checkPricesSettled accepts prices only in a zone whose calls are read as
// LLM API calls: cost llm, which knows the model and the bounds to price,
// and settle llm, which knows the kinds of tokens used.
func checkPricesSettled(priced, costLLM, settleLLM bool) error {
	switch {
	case !priced:
		return nil
	case !settleLLM:
		return errors.New("price needs settle llm (and cost llm): a price turns the tokens of each kind that an LLM API reports into dollars, which only settle llm reads")
	case !costLLM:
		return errors.New("price needs cost llm (and settle llm): a priced call reserves the dollars its model and bounds may spend, which only cost llm reads")
	}
	return nil
}

// formatMicros writes µ$ as dollars, exactly: 12345678 is "12.345678",
// 2500000 is "2.5", 10000000 is "10".
func formatMicros(n int64) string {
	sign := ""
	if n < 0 {
		sign, n = "-", -n
	}
	whole, frac := n/1_000_000, n%1_000_000
	if frac == 0 {
		return sign + strconv.FormatInt(whole, 10)
	}
	f := strings.TrimRight(fmt.Sprintf("%06d", frac), "0")
	return sign + strconv.FormatInt(whole, 10) + "." + f
}
