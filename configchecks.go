package slidingratelimit

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/redisconn"
	"github.com/slidingratelimit/caddy-sliding-ratelimit/limiter"
)

// The rules: every rule a configuration must follow, once (those of units
// are in units.go): Validate (module.go) and Zone.validate apply them to
// JSON, and the Caddyfile parser to each subdirective as it reads it, so
// that the same mistake gets the same words either way (plus the Caddyfile
// line). Each field that takes one of a few words has its words here, in its
// enum.

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
	periodEnum    = enum{"period", []string{periodDay, periodWeek, periodMonth}}
	topologyEnum  = enum{"redis_topology", redisconn.Topologies}
)

// check accepts one of the values, or "" (the default).
func (e enum) check(value string) error {
	if value == "" || slices.Contains(e.values, value) {
		return nil
	}
	last := len(e.values) - 1
	return fmt.Errorf("%s must be %s or %s, got %q%s", e.field, strings.Join(e.values[:last], ", "), e.values[last], value, didYouMean(value, e.values))
}

// maxSuggestDistance is how many edits (a letter added, dropped, changed,
// or two swapped) a misspelt name may be from the name it is taken for.
const maxSuggestDistance = 2

// didYouMean returns " (did you mean <name>?)" for the name among known
// that typed is a typo of, or "" when none is near enough. Letter case does
// not count: "Window" is window.
func didYouMean(typed string, known []string) string {
	best, bestDistance := "", maxSuggestDistance+1
	lower := strings.ToLower(typed)
	for _, name := range known {
		// A name of one or two letters is a few edits from everything.
		if d := editDistance(lower, name); d < bestDistance && d < len(typed) {
			best, bestDistance = name, d
		}
	}
	if best == "" {
		return ""
	}
	return fmt.Sprintf(" (did you mean %s?)", best)
}

// editDistance counts the edits from a to b: a byte added, dropped or
// changed, or two adjacent bytes swapped (the optimal string alignment
// distance).
func editDistance(a, b string) int {
	// rows[k][j] is the distance from a[:i-2+k] to b[:j], for the current i.
	rows := [3][]int{make([]int, len(b)+1), make([]int, len(b)+1), make([]int, len(b)+1)}
	for j := range rows[2] {
		rows[2][j] = j
	}
	for i := 1; i <= len(a); i++ {
		rows[0], rows[1], rows[2] = rows[1], rows[2], rows[0]
		cur, prev, prev2 := rows[2], rows[1], rows[0]
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				cur[j] = min(cur[j], prev2[j-2]+1)
			}
		}
	}
	return rows[2][len(b)]
}

// syntax is the values as the Caddyfile syntax writes them: a|b|c.
func (e enum) syntax() string { return strings.Join(e.values, "|") }

// Ranges of the prefix lengths.
const (
	maxIPv4Prefix = 32
	maxIPv6Prefix = 128
)

// checkPositive is the rule of timeout and wait.
func checkPositive(field string, d time.Duration) error {
	if d <= 0 {
		return fmt.Errorf("%s must be greater than zero, got %v", field, d)
	}
	return nil
}

// The spans the engine keeps, a window or a lease (limiter's Limit.Window):
// its times are microseconds, kept modulo 2^48 (8.9 years), and a key holds
// times from three windows back to one ahead.
const (
	minWindow = time.Microsecond
	maxWindow = 2 * 365 * 24 * time.Hour
)

// checkWindow is the rule of window and lease: from a microsecond to two
// years, what the engine keeps, so that a config it cannot keep fails to
// load instead of failing every request. A bare JSON number is nanoseconds
// (caddy.Duration), and a span that short is almost surely seconds written
// so: the error says how to write them.
func checkWindow(field string, d time.Duration) error {
	switch {
	case d <= 0:
		return checkPositive(field, d)
	case d < minWindow:
		return fmt.Errorf("%s %v is shorter than a microsecond, the least the limiter keeps (a bare JSON number is nanoseconds: %q: %d is %v; for seconds write \"%ds\")",
			field, d, field, int64(d), d, int64(d))
	case d > maxWindow:
		return fmt.Errorf("%s %v is longer than two years (%s), the most the limiter keeps", field, d, formatWindow(maxWindow))
	}
	return nil
}

