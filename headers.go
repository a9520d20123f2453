package slidingratelimit

import (
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/llmapi"
	"github.com/slidingratelimit/caddy-sliding-ratelimit/limiter"
)

// prepareHeaders precomputes the zone's parts of the headers and
// placeholders, which are the same for every request.
func (z *Zone) prepareHeaders() {
	z.maxText = strconv.FormatInt(z.MaxRequests, 10)
	z.quotedName = strconv.Quote(z.Name)
	if z.limit.Algorithm == limiter.Concurrency {
		z.maxText = strconv.FormatInt(z.Concurrent, 10)
	}
	z.policy = z.policyItem(z.maxText)
}

// policyItem is the zone's RateLimit-Policy item for a call whose max is
// maxText, in the zone's units: the draft's quota-unit parameter qu where
// the draft has a value for the unit ("content-bytes",
// "concurrent-requests"), none for requests (its default), and for the
// units it has no value for (tokens, a cost) the vendor-prefixed parameter
// srl-qu="units", and for a priced zone srl-qu="usd-micros" (millionths of
// a US dollar), as the draft asks of other units: a client that knows
// only the draft's reads requests, and the policy's name says what q
// counts. Requests in flight have no window; a period's window is the
// length of the period that holds now.
func (z *Zone) policyItem(maxText string) string {
	item := z.quotedName + ";q=" + maxText
	switch z.unit() {
	case unitConcurrentRequests:
		return item + `;qu="concurrent-requests"`
	case unitContentBytes:
		item += `;qu="content-bytes"`
	case unitUnits:
		item += `;srl-qu="units"`
	case unitUSDMicros:
		// Money, which the draft has no unit for either.
		item += `;srl-qu="usd-micros"`
	}
	window := z.limit.Window
	if z.period != nil {
		s := z.period.at(periodNow())
		window = s.end.Sub(s.start)
	}
	return item + ";w=" + strconv.FormatInt(ceilSeconds(window), 10)
}

// unread is the Remaining of a zone whose state a decision did not read:
// the other zones of a request denied without a store call (by the deny
// cache, or for a cost above a zone's max). Its RateLimit item is left
// out: a figure remembered from an earlier call would be a guess, since
// other requests and instances spend the zone meanwhile, and r=0;t=0 would
// tell the client the zone is spent.
const unread = -1

// maxOf is the text of a call's max, precomputed for the zone's own.
func (z *Zone) maxOf(max int64) string {
	if max == z.limit.Max {
		return z.maxText
	}
	return strconv.FormatInt(max, 10)
}

// policyOf is the RateLimit-Policy item of zone z in a call with check c:
// precomputed unless the call has a max of its own (a tenant's quota) or
// the zone a period, whose length changes.
func policyOf(z *Zone, c limiter.Check) string {
	if c.Limit.Max == z.limit.Max && z.period == nil {
		return z.policy
	}
	return z.policyItem(z.maxOf(c.Limit.Max))
}

// writeHeaders sets the rate-limit headers of a decision
// (draft-ietf-httpapi-ratelimit-headers-11), in each zone's units:
//
//	RateLimit-Policy: "<zone>";q=<max>[;qu="<unit>"];w=<window seconds>, ... (every zone applied)
//	RateLimit: "<zone>";r=<remaining>;t=<seconds until units free>[;srl-warn], ... (every zone applied whose state was read, the shown one first)
//
// and with mode legacy also X-RateLimit-Limit, X-RateLimit-Remaining and
// X-RateLimit-Reset (seconds) of the shown zone, the most restrictive. The
// RateLimit items after the first go nearest their limit first (the least
// left of their max), so that a client of several budgets (tokens, calls,
// requests in flight) sees each, the tightest first. It runs on every
// request: the values share one backing array, and the RateLimit field is
// built in one allocation.
func writeHeaders(h http.Header, mode string, zones []*Zone, checks []limiter.Check, decisions []limiter.Decision, shown int) {
	if mode == headersOff {
		return
	}
	policy := policyOf(zones[0], checks[0])
	if len(zones) > 1 {
		items := make([]string, len(zones))
		for i, z := range zones {
			items[i] = policyOf(z, checks[i])
		}
		policy = strings.Join(items, ", ")
	}
	z, d := zones[shown], decisions[shown]
	var buf [96 * maxInlineZones]byte
	// The most restrictive decision admits only when every zone does.
	admitted := d.Allowed
	item := appendRateLimitItem(buf[:0], z, checks[shown], d, admitted)
	if len(zones) > 1 {
		var orderBuf [maxInlineZones]int
		for _, i := range nearestFirst(orderBuf[:0], checks, decisions, shown) {
			item = append(item, ", "...)
			item = appendRateLimitItem(item, zones[i], checks[i], decisions[i], admitted)
		}
	}
	if mode != headersLegacy {
		values := make([]string, 2)
		values[0], values[1] = policy, string(item)
		// Full slice expressions: an append to one header never writes
		// into the other's value.
		h["Ratelimit-Policy"], h["Ratelimit"] = values[0:1:1], values[1:2:2]
		return
	}
	values := make([]string, 5)
	values[0], values[1] = policy, string(item)
	values[2] = z.maxOf(checks[shown].Limit.Max)
	values[3] = strconv.FormatInt(d.Remaining, 10)
	values[4] = formatSeconds(d.Reset)
	h["Ratelimit-Policy"], h["Ratelimit"] = values[0:1:1], values[1:2:2]
	h["X-Ratelimit-Limit"], h["X-Ratelimit-Remaining"], h["X-Ratelimit-Reset"] = values[2:3:3], values[3:4:4], values[4:5:5]
}

