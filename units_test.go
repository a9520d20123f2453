package slidingratelimit

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/adminapi"
	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/strictnum"
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
	z.units = newZoneUnits(z.Name, z.Cost, nil, nil, z.MaxRequestsFrom, z.MaxRequests, z.Settle, zap.NewNop())
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
		{`{"window": "1m", "max_requests": 5, "settle": {"header": "X-Usage", "bytes": true}}`, `settle takes a header, bytes, json paths or llm, not more than one`},
		{`{"window": "1m", "max_requests": 5, "settle": {}}`, `settle needs a header (settle header X-Usage), bytes (settle bytes)`},
		{`{"zones": [{"name": "z", "window": "1m", "max_requests": 5, "settle": {"header": "X Usage"}}]}`, `zone z: settle header: "X Usage" is not a header name`},
		{`{"window": "1m", "max_requests": 5, "max_requests_from": "X-Quota"}`, `max_requests_from must be a placeholder alone, such as {http.request.header.X-Quota}, got "X-Quota"`},
		{`{"zones": [{"name": "z", "window": "1m", "max_requests": 5}], "max_requests_from": "{http.request.header.X-Quota}"}`, `max_requests_from needs window and max_requests (its fallback); a zone has its own`},
		{`{"window": "1m", "max_requests": 281474976710656}`, `max_requests must be at most 2^48-1 (281474976710655), got 281474976710656`},
		{`{"window": "1m", "max_requests": 5, "settle": {"header": "X-Usage", "json": ["usage.total_tokens"]}}`, `settle takes a header, bytes, json paths or llm, not more than one`},
		{`{"zones": [{"name": "z", "window": "1m", "max_requests": 5, "settle": {"json": ["usage..total_tokens"]}}]}`, `zone z: settle json: "usage..total_tokens" is not a dotted path`},
		{`{"window": "1m", "max_requests": 5000, "cost": "5", "cost_json": {"paths": ["max_tokens"], "default": 4096}}`, `cost and cost json are one setting: set one (cost "5")`},
		{`{"window": "1m", "max_requests": 5000, "cost_json": {"default": 4096}}`, `cost json needs at least one path and a default`},
		{`{"zones": [{"name": "z", "window": "1m", "max_requests": 5000, "cost_json": {"paths": ["max_tokens"]}}]}`, `zone z: cost json: the default must be a whole number of at least 1, got 0`},
		{`{"window": "1m", "max_requests": 1000, "cost_json": {"paths": ["max_tokens"], "default": 4096}}`, `cost json: the default 4096 is above max_requests 1000`},
		{`{"zones": [{"name": "z", "concurrent": 2, "cost_json": {"paths": ["max_tokens"], "default": 1}}]}`, `cost_json`},
		{`{"window": "1m", "max_requests": 100000, "cost": "5", "cost_llm": {}}`, `cost and cost llm are one setting: set one (cost "5")`},
		{`{"window": "1m", "max_requests": 100000, "cost_json": {"paths": ["max_tokens"], "default": 4096}, "cost_llm": {}}`, `cost json and cost llm are one setting`},
		{`{"zones": [{"name": "z", "window": "1m", "max_requests": 100000, "cost_llm": {"default": -1}}]}`, `zone z: cost llm: the default output bound must be a whole number of at least 1, got -1`},
		{`{"zones": [{"name": "z", "window": "1m", "max_requests": 1000, "cost_llm": {}}]}`, `zone z: cost llm: the default output bound 4096 is above max_requests 1000`},
		{`{"zones": [{"name": "z", "concurrent": 2, "cost_llm": {}}]}`, `cost_llm`},
		{`{"window": "1m", "max_requests": 5, "settle": {"llm": true, "bytes": true}}`, `settle takes a header, bytes, json paths or llm, not more than one`},
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

// setRedisSave sets the shared Redis's RDB save points for the test, so
// that it keeps long budgets as a production Redis does; the test's end
// puts back none.
func setRedisSave(t *testing.T, points string) {
	t.Helper()
	rc := sharedRedis.Client(t)
	if err := rc.ConfigSet(context.Background(), "save", points).Err(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rc.ConfigSet(context.Background(), "save", "") })
}

