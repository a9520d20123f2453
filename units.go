package slidingratelimit

import (
	"bytes"
	"errors"
	"fmt"
	"net/http"
	"net/textproto"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/clientkey"
	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/jsonusage"
	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/llmapi"
	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/llmprice"
	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/strictnum"
	"github.com/slidingratelimit/caddy-sliding-ratelimit/limiter"
)

// The units a zone counts in, as headers, placeholders and the admin API
// name them.
const (
	// unitRequests: one per request, the default.
	unitRequests = "requests"
	// unitContentBytes: the bytes of response bodies (settle bytes).
	unitContentBytes = "content-bytes"
	// unitUnits: what requests say they cost (cost) or what their
	// responses report (settle header): tokens, a query's complexity.
	unitUnits = "units"
	// unitConcurrentRequests: requests in flight (a concurrency zone).
	unitConcurrentRequests = "concurrent-requests"
)

// zoneUnits is what a zone needs per request when a request is not simply
// one of max_requests: a cost, a quota per tenant, a settle. A zone with
// none of them has none (Zone.units is nil), and its requests pay for none
// of this.
type zoneUnits struct {
	cost zoneCost
	// quota is nil when the zone's max_requests holds for every client.
	quota *zoneQuota
	// settle is nil when a request's reservation stands (but for
	// count_status).
	settle *Settle
	// settleSource names what settle reads, in logs.
	settleSource string
	unit         string
	// admitted counts the units the zone admitted: each request's final
	// cost.
	admitted        prometheus.Counter
	settleFallbacks *valueFallbacks
}

// newZoneUnits returns what zone needs per request for its config values
// cost or costJSON, maxRequestsFrom (with the fallback maxRequests) and settle, nil when
// they are all empty; it binds their metrics.
func newZoneUnits(zone, cost string, costJSON *CostJSON, costLLM *CostLLM, maxRequestsFrom string, maxRequests int64, settle *Settle, logger *zap.Logger) *zoneUnits {
	if cost == "" && costJSON == nil && costLLM == nil && maxRequestsFrom == "" && settle == nil {
		return nil
	}
	m := &limiterMetrics
	msg := "cost is not a whole number of at least 1: the request reserves 1"
	switch {
	case costJSON != nil:
		msg = "cost json found no usable body: the request reserves the default"
	case costLLM != nil:
		msg = "cost llm cannot bound what a call may spend: it reserves the zone's ceiling"
	}
	u := &zoneUnits{
		cost:     newZoneCost(cost, costJSON, costLLM, newValueFallbacks(logger, zone, msg, m.costFallbacks.WithLabelValues(zone))),
		settle:   settle,
		unit:     unitRequests,
		admitted: m.unitsAdmitted.WithLabelValues(zone),
	}
	// Validate rejects a value that is no placeholder; until then it is
	// left out.
	if isPlaceholder(maxRequestsFrom) {
		u.quota = &zoneQuota{
			from:      parseNumberPlaceholder(maxRequestsFrom),
			fallback:  maxRequests,
			fallbacks: newValueFallbacks(logger, zone, "max_requests placeholder gave no whole number from 1 to 2^48-1: the fallback applies", m.quotaFallbacks.WithLabelValues(zone)),
		}
	}
	u.cost.refusals = [len(refusalReasons)]prometheus.Counter{
		m.bodyRefusals.WithLabelValues(zone, refusalReasons[refusedSlow]),
		m.bodyRefusals.WithLabelValues(zone, refusalReasons[refusedNotJSON]),
		m.bodyRefusals.WithLabelValues(zone, refusalReasons[refusedUnbounded]),
	}
	if u.cost.from != nil || u.cost.json != nil || u.cost.llm != nil || u.cost.fixed > 1 {
		u.unit = unitUnits
	}
	if settle != nil {
		settle.provision()
		u.unit, u.settleSource = unitUnits, "header "+settle.Header
		if settle.Bytes {
			u.unit, u.settleSource = unitContentBytes, "response bytes"
		}
		if len(settle.JSON) > 0 {
			u.settleSource = "json " + strings.Join(settle.JSON, " ")
		}
		if settle.LLM {
			u.settleSource = "llm"
		}
		msg := "settle found no whole number: the reservation stands"
		if settle.LLM {
			msg = "settle llm found no final usage: the call pays the larger of its reservation and what it reported plus its output bound"
		}
		u.settleFallbacks = newValueFallbacks(logger, zone, msg, m.settleFallbacks.WithLabelValues(zone))
	}
	for _, p := range u.placeholders() {
		// A name without a dot is a map's output or another handler's
		// placeholder, which a price or a quota often is: only names in
		// Caddy's namespaces can be checked.
		if strings.Contains(p.name(), ".") && !clientkey.KnownPlaceholder(p.name()) {
			logger.Warn("placeholder is not one Caddy provides to a request handler: it will expand to \"\" and the fallback apply (a typo?)",
				zap.String("zone", zone), zap.String("placeholder", p.raw))
		}
	}
	return u
}