// readsLLM reports whether the zone reads its calls as an LLM API's (cost
// llm): its units are then the API's tokens, and its answers speak the
// API's words.
func (z *Zone) readsLLM() bool {
	return z.units != nil && z.units.cost.llm != nil
}

// llmRoute returns the API a request's path names (llmapi.Detect, Unknown
// for a path it does not know), with ok set when one of the request's
// zones reads an LLM API.
func llmRoute(r *http.Request, zones []*Zone) (api llmapi.API, ok bool) {
	for _, z := range zones {
		if z.readsLLM() {
			return llmapi.Detect(r.URL.EscapedPath()), true
		}
	}
	return llmapi.Unknown, false
}

// writeSDKHeaders sets, on a route whose zones read an LLM API, the limit
// headers its vendor's clients read, from the figures of the RateLimit
// header: for requests, the zone counting requests with the fewest left;
// for tokens, the zone with cost llm (and no prices: µ$ are not tokens)
// with the fewest left. OpenAI's APIs get
//
//	x-ratelimit-limit-requests, x-ratelimit-remaining-requests, x-ratelimit-reset-requests (a duration: "1s", "6m0s")
//	x-ratelimit-limit-tokens, x-ratelimit-remaining-tokens, x-ratelimit-reset-tokens
//
// and Anthropic's
//
//	anthropic-ratelimit-requests-limit, -remaining, -reset (RFC 3339, UTC)
//	anthropic-ratelimit-tokens-limit, -remaining, -reset
//
// where reset is when room frees, as RateLimit's t says, rounded up to the
// second. A zone whose state the decision did not read is left out; with
// headers off there are none.
func writeSDKHeaders(h http.Header, mode string, r *http.Request, zones []*Zone, checks []limiter.Check, decisions []limiter.Decision) {
	if mode == headersOff {
		return
	}
	api, ok := llmRoute(r, zones)
	if !ok {
		return
	}
	var names *[2][3]string
	switch api {
	case llmapi.OpenAIChat, llmapi.OpenAICompletions, llmapi.OpenAIResponses:
		names = &openAILimitHeaders
	case llmapi.AnthropicMessages, llmapi.AnthropicCountTokens:
		names = &anthropicLimitHeaders
	default:
		return
	}
	requests, tokens := -1, -1
	for i, z := range zones {
		d := decisions[i]
		if d.Remaining == unread || z.limit.Algorithm == limiter.Concurrency {
			continue
		}
		switch {
		case z.unit() == unitRequests && (requests < 0 || d.Remaining < decisions[requests].Remaining):
			requests = i
		case z.readsLLM() && z.unit() == unitUnits && (tokens < 0 || d.Remaining < decisions[tokens].Remaining):
			tokens = i
		}
	}
	for kind, i := range [2]int{requests, tokens} {
		if i < 0 {
			continue
		}
		d := decisions[i]
		resetText := (time.Duration(ceilSeconds(d.Reset)) * time.Second).String()
		if names == &anthropicLimitHeaders {
			// The instant rounded up: a client that waits for it is never
			// early.
			resetText = time.Now().Add(d.Reset + time.Second - 1).Truncate(time.Second).UTC().Format(time.RFC3339)
		}
		h[names[kind][0]] = []string{zones[i].maxOf(checks[i].Limit.Max)}
		h[names[kind][1]] = []string{strconv.FormatInt(max(d.Remaining, 0), 10)}
		h[names[kind][2]] = []string{resetText}
	}
}