// TestQuotaFromTheClientWarnsAndTheRecipeFailsSafe: a quota read from a
// request header is warned of at load (and counted in config_warnings); the
// recipe's form, the auth answer's own placeholder, holds each tenant to the
// auth service's quota when a route runs forward_auth first, and gives the
// fallback when the limiter runs first (no route): in neither order does a
// client's own X-Quota count.
func TestQuotaFromTheClientWarnsAndTheRecipeFailsSafe(t *testing.T) {
	auth := newAuthService(t, map[string]string{"gold": "5"})
	prefix := uniquePrefix(t)
	warning := "max_requests is read from the request, which the client sends"
	forged := withHeader("X-Quota", "1000")
	gold := withHeader("Authorization", "Bearer gold")
	statuses := func(what string, n int, opts ...sendOption) []int {
		var got []int
		for range n {
			got = append(got, send(t, site, opts...).status)
		}
		t.Logf("%s: %v", what, got)
		return got
	}
	count := func(got []int, status int) int {
		n := 0
		for _, s := range got {
			if s == status {
				n++
			}
		}
		return n
	}

	// The unsafe form: warned, and the client's own quota counts.
	logFile := startCaddy(t, siteBlock(":9080", prefix+"u", `
	sliding_ratelimit {
		window 1m
		max_requests {http.request.header.X-Quota} 2
	}
	respond "ok"`))
	lines := logLines(t, logFile, warning)
	if len(lines) != 1 || !strings.Contains(lines[0], `{http.reverse_proxy.header.X-Quota}`) {
		t.Errorf("unsafe quota: warnings %v, want one that names {http.reverse_proxy.header.X-Quota}", lines)
	}
	if got := scrape(t, "caddy_sliding_ratelimit_config_warnings"); got != 1 {
		t.Errorf("config_warnings = %v with the unsafe quota, want 1", got)
	}
	if got := statuses("unsafe form, forged quota", 4, forged, from("127.0.0.2")); count(got, 200) != 4 {
		t.Errorf("the unsafe form took the client's quota: %v (this is what the warning is for)", got)
	}

	// The recipe's form. In a route after forward_auth: the auth service's
	// quota, 5, whatever the client says. Its hourly quotas want a Redis
	// that keeps them across a restart (docs/redis.md), or it warns.
	setRedisSave(t, "3600 1")
	limiter := func(suffix string) string {
		return `sliding_ratelimit {
		zone tenants 1h {http.reverse_proxy.header.X-Quota} 2 {
			key {http.reverse_proxy.header.X-Tenant}
		}
		redis ` + sharedRedis.URL() + `
		key_prefix ` + prefix + suffix + `
	}`
	}
	forwardAuth := `forward_auth ` + auth.url + ` {
		uri /check
		copy_headers X-Tenant X-Quota
	}`
	logFile = startCaddy(t, `:9080 {
	route {
		`+strings.ReplaceAll(forwardAuth, "\n", "\n\t")+`
		`+strings.ReplaceAll(limiter("r"), "\n", "\n\t")+`
		respond "ok"
	}
}`)
	if lines := logLines(t, logFile, "sliding_ratelimit", `"level":"warn"`); len(lines) != 0 {
		t.Errorf("the recipe's form: warnings %v, want none", lines)
	}
	if got := scrape(t, "caddy_sliding_ratelimit_config_warnings"); got != 0 {
		t.Errorf("config_warnings = %v after a reload without the unsafe quota, want 0", got)
	}
	if got := statuses("recipe, forward_auth first", 7, gold, forged, from("127.0.0.2")); count(got, 200) != 5 || count(got, 429) != 2 {
		t.Errorf("the recipe after forward_auth: %v, want the auth service's quota of 5", got)
	}

	// The same handlers without the route: the limiter runs first, before
	// forward_auth has answered. The fallback applies, keyed by address.
	startCaddy(t, `:9080 {
	`+forwardAuth+`
	`+limiter("n")+`
	respond "ok"
}`)
	if got := statuses("recipe, limiter first", 4, gold, forged, from("127.0.0.3")); count(got, 200) != 2 || count(got, 429) != 2 {
		t.Errorf("the recipe with the limiter first: %v, want the fallback quota of 2", got)
	}
}

// TestUnitsExactAcrossInstances: two real clients (127.0.0.2, 127.0.0.3)
// each send 40 requests at once with costs of 1 to 9, half to the Caddy and
// half to a second instance on the same Redis. Whatever the interleaving,
// the units admitted to each client never exceed its budget of 60, and are
// exactly what Redis holds for it; the other client's spending changes
// nothing.
func TestUnitsExactAcrossInstances(t *testing.T) {
	prefix := uniquePrefix(t)
	zone := uniqueZone("exact")
	startCaddy(t, siteBlock(":9080", prefix, `
	sliding_ratelimit {
		zone `+zone+` 10m 60 {
			cost {http.request.header.X-Cost}
		}
		timeout 1s
	}
	respond "ok"`))
	other := newInstance(t, `{"zones": [{"name": "`+zone+`", "window": "10m", "max_requests": 60, "cost": "{http.request.header.X-Cost}"}],
		"redis": "`+sharedRedis.URL()+`?client_name=other", "key_prefix": "`+prefix+`", "timeout": "1s"}`)
	type result struct{ admitted, denied int64 }
	// Every entry is made before any request goes: the map is only read
	// while they run.
	results := map[string]*result{"127.0.0.2": new(result), "127.0.0.3": new(result)}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for ip := range results {
		for i := range 40 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				cost := 1 + i%9
				opts := []sendOption{from(ip), withHeader("X-Cost", strconv.Itoa(cost))}
				if i%2 == 1 {
					opts = append(opts, to(other))
				}
				status := send(t, site, opts...).status
				mu.Lock()
				defer mu.Unlock()
				switch status {
				case http.StatusOK:
					results[ip].admitted += int64(cost)
				case http.StatusTooManyRequests:
					results[ip].denied++
				default:
					t.Errorf("%s, cost %d: status %d", ip, cost, status)
				}
			}()
		}
	}
	wg.Wait()
	for ip, r := range results {
		if r.admitted > 60 || r.denied == 0 {
			t.Errorf("%s: %d units admitted with %d denials, want at most 60, and denials (200 units asked)", ip, r.admitted, r.denied)
		}
		if held := unitsHeld(t, other, zone, ip); held != r.admitted {
			t.Errorf("%s: Redis holds %d units, the answers admitted %d", ip, held, r.admitted)
		}
	}
}