// priceBy makes the zone count µ$ at prices, when it has any and reads its
// calls with cost llm (the rules refuse prices without it), and reports
// whether it does. u may be nil: a zone that counts requests.
func (u *zoneUnits) priceBy(zone string, prices []*Price, table *llmprice.Table, logger *zap.Logger) bool {
	if u == nil || len(prices) == 0 && table == nil || u.cost.llm == nil {
		return false
	}
	u.cost.prices = newPriceTable(zone, prices, logger)
	u.cost.prices.withTable(table)
	u.unit = unitUSDMicros
	return true
}

// placeholders are those of the cost and the quota.
func (u *zoneUnits) placeholders() []*numberPlaceholder {
	var ps []*numberPlaceholder
	if u.cost.from != nil {
		ps = append(ps, u.cost.from)
	}
	if u.quota != nil {
		ps = append(ps, u.quota.from)
	}
	return ps
}

// price sets what r costs in the zone, and the max of its call; an error
// is a *bodyRefusal: r is answered without going on.
func (u *zoneUnits) price(r *http.Request, repl *caddy.Replacer, c *limiter.Check) error {
	if u.quota != nil {
		c.Limit.Max = u.quota.of(r, repl)
	}
	var err error
	c.Cost, err = u.cost.of(r, repl, c.Limit.Max)
	return err
}

// name is what the zone counts in; a zone without units counts requests.
func (u *zoneUnits) name() string {
	if u == nil {
		return unitRequests
	}
	return u.unit
}

// numberPlaceholder is a config value that is one placeholder alone, such as
// "{http.request.header.X-Cost}" or "{http.vars.cost}", read per request as
// keys read theirs (internal/clientkey): a header, query parameter or cookie
// by its first value, anything else through Caddy's replacer.
type numberPlaceholder struct {
	raw  string
	part clientkey.Part
}

// isPlaceholder reports whether s is one placeholder alone: "{...}" with no
// other brace inside.
func isPlaceholder(s string) bool {
	return len(s) > 2 && s[0] == '{' && s[len(s)-1] == '}' && !strings.ContainsAny(s[1:len(s)-1], "{}")
}

// parseNumberPlaceholder returns the placeholder of s, which the config's
// rules have checked to be one (isPlaceholder).
func parseNumberPlaceholder(s string) *numberPlaceholder {
	return &numberPlaceholder{raw: s, part: clientkey.PlaceholderPart(s[1 : len(s)-1])}
}

// value returns the placeholder's value for r.
func (p *numberPlaceholder) value(r *http.Request, repl *caddy.Replacer) string {
	return p.part.Value(r, repl)
}

// name is the placeholder's name, without braces, for the check that Caddy
// provides it.
func (p *numberPlaceholder) name() string { return strings.Trim(p.raw, "{}") }

