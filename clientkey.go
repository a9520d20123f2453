package slidingratelimit

import (
	"net"
	"net/http"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/limiter"
)

// clientKey expands the key template for r. A key that expands to "" falls
// back to the client IP, so leaving out a header does not escape the limit.
// The result is bounded in length (limiter.BoundKey).
func clientKey(r *http.Request, repl *caddy.Replacer, template string) string {
	var key string
	if template == defaultKey {
		key = clientIP(r)
	} else {
		key = repl.ReplaceAll(template, "")
	}
	if key == "" {
		key = clientIP(r)
	}
	return limiter.BoundKey(key)
}

// clientIP is the client address as Caddy resolved it (trusted_proxies
// applied), or the connection's peer address.
func clientIP(r *http.Request) string {
	if ip, ok := caddyhttp.GetVar(r.Context(), caddyhttp.ClientIPVarKey).(string); ok && ip != "" {
		return ip
	}
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}
