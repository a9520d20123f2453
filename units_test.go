package slidingratelimit

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/limiter"
)

// unitZone is a zone provisioned for headers and placeholders, without a
// store.
func unitZone(t *testing.T, z *Zone) *Zone {
	t.Helper()
	if err := initMetrics(nil); err != nil {
		t.Fatal(err)
	}
	z.limit = limiter.Limit{Window: time.Duration(z.Window), Max: z.MaxRequests}
	z.units = newZoneUnits(z.Name, z.Cost, nil, z.MaxRequestsFrom, z.MaxRequests, z.Settle, zap.NewNop())
	z.prepareHeaders()
	return z
}

// TestHeadersSpeakUnits: the policy of a zone counted in bytes carries the
// draft's quota unit; one counted in units the draft has no name for, or in
// requests, carries none; a tenant's call shows its own quota, in the policy
// and the legacy limit.
func TestHeadersSpeakUnits(t *testing.T) {
	bytes := unitZone(t, &Zone{Name: "bw", Window: caddy.Duration(time.Hour), MaxRequests: 1000000000, Settle: &Settle{Bytes: true}})
	tokens := unitZone(t, &Zone{Name: "tokens", Window: caddy.Duration(time.Minute), MaxRequests: 100000, Settle: &Settle{Header: "X-Usage"}})
	tenants := unitZone(t, &Zone{Name: "tenants", Window: caddy.Duration(time.Minute), MaxRequests: 10, MaxRequestsFrom: "{http.request.header.X-Quota}"})
	zones := []*Zone{bytes, tokens, tenants}
	checks := []limiter.Check{{Limit: bytes.limit}, {Limit: tokens.limit}, {Limit: limiter.Limit{Window: time.Minute, Max: 5000}}}
	decisions := []limiter.Decision{{Allowed: true, Remaining: 999999000}, {Allowed: true, Remaining: 99000}, {Allowed: true, Remaining: 4000}}
	h := http.Header{}
	writeHeaders(h, headersLegacy, zones, checks, decisions, 2)
	want := http.Header{
		"Ratelimit-Policy":      {`"bw";q=1000000000;qu="content-bytes";w=3600, "tokens";q=100000;srl-qu="units";w=60, "tenants";q=5000;w=60`},
		"Ratelimit":             {`"tenants";r=4000;t=0, "tokens";r=99000;t=0, "bw";r=999999000;t=0`},
		"X-Ratelimit-Limit":     {"5000"},
		"X-Ratelimit-Remaining": {"4000"},
		"X-Ratelimit-Reset":     {"0"},
	}
	for k, v := range want {
		if got := h.Get(k); got != v[0] {
			t.Errorf("%s %q, want %q", k, got, v[0])
		}
	}

	r := caddyhttp.PrepareRequest(httptest.NewRequest("GET", "http://example.test/", nil), caddy.NewReplacer(), httptest.NewRecorder(), nil)
	repl := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	setPlaceholders(r, repl, tenants, limiter.Check{Limit: checks[2].Limit}, decisions[2])
	if got, want := repl.ReplaceAll("{http.sliding_ratelimit.limit} {http.sliding_ratelimit.unit} {http.sliding_ratelimit.cost}", ""), "5000 requests 1"; got != want {
		t.Errorf("placeholders %q, want %q", got, want)
	}
	setPlaceholders(r, repl, bytes, limiter.Check{Limit: bytes.limit, Cost: 3}, decisions[0])
	if got, want := repl.ReplaceAll("{http.sliding_ratelimit.limit} {http.sliding_ratelimit.unit} {http.sliding_ratelimit.cost}", ""), "1000000000 content-bytes 3"; got != want {
		t.Errorf("placeholders %q, want %q", got, want)
	}
}