// valueFallbacks counts, in a metric, and logs at most once an interval, the
// requests of a zone whose value (a cost, a quota, a reported usage) was
// missing or not a number the zone takes, so that a fallback applied: a header
// that never comes, or a placeholder with a typo, shows up without a line per
// request.
type valueFallbacks struct {
	logger  *zap.Logger
	zone    string
	msg     string
	counter prometheus.Counter
	throttle
}

func newValueFallbacks(logger *zap.Logger, zone, msg string, counter prometheus.Counter) *valueFallbacks {
	return &valueFallbacks{logger: logger, zone: zone, msg: msg, counter: counter, throttle: throttle{interval: time.Minute}}
}

// record counts one fallback of the value of source (its placeholder, or
// its header) and logs when due, saying why, not what the value was: a
// request's value may hold anything, a credential included.
func (f *valueFallbacks) record(source, why string) {
	f.counter.Inc()
	if count, due := f.event(); due {
		f.logger.Warn(f.msg,
			zap.String("zone", f.zone),
			zap.String("from", source),
			zap.String("value", why),
			zap.Int64("requests", count))
	}
}

// zoneCost is what one request of a zone reserves before it goes on: a
// number of the config, or a placeholder read per request. A request value
// can never make a request free or negative: what is not a whole number of
// at least 1 (missing, "0", "-5", "1e9", "NaN", "5,7") reserves 1, and is
// counted and logged (valueFallbacks); a repeated header counts by its first
// value, as keys read it; a number above the zone's max_requests, however
// large ("99999999999999999999"), is a request that no wait admits: the
// engine denies it as never admitted.
type zoneCost struct {
	// fixed is the cost of every request when from, json and llm are nil.
	fixed int64
	from  *numberPlaceholder
	// json reads the cost from the request's body (cost json), llm from
	// an LLM API call's (cost llm).
	json *CostJSON
	llm  *CostLLM
	// prices turn llm's tokens into µ$ (price.go); nil: tokens.
	prices *priceTable
	// fallbacks counts requests whose value reserved 1 instead.
	fallbacks *valueFallbacks
	// refusals count the requests refused for their body, by reason
	// (refusedSlow, refusedNotJSON, refusedUnbounded).
	refusals [len(refusalReasons)]prometheus.Counter
}

// newZoneCost returns the cost of the config value cost, which the rules
// have checked: "" (1), a whole number, or a placeholder alone; or, when
// costJSON or costLLM is set, the cost that it reads.
func newZoneCost(cost string, costJSON *CostJSON, costLLM *CostLLM, fallbacks *valueFallbacks) zoneCost {
	if costLLM != nil {
		return zoneCost{llm: costLLM, fallbacks: fallbacks}
	}
	if costJSON != nil {
		costJSON.provision()
		return zoneCost{json: costJSON, fallbacks: fallbacks}
	}
	if isPlaceholder(cost) {
		return zoneCost{from: parseNumberPlaceholder(cost), fallbacks: fallbacks}
	}
	n, err := strconv.ParseInt(cost, 10, 64)
	if err != nil || n < 1 {
		n = 1
	}
	return zoneCost{fixed: n}
}

// of returns what r reserves under the call's max (budget), from 1 to
// strictnum.Max, or the refusal of a body that cannot be priced.
func (c *zoneCost) of(r *http.Request, repl *caddy.Replacer, budget int64) (int64, error) {
	switch {
	case c.llm != nil:
		n, why, err := c.llm.of(r, budget, c.prices)
		if why != "" {
			c.fallbacks.record("llm", why)
		}
		return c.refused(n, err)
	case c.json != nil:
		n, why, err := c.json.of(r, budget)
		if why != "" {
			c.fallbacks.record(c.json.source(), why)
		}
		return c.refused(n, err)
	case c.from == nil:
		return c.fixed, nil
	}
	v := c.from.value(r, repl)
	if n, ok := strictnum.Parse(v); ok && n >= 1 {
		return n, nil
	}
	c.fallbacks.record(c.from.raw, strictnum.WhyNot(v))
	return 1, nil
}

