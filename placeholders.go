package slidingratelimit

import (
	"net/http"
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/limiter"
)

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
