package slidingratelimit

import "strings"

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
}

// knownPlaceholder reports whether name (without braces) is a placeholder a
// request handler can read. Anything else, such as a typo like
// "http.request.heder.X", expands to "" at run time.
func knownPlaceholder(name string) bool {
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
