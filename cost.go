package slidingratelimit

import (
	"net/http"
	"strconv"

	"github.com/caddyserver/caddy/v2"
)

// zoneCost is what one request of a zone reserves before it goes on: a
// number of the config, or a placeholder read per request. A request value
// can never make a request free or negative: what is not a whole number of
// at least 1 (missing, "0", "-5", "1e9", "NaN", "5,7") reserves 1, and is
// counted and logged (valueFallbacks); a repeated header counts by its first
// value, as keys read it; a number above the zone's max_requests, however
// large ("99999999999999999999"), is a request that no wait admits: the
// engine denies it as never admitted.
type zoneCost struct {
	// fixed is the cost of every request when from and json are nil.
	fixed int64
	from  *numberPlaceholder
	// json reads the cost from the request's body (cost json).
	json *CostJSON
	// fallbacks counts requests whose value reserved 1 instead.
	fallbacks *valueFallbacks
}

// newZoneCost returns the cost of the config value cost, which the rules
// have checked: "" (1), a whole number, or a placeholder alone; or, when
// costJSON is set, the cost that it reads.
func newZoneCost(cost string, costJSON *CostJSON, fallbacks *valueFallbacks) zoneCost {
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

// of returns what r reserves, from 1 to maxCount.
func (c *zoneCost) of(r *http.Request, repl *caddy.Replacer) int64 {
	if c.json != nil {
		n, why := c.json.of(r)
		if why != "" {
			c.fallbacks.record(c.json.source(), why)
		}
		return n
	}
	if c.from == nil {
		return c.fixed
	}
	v := c.from.value(r, repl)
	if n, ok := parseCount(v); ok && n >= 1 {
		return n
	}
	c.fallbacks.record(c.from.raw, whyNot(v))
	return 1
}

// largest is the most a request of the zone can reserve under max: the
// fixed cost, or max itself when requests say their own.
func (c *zoneCost) largest(max int64) int64 {
	if c.from == nil && c.json == nil {
		return c.fixed
	}
	return max
}
