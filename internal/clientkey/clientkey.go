// Package clientkey builds a zone's client keys from a request: a key
// template parsed once, read per request from the first value of each
// header, query parameter or cookie it names, in two namespaces (addresses
// and values) no request value can cross, bounded to what the store keeps.
package clientkey

import (
	"net"
	"net/http"
	"net/netip"
	"net/textproto"
	"net/url"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/limiter"
)

// Client keys live in two namespaces that no request value can reach from the
// other:
//   - address keys are the client's address (grouped by prefix), as Caddy
//     resolved it: "192.0.2.1", "2001:db8:1:2::/64";
//   - value keys are built from what the request sends (headers, query
//     parameters, cookies, ...) and always start with ValueMark: a client
//     that sends "Authorization: 192.0.2.1" gets the key "=192.0.2.1", never
//     the address key of the client at 192.0.2.1.
//
// A template that is the client address alone makes address keys; any other
// template makes value keys, and falls back to the address key when every
// placeholder in it expands to "" (a client cannot escape its limit by leaving
// a header out, nor crowd every header-less client into one bucket).
const ValueMark = "="

// missingPartMark starts the stand-in for an empty placeholder of a composite
// template (two or more placeholders): the client's address. Values are
// escaped so that they never hold it (see Template.escape).
const missingPartMark = "@"

// Placeholders whose template alone makes address keys.
const (
	clientIPPlaceholder   = "{http.vars.client_ip}"
	remoteHostPlaceholder = "{http.request.remote.host}"
)

// Template is a zone's key, parsed once at provision into literal text and
// placeholders, so that a request reads each placeholder's first value (the
// one an application reads) instead of Caddy's comma-joined list.
type Template struct {
	// Raw is the template as configured.
	Raw string
	// Address is the placeholder of a template that is the client address
	// alone; "" for a value template.
	Address string
	parts   []Part
	// placeholders counts the placeholder parts.
	placeholders int
	// escape lists the bytes percent-encoded in the values of a composite
	// template: '%', the missing-part mark, and every byte of the literal
	// text. Then the literal text splits a key into its values in one way
	// only, and two different lists of values never make the same key.
	escape string
}

type partKind uint8

const (
	partLiteral  partKind = iota
	partHeader            // {http.request.header.<name>}: the first value
	partQuery             // {http.request.uri.query.<name>}: the first value
	partCookie            // {http.request.cookie.<name>}: the first cookie of that name
	partReplacer          // any other placeholder, expanded by Caddy's replacer
)

type Part struct {
	kind partKind
	// text is the literal text, the header (canonical), query parameter or
	// cookie name, or the whole placeholder "{...}" for the replacer.
	text string
}

// Parse splits raw into literal text and placeholders.
func Parse(raw string) Template {
	t := Template{Raw: raw}
	if raw == clientIPPlaceholder || raw == remoteHostPlaceholder {
		t.Address = raw
		return t
	}
	literal := "%" + missingPartMark
	rest := raw
	for rest != "" {
		open := strings.IndexByte(rest, '{')
		end := -1
		if open >= 0 {
			end = strings.IndexByte(rest[open:], '}')
		}
		if open < 0 || end < 0 {
			t.parts = append(t.parts, Part{kind: partLiteral, text: rest})
			literal += rest
			break
		}
		end += open
		if open > 0 {
			t.parts = append(t.parts, Part{kind: partLiteral, text: rest[:open]})
			literal += rest[:open]
		}
		t.parts = append(t.parts, PlaceholderPart(rest[open+1:end]))
		t.placeholders++
		rest = rest[end+1:]
	}
	t.escape = literal
	return t
}

func PlaceholderPart(name string) Part {
	if field, ok := strings.CutPrefix(name, "http.request.header."); ok {
		return Part{kind: partHeader, text: textproto.CanonicalMIMEHeaderKey(field)}
	}
	if param, ok := strings.CutPrefix(name, "http.request.uri.query."); ok {
		return Part{kind: partQuery, text: param}
	}
	if cookie, ok := strings.CutPrefix(name, "http.request.cookie."); ok {
		return Part{kind: partCookie, text: cookie}
	}
	return Part{kind: partReplacer, text: "{" + name + "}"}
}

// PlaceholderNames returns the names of the template's placeholders.
func (t *Template) PlaceholderNames() []string {
	if t.Address != "" {
		return []string{strings.Trim(t.Address, "{}")}
	}
	var names []string
	for _, p := range t.parts {
		switch p.kind {
		case partHeader:
			names = append(names, "http.request.header."+p.text)
		case partQuery:
			names = append(names, "http.request.uri.query."+p.text)
		case partCookie:
			names = append(names, "http.request.cookie."+p.text)
		case partReplacer:
			names = append(names, strings.Trim(p.text, "{}"))
		}
	}
	return names
}

