package slidingratelimit

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/caddyserver/caddy/v2"
	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/llmapi"
	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/llmprice"
	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/strictnum"
)

// The LLM APIs' wire formats are internal/llmapi's: this file binds them to
// a zone's cost (cost llm) and settle (settle llm).

// CostLLM reserves, per request, the most an LLM API call can spend, read
// from its JSON body by the API its path names: OpenAI chat completions,
// completions and Responses (and the servers that speak them: vLLM,
// llama.cpp, Ollama's /v1), Anthropic Messages, Gemini generateContent and
// streamGenerateContent, Ollama's /api/chat and /api/generate, and Bedrock
// Converse and ConverseStream. The reservation is the call's output bound
// (max_tokens and its kin), times every multiplier the API has (n,
// best_of, candidateCount), plus the body's bytes (a text prompt has no
// more tokens than bytes). Keys match as the most lenient server matches
// them: Unicode simple case folding, and of keys given twice the largest.
// A path of none of these APIs takes every API's fields at once.
//
// The reader is a closed world: each media part adds the most its vendor
// bills for one (an image by URL as inline), a prompt list and a batch add
// up their requests, and what it cannot bound (input by reference: files,
// earlier responses, cached contents; hosted tools; a field, part type or
// path it does not know) takes the zone's policy: refused with 400 and
// words that say what could not be bounded, or, with a ceiling, reserved
// at the ceiling. With prices, a call whose server tools may search the
// web for a fee each also reserves the fees of the most searches its
// request allows (Anthropic's max_uses, the Responses API's
// max_tool_calls), and is refused, whatever the ceiling, when nothing in
// it bounds them.
//
// A body that does not arrive whole within 10 seconds is answered 408, and
// a body that is not one JSON value (trailing bytes, NaN, a comment) 400,
// without reaching the next handler, since a server that reads it more
// leniently could generate more than the limiter read
// (body_refusals_total). A body above 1 MiB is not read: it reserves the
// call's whole max_requests. A request without a body reserves 1.
type CostLLM struct {
	// Default is the output bound of a call that names none: it should be
	// the most the upstream generates for such a call. Default: 4096.
	Default int64 `json:"default,omitempty"`

	// Ceiling is what a call reserves, in tokens, when the limiter cannot
	// bound what it may spend (input by reference, a hosted tool, a field
	// it does not know): the most the operator lets such a call cost, say
	// the model's context window plus its output bound. Such a call then
	// pays its usage as any other; it can overrun the ceiling, by what it
	// uses beyond it. With prices, the ceiling is priced at the dearest
	// rate. 0 (the default): such a call is refused with 400
	// (body_refusals_total{reason="unbounded"}), unless CeilingModel is
	// set.
	Ceiling int64 `json:"ceiling,omitempty"`

	// CeilingModel reserves, for a call the limiter cannot bound, the
	// most its model can be billed as the zone's price table says: its
	// context window (max_input_tokens) once, and once more after each
	// search its request allows (each round of a server tool reads the
	// context again), plus its output limit (max_output_tokens, or the
	// call's smaller bound), at the dearest rates, plus the searches'
	// fees. Such a call is never billed more. A call of a model the table
	// gives no limits for, or that may read its context more often than
	// the request bounds (a server tool with no max_uses, a batch, a
	// field the limiter does not know), is refused as without a ceiling.
	// Needs price_table; Caddyfile: ceiling model. Default: false.
	CeilingModel bool `json:"ceiling_model,omitempty"`

	// Cap is the most one call reserves, in tokens, whatever its bounds
	// say: for agents that ask for 64k-128k output tokens and use a few
	// thousand, whose reservations would refuse them while little is
	// spent. A capped call still pays all it used, so a window can pass
	// its budget by at most the cap's shortfall, the most a call can use
	// beyond the cap, times the calls in flight; keep an inflight zone
	// beside it. With prices, the cap is priced as the call's output.
	// 0 (the default): no cap, a budget is never overshot.
	Cap int64 `json:"cap,omitempty"`
}

// defaultLLMOutput is cost llm's default output bound.
const defaultLLMOutput = 4096

// outputDefault is the default output bound, set or not.
func (c *CostLLM) outputDefault() int64 {
	if c.Default == 0 {
		return defaultLLMOutput
	}
	return c.Default
}