// refused counts a refusal of a body.
func (c *zoneCost) refused(n int64, err error) (int64, error) {
	var b *bodyRefusal
	if errors.As(err, &b) {
		c.refusals[b.reason].Inc()
	}
	return n, err
}

// largest is the most a request of the zone can reserve under max: the
// fixed cost, or max itself when requests say their own.
func (c *zoneCost) largest(max int64) int64 {
	if c.from == nil && c.json == nil && c.llm == nil {
		return c.fixed
	}
	return max
}

// CostJSON reserves, per request, a cost read from the request's JSON body:
// what an LLM call may use at most, from its max_tokens and its size.
type CostJSON struct {
	// Paths are dotted paths from the body's root (max_tokens,
	// generation_config.max_output_tokens): only the client's own top
	// level, never a field nested deeper, so that no nested field can
	// lower what a request reserves. The cost is the sum of their
	// values. Keys match as the most lenient server matches them: with
	// Unicode simple case folding, escapes decoded (Max_Tokens, and
	// max_to\u212aens with a Kelvin sign, are max_tokens, as Go's
	// encoding/json reads them), and a key that the body repeats, in any
	// spelling, counts by its largest value, since servers differ on
	// which one they take and the largest bounds them all. A value counts
	// when it is a number of at least 0, however written (a fraction
	// rounded up: 1e3, 1000.0 and "1000" are 1000, as lenient servers
	// read them); null counts as missing.
	Paths []string `json:"paths,omitempty"`

	// Default is the cost of a request whose body has none of the paths,
	// or is not JSON, or has a value at a path that is no number of at
	// least 0 (negative, a word, an object); all but the missing value are
	// counted in cost_fallbacks_total and logged at most once a minute
	// per zone. It should be the most the upstream gives a request that
	// names none. At least 1. A body that does not arrive whole within 10
	// seconds is never passed on with a smaller reservation than it asks
	// for: the request is answered 408 without reaching the next handler
	// (body_refusals_total{reason="slow"}). A body above 1 MiB is not read:
	// it reserves the call's whole max_requests.
	Default int64 `json:"default,omitempty"`

	// Body adds the size of the request body in bytes (+body): a text
	// prompt has no more tokens than bytes, so the sum bounds a call's
	// input and output tokens.
	Body bool `json:"body,omitempty"`

	paths [][]string
}

func (c *CostJSON) provision() {
	c.paths = make([][]string, len(c.Paths))
	for i, p := range c.Paths {
		c.paths[i] = strings.Split(p, ".")
	}
}

// source names the cost in logs.
func (c *CostJSON) source() string { return "json " + strings.Join(c.Paths, " ") }

// checkCostJSON accepts paths and a default of at least 1.
func checkCostJSON(c *CostJSON, cost string) error {
	switch {
	case c == nil:
		return nil
	case cost != "":
		return fmt.Errorf("cost and cost json are one setting: set one (cost %q)", cost)
	case len(c.Paths) == 0:
		return errors.New("cost json needs at least one path and a default (cost json max_tokens 4096)")
	case c.Default < 1 || c.Default > strictnum.Max:
		return fmt.Errorf("cost json: the default must be a whole number of at least 1, got %d", c.Default)
	}
	for _, p := range c.Paths {
		if err := checkJSONPath(p); err != nil {
			return fmt.Errorf("cost json: %w", err)
		}
	}
	return nil
}

// checkCostJSONFits rejects a default above a fixed max_requests: no
// request without the paths would ever be admitted.
func checkCostJSONFits(c *CostJSON, maxRequests int64, maxRequestsFrom string) error {
	if c != nil && maxRequestsFrom == "" && c.Default > maxRequests {
		return fmt.Errorf("cost json: the default %d is above max_requests %d: no request without the paths would ever be admitted", c.Default, maxRequests)
	}
	return nil
}

