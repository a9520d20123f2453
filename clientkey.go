package slidingratelimit

import (
	"net"
	"net/http"
	"net/netip"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/limiter"
)

// clientKey expands the key template for r. A key that expands to "" falls
// back to the client IP, so leaving out a header does not escape the limit.
// A key that is an IP address is grouped by prefix. The result is bounded in
// length (limiter.BoundKey).
func clientKey(r *http.Request, repl *caddy.Replacer, template string, ipv4Bits, ipv6Bits int) string {
	var key string
	if template == defaultKey {
		key = clientIP(r)
	} else {
		key = repl.ReplaceAll(template, "")
	}
	if key == "" {
		key = clientIP(r)
	}
	return normalizeKey(key, ipv4Bits, ipv6Bits)
}

// normalizeKey turns a raw client key into the key stored and cached: an IP
// address grouped by prefix, the length bounded (limiter.BoundKey). The admin
// API applies it to the keys operators send, so they address the same state.
func normalizeKey(key string, ipv4Bits, ipv6Bits int) string {
	return limiter.BoundKey(groupIP(key, ipv4Bits, ipv6Bits))
}

// groupIP returns key unchanged unless it is an IP address, which becomes
// its network of the given prefix length ("2001:db8:1:2::/64"), so that one
// client with many addresses counts once.
func groupIP(key string, ipv4Bits, ipv6Bits int) string {
	parsed, err := netip.ParseAddr(key)
	if err != nil {
		return key
	}
	addr := parsed.Unmap().WithZone("")
	bits := ipv6Bits
	if addr.Is4() {
		bits = ipv4Bits
	}
	if bits >= addr.BitLen() {
		if addr == parsed {
			return key
		}
		return addr.String()
	}
	prefix, err := addr.Prefix(bits)
	if err != nil {
		return key
	}
	return prefix.String()
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