// of returns what r reserves under the call's max (budget), or the refusal
// of a body that cannot be priced: its tokens, or with prices its µ$; why
// is what could not be bounded, when the ceiling was reserved.
func (c *CostLLM) of(r *http.Request, budget int64, prices *priceTable) (n int64, why string, err error) {
	body := peekBody(r)
	switch body.why {
	case "":
	case costTooLarge:
		return budget, "", nil
	default:
		return 0, "", &bodyRefusal{reason: refusedSlow}
	}
	if len(body.data) == 0 {
		return 1, "", nil
	}
	call, err := llmapi.ReadRequest(r.URL.Path, body.data, c.outputDefault())
	if err != nil {
		return 0, "", &bodyRefusal{reason: refusedNotJSON}
	}
	if p, ok := r.Body.(*bodyPeek); ok {
		p.model, p.modelRead = call.Model, true
		p.output = max(p.output, call.Output)
		if !call.API.ReportsSearches() {
			p.searches = max(p.searches, call.Searches)
		}
	}
	if call.Unbounded != "" || prices != nil && call.SearchesUnbounded != "" {
		return c.ofUnbounded(call, prices)
	}
	if prices != nil {
		input, output := call.Input+call.Media, call.Output
		if limit, ok := prices.outputLimit(call.Model); ok && (!call.Named || call.Bound > limit) {
			// The model generates no more than its limit, whatever the
			// call names: a call that names none, or more, reserves it.
			output = min(strictnum.Max, limit*call.Completions+call.Batch)
		}
		if c.Cap > 0 && input+output > c.Cap {
			input, output = 0, c.Cap
		}
		return max(prices.of(call.Model).reserve(input, output), 1), "", nil
	}
	if c.Cap > 0 {
		return max(min(call.Reserve, c.Cap), 1), "", nil
	}
	return min(max(call.Reserve, 1), strictnum.Max), "", nil
}

// ofUnbounded is what a call reserves that the reader could not bound: the
// ceiling, and with prices the fees of the most searches the call allows;
// or its refusal. A ceiling bounds tokens, never fees: with prices, a call
// whose searches nothing bounds is refused whatever the ceiling, since no
// count reserved for it could hold its bill.
func (c *CostLLM) ofUnbounded(call llmapi.Request, prices *priceTable) (n int64, why string, err error) {
	refuse := func(why string) (int64, string, error) {
		return 0, "", &bodyRefusal{reason: refusedUnbounded, why: why}
	}
	switch {
	case call.Unbounded != "" && c.Ceiling == 0 && !c.CeilingModel:
		return refuse(call.Unbounded)
	case prices != nil && call.SearchesUnbounded != "":
		return refuse(call.SearchesUnbounded)
	}
	var fees llmprice.Sum
	if prices != nil {
		fees.Add(call.Searches, prices.searchFeeOf(call.Model))
	}
	if c.CeilingModel {
		window, limit, ok := prices.window(call.Model)
		switch {
		case !ok:
			return refuse(fmt.Sprintf("%s; and the price table gives no context window and output limit for the model %q, which ceiling model reserves", call.Unbounded, call.Model))
		case call.Passes == 0:
			return refuse(call.Unbounded + "; and the call may read its context more often than the request bounds, so its model's context window does not bound it")
		}
		output := limit
		if call.Named {
			output = min(output, call.Bound)
		}
		// Each read of the context (once, and once after each search)
		// is at most the context window.
		input := mulSat(window, call.Passes)
		return max(addSat(prices.of(call.Model).reserve(input, mulSat(output, call.Completions)), fees.Micros()), 1), call.Unbounded, nil
	}
	tokens := max(call.Reserve, c.Ceiling)
	if prices != nil {
		return max(addSat(prices.of(call.Model).reserveDearest(tokens), fees.Micros()), 1), call.Unbounded, nil
	}
	return tokens, call.Unbounded, nil
}

// requestSearches is the most searches r's server tools may bill, as cost
// llm read them, when its API's usage does not report the searches made:
// what a settle charges for them.
func requestSearches(r *http.Request) int64 {
	if p, ok := r.Body.(*bodyPeek); ok && p.modelRead {
		return p.searches
	}
	return 0
}

// addSat and mulSat are a + b and a × b, at most strictnum.Max, for
// numbers from 0 to strictnum.Max.
func addSat(a, b int64) int64 { return min(a+b, strictnum.Max) }

func mulSat(a, b int64) int64 {
	if a == 0 || b <= strictnum.Max/a {
		return min(a*b, strictnum.Max)
	}
	return strictnum.Max
}