// of returns what r reserves under the call's max, at least 1, and why it
// took the default ("" when it did not, or the body has none of the paths),
// or the refusal of a body that did not arrive whole.
func (c *CostJSON) of(r *http.Request, budget int64) (int64, string, error) {
	body := peekBody(r)
	switch body.why {
	case "":
	case costSlow, costUnread:
		return 0, "", &bodyRefusal{reason: refusedSlow}
	case costTooLarge:
		// Unread, it may ask for anything: the whole budget.
		return budget, costTooLarge, nil
	}
	cost := c.Default
	n, found, why := c.read(body.data)
	if found && why == "" {
		cost = n
	}
	if c.Body {
		cost = min(cost+body.size, strictnum.Max)
	}
	return max(cost, 1), why, nil
}

// read sums the values at the paths in the JSON document doc, each path's
// largest (llmapi.ReadPaths matches keys as lenient servers do); found is
// false when it has none of them.
func (c *CostJSON) read(doc []byte) (sum int64, found bool, why string) {
	if len(bytes.TrimSpace(doc)) == 0 {
		return 0, false, ""
	}
	vals, err := llmapi.ReadPaths(doc, c.paths)
	if err != nil {
		return 0, false, costNotJSON
	}
	for _, v := range vals {
		if v.Odd {
			return 0, false, strictnum.NotWhole
		}
		if v.Found {
			found = true
			sum = min(sum+v.N, strictnum.Max)
		}
	}
	return sum, found, ""
}

// zoneQuota is a zone's max_requests taken per request from a placeholder (a
// tenant's quota, from a header that forward_auth copies, a map output, or
// {http.vars.*}), with the zone's max_requests as the fallback when the value
// is missing or not a whole number from 1 to maxMaxRequests. The fallback
// is never "unlimited": a tenant without a quota gets the zone's static limit.
// The zone's identity holds no max (see zoneIdentity), so a tenant whose
// quota changes keeps its window; the engine decides each call exactly for
// its own max.
type zoneQuota struct {
	from      *numberPlaceholder
	fallback  int64
	fallbacks *valueFallbacks
}

// of returns the max of r's call.
func (q *zoneQuota) of(r *http.Request, repl *caddy.Replacer) int64 {
	v := q.from.value(r, repl)
	n, ok := strictnum.Parse(v)
	switch {
	case ok && n >= 1 && n <= maxMaxRequests:
		return n
	case ok && n > maxMaxRequests:
		q.fallbacks.record(q.from.raw, strictnum.TooLarge)
	default:
		q.fallbacks.record(q.from.raw, strictnum.WhyNot(v))
	}
	return q.fallback
}

// A quota (max_requests from a placeholder) or a cost read from what the
// client sends (a header, a query parameter, a cookie, the body) is the
// client's to choose unless a handler that runs before the limiter replaces
// it, and the limiter is ordered before forward_auth: without a route that
// orders them, `max_requests {http.request.header.X-Quota} 10` lets a client
// send X-Quota: 281474976710655 and have it. The module cannot see the
// handlers around it, so it warns at load and names the form that is safe in
// any order: the auth answer's own placeholder,
// {http.reverse_proxy.header.<name>}, which only forward_auth sets, and which
// is empty (the fallback applies) when the limiter runs first.

// authAnswerPlaceholder is the safe form's namespace: the headers of the
// answer of forward_auth's (or reverse_proxy's) upstream, set by it on the
// request's replacer for the handlers after it.
const authAnswerPlaceholder = "http.reverse_proxy.header."

// clientChosen reports whether a placeholder (without braces) reads what the
// client sent: anything of the request but its addresses and its verified
// certificate.
func clientChosen(name string) bool {
	rest, ok := strings.CutPrefix(name, "http.request.")
	if !ok {
		return false
	}
	for _, server := range []string{"remote", "local", "tls."} {
		if strings.HasPrefix(rest, server) {
			return false
		}
	}
	return true
}