// TestSettledUnitsAcrossInstances: a client alternates between two
// instances on one Redis, each request reserving 1 unit and settled to the
// 7 units its response reports. It is admitted while its window holds less
// than the budget of 60, so it pays for 63 (the last request's overrun is
// all it gets past the budget), and both instances then deny it.
func TestSettledUnitsAcrossInstances(t *testing.T) {
	prefix := uniquePrefix(t)
	zone := uniqueZone("settled")
	config := `{"zones": [{"name": "` + zone + `", "window": "10m", "max_requests": 60, "settle": {"header": "X-Usage"}}],
		"redis": "` + sharedRedis.URL() + `", "key_prefix": "` + prefix + `", "timeout": "1s"}`
	instances := []*instance{newInstance(t, config), newInstance(t, config[:len(config)-1]+`, "redis": "`+sharedRedis.URL()+`?client_name=b"}`)}
	usage := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		w.Header().Set("X-Usage", "7")
		w.WriteHeader(http.StatusOK)
		return nil
	})
	admitted := 0
	for i := range 12 {
		if send(t, "/", to(instances[i%2]), from("192.0.2.70"), withNext(usage)).status == http.StatusOK {
			admitted++
		}
	}
	if admitted != 9 {
		t.Errorf("%d requests admitted, want 9: 8 leave 56 units, under 60; the 9th makes 63", admitted)
	}
	if held := unitsHeld(t, instances[0], zone, "192.0.2.70"); held != 63 {
		t.Errorf("Redis holds %d units, want 63", held)
	}
}

// uniqueZone is a zone name of its own for a test, so that process-wide
// metrics count only its requests.
func uniqueZone(prefix string) string {
	return prefix + strconv.FormatInt(time.Now().UnixNano()%1e9, 36)
}

