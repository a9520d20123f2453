package slidingratelimit

import (
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

func init() {
	httpcaddyfile.RegisterHandlerDirective("sliding_ratelimit", parseCaddyfile)
	// Before authentication, so that a flood of bad credentials is limited
	// before it costs a password hash; no `order` line needed.
	httpcaddyfile.RegisterDirectiveOrder("sliding_ratelimit", httpcaddyfile.Before, "basic_auth")
}

func parseCaddyfile(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	handler := new(Handler)
	err := handler.UnmarshalCaddyfile(h.Dispenser)
	return handler, err
}

// UnmarshalCaddyfile sets up the handler from Caddyfile tokens. Syntax:
//
//	sliding_ratelimit [<matcher>] {
//		window       <duration>
//		max_requests <n>
//		key          <string>
//		fail_mode    open|closed
//		redis        <url>
//		key_prefix   <string>
//		timeout      <duration>
//		headers      draft|legacy|off
//		log_keys
//	}
//
// window and max_requests are required; the rest have defaults: key
// {client_ip}, fail_mode open, no redis (in-process store), key_prefix srl:,
// timeout 100ms, headers draft.
func (h *Handler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // directive name
	if d.NextArg() {
		return d.ArgErr()
	}
	seen := make(map[string]bool)
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		name := d.Val()
		if seen[name] {
			return d.Errf("duplicate subdirective '%s'", name)
		}
		seen[name] = true
		if name == "log_keys" {
			if d.NextArg() {
				return d.ArgErr()
			}
			h.LogKeys = true
			continue
		}
		var arg string
		if !d.AllArgs(&arg) {
			return d.ArgErr()
		}
		switch name {
		case "window":
			dur, err := parsePositiveDuration(d, name, arg)
			if err != nil {
				return err
			}
			h.Window = dur
		case "max_requests":
			n, err := strconv.ParseInt(arg, 10, 64)
			if err != nil {
				return d.Errf("max_requests must be a whole number, got %q", arg)
			}
			if n < 1 {
				return d.Errf("max_requests must be at least 1, got %d", n)
			}
			h.MaxRequests = n
		case "key":
			h.Key = arg
		case "fail_mode":
			if arg != failOpen && arg != failClosed {
				return d.Errf("fail_mode must be open or closed, got %q", arg)
			}
			h.FailMode = arg
		case "redis":
			// A URL with placeholders is checked once they are known.
			if !strings.Contains(arg, "{") {
				if _, err := parseRedisURL(arg); err != nil {
					return d.Errf("redis: %v", err)
				}
			}
			h.Redis = arg
		case "key_prefix":
			if strings.ContainsAny(arg, "{}") {
				return d.Errf("key_prefix must not contain '{' or '}', got %q", arg)
			}
			h.KeyPrefix = arg
		case "timeout":
			dur, err := parsePositiveDuration(d, name, arg)
			if err != nil {
				return err
			}
			h.Timeout = dur
		case "headers":
			if arg != headersDraft && arg != headersLegacy && arg != headersOff {
				return d.Errf("headers must be draft, legacy or off, got %q", arg)
			}
			h.Headers = arg
		default:
			return d.Errf("unrecognized subdirective '%s'", name)
		}
	}
	if !seen["window"] {
		return d.Err("window is required")
	}
	if !seen["max_requests"] {
		return d.Err("max_requests is required")
	}
	return nil
}

// parsePositiveDuration parses the argument of subdirective name, which must
// be a duration greater than zero.
func parsePositiveDuration(d *caddyfile.Dispenser, name, arg string) (caddy.Duration, error) {
	dur, err := caddy.ParseDuration(arg)
	if err != nil {
		return 0, d.Errf("%s: invalid duration %q: %v", name, arg, err)
	}
	if dur <= 0 {
		return 0, d.Errf("%s must be greater than zero, got %s", name, arg)
	}
	return caddy.Duration(dur), nil
}

// Interface guard
var _ caddyfile.Unmarshaler = (*Handler)(nil)
