package slidingratelimit

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/llmapi"
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
// of a body that cannot be priced: its tokens, or with prices its µ$.
func (c *CostLLM) of(r *http.Request, budget int64, prices *priceTable) (int64, error) {
	body := peekBody(r)
	switch body.why {
	case "":
	case costTooLarge:
		return budget, nil
	default:
		return 0, &bodyRefusal{reason: refusedSlow}
	}
	if len(body.data) == 0 {
		return 1, nil
	}
	call, err := llmapi.ReadRequest(r.URL.Path, body.data, c.outputDefault())
	if err != nil {
		return 0, &bodyRefusal{reason: refusedNotJSON}
	}
	if p, ok := r.Body.(*bodyPeek); ok {
		p.model, p.modelRead = call.Model, true
		p.output = max(p.output, call.Output)
	}
	if prices != nil {
		return max(prices.of(call.Model).reserve(call.Input, call.Output), 1), nil
	}
	return min(max(call.Reserve, 1), strictnum.Max), nil
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
	}
	return nil
}

// checkCostLLMFits rejects a default above a fixed max_requests: no call
// that names no output bound would ever be admitted.
func checkCostLLMFits(c *CostLLM, maxRequests int64, maxRequestsFrom string) error {
	if c != nil && maxRequestsFrom == "" && c.outputDefault() > maxRequests {
		return fmt.Errorf("cost llm: the default output bound %d is above max_requests %d: no call that names no max_tokens would ever be admitted (give a smaller default: cost llm 1024)", c.outputDefault(), maxRequests)
	}
	return nil
}