// TestCostFromARequestValue: through Caddy and Redis, what each value of a
// cost header reserves. A request value never makes a request free or
// negative: what is not a whole number of at least 1 reserves 1, counted in
// the metric and logged once; a repeated header counts by its first value;
// a number above max_requests, however large, is a 429 without Retry-After,
// which handle_errors can explain with the cost and the limit.
func TestCostFromARequestValue(t *testing.T) {
	zone := uniqueZone("cost")
	logFile := startCaddy(t, siteBlock(":9080", uniquePrefix(t), `
	sliding_ratelimit {
		zone `+zone+` 1m 100 {
			cost {http.request.header.X-Cost}
			key {http.request.header.X-Client}
		}
	}
	respond "ok"
	handle_errors 429 {
		respond "cost {http.sliding_ratelimit.cost} of {http.sliding_ratelimit.limit} {http.sliding_ratelimit.unit}, retry after {http.sliding_ratelimit.retry_after}" 429
	}`))
	fallbacks := 0
	for _, c := range []struct {
		name      string
		values    []string
		status    int
		remaining int
		fallback  bool
	}{
		{"missing", nil, 200, 99, true},
		{"empty", []string{""}, 200, 99, true},
		{"zero", []string{"0"}, 200, 99, true},
		{"negative", []string{"-5"}, 200, 99, true},
		{"exponent", []string{"1e9"}, 200, 99, true},
		{"NaN", []string{"NaN"}, 200, 99, true},
		{"list", []string{"60,1"}, 200, 99, true},
		{"plus", []string{"+5"}, 200, 99, true},
		{"fraction", []string{"5.5"}, 200, 99, true},
		{"five", []string{"5"}, 200, 95, false},
		{"repeated", []string{"3", "50"}, 200, 97, false},
		{"all", []string{"100"}, 200, 0, false},
		{"above max", []string{"101"}, 429, 100, false},
		{"enormous", []string{"99999999999999999999"}, 429, 100, false},
	} {
		res := send(t, site, from("127.0.0.2"), withHeader("X-Client", c.name), withHeader("X-Cost", c.values...))
		if res.status != c.status {
			t.Errorf("%s %q: status %d, want %d", c.name, c.values, res.status, c.status)
		}
		if got, want := res.header.Get("RateLimit"), fmt.Sprintf(`"%s";r=%d;`, zone, c.remaining); !strings.HasPrefix(got, want) {
			t.Errorf("%s %q: RateLimit %q, want it to start with %s", c.name, c.values, got, want)
		}
		if c.status == http.StatusTooManyRequests {
			if retry := res.header.Get("Retry-After"); retry != "" {
				t.Errorf("%s: Retry-After %q on a request no wait admits, want none", c.name, retry)
			}
			if want := "of 100 units, retry after 0"; !strings.Contains(res.body, want) {
				t.Errorf("%s: handle_errors body %q, want it to hold %q", c.name, res.body, want)
			}
		}
		if c.fallback {
			fallbacks++
		}
	}
	if got := testutil.ToFloat64(limiterMetrics.costFallbacks.WithLabelValues(zone)); got != float64(fallbacks) {
		t.Errorf("cost_fallbacks_total %v, want %d", got, fallbacks)
	}
	// The first fallback is logged, the others within the minute counted.
	if lines := logLines(t, logFile, "cost is not a whole number", zone); len(lines) != 1 {
		t.Errorf("%d log lines about the cost, want 1: %q", len(lines), lines)
	} else if strings.Contains(lines[0], "NaN") {
		t.Errorf("the log line holds the request's value: %s", lines[0])
	}
	if got := testutil.ToFloat64(limiterMetrics.unitsAdmitted.WithLabelValues(zone)); got != 9+5+3+100 {
		t.Errorf("units_total %v, want %d", got, 9+5+3+100)
	}
}

// TestFixedCost: with cost 10, max_requests 25 is a budget of two requests
// and a half: two are admitted, the third waits until the first ages out,
// and the headers count units.
func TestFixedCost(t *testing.T) {
	startCaddy(t, siteBlock(":9080", uniquePrefix(t), `
	sliding_ratelimit {
		window 1m
		max_requests 25
		cost 10
	}
	respond "ok"`))
	client := from("127.0.0.3")
	for i, want := range []struct {
		status int
		r      string
	}{{200, "15"}, {200, "5"}, {429, "5"}} {
		res := send(t, site, client)
		if res.status != want.status || !strings.HasPrefix(res.header.Get("RateLimit"), `"default";r=`+want.r+";") {
			t.Errorf("request %d: %d %q, want %d with r=%s", i+1, res.status, res.header.Get("RateLimit"), want.status, want.r)
		}
		if want.status == 429 {
			if retry, _ := strconv.Atoi(res.header.Get("Retry-After")); retry < 50 || retry > 60 {
				t.Errorf("Retry-After %q, want the first admission's age-out, about 60", res.header.Get("Retry-After"))
			}
		}
	}
	if got, want := send(t, site, client).header.Get("RateLimit-Policy"), `"default";q=25;srl-qu="units";w=60`; got != want {
		t.Errorf("RateLimit-Policy %q, want %q (the vendor-prefixed unit: the draft has none for units)", got, want)
	}
}

// TestCostFromAMap: a cost that a map sets per path, as an earlier handler
// prices requests: an export costs 10, anything else 1.
func TestCostFromAMap(t *testing.T) {
	zone := uniqueZone("priced")
	logFile := startCaddy(t, siteBlock(":9080", uniquePrefix(t), `
	map {path} {price} {
		/export 10
		default 1
	}
	sliding_ratelimit {
		zone `+zone+` 1m 30 {
			cost {price}
		}
	}
	respond "ok"`))
	for i, c := range []struct{ path, r string }{{"export", "20"}, {"list", "19"}, {"export", "9"}} {
		if got := send(t, site+c.path, from("127.0.0.6")).header.Get("RateLimit"); !strings.HasPrefix(got, `"`+zone+`";r=`+c.r+";") {
			t.Errorf("request %d, /%s: RateLimit %q, want r=%s", i+1, c.path, got, c.r)
		}
	}
	if lines := logLines(t, logFile, "placeholder is not one Caddy provides", zone); len(lines) > 0 {
		t.Errorf("a map's output is warned about as unknown: %s", lines[0])
	}
}

