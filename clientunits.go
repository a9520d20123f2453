package slidingratelimit

import (
	"strings"

	"go.uber.org/zap"
)

// A quota (max_requests from a placeholder) or a cost read from what the
// client sends (a header, a query parameter, a cookie, the body) is the
// client's to choose unless a handler that runs before the limiter replaces
// it, and the limiter is ordered before forward_auth: without a route that
// orders them, `max_requests {http.request.header.X-Quota} 10` lets a client
// send X-Quota: 281474976710655 and have it. The module cannot see the
// handlers around it, so it warns at load and names the form that is safe in
// any order: the auth answer's own placeholder,
// {http.reverse_proxy.header.<name>}, which only forward_auth sets, and which
// is empty (the fallback applies) when the limiter runs first.

// authAnswerPlaceholder is the safe form's namespace: the headers of the
// answer of forward_auth's (or reverse_proxy's) upstream, set by it on the
// request's replacer for the handlers after it.
const authAnswerPlaceholder = "http.reverse_proxy.header."

// clientChosen reports whether a placeholder (without braces) reads what the
// client sent: anything of the request but its addresses and its verified
// certificate.
func clientChosen(name string) bool {
	rest, ok := strings.CutPrefix(name, "http.request.")
	if !ok {
		return false
	}
	for _, server := range []string{"remote", "local", "tls."} {
		if strings.HasPrefix(rest, server) {
			return false
		}
	}
	return true
}

// warnClientChosenUnits warns of a zone whose quota, or whose cost without a
// settle that corrects it after the response, the client chooses.
func warnClientChosenUnits(logger *zap.Logger, zone, maxRequestsFrom, cost string, settled bool) {
	warn := func(field, raw string) {
		name := strings.TrimSuffix(strings.TrimPrefix(raw, "{"), "}")
		if !clientChosen(name) {
			return
		}
		safe := raw
		if header, ok := strings.CutPrefix(name, "http.request.header."); ok {
			safe = "{" + authAnswerPlaceholder + header + "}"
		}
		logger.Warn(field+" is read from the request, which the client sends: a client can choose its own unless a handler that runs before sliding_ratelimit replaces it, and sliding_ratelimit runs before forward_auth unless a route orders them; take it from the auth service's answer, "+safe+", which only forward_auth sets and which gives the fallback in any order (docs/tenants.md)",
			zap.String("zone", zone), zap.String("placeholder", raw))
	}
	if maxRequestsFrom != "" {
		warn("max_requests", maxRequestsFrom)
	}
	if strings.HasPrefix(cost, "{") && !settled {
		warn("cost", cost)
	}
}
