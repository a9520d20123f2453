package slidingratelimit

import (
	"net/http"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// Numbers that come with a request (a cost, a tenant's quota) or with its
// response (the usage an upstream reports) are read strictly: base-10 ASCII
// digits and nothing else. "+5", "5.0", "1e9", "0x10", " 5" and "NaN" are not
// numbers here, so a value never means something other than what it shows.

// maxCount is what parseCount saturates at: the largest cost the engine
// takes (2^53), above any max_requests (at most 2^48-1), so a number too
// large for an int64 is still a number above every budget.
const maxCount = 1 << 53

// parseCount reads s as a whole number: digits only, at least one. A number
// above maxCount is maxCount.
func parseCount(s string) (n int64, ok bool) {
	if s == "" {
		return 0, false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		if n < maxCount {
			n = n*10 + int64(c-'0')
		}
	}
	return min(n, maxCount), true
}

// numberPlaceholder is a config value that is one placeholder alone, such as
// "{http.request.header.X-Cost}" or "{http.vars.cost}", read per request as
// keys read theirs (keys.go): a header, query parameter or cookie by its
// first value, anything else through Caddy's replacer.
type numberPlaceholder struct {
	raw  string
	part keyPart
}

// isPlaceholder reports whether s is one placeholder alone: "{...}" with no
// other brace inside.
func isPlaceholder(s string) bool {
	return len(s) > 2 && s[0] == '{' && s[len(s)-1] == '}' && !strings.ContainsAny(s[1:len(s)-1], "{}")
}

// parseNumberPlaceholder returns the placeholder of s, which the config's
// rules have checked to be one (isPlaceholder).
func parseNumberPlaceholder(s string) *numberPlaceholder {
	return &numberPlaceholder{raw: s, part: placeholderPart(s[1 : len(s)-1])}
}

// value returns the placeholder's value for r.
func (p *numberPlaceholder) value(r *http.Request, repl *caddy.Replacer) string {
	return p.part.value(r, repl)
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

// Why a value fell back.
const (
	valueMissing  = "missing"
	valueNotWhole = "not a whole number"
	valueZero     = "zero"
	valueTooLarge = "too large"
)

// whyNot says why value is no whole number of at least 1.
func whyNot(value string) string {
	if value == "" {
		return valueMissing
	}
	if _, ok := parseCount(value); ok {
		return valueZero
	}
	return valueNotWhole
}