// warnClientChosenUnits warns of a zone whose quota, or whose cost without a
// settle that corrects it after the response, the client chooses.
func warnClientChosenUnits(logger *zap.Logger, zone, maxRequestsFrom, cost string, settled bool) {
	warn := func(field, raw string) {
		name := strings.TrimSuffix(strings.TrimPrefix(raw, "{"), "}")
		if !clientChosen(name) {
			return
		}
		safe := raw
		if header, ok := strings.CutPrefix(name, "http.request.header."); ok {
			safe = "{" + authAnswerPlaceholder + header + "}"
		}
		logger.Warn(field+" is read from the request, which the client sends: a client can choose its own unless a handler that runs before sliding_ratelimit replaces it, and sliding_ratelimit runs before forward_auth unless a route orders them; take it from the auth service's answer, "+safe+", which only forward_auth sets and which gives the fallback in any order (docs/tenants.md)",
			zap.String("zone", zone), zap.String("placeholder", raw))
	}
	if maxRequestsFrom != "" {
		warn("max_requests", maxRequestsFrom)
	}
	if strings.HasPrefix(cost, "{") && !settled {
		warn("cost", cost)
	}
}

// The settle config is here with the zone's other units; what a response
// says it cost is read in settle.go.

// Settle says how a zone learns what a request really cost, which is known
// only once its response is: the request reserves its cost (see the zone's
// cost, default 1) before it goes on, and is admitted while the window has
// room for that reservation; after the response, the reservation is replaced
// by the real cost, so the client pays in full for what it used, even past
// max_requests (it then waits until enough ages out). Set one of its fields.
type Settle struct {
	// Header names a response header, or trailer, whose value is the real
	// cost, such as the token usage an LLM upstream reports. reverse_proxy
	// copies an upstream's trailers into the response's header map at the
	// end of the body, where the value is read once the response is done;
	// a trailer wins over a header of the same name; a header that a handler
	// before this one deletes as the status goes out (header -X-Usage, to
	// keep it from clients) is read as it was then. The value is a whole
	// number of units, 0 included. No value, or one that is not a whole number
	// ("-5", "1.5", "abc"): the reservation stands, and the request is
	// counted and logged at most once a minute per zone. A value above the
	// call's max_requests is charged in full: the client is then refused,
	// with a Retry-After that says when, until it ages out.
	Header string `json:"header,omitempty"`

	// Bytes settles a request to the bytes of its response body as they
	// leave this handler (compressed, when encode runs after it, as it does
	// in Caddy's directive order), in full. A response with no body (HEAD, 304) costs 0; bytes after a protocol
	// switch (a WebSocket) are not counted.
	Bytes bool `json:"bytes,omitempty"`

	// JSON names the numbers of the response body that make its real
	// cost, as APIs report usage: the cost is the sum, over these dotted
	// paths ("usage.total_tokens"), of the last number found at each, in
	// the body's JSON document (or each of a sequence, as
	// newline-delimited JSON, or each element of a top-level array), or in
	// the data of each event of a text/event-stream. A path is matched
	// from the top of each document or event: "usage.total_tokens" is the
	// document's own usage, never one nested in its content; name a
	// deeper place in full ("response.usage.total_tokens"). The body
	// passes through as it comes, read as it goes without being
	// kept; a document or event counts once it is whole. No number at
	// any path, a last number that is not a whole number ("-5", "1.5",
	// "1e3"), a compressed body (a Content-Encoding), or a response cut
	// short (the client left, the upstream broke off, the handler
	// failed): the reservation stands, counted and logged as for header.
	// A sum above the call's max_requests is charged in full.
	JSON []string `json:"json,omitempty"`

	// LLM settles a request to the whole usage its LLM API reports, read
	// as the body passes, only where the API puts it (see CostLLM for the
	// APIs): OpenAI's total_tokens, the Responses API's response.usage of
	// its final event, Anthropic's input, cache creation, cache read and
	// output tokens (cumulative in a stream), Gemini's totalTokenCount
	// (running totals), Ollama's prompt_eval_count and eval_count,
	// Bedrock's usage, in a JSON answer or in its stream (AWS's event
	// stream for ConverseStream). A response without usage, compressed, or
	// cut short pays its reservation, as for json. A usage above the
	// call's max_requests is charged in full.
	LLM bool `json:"llm,omitempty"`

	// header is Header in canonical form.
	header string
	// paths are the JSON paths, split at their dots.
	paths [][]string
}