// modelPlaceholder is the model a request names: its body's "model", or
// the path's for Gemini and Bedrock (noModel when it names none), for a
// zone's key and matchers, and for the handlers after.
const modelPlaceholder = "http.sliding_ratelimit.model"

// noModel is the model placeholder of a request that names none: a value
// of its own, never a named model's.
const noModel = "(none)"

// modelProvider gives r's model placeholder, reading its body ahead (as
// cost llm does, once for both) only when a key, a matcher or a handler
// asks for it.
func modelProvider(r *http.Request) caddy.ReplacerFunc {
	return func(key string) (any, bool) {
		if key != modelPlaceholder {
			return nil, false
		}
		if p, ok := r.Body.(*bodyPeek); ok && p.modelRead {
			return orNoModel(p.model), true
		}
		body := peekBody(r)
		call, _ := llmapi.ReadRequest(r.URL.Path, body.data, 1)
		if p, ok := r.Body.(*bodyPeek); ok {
			p.model, p.modelRead = call.Model, true
		}
		return orNoModel(call.Model), true
	}
}

func orNoModel(model string) string {
	if model == "" {
		return noModel
	}
	return model
}

// requestModel is the model that r names, as cost llm read it (its body's
// "model", Gemini's and Bedrock's path), for the settle to price the usage
// of the same model as the reservation did.
func requestModel(r *http.Request) string {
	if p, ok := r.Body.(*bodyPeek); ok && p.modelRead {
		return p.model
	}
	// No body was read (none sent): only a path can name the model.
	call, _ := llmapi.ReadRequest(r.URL.Path, nil, 0)
	return call.Model
}

// checkCostLLM accepts a default of 0 (4096) or from 1 to strictnum.Max,
// and one cost setting.
func checkCostLLM(c *CostLLM, cost string, costJSON bool) error {
	switch {
	case c == nil:
		return nil
	case cost != "":
		return fmt.Errorf("cost and cost llm are one setting: set one (cost %q)", cost)
	case costJSON:
		return errors.New("cost json and cost llm are one setting: set one")
	case c.Default < 0 || c.Default > strictnum.Max:
		return fmt.Errorf("cost llm: the default output bound must be a whole number of at least 1, got %d", c.Default)
	case c.Ceiling < 0 || c.Ceiling > strictnum.Max:
		return fmt.Errorf("cost llm: the ceiling must be a whole number of at least 1 (cost llm 4096 ceiling 200000), got %d", c.Ceiling)
	case c.Cap < 0 || c.Cap > strictnum.Max:
		return fmt.Errorf("cost llm: the cap must be a whole number of at least 1 (cost llm 4096 cap 32000), got %d", c.Cap)
	case c.CeilingModel && c.Ceiling > 0:
		return fmt.Errorf("cost llm: ceiling model and ceiling %d are one setting: give one", c.Ceiling)
	case c.CeilingModel && c.Cap > 0:
		return errors.New("cost llm: ceiling model reserves what a model's context window allows, above any cap: give ceiling model or cap")
	case c.Cap > 0 && c.Ceiling > c.Cap:
		return fmt.Errorf("cost llm: the ceiling %d is above the cap %d, which every call's reservation stays within: give one or the other", c.Ceiling, c.Cap)
	}
	return nil
}

// checkCeilingModel accepts ceiling model only beside a price table, which
// gives the models' context windows.
func checkCeilingModel(c *CostLLM, priceTable string) error {
	if c != nil && c.CeilingModel && priceTable == "" {
		return errors.New("cost llm: ceiling model reserves a model's context window, which only a price_table gives: add price_table <file>, or give a ceiling in tokens")
	}
	return nil
}

// checkCostLLMFits rejects a default above a fixed max_requests: no call
// that names no output bound would ever be admitted.
func checkCostLLMFits(c *CostLLM, maxRequests int64, maxRequestsFrom string) error {
	if c != nil && maxRequestsFrom == "" && c.outputDefault() > maxRequests {
		return fmt.Errorf("cost llm: the default output bound %d is above max_requests %d: no call that names no max_tokens would ever be admitted (give a smaller default: cost llm 1024)", c.outputDefault(), maxRequests)
	}
	if c != nil && maxRequestsFrom == "" && c.Ceiling > maxRequests {
		return fmt.Errorf("cost llm: the ceiling %d is above max_requests %d: no call that it covers would ever be admitted (give a smaller ceiling, or none to refuse such calls)", c.Ceiling, maxRequests)
	}
	return nil
}