// TestUnknownCostPlaceholderWarns: a cost placeholder in one of Caddy's
// namespaces that Caddy does not provide (a typo) is warned about at start.
func TestUnknownCostPlaceholderWarns(t *testing.T) {
	zone := uniqueZone("typo")
	logFile := startCaddy(t, `
:9080 {
	sliding_ratelimit {
		zone `+zone+` 1m 30 {
			cost {http.request.heder.X-Cost}
		}
	}
	respond "ok"
}`)
	if lines := logLines(t, logFile, "placeholder is not one Caddy provides", zone, "heder"); len(lines) != 1 {
		t.Errorf("%d warnings about the misspelt placeholder, want 1", len(lines))
	}
}

// TestCostJSONRead: the values at paths from the root, the largest of a
// repeated key, numbers however written; anything else is the default.
func TestCostJSONRead(t *testing.T) {
	c := &CostJSON{Paths: []string{"max_tokens", "generation_config.max_output_tokens"}, Default: 4096}
	c.provision()
	cases := []struct {
		doc   string
		want  int64
		found bool
		why   string
	}{
		{`{"max_tokens": 100, "messages": []}`, 100, true, ""},
		{`{"max_tokens": 100, "generation_config": {"max_output_tokens": 50}}`, 150, true, ""},
		{`{"max_tokens": 1, "max_tokens": 99999}`, 99999, true, ""},
		{`{"max_tokens": 99999, "max_tokens": 1}`, 99999, true, ""},
		{`{"messages": [{"max_tokens": 1}], "x": {"max_tokens": 2}}`, 0, false, ""},
		{`{"max_tokens": 1e3}`, 1000, true, ""},
		{`{"max_tokens": 1000.0}`, 1000, true, ""},
		{`{"max_tokens": 10.5}`, 11, true, ""},
		{`{"max_tokens": "500"}`, 500, true, ""},
		{`{"max_tokens": 1e300}`, strictnum.Max, true, ""},
		{`{"max_tokens": 99999999999999999999999}`, strictnum.Max, true, ""},
		{`{"max_tokens": null}`, 0, false, ""},
		{`{"max_tokens": 0}`, 0, true, ""},
		{`{"max_tokens": -5}`, 0, false, strictnum.NotWhole},
		{`{"max_tokens": "lots"}`, 0, false, strictnum.NotWhole},
		{`{"max_tokens": true}`, 0, false, strictnum.NotWhole},
		{`{"max_tokens": [1, 2]}`, 0, false, strictnum.NotWhole},
		{`{"max_tokens": {"n": 5}}`, 0, false, strictnum.NotWhole},
		{`{"max_tokens": 1, "Max_Tokens": 50000}`, 50000, true, ""},
		{`{"max_to\u212aens": 7000, "max_tokens": 1}`, 7000, true, ""},
		{`{"max_tokens": 5, "x": NaN}`, 0, false, costNotJSON},
		{`{"max_tokens": 5`, 0, false, costNotJSON},
		{`{"max_tokens": 5} {"max_tokens": 1}`, 0, false, costNotJSON},
		{`max_tokens=5`, 0, false, costNotJSON},
		{strings.Repeat("[", 100000), 0, false, costNotJSON},
		{``, 0, false, ""},
	}
	for _, tc := range cases {
		n, found, why := c.read([]byte(tc.doc))
		if n != tc.want || found != tc.found || why != tc.why {
			t.Errorf("%.60s: %d %v %q, want %d %v %q", tc.doc, n, found, why, tc.want, tc.found, tc.why)
		}
	}
}

// echoServer answers each request with the size and SHA-256 of the body it
// got.
func echoServer(t *testing.T) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := sha256.New()
		n, err := io.Copy(h, r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		fmt.Fprintf(w, "%d %s", n, hex.EncodeToString(h.Sum(nil)))
	}))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

func digest(body string) string {
	sum := sha256.Sum256([]byte(body))
	return fmt.Sprintf("%d %s", len(body), hex.EncodeToString(sum[:]))
}