// provision precomputes what each response needs.
func (s *Settle) provision() {
	s.header = textproto.CanonicalMIMEHeaderKey(s.Header)
	s.paths = make([][]string, len(s.JSON))
	for i, p := range s.JSON {
		s.paths[i] = strings.Split(p, ".")
	}
}

// The rules of units, as those of zones.go: each once, for JSON and the
// Caddyfile alike.

// maxMaxRequests is the largest max_requests: the engine keeps a zone's
// running sums of units modulo 2^48.
const maxMaxRequests = 1<<48 - 1

func checkMaxRequests(n int64) error {
	if n < 1 {
		return fmt.Errorf("max_requests must be at least 1, got %d", n)
	}
	if n > maxMaxRequests {
		return fmt.Errorf("max_requests must be at most 2^48-1 (%d), got %d", int64(maxMaxRequests), n)
	}
	return nil
}

// checkMaxRequestsFrom accepts a placeholder alone, whose value is each
// request's max_requests.
func checkMaxRequestsFrom(placeholder string) error {
	if placeholder != "" && !isPlaceholder(placeholder) {
		return fmt.Errorf("max_requests_from must be a placeholder alone, such as {http.request.header.X-Quota}, got %q", placeholder)
	}
	return nil
}

// checkCost accepts a whole number of at least 1, or a placeholder alone.
func checkCost(cost string) error {
	if cost == "" || isPlaceholder(cost) {
		return nil
	}
	if n, ok := strictnum.Parse(cost); !ok || n < 1 {
		return fmt.Errorf("cost must be a whole number of at least 1, or a placeholder alone such as {http.request.header.X-Cost}, got %q", cost)
	}
	return nil
}

// checkCostFits rejects a fixed cost above a fixed max_requests: no request
// would ever be admitted.
func checkCostFits(cost string, maxRequests int64, maxRequestsFrom string) error {
	if n, ok := strictnum.Parse(cost); ok && maxRequestsFrom == "" && n > maxRequests {
		return fmt.Errorf("cost %d is above max_requests %d: no request would ever be admitted", n, maxRequests)
	}
	return nil
}

// checkSettle accepts a header name, bytes, or JSON paths, one of them.
func checkSettle(s *Settle) error {
	if s == nil {
		return nil
	}
	set := 0
	for _, on := range []bool{s.Bytes, s.Header != "", len(s.JSON) > 0, s.LLM} {
		if on {
			set++
		}
	}
	switch {
	case set > 1:
		return errors.New("settle takes a header, bytes, json paths or llm, not more than one")
	case set == 0:
		return errors.New("settle needs a header (settle header X-Usage), bytes (settle bytes), json paths (settle json usage.total_tokens) or llm (settle llm)")
	case s.Header != "" && !isToken(s.Header):
		return fmt.Errorf("settle header: %q is not a header name", s.Header)
	}
	for _, p := range s.JSON {
		if err := checkJSONPath(p); err != nil {
			return fmt.Errorf("settle json: %w", err)
		}
	}
	return nil
}

// checkJSONPath accepts a dotted path of object keys (usage.total_tokens),
// each a plain name: no empty one, no quote, backslash, bracket or brace,
// no ':' or ',' (settle's paths name the zone's state: zoneIdentity), at
// most jsonusage.MaxKey bytes.
func checkJSONPath(p string) error {
	for _, name := range strings.Split(p, ".") {
		if name == "" || len(name) > jsonusage.MaxKey || strings.ContainsAny(name, "\\\"{}[]:, \t") {
			return fmt.Errorf("%q is not a dotted path of names such as usage.total_tokens", p)
		}
	}
	return nil
}

// isToken reports whether s is an HTTP token, as header names are
// (RFC 9110, section 5.6.2).
func isToken(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return s != ""
}