// The limit headers of the vendors' APIs, canonical: for requests, then
// for tokens, the limit, remaining and reset.
var (
	openAILimitHeaders = [2][3]string{
		{"X-Ratelimit-Limit-Requests", "X-Ratelimit-Remaining-Requests", "X-Ratelimit-Reset-Requests"},
		{"X-Ratelimit-Limit-Tokens", "X-Ratelimit-Remaining-Tokens", "X-Ratelimit-Reset-Tokens"},
	}
	anthropicLimitHeaders = [2][3]string{
		{"Anthropic-Ratelimit-Requests-Limit", "Anthropic-Ratelimit-Requests-Remaining", "Anthropic-Ratelimit-Requests-Reset"},
		{"Anthropic-Ratelimit-Tokens-Limit", "Anthropic-Ratelimit-Tokens-Remaining", "Anthropic-Ratelimit-Tokens-Reset"},
	}
)

// appendRateLimitItem appends zone z's RateLimit item for decision d of
// check c, with warnParam when the request was admitted and its client has
// reached the zone's soft limit.
func appendRateLimitItem(item []byte, z *Zone, c limiter.Check, d limiter.Decision, admitted bool) []byte {
	item = append(item, z.quotedName...)
	item = append(item, ";r="...)
	item = strconv.AppendInt(item, d.Remaining, 10)
	if z.limit.Algorithm != limiter.Concurrency {
		// A slot in flight frees when a request ends: no time to say.
		item = append(item, ";t="...)
		item = strconv.AppendInt(item, ceilSeconds(d.Reset), 10)
	}
	if admitted && z.warns(c, d) {
		item = append(item, warnParam...)
	}
	return item
}

// nearestFirst appends to order the indexes of the zones but shown and
// those unread, the least left of their max first (a tie keeps the
// config's order).
func nearestFirst(order []int, checks []limiter.Check, decisions []limiter.Decision, shown int) []int {
	left := func(i int) float64 {
		return float64(decisions[i].Remaining) / float64(max(checks[i].Limit.Max, 1))
	}
	for i := range checks {
		if i == shown || decisions[i].Remaining == unread {
			continue
		}
		// Insertion: a request has a few zones.
		at := len(order)
		for at > 0 && left(order[at-1]) > left(i) {
			at--
		}
		order = append(order, 0)
		copy(order[at+1:], order[at:])
		order[at] = i
	}
	return order
}

// ceilSeconds rounds d up to whole seconds: a client that waits the rounded
// time is never early. A positive duration is at least one second.
func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}

func formatSeconds(d time.Duration) string {
	return strconv.FormatInt(ceilSeconds(d), 10)
}

// setPlaceholders exposes a decision as {http.sliding_ratelimit.*}, for
// handle_errors and logs. The values are formatted only if a placeholder is
// used; a later decision on the same request (a second handler) replaces
// the earlier one. The request's provider is found through its vars, a map
// lookup, rather than through the replacer, which asks every provider.
func setPlaceholders(r *http.Request, repl *caddy.Replacer, z *Zone, c limiter.Check, d limiter.Decision) {
	vars, _ := r.Context().Value(caddyhttp.VarsCtxKey).(map[string]any)
	if vars == nil {
		// Not a request Caddy's server prepared; keep the provider in the
		// replacer itself.
		if v, ok := repl.Get(placeholdersVar); ok {
			vars = v.(map[string]any)
		} else {
			vars = make(map[string]any, 1)
			repl.Set(placeholdersVar, vars)
		}
	}
	if p, ok := vars[placeholdersVar].(*decisionPlaceholders); ok {
		p.zone, p.max, p.cost, p.decision = z, c.Limit.Max, c.Cost, d
		return
	}
	p := &decisionPlaceholders{zone: z, max: c.Limit.Max, cost: c.Cost, decision: d}
	vars[placeholdersVar] = p
	repl.Map(p.replace)
}

// placeholdersVar holds a request's decisionPlaceholders in its vars.
const placeholdersVar = "sliding_ratelimit.decision"

type decisionPlaceholders struct {
	zone *Zone
	// max and cost are the call's.
	max, cost int64
	decision  limiter.Decision
}

// String keeps the decision readable where vars are printed.
func (p *decisionPlaceholders) String() string {
	return p.zone.Name + " remaining " + strconv.FormatInt(p.decision.Remaining, 10)
}

func (p *decisionPlaceholders) replace(key string) (any, bool) {
	name, ok := strings.CutPrefix(key, "http.sliding_ratelimit.")
	if !ok {
		return nil, false
	}
	switch name {
	case "zone":
		return p.zone.Name, true
	case "limit":
		return p.zone.maxOf(p.max), true
	case "unit":
		return p.zone.unit(), true
	case "cost":
		return max(p.cost, 1), true
	case "remaining":
		return p.decision.Remaining, true
	case "retry_after":
		return ceilSeconds(p.decision.RetryAfter), true
	case "reset":
		return ceilSeconds(p.decision.Reset), true
	}
	return nil, false
}
