package slidingratelimit

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/redisconn"
	"github.com/slidingratelimit/caddy-sliding-ratelimit/limiter"
)

// This file holds every rule a configuration must follow, once: Validate
// (config.go) and Zone.validate apply them to JSON, and the Caddyfile parser
// to each subdirective as it reads it, so that the same mistake gets the
// same words either way (plus the Caddyfile line). Each field that takes one
// of a few words has its words here, in its enum.

// Modes.
const (
	modeEnforce = "enforce"
	modeReport  = "report"
)

// Fail modes: what a request gets when Redis cannot decide in time.
const (
	failOpen   = "open"
	failClosed = "closed"
	failLocal  = "local"
)

// Header modes.
const (
	headersDraft  = "draft"
	headersLegacy = "legacy"
	headersOff    = "off"
)

// Algorithms.
const (
	algorithmLog     = "log"
	algorithmCounter = "counter"
)

// enum is a field that takes one of a few words.
type enum struct {
	field  string
	values []string
}

var (
	modeEnum      = enum{"mode", []string{modeEnforce, modeReport}}
	failModeEnum  = enum{"fail_mode", []string{failOpen, failClosed, failLocal}}
	headersEnum   = enum{"headers", []string{headersDraft, headersLegacy, headersOff}}
	algorithmEnum = enum{"algorithm", []string{algorithmLog, algorithmCounter}}
	topologyEnum  = enum{"redis_topology", redisconn.Topologies}
)

// check accepts one of the values, or "" (the default).
func (e enum) check(value string) error {
	if value == "" || slices.Contains(e.values, value) {
		return nil
	}
	last := len(e.values) - 1
	return fmt.Errorf("%s must be %s or %s, got %q", e.field, strings.Join(e.values[:last], ", "), e.values[last], value)
}

// syntax is the values as the Caddyfile syntax writes them: a|b|c.
func (e enum) syntax() string { return strings.Join(e.values, "|") }

// Ranges of the prefix lengths.
const (
	maxIPv4Prefix = 32
	maxIPv6Prefix = 128
)

// checkPositive is the rule of window and timeout.
func checkPositive(field string, d time.Duration) error {
	if d <= 0 {
		return fmt.Errorf("%s must be greater than zero, got %v", field, d)
	}
	return nil
}

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
	if n, ok := parseCount(cost); !ok || n < 1 {
		return fmt.Errorf("cost must be a whole number of at least 1, or a placeholder alone such as {http.request.header.X-Cost}, got %q", cost)
	}
	return nil
}