// checkWindowOrPeriod is the rule of a window (checkWindow) where no period
// stands for it.
func checkWindowOrPeriod(window time.Duration, period string) error {
	if period != "" && window == 0 {
		return nil
	}
	return checkWindow("window", window)
}

// checkPeriod is the rule of a period and its time_zone: a day, week or
// month instead of a window, counted exactly (algorithm log: a counter's
// fixed windows would not fall on the period's) and without a wait (room
// comes back only when the next period starts); a time_zone that loads,
// and only with a period.
func checkPeriod(period, timeZone string, window time.Duration, algorithm string, wait time.Duration) error {
	if period == "" {
		if timeZone != "" {
			return fmt.Errorf("time_zone %s needs a period: window day, week or month", timeZone)
		}
		return nil
	}
	if err := periodEnum.check(period); err != nil {
		return err
	}
	switch {
	case window != 0:
		return fmt.Errorf("period %s and window %v exclude each other: a period is its window", period, window)
	case algorithm == algorithmCounter:
		return fmt.Errorf("a %s period counts with algorithm log: a counter's fixed windows would not fall on the period's", period)
	case wait != 0:
		return fmt.Errorf("a %s period takes no wait: its room comes back only when the next period starts (wait %v)", period, wait)
	}
	_, err := loadTimeZone(timeZone)
	return err
}

// warnShortWindow warns of a window or lease under a millisecond, which the
// engine keeps but no one means: most likely seconds given as a bare JSON
// number, which is nanoseconds.
func warnShortWindow(logger *zap.Logger, zone string, l limiter.Limit) {
	if l.Window < minWindow || l.Window >= time.Millisecond {
		// The rules refuse the first; the rest is meant.
		return
	}
	field := "window"
	if l.Algorithm == limiter.Concurrency {
		field = "lease"
	}
	logger.Warn("a window or lease under a millisecond: a bare JSON number is nanoseconds, so seconds need their unit",
		zap.String("zone", zone), zap.Duration(field, l.Window), zap.String("for_seconds_write", strconv.FormatInt(int64(l.Window), 10)+"s"))
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
// keeps the admissions of the windows a wait spans, and two years; and only a zone of
// algorithm log (the handler's algorithm when the zone sets none) waits,
// since a counter cannot promise a slot at a later time.
func checkWait(wait, window time.Duration, algorithm string) error {
	if wait < 0 {
		return fmt.Errorf("wait must not be negative, got %v", wait)
	}
	if window > 0 && wait > limiter.MaxWaitWindows*window {
		return fmt.Errorf("wait %v is longer than %d windows of %v, the most a request may wait", wait, limiter.MaxWaitWindows, window)
	}
	if wait > maxWindow {
		return fmt.Errorf("wait %v is longer than two years, the most a request may wait", wait)
	}
	if wait > 0 && algorithm == algorithmCounter {
		return fmt.Errorf("wait needs algorithm log: a counter cannot promise a later slot (wait %v)", wait)
	}
	return nil
}

// checkWarnPercent is the rule of a zone's soft limit: a share of its max
// from 1% to 99% (0: none); at 100% the soft limit is the limit.
func checkWarnPercent(percent int) error {
	if percent < 0 || percent > 99 {
		return fmt.Errorf("warn must be a share from 1%% to 99%% of max_requests, got %d%%", percent)
	}
	return nil
}

// checkZoneMode is the rule of a zone's mode: enforce or report, and a
// zone in report mode, which never holds a request, takes no wait.
func checkZoneMode(mode string, wait time.Duration) error {
	if err := modeEnum.check(mode); err != nil {
		return err
	}
	if mode == modeReport && wait != 0 {
		return fmt.Errorf("a zone in mode report never holds a request: remove wait %v", wait)
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
	case lease > 0:
		return checkWindow("lease", lease)
	}
	return nil
}

// formatWindow writes a window in its largest whole unit: 1h, 90s, 1500ms,
// 250us.
func formatWindow(w time.Duration) string {
	for _, u := range []struct {
		unit   time.Duration
		suffix string
	}{
		{time.Hour, "h"}, {time.Minute, "m"}, {time.Second, "s"}, {time.Millisecond, "ms"}, {time.Microsecond, "us"},
	} {
		if w%u.unit == 0 {
			return strconv.FormatInt(int64(w/u.unit), 10) + u.suffix
		}
	}
	return strconv.FormatInt(int64(w), 10) + "ns"
}
