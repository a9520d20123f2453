package slidingratelimit

import (
	"strconv"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/limiter"
)

// zone is one named limit with what the hot path needs precomputed.
type zone struct {
	name  string
	key   string // client key template, with placeholders
	limit limiter.Limit
	// policy is the RateLimit-Policy header value, fixed per zone.
	policy string
	// maxText is the limit as text, for headers and placeholders.
	maxText string
}

func newZone(name, key string, limit limiter.Limit) zone {
	maxText := strconv.FormatInt(limit.Max, 10)
	return zone{
		name:    name,
		key:     key,
		limit:   limit,
		policy:  strconv.Quote(name) + ";q=" + maxText + ";w=" + strconv.FormatInt(ceilSeconds(limit.Window), 10),
		maxText: maxText,
	}
}
