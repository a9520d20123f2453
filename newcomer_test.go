package slidingratelimit

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/adminapi"
	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/redistest"
)

// The rough edges a newcomer hit, each tried as they tried it: through a
// real Caddy's admin API, and the caddy command run as a process.

// TestDurationWithoutUnit: `window 60` gets the duration it most likely
// means; `1mn` gets the units.
func TestDurationWithoutUnit(t *testing.T) {
	startCaddy(t, `:9080 {
	respond "ok"
}`)
	for _, c := range []struct{ lines, want string }{
		{"window 60\n\t\tmax_requests 10", `window: invalid duration \"60\": a duration needs a unit: 60s for seconds (or 1m), at Caddyfile:`},
		{"window 7200\n\t\tmax_requests 10", `7200s for seconds (or 2h)`},
		{"window 90\n\t\tmax_requests 10", `a duration needs a unit: 90s for seconds, at`},
		{"window 1mn\n\t\tmax_requests 10", `window: invalid duration \"1mn\": time: unknown unit \"mn\" in duration \"1mn\"; the units are ns, us, ms, s, m, h and d (24h), combined as in 1m30s`},
		{"zone api 60 10", `window: invalid duration \"60\": a duration needs a unit: 60s for seconds (or 1m)`},
		{"window 1m\n\t\tmax_requests 10\n\t\twait 500", `wait: invalid duration \"500\": a duration needs a unit: 500s for seconds`},
	} {
		config := globalOptions + ":9080 {\n\tsliding_ratelimit {\n\t\t" + c.lines + "\n\t}\n}\n"
		res := send(t, adminURL+"/load", withMethod(http.MethodPost), withBody("text/caddyfile", config))
		if res.status != http.StatusBadRequest || !strings.Contains(res.body, c.want) {
			t.Errorf("loading %q: %d %s, want 400 with %s", c.lines, res.status, res.body, c.want)
		}
	}
}

// zonesSite has two sites: one shares zone api with the other, which also
// has a concurrency zone and a per-tenant quota.
func zonesSite(t *testing.T) string {
	prefix := uniquePrefix(t)
	return `:9080 {
	sliding_ratelimit {
		redis ` + sharedRedis.URL() + `
		key_prefix ` + prefix + `
		key {http.request.header.X-Client}
		zone api 1m 100
		zone reports {
			concurrent 2
		}
		zone tenants {
			window 1h
			max_requests {http.vars.quota} 1000
			wait 2s
		}
	}
	respond "ok"
}

:9081 {
	sliding_ratelimit {
		redis ` + sharedRedis.URL() + `
		key_prefix ` + prefix + `
		key {http.request.header.X-Client}
		zone api 1m 100
	}
	respond "ok"
}
`
}

// TestZonesListing: GET /sliding_ratelimit/zones and `caddy
// sliding-ratelimit zones` list the running zones; an unknown zone's error
// names them; the path in an error reads as written.
func TestZonesListing(t *testing.T) {
	startCaddy(t, zonesSite(t))
	res := send(t, adminURL+"/sliding_ratelimit/zones")
	var answer adminapi.ZonesAnswer
	if res.status != http.StatusOK || json.Unmarshal([]byte(res.body), &answer) != nil {
		t.Fatalf("GET zones: %d %s", res.status, res.body)
	}
	want := []adminapi.ZoneInfo{
		{Name: "api", Identity: "api:1m:100", Limit: 100, WindowSeconds: 60, Algorithm: "log", Unit: "requests", Key: "{http.request.header.X-Client}", Handlers: 2},
		{Name: "reports", Identity: "reports:concurrent:2", Limit: 2, Algorithm: "concurrency", Unit: "concurrent-requests", Key: "{http.request.header.X-Client}", Handlers: 1},
		{Name: "tenants", Identity: "", Limit: 1000, LimitFrom: "{http.vars.quota}", WindowSeconds: 3600, Algorithm: "log", Unit: "requests", Key: "{http.request.header.X-Client}", WaitSeconds: 2, Handlers: 1},
	}
	if len(answer.Zones) != len(want) {
		t.Fatalf("GET zones: %s, want %d zones", res.body, len(want))
	}
	for i, w := range want {
		got := answer.Zones[i]
		if w.Identity == "" {
			w.Identity = got.Identity // a per-tenant zone's identity is the zone's own business
		}
		if got != w {
			t.Errorf("zone %d: %+v, want %+v", i, got, w)
		}
	}

	res = send(t, adminURL+"/sliding_ratelimit/zones/apl/keys/a")
	if res.status != http.StatusNotFound || !strings.Contains(res.body, `unknown zone \"apl\": no sliding_ratelimit handler has a zone of that name; the zones are api, reports, tenants`) {
		t.Errorf("unknown zone: %d %s, want 404 naming the zones", res.status, res.body)
	}
	res = send(t, adminURL+"/sliding_ratelimit/zones/api")
	if res.status != http.StatusBadRequest || !strings.Contains(res.body, "want /sliding_ratelimit/zones/{zone}/keys/{key}, /sliding_ratelimit/zones or /sliding_ratelimit/blocked") ||
		strings.Contains(res.body, `\u003c`) {
		t.Errorf("malformed path: %d %s, want the paths as written", res.status, res.body)
	}

	out, status := runCaddy(t, "sliding-ratelimit", "zones", "--address", "localhost:2999")
	for _, line := range []string{
		"ZONE     IDENTITY",
		"api      api:1m:100",
		"reports  reports:concurrent:2",
		"tenants ",
		"{http.vars.quota} (fallback 1000)",
	} {
		if !strings.Contains(out, line) {
			t.Errorf("caddy sliding-ratelimit zones: no %q in\n%s", line, out)
		}
	}
	if status != 0 {
		t.Errorf("caddy sliding-ratelimit zones: exit status %d", status)
	}
}