// checkCostFits rejects a fixed cost above a fixed max_requests: no request
// would ever be admitted.
func checkCostFits(cost string, maxRequests int64, maxRequestsFrom string) error {
	if n, ok := parseCount(cost); ok && maxRequestsFrom == "" && n > maxRequests {
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
	for _, on := range []bool{s.Bytes, s.Header != "", len(s.JSON) > 0} {
		if on {
			set++
		}
	}
	switch {
	case set > 1:
		return errors.New("settle takes a header, bytes or json paths, not more than one")
	case set == 0:
		return errors.New("settle needs a header (settle header X-Usage) or bytes (settle bytes) or json paths (settle json usage.total_tokens)")
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
// most jsonMaxKey bytes.
func checkJSONPath(p string) error {
	for _, name := range strings.Split(p, ".") {
		if name == "" || len(name) > jsonMaxKey || strings.ContainsAny(name, "\\\"{}[]:, \t") {
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

func checkPrefixBits(field string, n, most int) error {
	if n < 1 || n > most {
		return fmt.Errorf("%s must be from 1 to %d, got %d", field, most, n)
	}
	return nil
}

// checkKeyPrefix keeps the Redis Cluster hash tag the client key's alone.
func checkKeyPrefix(prefix string) error {
	if strings.ContainsAny(prefix, "{}") {
		return fmt.Errorf("key_prefix must not contain '{' or '}', got %q", prefix)
	}
	return nil
}

// checkKeyTemplate rejects a key whose braces do not pair up. A placeholder
// left open, as in "{http.request.header.X-Api-Key", is no placeholder at
// all: the key is then the same text for every request, one bucket for every
// client, without a word. A key without braces is a constant on purpose (one
// limit for everyone) and stays allowed.
func checkKeyTemplate(key string) error {
	open := -1 // where the placeholder being read starts
	for i := 0; i < len(key); i++ {
		switch key[i] {
		case '{':
			if open >= 0 {
				return fmt.Errorf("key %q: '{' inside the placeholder %q, which is not closed: placeholders do not nest", key, key[open:i])
			}
			open = i
		case '}':
			if open < 0 {
				return fmt.Errorf("key %q: '}' %s closes no '{'", key, after(key[:i]))
			}
			if i == open+1 {
				return fmt.Errorf("key %q: empty placeholder '{}' %s", key, after(key[:open]))
			}
			open = -1
		}
	}
	if open >= 0 {
		return fmt.Errorf("key %q: the placeholder %q has no closing '}', so the key would be the same text for every client: one bucket for all", key, key[open:])
	}
	return nil
}

// after says where in a key something is: after the text before it.
func after(before string) string {
	if before == "" {
		return "at the start"
	}
	return fmt.Sprintf("after %q", before)
}

// checkZoneName accepts names safe in a quoted header item, a metrics label,
// a URL path segment and a Redis key.
func checkZoneName(name string) error {
	if name == "" {
		return errors.New("zone name is required")
	}
	if len(name) > 64 {
		return fmt.Errorf("zone name %q is longer than 64 bytes", name)
	}
	for _, c := range name {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.') {
			return fmt.Errorf("zone name %q: only letters, digits, '_', '-' and '.' are allowed", name)
		}
	}
	return nil
}

// checkCountStatus accepts codes from 100 to 599 and classes 1 to 5.
func checkCountStatus(list []int) error {
	for _, s := range list {
		if !(s >= 1 && s <= 5 || s >= 100 && s <= 599) {
			return fmt.Errorf("count_status must be status codes from 100 to 599 or classes 1 to 5 (1xx to 5xx), got %d", s)
		}
	}
	return nil
}

// checkWait is the rule of wait: not negative; at most
// limiter.MaxWaitWindows windows (window 0: not known here), since the store
// keeps the admissions of the windows a wait spans; and only a zone of
// algorithm log (the handler's algorithm when the zone sets none) waits,
// since a counter cannot promise a slot at a later time.
func checkWait(wait, window time.Duration, algorithm string) error {
	if wait < 0 {
		return fmt.Errorf("wait must not be negative, got %v", wait)
	}
	if window > 0 && wait > limiter.MaxWaitWindows*window {
		return fmt.Errorf("wait %v is longer than %d windows of %v, the most a request may wait", wait, limiter.MaxWaitWindows, window)
	}
	if wait > 0 && algorithm == algorithmCounter {
		return fmt.Errorf("wait needs algorithm log: a counter cannot promise a later slot (wait %v)", wait)
	}
	return nil
}

func checkMaxWaiting(n int) error {
	if n < 0 {
		return fmt.Errorf("max_waiting must be at least 1, got %d", n)
	}
	return nil
}

// checkConcurrencyZone is the rule of a zone with concurrent or lease: a
// number of requests in flight and how long a slot outlives news of its
// request, and nothing of a zone that counts admissions in a window.
func checkConcurrencyZone(concurrent int64, lease time.Duration, counts, algorithm string, wait time.Duration) error {
	switch {
	case concurrent < 1:
		return fmt.Errorf("concurrent must be at least 1, got %d (lease goes with concurrent)", concurrent)
	case lease < 0:
		return fmt.Errorf("lease must not be negative, got %v", lease)
	case counts != "":
		return fmt.Errorf("a concurrency zone counts requests in flight, not in a window: remove %s (or concurrent)", counts)
	case algorithm != "":
		return fmt.Errorf("a concurrency zone takes no algorithm, got %q", algorithm)
	case wait != 0:
		return fmt.Errorf("a concurrency zone takes no wait: a request takes its slot at once or is denied (wait %v)", wait)
	}
	return nil
}
