package slidingratelimit

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/redisconn"
)

// This file holds every rule a configuration must follow, once: Validate
// applies them to JSON, and the Caddyfile parser to each subdirective as it
// reads it, so that the same mistake gets the same words either way (plus
// the Caddyfile line).

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

func checkMaxRequests(n int64) error {
	if n < 1 {
		return fmt.Errorf("max_requests must be at least 1, got %d", n)
	}
	return nil
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

// checkZoneNames rejects a name given twice, counting the zone that the
// top-level window and max_requests define.
func checkZoneNames(hasDefault bool, zones []*Zone) error {
	seen := map[string]bool{defaultZone: hasDefault}
	for _, z := range zones {
		if seen[z.Name] {
			if z.Name == defaultZone && hasDefault {
				return fmt.Errorf("zone %s clashes with the zone that window and max_requests define", defaultZone)
			}
			return fmt.Errorf("zone %s is defined twice", z.Name)
		}
		seen[z.Name] = true
	}
	return nil
}

// checkLimit checks a zone's own fields.
func (z *Zone) checkLimit() error {
	for _, err := range []error{
		checkZoneName(z.Name),
		checkPositive("window", time.Duration(z.Window)),
		checkMaxRequests(z.MaxRequests),
		checkKeyTemplate(z.Key),
		algorithmEnum.check(z.Algorithm),
		checkCountStatus(z.CountStatus),
	} {
		if err != nil {
			if z.Name == "" {
				return err
			}
			return fmt.Errorf("zone %s: %w", z.Name, err)
		}
	}
	return nil
}

// Validate checks the configuration: every rule of this file, on the JSON
// fields. Zero values of optional fields mean their defaults.
func (h *Handler) Validate() error {
	hasDefault := h.Window != 0 || h.MaxRequests != 0
	if !hasDefault && len(h.Zones) == 0 {
		return errors.New("no limit: set window and max_requests, or at least one zone")
	}
	var errs []error
	if hasDefault {
		errs = append(errs, checkPositive("window", time.Duration(h.Window)), checkMaxRequests(h.MaxRequests))
	}
	// Provision has set the defaults of the optional fields.
	errs = append(errs,
		checkPositive("timeout", time.Duration(h.Timeout)),
		checkPrefixBits("ipv4_prefix", h.IPv4Prefix, maxIPv4Prefix),
		checkPrefixBits("ipv6_prefix", h.IPv6Prefix, maxIPv6Prefix),
		checkKeyTemplate(h.Key),
		checkKeyPrefix(h.KeyPrefix),
		failModeEnum.check(h.FailMode),
		headersEnum.check(h.Headers),
		modeEnum.check(h.Mode),
		algorithmEnum.check(h.Algorithm),
		topologyEnum.check(h.RedisTopology),
		checkZoneNames(hasDefault, h.Zones),
		checkCountStatus(h.CountStatus),
	)
	for _, z := range h.Zones {
		errs = append(errs, z.checkLimit())
	}
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}