// TestCommandPlainErrorsAndTypos: the command's errors are a line a person
// reads, not a JSON log entry; a misspelt subcommand fails and suggests the
// right one, instead of printing the help and exiting 0.
func TestCommandPlainErrorsAndTypos(t *testing.T) {
	startCaddy(t, zonesSite(t))
	out, status := runCaddy(t, "sliding-ratelimit", "status", "--zone", "nope", "--key", "k", "--address", "localhost:2999")
	if status == 0 || !strings.Contains(out, `Error: unknown zone "nope": no sliding_ratelimit handler has a zone of that name; the zones are api, reports, tenants`) ||
		strings.Contains(out, `"level"`) {
		t.Errorf("unknown zone: exit status %d, printed %s; want a plain error line", status, out)
	}
	for _, c := range []struct{ typo, want string }{
		{"stat", "did you mean status?"},
		{"rest", "did you mean reset?"},
		{"blockd", "did you mean blocked?"},
		{"zone", "did you mean zones?"},
		{"purge", "run caddy sliding-ratelimit --help for the list"},
	} {
		out, status := runCaddy(t, "sliding-ratelimit", c.typo, "--zone", "api", "--key", "k")
		if status == 0 || !strings.Contains(out, `unknown subcommand "`+c.typo+`" of caddy sliding-ratelimit`) || !strings.Contains(out, c.want) {
			t.Errorf("caddy sliding-ratelimit %s: exit status %d, printed %s; want a failure with %q", c.typo, status, out, c.want)
		}
	}
	if out, status := runCaddy(t, "sliding-ratelimit"); status != 0 || !strings.Contains(out, "status --zone <zone> --key <key>") {
		t.Errorf("caddy sliding-ratelimit alone: exit status %d, printed %s; want the help", status, out)
	}
}

// TestGoRedisLinesInCaddysLog: go-redis's own lines (a failed dial in an
// outage) are in Caddy's log, as its lines are, and throttled: one of a kind
// for many failed requests.
func TestGoRedisLinesInCaddysLog(t *testing.T) {
	srv := redistest.Start(t)
	logFile := startCaddy(t, `:9080 {
	sliding_ratelimit {
		window 1m
		max_requests 100
		key {http.request.header.X-Client}
		redis `+srv.URL()+`
		key_prefix `+uniquePrefix(t)+`
	}
	respond "ok"
}`)
	send(t, site, withHeader("X-Client", "before"))
	srv.Stop()
	for i := range 40 {
		send(t, site, withHeader("X-Client", "c"+strconv.Itoa(i)))
		time.Sleep(30 * time.Millisecond) // past the breaker's pauses, so that go-redis dials again
	}
	lines := logLines(t, logFile, `"logger":"go-redis"`)
	dials := logLines(t, logFile, `"logger":"go-redis"`, "failed to dial")
	if len(dials) == 0 {
		t.Fatalf("no go-redis line about the failed dials in Caddy's log; its go-redis lines: %v", lines)
	}
	if len(dials) > 2 || !strings.Contains(dials[0], `"level":"warn"`) {
		t.Errorf("go-redis dial lines in Caddy's log, want one or two warnings for 40 requests in an outage:\n%s", strings.Join(dials, "\n"))
	}
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
	logFile := startCaddy(t, `:9080 {
	sliding_ratelimit {
		window 1m
		max_requests {http.request.header.X-Quota} 2
		redis `+sharedRedis.URL()+`
		key_prefix `+prefix+`u
	}
	respond "ok"
}`)
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
	// quota, 5, whatever the client says.
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

// TestRedisSilentAtStartSaysWhatItMeans: a Redis that answers nothing at
// load is a warning that says what the fail mode does until it answers (with
// open: every limit off), counted in config_warnings; the requests it lets
// through are counted as failed_open, which SlidingRatelimitFailingOpen
// alerts on.
func TestRedisSilentAtStartSaysWhatItMeans(t *testing.T) {
	port, err := redistest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ failMode, want string }{
		{"open", "redis not reachable at provision: requests pass unlimited (fail_mode open) until it answers"},
		{"closed", "redis not reachable at provision: requests are refused with 503 (fail_mode closed) until it answers"},
	} {
		zone := uniqueZone("silent")
		logFile := startCaddy(t, `:9080 {
	sliding_ratelimit {
		zone `+zone+` 1m 2
		redis redis://127.0.0.1:`+strconv.Itoa(port)+`/0
		fail_mode `+c.failMode+`
	}
	respond "ok"
}`)
		if lines := logLines(t, logFile, c.want); len(lines) != 1 || !strings.Contains(lines[0], `"level":"warn"`) {
			t.Errorf("fail_mode %s: warnings %v, want one saying %q", c.failMode, logLines(t, logFile, "not reachable"), c.want)
		}
		if got := scrape(t, "caddy_sliding_ratelimit_config_warnings"); got != 1 {
			t.Errorf("fail_mode %s: config_warnings = %v, want 1", c.failMode, got)
		}
		if c.failMode == "open" {
			expect(t, "a silent Redis, fail_mode open", site, []int{200, 200, 200, 200}, from("127.0.0.2"))
			if got := scrape(t, `caddy_sliding_ratelimit_decisions_total{result="failed_open",zone="`+zone+`"}`); got != 4 {
				t.Errorf("failed_open = %v, want 4", got)
			}
		}
	}
}
