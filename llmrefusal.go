package slidingratelimit

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/llmapi"
	"github.com/slidingratelimit/caddy-sliding-ratelimit/limiter"
)

// A denial on a route whose zones read an LLM API (cost llm) answers as
// that API answers its own rate limits, so that the vendor's SDK raises its
// own rate-limit error (OpenAI's and Anthropic's RateLimitError, Gemini's
// RESOURCE_EXHAUSTED, Bedrock's ThrottlingException) and knows whether a
// retry can help: OpenAI's and Anthropic's SDKs obey x-should-retry, and
// prefer retry-after-ms to Retry-After. The API is the one the request's
// path names (llmapi.Detect); a path it does not know gets the bare 429.

// sdkSleepBound is the longest wait a denial lets an SDK sleep out. Above
// it the answer says x-should-retry: false, and OpenAI's error type says
// the quota is spent. The OpenAI and Anthropic Python SDKs obey a
// Retry-After only up to 60 s (longer, they back off a second or so and
// try again), while their Node SDKs sleep whatever it says, a day's budget
// included; 60 s is the wait both already treat as worth sleeping, and a
// budget of a day or a month, the one a client cannot outwait, is far
// above it.
const sdkSleepBound = 60 * time.Second

// llmRefusal is a denial as an LLM API's SDK reads it.
type llmRefusal struct {
	api   llmapi.API
	zone  *Zone
	check limiter.Check
	d     limiter.Decision
}

// llmRefusalOf returns the refusal of a request denied by zone z (the one
// the headers show) with check c and decision d, when one of its zones
// reads an LLM API; ok is false otherwise.
func llmRefusalOf(r *http.Request, zones []*Zone, z *Zone, c limiter.Check, d limiter.Decision) (f llmRefusal, ok bool) {
	api, ok := llmRoute(r, zones)
	return llmRefusal{api: api, zone: z, check: c, d: d}, ok
}

// hopeless reports whether a client should not retry: no wait admits the
// request, or the wait is longer than a client should sleep.
func (f llmRefusal) hopeless() bool {
	return f.d.Never || f.d.RetryAfter > sdkSleepBound
}

// setRetryHeaders sets what the SDKs read to decide on a retry, beside
// Retry-After: retry-after-ms, the wait in milliseconds (rounded up, as
// Retry-After is to seconds), and x-should-retry: false when a retry
// cannot help. A short wait says nothing of x-should-retry: the SDKs retry
// a 429 by default.
func (f llmRefusal) setRetryHeaders(h http.Header) {
	if !f.d.Never {
		h["Retry-After-Ms"] = []string{strconv.FormatInt(int64((f.d.RetryAfter+time.Millisecond-1)/time.Millisecond), 10)}
	}
	if f.hopeless() {
		h["X-Should-Retry"] = []string{"false"}
	}
}

// write answers the 429 with the API's own error body; an API this does
// not know gets the bare status.
func (f llmRefusal) write(w http.ResponseWriter) {
	body := f.body()
	if body == nil {
		w.WriteHeader(http.StatusTooManyRequests)
		return
	}
	h := w.Header()
	h["Content-Type"] = []string{"application/json"}
	if f.api == llmapi.BedrockConverse {
		// What AWS's SDKs read an error's type from (restJson1).
		h["X-Amzn-Errortype"] = []string{"ThrottlingException"}
	}
	w.WriteHeader(http.StatusTooManyRequests)
	_, _ = w.Write(body)
}

// body is the API's error document (each vendor's reference for a 429),
// nil for an API without one here.
func (f llmRefusal) body() []byte {
	msg := f.message()
	var doc any
	switch f.api {
	case llmapi.OpenAIChat, llmapi.OpenAICompletions, llmapi.OpenAIResponses:
		// OpenAI's two 429s: a rate limit (type the kind of limit, code
		// rate_limit_exceeded), and a spent quota (type and code
		// insufficient_quota), which its docs say no retry lifts.
		typ, code := "tokens", "rate_limit_exceeded"
		if u := f.zone.unit(); u == unitRequests || u == unitConcurrentRequests {
			typ = "requests"
		}
		if f.d.RetryAfter > sdkSleepBound {
			typ, code = "insufficient_quota", "insufficient_quota"
		}
		doc = map[string]any{"error": map[string]any{"message": msg, "type": typ, "param": nil, "code": code}}
	case llmapi.AnthropicMessages, llmapi.AnthropicCountTokens:
		doc = map[string]any{"type": "error", "error": map[string]any{"type": "rate_limit_error", "message": msg}}
	case llmapi.Gemini:
		// google.rpc.Status, as Google's APIs answer errors.
		doc = map[string]any{"error": map[string]any{"code": http.StatusTooManyRequests, "message": msg, "status": "RESOURCE_EXHAUSTED"}}
	case llmapi.Ollama:
		doc = map[string]any{"error": msg}
	case llmapi.BedrockConverse:
		doc = map[string]any{"message": msg}
	default:
		return nil
	}
	body, _ := json.Marshal(doc)
	return body
}

// message says which limit denied the call and when it may pass, in the
// zone's units.
func (f llmRefusal) message() string {
	z, c, d := f.zone, f.check, f.d
	unit := z.unit()
	if z.readsLLM() && unit == unitUnits {
		unit = "tokens"
	}
	per := "per " + (time.Duration(ceilSeconds(z.limit.Window)) * time.Second).String()
	if z.limit.Algorithm == limiter.Concurrency {
		per = "at once"
	}
	limit := fmt.Sprintf("zone %q allows %d %s %s", z.Name, c.Limit.Max, unit, per)
	wait := (time.Duration(ceilSeconds(d.RetryAfter)) * time.Second).String()
	switch {
	case d.Never:
		return fmt.Sprintf("Request too large: it may cost %d %s, and %s.", c.Cost, unit, limit)
	case d.RetryAfter > sdkSleepBound:
		return fmt.Sprintf("Budget spent: %s. It has room again in %s.", limit, wait)
	}
	return fmt.Sprintf("Rate limit reached: %s. Try again in %s.", limit, wait)
}