// TestCostJSONThroughCaddy: real Caddy reserves max_tokens and the body's
// size from each request's JSON body, and passes the body on intact,
// chunked, large or not JSON; what no path gives, or gives badly, reserves
// the default; a body above 1 MiB the zone's whole max; a body that never
// comes is answered 408 once its time is up, and never passed on.
func TestCostJSONThroughCaddy(t *testing.T) {
	defer func(d time.Duration) { costJSONReadTime = d }(costJSONReadTime)
	costJSONReadTime = 2 * time.Second
	upstream := echoServer(t)
	startCaddy(t, siteBlock(":9080", uniquePrefix(t), `
	sliding_ratelimit {
		key {http.request.header.Authorization}
		zone cjtokens 1m 10000000 {
			cost json max_tokens 4096 +body
		}
		zone cjplain 1m 1000000 {
			cost json max_tokens 4096
		}
	}
	reverse_proxy `+upstream+``), withGlobals(`
servers {
	metrics
}`))
	fallbacks := func() float64 {
		return scrape(t, `caddy_sliding_ratelimit_cost_fallbacks_total{zone="cjtokens"}`)
	}
	big := `{"max_tokens": 7, "messages": [{"content": "` + strings.Repeat("x", 2<<20) + `"}]}`
	cases := []struct {
		name, body string
		chunked    bool
		tokens     int64 // what the paths give, or the default
		fallback   bool
	}{
		{"max_tokens", `{"model": "m", "max_tokens": 100, "messages": [{"role": "user", "content": "hi"}]}`, false, 100, false},
		{"chunked", `{"model": "m", "max_tokens": 100}`, true, 100, false},
		{"a repeated key", `{"max_tokens": 1, "max_tokens": 90000}`, false, 90000, false},
		{"another spelling", `{"max_tokens": 1, "Max_Tokens": 50000}`, false, 50000, false},
		{"a Kelvin sign", `{"max_tokens": 1, "max_to\u212aens": 60000}`, false, 60000, false},
		{"nested only", `{"messages": [{"max_tokens": 1}], "options": {"max_tokens": 1}}`, false, 4096, false},
		{"none", `{"model": "m"}`, false, 4096, false},
		{"negative", `{"max_tokens": -100000}`, false, 4096, true},
		{"a word", `{"max_tokens": "few"}`, false, 4096, true},
		{"not JSON", `max_tokens=1`, false, 4096, true},
		{"above 1 MiB", big, false, -1, true},
		{"above 1 MiB, chunked", big, true, -1, true},
	}
	for i, c := range cases {
		key := "cj-" + strconv.Itoa(i)
		before := fallbacks()
		var body io.Reader = strings.NewReader(c.body)
		if c.chunked {
			body = io.MultiReader(body) // no length: sent chunked
		}
		req, _ := http.NewRequest(http.MethodPost, site, body)
		req.Header.Set("Authorization", key)
		req.Header.Set("Content-Type", "application/json")
		res, err := clientAt(t, "127.0.0.1").Do(req)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		got, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != http.StatusOK || string(got) != digest(c.body) {
			t.Errorf("%s: status %d, the upstream got %q, want the body intact (%s)", c.name, res.StatusCode, got, digest(c.body))
		}
		// Unread, a body above 1 MiB reserves the zone's whole max.
		withBody, plain := c.tokens+int64(len(c.body)), c.tokens
		if c.tokens < 0 {
			withBody, plain = 10000000, 1000000
		}
		if used := adminState(t, "cjtokens", key).Count; used != withBody {
			t.Errorf("%s: %d reserved with +body, want %d", c.name, used, withBody)
		}
		if used := adminState(t, "cjplain", key).Count; used != plain {
			t.Errorf("%s: %d reserved, want %d", c.name, used, plain)
		}
		if got, want := fallbacks()-before, map[bool]float64{true: 1}[c.fallback]; got != want {
			t.Errorf("%s: cost_fallbacks_total rose by %v, want %v", c.name, got, want)
		}
	}

	// A body that never comes: 10 of the 5000 bytes its Content-Length
	// says. Once its time is up the request is answered 408, reserves
	// nothing, and never reaches the upstream.
	refusals := func() float64 {
		return scrape(t, `caddy_sliding_ratelimit_body_refusals_total{reason="slow",zone="cjtokens"}`)
	}
	before := refusals()
	conn, err := net.Dial("tcp", "127.0.0.1:9080")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "POST / HTTP/1.1\r\nHost: x\r\nAuthorization: cj-slow\r\nContent-Type: application/json\r\nContent-Length: 5000\r\n\r\n{\"max_tokens\": 90000, ")
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	answer, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("a body that never comes: no answer: %v", err)
	}
	text, _ := io.ReadAll(answer.Body)
	if answer.StatusCode != http.StatusRequestTimeout || !strings.Contains(string(text), "did not arrive whole") {
		t.Errorf("a body that never comes: status %d %q, want 408 saying why", answer.StatusCode, text)
	}
	if used := adminState(t, "cjtokens", "cj-slow").Count; used != 0 {
		t.Errorf("a body that never comes: %d reserved, want none", used)
	}
	if got := refusals() - before; got != 1 {
		t.Errorf("body_refusals_total{reason=\"slow\"} rose by %v, want 1", got)
	}
	conn.Close()

	// A chunked body sent slowly, but within the time: read whole.
	pr, pw := io.Pipe()
	go func() {
		for _, part := range []string{`{"max_tokens"`, `: 300, "x": `, `"y"}`} {
			time.Sleep(50 * time.Millisecond)
			pw.Write([]byte(part))
		}
		pw.Close()
	}()
	req, _ := http.NewRequest(http.MethodPost, site, pr)
	req.Header.Set("Authorization", "cj-trickle")
	res, err := clientAt(t, "127.0.0.1").Do(req)
	if err != nil {
		t.Fatal(err)
	}
	line, _ := bufio.NewReader(res.Body).ReadString('\n')
	res.Body.Close()
	if want := digest(`{"max_tokens": 300, "x": "y"}`); line != want {
		t.Errorf("a trickled body: the upstream got %q, want %q", line, want)
	}
	if used := adminState(t, "cjplain", "cj-trickle").Count; used != 300 {
		t.Errorf("a trickled body: %d reserved, want 300", used)
	}
}