// TestNeverIsMostRestrictive: a zone that no wait can make admit the
// request is the one the headers report, so no Retry-After from another
// zone sends the client back for nothing.
func TestNeverIsMostRestrictive(t *testing.T) {
	decisions := []limiter.Decision{
		{RetryAfter: time.Hour, Reset: time.Hour},
		{Never: true},
		{RetryAfter: time.Minute, Reset: time.Minute},
	}
	if got := mostRestrictive(decisions); got != 1 {
		t.Errorf("shown %d, want 1, the never", got)
	}
}

// TestUnitsConfigErrors: JSON configs get the rules the Caddyfile gets, in
// the same words.
func TestUnitsConfigErrors(t *testing.T) {
	for _, c := range []struct{ config, want string }{
		{`{"window": "1m", "max_requests": 5, "cost": "0"}`, `cost must be a whole number of at least 1, or a placeholder alone such as {http.request.header.X-Cost}, got "0"`},
		{`{"window": "1m", "max_requests": 5, "cost": "6"}`, `cost 6 is above max_requests 5: no request would ever be admitted`},
		{`{"zones": [{"name": "z", "window": "1m", "max_requests": 5, "cost": "{http.request.header.X-Cost"}]}`, `zone z: cost must be a whole number`},
		{`{"window": "1m", "max_requests": 5, "settle": {"header": "X-Usage", "bytes": true}}`, `settle takes a header, bytes or json paths, not more than one`},
		{`{"window": "1m", "max_requests": 5, "settle": {}}`, `settle needs a header (settle header X-Usage) or bytes (settle bytes)`},
		{`{"zones": [{"name": "z", "window": "1m", "max_requests": 5, "settle": {"header": "X Usage"}}]}`, `zone z: settle header: "X Usage" is not a header name`},
		{`{"window": "1m", "max_requests": 5, "max_requests_from": "X-Quota"}`, `max_requests_from must be a placeholder alone, such as {http.request.header.X-Quota}, got "X-Quota"`},
		{`{"zones": [{"name": "z", "window": "1m", "max_requests": 5}], "max_requests_from": "{http.request.header.X-Quota}"}`, `max_requests_from needs window and max_requests (its fallback); a zone has its own`},
		{`{"window": "1m", "max_requests": 281474976710656}`, `max_requests must be at most 2^48-1 (281474976710655), got 281474976710656`},
		{`{"window": "1m", "max_requests": 5, "settle": {"header": "X-Usage", "json": ["usage.total_tokens"]}}`, `settle takes a header, bytes or json paths, not more than one`},
		{`{"zones": [{"name": "z", "window": "1m", "max_requests": 5, "settle": {"json": ["usage..total_tokens"]}}]}`, `zone z: settle json: "usage..total_tokens" is not a dotted path`},
		{`{"window": "1m", "max_requests": 5000, "cost": "5", "cost_json": {"paths": ["max_tokens"], "default": 4096}}`, `cost and cost json are one setting: set one (cost "5")`},
		{`{"window": "1m", "max_requests": 5000, "cost_json": {"default": 4096}}`, `cost json needs at least one path and a default`},
		{`{"zones": [{"name": "z", "window": "1m", "max_requests": 5000, "cost_json": {"paths": ["max_tokens"]}}]}`, `zone z: cost json: the default must be a whole number of at least 1, got 0`},
		{`{"window": "1m", "max_requests": 1000, "cost_json": {"paths": ["max_tokens"], "default": 4096}}`, `cost json: the default 4096 is above max_requests 1000`},
		{`{"zones": [{"name": "z", "concurrent": 2, "cost_json": {"paths": ["max_tokens"], "default": 1}}]}`, `cost_json`},
	} {
		err := provisionError(t, c.config)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want one containing %q", c.config, err, c.want)
		}
	}
	// A fixed cost above the fallback of a per-tenant max is no mistake: a
	// tenant's quota may be larger.
	if err := provisionError(t, `{"window": "1m", "max_requests": 5, "max_requests_from": "{http.request.header.X-Quota}", "cost": "10"}`); err != nil {
		t.Errorf("cost above the fallback of a per-tenant max: %v", err)
	}
}