// key builds r's client key and reports whether it fell back to the client
// address because every placeholder expanded to "". An address is grouped by
// prefix; the result is bounded in length (limiter.BoundKey).
func (t *Template) Key(r *http.Request, repl *caddy.Replacer, ipv4Bits, ipv6Bits int) (key string, fellBack bool) {
	if t.Address == remoteHostPlaceholder {
		return AddressKey(peerHost(r), ipv4Bits, ipv6Bits), false
	}
	if t.Address != "" {
		return AddressKey(clientIP(r), ipv4Bits, ipv6Bits), false
	}
	if t.placeholders <= 1 {
		return t.singleKey(r, repl, ipv4Bits, ipv6Bits)
	}
	return t.compositeKey(r, repl, ipv4Bits, ipv6Bits)
}

// singleKey builds the key of a template with at most one placeholder: its
// value, with the literal text around it. A template that is the placeholder
// alone and yields an address (a header set by a proxy, say) groups it by
// prefix, as address keys are, but keeps it in the value namespace.
func (t *Template) singleKey(r *http.Request, repl *caddy.Replacer, ipv4Bits, ipv6Bits int) (string, bool) {
	if len(t.parts) == 1 && t.parts[0].kind != partLiteral {
		v := t.parts[0].Value(r, repl)
		if v == "" {
			return AddressKey(clientIP(r), ipv4Bits, ipv6Bits), true
		}
		return limiter.BoundKey(ValueMark + GroupIP(v, ipv4Bits, ipv6Bits)), false
	}
	var b strings.Builder
	b.WriteString(ValueMark)
	for _, p := range t.parts {
		if p.kind == partLiteral {
			b.WriteString(p.text)
			continue
		}
		v := p.Value(r, repl)
		if v == "" {
			return AddressKey(clientIP(r), ipv4Bits, ipv6Bits), true
		}
		b.WriteString(v)
	}
	return limiter.BoundKey(b.String()), false
}

// compositeKey builds the key of a template with two or more placeholders.
// Values are escaped, so the key says which value came from which
// placeholder; an empty one is replaced by the client address, so a client
// that leaves out one part is limited per address within the others, and
// cannot reach another client's key by moving text from one part to another.
func (t *Template) compositeKey(r *http.Request, repl *caddy.Replacer, ipv4Bits, ipv6Bits int) (string, bool) {
	var b strings.Builder
	b.WriteString(ValueMark)
	empty := 0
	var address string
	for _, p := range t.parts {
		if p.kind == partLiteral {
			b.WriteString(p.text)
			continue
		}
		v := p.Value(r, repl)
		if v == "" {
			empty++
			if address == "" {
				address = AddressKey(clientIP(r), ipv4Bits, ipv6Bits)
			}
			b.WriteString(missingPartMark)
			b.WriteString(escapeBytes(address, t.escape))
			continue
		}
		b.WriteString(escapeBytes(v, t.escape))
	}
	if empty == t.placeholders {
		return address, true
	}
	return limiter.BoundKey(b.String()), false
}

// value reads the part's placeholder from r: for headers, query parameters
// and cookies the first value, which is what an application behind Caddy
// reads; a client that repeats one must not get a fresh key by it.
func (p Part) Value(r *http.Request, repl *caddy.Replacer) string {
	switch p.kind {
	case partHeader:
		if vals := r.Header[p.text]; len(vals) > 0 {
			return vals[0]
		}
		return ""
	case partQuery:
		return firstQueryValue(r.URL.RawQuery, p.text)
	case partCookie:
		for _, c := range r.Cookies() {
			// As Caddy's cookie placeholder matches names.
			if strings.EqualFold(c.Name, p.text) {
				return c.Value
			}
		}
		return ""
	case partReplacer:
		return repl.ReplaceAll(p.text, "")
	}
	return p.text
}

// firstQueryValue returns the first value of the query parameter name, read
// as net/url's ParseQuery reads it (pairs holding ';' or bad escapes are
// skipped), or "".
func firstQueryValue(rawQuery, name string) string {
	for rawQuery != "" {
		var pair string
		pair, rawQuery, _ = strings.Cut(rawQuery, "&")
		if pair == "" || strings.Contains(pair, ";") {
			continue
		}
		rawKey, rawValue, _ := strings.Cut(pair, "=")
		key, err := url.QueryUnescape(rawKey)
		if err != nil || key != name {
			continue
		}
		value, err := url.QueryUnescape(rawValue)
		if err != nil {
			continue
		}
		return value
	}
	return ""
}