// authService is a real HTTP auth service for forward_auth: it knows each
// bearer token's tenant and quota, answers 200 with X-Tenant and X-Quota
// (none for a tenant without a quota), and 401 to any other token.
type authService struct {
	mu     sync.Mutex
	quotas map[string]string // token -> quota; "" for none
	url    string
}

func newAuthService(t *testing.T, quotas map[string]string) *authService {
	a := &authService{quotas: quotas}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		token, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		a.mu.Lock()
		quota, ok := a.quotas[token]
		a.mu.Unlock()
		if !ok {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		w.Header().Set("X-Tenant", token)
		if quota != "" {
			w.Header().Set("X-Quota", quota)
		}
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(srv.Close)
	a.url = strings.TrimPrefix(srv.URL, "http://")
	return a
}

func (a *authService) setQuota(token, quota string) {
	a.mu.Lock()
	a.quotas[token] = quota
	a.mu.Unlock()
}

// TestTenantsRecipe is the recipe of docs/tenants.md, with smaller quotas:
// forward_auth asks a real auth service for each tenant's quota, copies it
// into X-Quota (deleting the client's own first), and the zone holds each
// tenant to it. A client's own X-Quota changes nothing; a tenant without a
// quota gets the fallback, never "unlimited", counted in the metric; a quota
// that changes keeps the tenant's window.
func TestTenantsRecipe(t *testing.T) {
	auth := newAuthService(t, map[string]string{"gold": "5", "free": "2", "new": ""})
	app := usageUpstream(t)
	zone := uniqueZone("tenants")
	startCaddy(t, siteBlock(":9080", uniquePrefix(t), `
	route /api/* {
		forward_auth `+auth.url+` {
			uri /check
			copy_headers X-Tenant X-Quota
		}
		sliding_ratelimit {
			zone `+zone+` 1h {http.reverse_proxy.header.X-Quota} 3 {
				key {http.reverse_proxy.header.X-Tenant}
			}
		}
		reverse_proxy `+app+`
	}`))
	api := site + "api/report"
	forged := withHeader("X-Quota", "1000")
	for _, c := range []struct {
		token    string
		admitted int
		quota    string
	}{
		{"gold", 5, "5"},
		{"free", 2, "2"},
		// No quota from the auth service: the client's own is deleted, and
		// the fallback applies.
		{"new", 3, "3"},
	} {
		bearer := withHeader("Authorization", "Bearer "+c.token)
		for i := 1; i <= c.admitted+1; i++ {
			res := send(t, api, from("127.0.0.2"), bearer, forged)
			want := http.StatusOK
			if i > c.admitted {
				want = http.StatusTooManyRequests
			}
			if res.status != want {
				t.Errorf("%s, request %d: status %d, want %d", c.token, i, res.status, want)
			}
			if policy, want := res.header.Get("RateLimit-Policy"), fmt.Sprintf(`"%s";q=%s;w=3600`, zone, c.quota); policy != want {
				t.Errorf("%s: RateLimit-Policy %q, want %q", c.token, policy, want)
			}
		}
	}
	if got := testutil.ToFloat64(limiterMetrics.quotaFallbacks.WithLabelValues(zone)); got != 4 {
		t.Errorf("max_requests_fallbacks_total %v, want 4: the requests of the tenant without a quota", got)
	}
	expect(t, "a token the auth service refuses", api, []int{401}, from("127.0.0.2"), withHeader("Authorization", "Bearer forged"), forged)

	// A raised quota keeps the window: gold has used 5, so 7 leaves 2.
	auth.setQuota("gold", "7")
	expect(t, "gold with its quota raised to 7", api, []int{200, 200, 429}, from("127.0.0.3"), withHeader("Authorization", "Bearer gold"))
	if s := adminState(t, zone, "gold"); s.Identity != zone || s.Count != 7 || s.Limit != 7 || s.Remaining != 0 ||
		s.LimitFrom != "{http.reverse_proxy.header.X-Quota}" || s.LimitSource != "last_decision" {
		t.Errorf("admin state of gold %+v, want identity %s, count 7, limit 7 (its last admission's) from the placeholder, remaining 0", s, zone)
	}
}

// TestAdminShowsTenantQuota: through Caddy and Redis, the admin API and
// `status` count a tenant's state against its own quota (from forward_auth),
// the max its last admission was decided with, not the zone's fallback; a
// client never admitted shows the fallback and says so.
func TestAdminShowsTenantQuota(t *testing.T) {
	auth := newAuthService(t, map[string]string{"small": "3"})
	zone := uniqueZone("tenantquota")
	startCaddy(t, siteBlock(":9080", uniquePrefix(t), `
	route /api/* {
		forward_auth `+auth.url+` {
			uri /check
			copy_headers X-Tenant X-Quota
		}
		sliding_ratelimit {
			zone `+zone+` 1h {http.reverse_proxy.header.X-Quota} 1000 {
				key {http.reverse_proxy.header.X-Tenant}
			}
		}
		respond "ok"
	}`))
	expect(t, "small, quota 3", site+"api/x", []int{200, 200, 200, 429}, from("127.0.0.2"), withHeader("Authorization", "Bearer small"))
	s := adminState(t, zone, "small")
	if s.Limit != 3 || s.LimitSource != "last_decision" || s.Count != 3 || s.Remaining != 0 || s.RetryAfterSeconds < 3000 || s.RetryAfterSeconds > 3600 {
		t.Errorf("admin state of small %+v, want limit 3 from its last decision, count 3, remaining 0, retry after about 3600s", s)
	}
	out, err := runCommand(t, "status", "--zone", zone, "--key", "small", "--address", "localhost:2999")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 5 || !strings.Contains(strings.Join(strings.Fields(lines[1]), " "), " =small 3 0 requests ") ||
		strings.HasSuffix(lines[1], " 0s") || strings.Join(strings.Fields(lines[3]), " ") != "LIMIT FROM SOURCE" ||
		strings.Join(strings.Fields(lines[4]), " ") != "3 {http.reverse_proxy.header.X-Quota} last_decision" {
		t.Errorf("status of small printed:\n%s", out)
	}
	if b := commandJSON[adminapi.BlockedAnswer](t, "blocked"); b.Count != 1 || b.Blocked[0].Key != "=small" {
		t.Errorf("blocked: %+v, want small", b)
	}

	s = adminState(t, zone, "nobody")
	if s.Limit != 1000 || s.LimitSource != "fallback" || s.Count != 0 || s.Remaining != 1000 || s.RetryAfterSeconds != 0 {
		t.Errorf("admin state of a client never admitted %+v, want limit 1000, the fallback, remaining 1000", s)
	}
	out, err = runCommand(t, "status", "--zone", zone, "--key", "nobody", "--address", "localhost:2999")
	if err != nil {
		t.Fatal(err)
	}
	if lines := strings.Split(strings.TrimSpace(out), "\n"); len(lines) != 5 ||
		strings.Join(strings.Fields(lines[4]), " ") != "1000 {http.reverse_proxy.header.X-Quota} fallback" {
		t.Errorf("status of nobody printed:\n%s", out)
	}
}

// TestQuotaValues: through Caddy and Redis, a max_requests placeholder's
// values that are no whole number from 1 to 2^48-1 get the fallback, each
// counted; a repeated header counts by its first value. (Here the client
// sets the header itself, which is why docs/tenants.md takes it from
// forward_auth.)
func TestQuotaValues(t *testing.T) {
	zone := uniqueZone("quota")
	startCaddy(t, siteBlock(":9080", uniquePrefix(t), `
	sliding_ratelimit {
		zone `+zone+` 1m {http.request.header.X-Quota} 2 {
			key {http.request.header.X-Client}
		}
	}
	respond "ok"`))
	fallbacks := 0
	for _, c := range []struct {
		name   string
		values []string
		q      string
	}{
		{"missing", nil, "2"},
		{"empty", []string{""}, "2"},
		{"zero", []string{"0"}, "2"},
		{"negative", []string{"-10"}, "2"},
		{"word", []string{"unlimited"}, "2"},
		{"exponent", []string{"1e3"}, "2"},
		{"beyond the engine", []string{"281474976710656"}, "2"},
		{"enormous", []string{"99999999999999999999"}, "2"},
		{"ten", []string{"10"}, "10"},
		{"repeated", []string{"4", "1000"}, "4"},
	} {
		res := send(t, site, withHeader("X-Client", c.name), withHeader("X-Quota", c.values...))
		if got, want := res.header.Get("RateLimit-Policy"), `"`+zone+`";q=`+c.q+";w=60"; got != want {
			t.Errorf("%s %q: RateLimit-Policy %q, want %q", c.name, c.values, got, want)
		}
		if c.q == "2" {
			fallbacks++
		}
	}
	if got := testutil.ToFloat64(limiterMetrics.quotaFallbacks.WithLabelValues(zone)); got != float64(fallbacks) {
		t.Errorf("max_requests_fallbacks_total %v, want %d", got, fallbacks)
	}
}
