package slidingratelimit

import (
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
// the quota is spent. The OpenAI and Anthropic Python SDKs and OpenAI's
// Node SDK 7 obey a Retry-After only up to 60 s (longer, they back off a
// second or so and try again, in vain), while OpenAI's Node SDK 6 and
// Anthropic's 1.x sleep whatever it says, a day's budget included: 60 s is
// the wait the vendors already treat as worth sleeping, and a budget of a
// day or a month, the one a client cannot outwait, is far above it.
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
// Retry-After: retry-after-ms, the wait in milliseconds (rounded up, never
// 0, as Retry-After is to seconds: OpenAI's Node SDK 7 retries a 0 at
// once), and x-should-retry: false when a retry cannot help. A short wait
// says nothing of x-should-retry: the SDKs retry a 429 by default.
func (f llmRefusal) setRetryHeaders(h http.Header) {
	if !f.d.Never {
		ms := max((f.d.RetryAfter+time.Millisecond-1)/time.Millisecond, 1)
		h["Retry-After-Ms"] = []string{strconv.FormatInt(int64(ms), 10)}
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
// nil for an API without one here. It is built by appending, as the
// RateLimit header is: a flood of refused calls pays for it on each.
func (f llmRefusal) body() []byte {
	b := make([]byte, 0, 320)
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
		b = append(b, `{"error":{"message":`...)
		b = f.appendMessage(b)
		b = append(b, `,"type":"`+typ+`","param":null,"code":"`+code+`"}}`...)
	case llmapi.AnthropicMessages, llmapi.AnthropicCountTokens:
		b = append(b, `{"type":"error","error":{"type":"rate_limit_error","message":`...)
		b = f.appendMessage(b)
		b = append(b, "}}"...)
	case llmapi.Gemini:
		// google.rpc.Status, as Google's APIs answer errors.
		b = append(b, `{"error":{"code":429,"message":`...)
		b = f.appendMessage(b)
		b = append(b, `,"status":"RESOURCE_EXHAUSTED"}}`...)
	case llmapi.Ollama:
		b = append(b, `{"error":`...)
		b = f.appendMessage(b)
		b = append(b, '}')
	case llmapi.BedrockConverse:
		b = append(b, `{"message":`...)
		b = f.appendMessage(b)
		b = append(b, '}')
	default:
		return nil
	}
	return b
}

// appendMessage appends, as a JSON string, which limit denied the call and
// when it may pass, in the zone's units:
//
//	Rate limit reached: zone "calls" allows 60 requests per 1m0s. Try again in 12s.
//	Budget spent: zone "tokens" allows 100000 tokens per 24h0m0s. It has room again in 23h49m33s.
//	Request too large: it may cost 150000 tokens, and zone "tokens" allows 100000 tokens per 1m0s.
func (f llmRefusal) appendMessage(b []byte) []byte {
	z, c, d := f.zone, f.check, f.d
	unit := z.unit()
	if z.readsLLM() && unit == unitUnits {
		unit = "tokens"
	}
	b = append(b, '"')
	switch {
	case d.Never:
		b = append(b, "Request too large: it may cost "...)
		b = strconv.AppendInt(b, c.Cost, 10)
		b = append(b, " "+unit+", and "...)
	case d.RetryAfter > sdkSleepBound:
		b = append(b, "Budget spent: "...)
	default:
		b = append(b, "Rate limit reached: "...)
	}
	// A zone's name is letters, digits, '_', '-' and '.' (checkZoneName):
	// nothing in it needs escaping.
	b = append(b, `zone \"`+z.Name+`\" allows `...)
	b = strconv.AppendInt(b, c.Limit.Max, 10)
	b = append(b, " "+unit+" "...)
	if z.limit.Algorithm == limiter.Concurrency {
		b = append(b, "at once"...)
	} else {
		b = append(b, "per "+(time.Duration(ceilSeconds(z.limit.Window))*time.Second).String()...)
	}
	wait := (time.Duration(ceilSeconds(d.RetryAfter)) * time.Second).String()
	switch {
	case d.Never:
		b = append(b, '.')
	case d.RetryAfter > sdkSleepBound:
		b = append(b, ". It has room again in "+wait+"."...)
	default:
		b = append(b, ". Try again in "+wait+"."...)
	}
	return append(b, '"')
}