// escapeBytes percent-encodes every byte of s that is in set.
func escapeBytes(s, set string) string {
	if !strings.ContainsAny(s, set) {
		return s
	}
	const hex = "0123456789ABCDEF"
	var b strings.Builder
	b.Grow(len(s) + 8)
	for i := 0; i < len(s); i++ {
		c := s[i]
		if strings.IndexByte(set, c) >= 0 {
			b.WriteByte('%')
			b.WriteByte(hex[c>>4])
			b.WriteByte(hex[c&15])
			continue
		}
		b.WriteByte(c)
	}
	return b.String()
}

// AddressKey is the key of a client address in the address namespace.
func AddressKey(addr string, ipv4Bits, ipv6Bits int) string {
	return limiter.BoundKey(GroupIP(addr, ipv4Bits, ipv6Bits))
}

// GroupIP returns key unchanged unless it is an IP address, which becomes
// its network of the given prefix length ("2001:db8:1:2::/64"), so that one
// client with many addresses counts once.
func GroupIP(key string, ipv4Bits, ipv6Bits int) string {
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
	return peerHost(r)
}

// peerHost is the host of the connection's peer address.
func peerHost(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// StoredKey turns a client key an operator names (admin API) into the key the
// zone stores: an address is grouped as address keys are; in a zone keyed by
// request values, a key that is not an address is a value (the leading
// ValueMark may be given, and must be for a value that looks like an
// address, as the zone stores it); a hashed key ("#...") is taken as it is.
func (t *Template) StoredKey(raw string, ipv4Bits, ipv6Bits int) string {
	if strings.HasPrefix(raw, "#") {
		// limiter.BoundKey's hashes start with '#', which it never keeps
		// in a key it leaves as it is.
		return raw
	}
	if t.Address == "" {
		if v, ok := strings.CutPrefix(raw, ValueMark); ok {
			if len(t.parts) == 1 {
				v = GroupIP(v, ipv4Bits, ipv6Bits)
			}
			return limiter.BoundKey(ValueMark + v)
		}
		if !IsAddress(raw) {
			return limiter.BoundKey(ValueMark + raw)
		}
	}
	return AddressKey(raw, ipv4Bits, ipv6Bits)
}

// IsAddress reports whether s is an IP address or prefix.
func IsAddress(s string) bool {
	if _, err := netip.ParseAddr(s); err == nil {
		return true
	}
	_, err := netip.ParsePrefix(s)
	return err == nil
}

// knownPlaceholderPrefixes are the placeholder namespaces whose values a
// request handler can read: Caddy's request placeholders, variables set by
// vars and map, authentication results, the answer of forward_auth's
// upstream (for the handlers after it), regexp captures of matchers, and
// the environment. The Caddyfile's shorthands ({client_ip}, {header.*},
// {query.*}, {cookie.*}, {vars.*}, {re.*}, ...) expand into these.
var knownPlaceholderPrefixes = []string{
	"http.request.header.",
	"http.request.cookie.",
	"http.request.uri.query.",
	"http.request.uri.path.",
	"http.request.orig_uri.path.",
	"http.request.host.labels.",
	"http.request.tls.",
	"http.request.remote.host/",
	"http.vars.",
	"http.auth.",
	"http.reverse_proxy.header.",
	"http.regexp.",
	"env.",
}

// knownRequestPlaceholders are Caddy's request placeholders without a
// variable part (modules/caddyhttp/replacer.go).
var knownRequestPlaceholders = map[string]bool{}

func init() {
	for _, name := range strings.Fields(`method scheme proto proto_name host port hostport
		local local.host local.port remote remote.host remote.port
		uri uri_escaped uri.path uri.path_escaped uri.path.file uri.path.dir
		uri.path.file.base uri.path.file.ext uri.query uri.query_escaped uri.prefixed_query
		duration duration_ms uuid body body_base64
		orig_method orig_uri orig_uri.path orig_uri.path.file orig_uri.path.file_escaped
		orig_uri.path.dir orig_uri.query orig_uri.prefixed_query`) {
		knownRequestPlaceholders["http.request."+name] = true
	}
	// The model an LLM call names, which sliding_ratelimit provides.
	knownRequestPlaceholders["http.sliding_ratelimit.model"] = true
}

// KnownPlaceholder reports whether name (without braces) is a placeholder a
// request handler can read. Anything else, such as a typo like
// "http.request.heder.X", expands to "" at run time.
func KnownPlaceholder(name string) bool {
	if knownRequestPlaceholders[name] {
		return true
	}
	for _, prefix := range knownPlaceholderPrefixes {
		if rest, ok := strings.CutPrefix(name, prefix); ok && rest != "" {
			return true
		}
	}
	return false
}
