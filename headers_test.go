package slidingratelimit

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/limiter"
)

func TestMostRestrictive(t *testing.T) {
	allow := func(remaining int64, reset time.Duration) limiter.Decision {
		return limiter.Decision{Allowed: true, Remaining: remaining, Reset: reset}
	}
	deny := func(retry time.Duration) limiter.Decision {
		return limiter.Decision{RetryAfter: retry, Reset: retry}
	}
	for _, c := range []struct {
		name      string
		decisions []limiter.Decision
		want      int
	}{
		{"one", []limiter.Decision{allow(3, time.Second)}, 0},
		{"fewest left", []limiter.Decision{allow(5, time.Second), allow(2, time.Second), allow(4, time.Second)}, 1},
		{"tie: later reset", []limiter.Decision{allow(2, time.Second), allow(2, time.Minute)}, 1},
		{"a denial beats any admission", []limiter.Decision{allow(0, time.Hour), deny(time.Second)}, 1},
		{"the denial that admits last", []limiter.Decision{deny(time.Second), deny(time.Hour), deny(time.Minute)}, 1},
	} {
		if got := mostRestrictive(c.decisions); got != c.want {
			t.Errorf("%s: %d, want %d", c.name, got, c.want)
		}
	}
}

func TestWriteHeaders(t *testing.T) {
	burst := &Zone{Name: "burst", Window: 1e9, MaxRequests: 10}
	hourly := &Zone{Name: "hourly", Window: 3600e9, MaxRequests: 1000}
	for _, z := range []*Zone{burst, hourly} {
		z.limit = limiter.Limit{Window: time.Duration(z.Window), Max: z.MaxRequests}
		z.prepareHeaders()
	}
	decisions := []limiter.Decision{
		{Allowed: true, Remaining: 9, Reset: 400 * time.Millisecond},
		{Allowed: true, Remaining: 999, Reset: time.Hour},
	}
	for _, c := range []struct {
		mode string
		want http.Header
	}{
		{headersDraft, http.Header{
			"Ratelimit-Policy": {`"burst";q=10;w=1, "hourly";q=1000;w=3600`},
			"Ratelimit":        {`"burst";r=9;t=1, "hourly";r=999;t=3600`},
		}},
		{headersLegacy, http.Header{
			"Ratelimit-Policy":      {`"burst";q=10;w=1, "hourly";q=1000;w=3600`},
			"Ratelimit":             {`"burst";r=9;t=1, "hourly";r=999;t=3600`},
			"X-Ratelimit-Limit":     {"10"},
			"X-Ratelimit-Remaining": {"9"},
			"X-Ratelimit-Reset":     {"1"},
		}},
		{headersOff, http.Header{}},
	} {
		h := http.Header{}
		writeHeaders(h, c.mode, []*Zone{burst, hourly}, []limiter.Check{{Limit: burst.limit}, {Limit: hourly.limit}}, decisions, 0)
		if len(h) != len(c.want) {
			t.Errorf("%s: headers %v, want %v", c.mode, h, c.want)
		}
		for k, v := range c.want {
			if got := h.Get(k); got != v[0] {
				t.Errorf("%s: %s %q, want %q", c.mode, k, got, v[0])
			}
		}
	}
}

// TestPlaceholdersShowTheLastDecision: a second handler on one request
// replaces the first one's placeholders, with or without Caddy's vars.
func TestPlaceholdersShowTheLastDecision(t *testing.T) {
	first := &Zone{Name: "first", MaxRequests: 5}
	second := &Zone{Name: "second", MaxRequests: 9}
	first.prepareHeaders()
	second.prepareHeaders()
	for _, prepared := range []bool{true, false} {
		r := httptest.NewRequest("GET", "http://example.test/", nil)
		repl := caddy.NewReplacer()
		if prepared {
			r = caddyhttp.PrepareRequest(r, repl, httptest.NewRecorder(), nil)
		}
		setPlaceholders(r, repl, first, limiter.Check{}, limiter.Decision{Allowed: true, Remaining: 4})
		setPlaceholders(r, repl, second, limiter.Check{}, limiter.Decision{RetryAfter: 1500 * time.Millisecond})
		got := repl.ReplaceAll("{http.sliding_ratelimit.zone} {http.sliding_ratelimit.limit} {http.sliding_ratelimit.remaining} {http.sliding_ratelimit.retry_after}", "")
		if want := "second 9 0 2"; got != want {
			t.Errorf("prepared %v: placeholders %q, want %q", prepared, got, want)
		}
	}
}

// TestPlaceholdersInHeaderNeedDefer: Caddy runs `header` before the limiter,
// so its placeholders are text there unless the header is deferred, as
// docs/responses.md says.
func TestPlaceholdersInHeaderNeedDefer(t *testing.T) {
	startCaddy(t, `
:9080 {
	header X-Plain {http.sliding_ratelimit.remaining}
	header {
		defer
		X-Deferred {http.sliding_ratelimit.remaining}
	}
	header >X-Arrow {http.sliding_ratelimit.remaining}
	sliding_ratelimit {
		window 1m
		max_requests 5
	}
	respond "ok"
}`)
	h := send(t, site, from("127.0.0.6")).header
	if got, want := h.Get("X-Plain"), "{http.sliding_ratelimit.remaining}"; got != want {
		t.Errorf("header without defer: %q, want %q", got, want)
	}
	for _, name := range []string{"X-Deferred", "X-Arrow"} {
		if got := h.Get(name); got != "4" {
			t.Errorf("%s: %q, want 4", name, got)
		}
	}
}

// TestDenialWithoutStoreCallLeavesUnreadZonesOut: a denial answered without
// a store call (the deny cache's, or a cost above a zone's max) knows
// nothing of the request's other zones, so their RateLimit items are left
// out, not shown as spent (r=0;t=0); RateLimit-Policy still lists them.
func TestDenialWithoutStoreCallLeavesUnreadZonesOut(t *testing.T) {
	burst, hourly := uniqueZone("burst"), uniqueZone("hourly")
	in := newInstance(t, `{"zones": [{"name": "`+burst+`", "window": "1m", "max_requests": 2},
		{"name": "`+hourly+`", "window": "1h", "max_requests": 100, "cost": "{http.request.header.X-Cost}"}]}`)
	client := from("192.0.2.7")
	policy := fmt.Sprintf(`%q;q=2;w=60, %q;q=100;srl-qu="units";w=3600`, burst, hourly)
	expect(t, "within the burst", "/", []int{200, 200}, to(in), client)
	fromStore := send(t, "/", to(in), client)
	if want := fmt.Sprintf(`%q;r=0;t=60, %q;r=98;t=3600`, burst, hourly); fromStore.status != http.StatusTooManyRequests || fromStore.header.Get("RateLimit") != want {
		t.Errorf("the denial from the store: %d, RateLimit %q; want 429 and %s", fromStore.status, fromStore.header.Get("RateLimit"), want)
	}
	hits := testutil.ToFloat64(limiterMetrics.denyCacheHits.WithLabelValues(burst))
	cached := send(t, "/", to(in), client)
	if testutil.ToFloat64(limiterMetrics.denyCacheHits.WithLabelValues(burst)) != hits+1 {
		t.Fatal("the second denial did not come from the deny cache")
	}
	if want := fmt.Sprintf(`%q;r=0;t=60`, burst); cached.status != http.StatusTooManyRequests || cached.header.Get("RateLimit") != want {
		t.Errorf("the denial from the deny cache: %d, RateLimit %q; want 429 and %s (the hourly zone was not read)", cached.status, cached.header.Get("RateLimit"), want)
	}
	if got := cached.header.Get("RateLimit-Policy"); got != policy {
		t.Errorf("the denial from the deny cache: RateLimit-Policy %q, want %s", got, policy)
	}

	never := send(t, "/", to(in), from("192.0.2.8"), withHeader("X-Cost", "101"))
	if want := fmt.Sprintf(`%q;r=100;t=0`, hourly); never.status != http.StatusTooManyRequests || never.header.Get("RateLimit") != want {
		t.Errorf("a cost above the max: %d, RateLimit %q; want 429 and %s (the burst zone was not read)", never.status, never.header.Get("RateLimit"), want)
	}
}

// TestCounterResetMayOutlastTheWindow: a counter zone's t can be longer
// than its window (t=3999 on a window of 1h) and is right: the units of the
// current fixed window leave only once it has ended, and then gradually, as
// the previous window's weight falls, about window/count apart. So with 9
// requests in this fixed window and none in the one before, the first unit
// frees at the end of this window plus 1h/9: up to 4000 s on 1h.
func TestCounterResetMayOutlastTheWindow(t *testing.T) {
	zone := uniqueZone("hourly")
	// Redis's fixed windows start at multiples of the window since the Unix
	// epoch (the in-process store's, since it started).
	in := newInstance(t, `{"zones": [{"name": "`+zone+`", "window": "1h", "max_requests": 10, "algorithm": "counter"}],
		"redis": "`+sharedRedis.URL()+`", "key_prefix": "`+uniquePrefix(t)+`"}`)
	client := from("192.0.2.9")
	const window = time.Hour
	before := time.Now()
	var last answer
	for range 9 {
		last = send(t, "/", to(in), client)
	}
	after := time.Now()
	if before.Truncate(window) != after.Truncate(window) {
		t.Skip("the requests straddled the end of a fixed window")
	}
	// t = the rest of this fixed window + window/9, rounded up.
	most := ceilSeconds(window - before.Sub(before.Truncate(window)) + window/9)
	least := ceilSeconds(window - after.Sub(after.Truncate(window)) + window/9)
	var r, tSeconds int64
	if _, err := fmt.Sscanf(last.header.Get("RateLimit"), strconv.Quote(zone)+";r=%d;t=%d", &r, &tSeconds); err != nil {
		t.Fatalf("RateLimit %q: %v", last.header.Get("RateLimit"), err)
	}
	if r != 1 || tSeconds < least || tSeconds > most {
		t.Errorf("after 9 requests: r=%d;t=%d, want r=1 and t from %d to %d (the rest of the fixed window, then 1h/9)", r, tSeconds, least, most)
	}
}

// TestWriteSDKHeaders: on an LLM route, the vendor's limit headers show
// the zone counting requests and the zone counting tokens with the fewest
// left, each read; money and requests in flight are neither.
func TestWriteSDKHeaders(t *testing.T) {
	llm := func(unit string) *zoneUnits { return &zoneUnits{cost: zoneCost{llm: &CostLLM{}}, unit: unit} }
	zones := []*Zone{
		{Name: "calls", Window: 60e9, MaxRequests: 60},
		{Name: "burst", Window: 1e9, MaxRequests: 5},
		{Name: "tokens", Window: 60e9, MaxRequests: 100000, units: llm(unitUnits)},
		{Name: "spend", Window: 86400e9, MaxRequests: 10000000, units: llm(unitUSDMicros)},
		{Name: "inflight", Concurrent: 2},
	}
	checks := make([]limiter.Check, len(zones))
	for i, z := range zones {
		z.limit = limiter.Limit{Window: time.Duration(z.Window), Max: z.MaxRequests}
		if z.Concurrent > 0 {
			z.limit = limiter.Limit{Window: time.Minute, Max: z.Concurrent, Algorithm: limiter.Concurrency}
		}
		z.prepareHeaders()
		checks[i].Limit = z.limit
	}
	decisions := func(burstLeft int64) []limiter.Decision {
		return []limiter.Decision{
			{Allowed: true, Remaining: 50, Reset: 40 * time.Second},
			{Allowed: true, Remaining: burstLeft, Reset: 300 * time.Millisecond},
			{Allowed: true, Remaining: 9000, Reset: 30 * time.Second},
			{Allowed: true, Remaining: 1, Reset: time.Hour},
			{Allowed: true, Remaining: 0},
		}
	}
	openai := http.Header{
		"X-Ratelimit-Limit-Requests": {"5"}, "X-Ratelimit-Remaining-Requests": {"2"}, "X-Ratelimit-Reset-Requests": {"1s"},
		"X-Ratelimit-Limit-Tokens": {"100000"}, "X-Ratelimit-Remaining-Tokens": {"9000"}, "X-Ratelimit-Reset-Tokens": {"30s"},
	}
	for _, c := range []struct {
		name, path, mode string
		zones            []*Zone
		burstLeft        int64
		want             http.Header
	}{
		{"OpenAI", "/v1/chat/completions", headersDraft, zones, 2, openai},
		{"legacy mode too", "/openai/v1/responses", headersLegacy, zones, 2, openai},
		{"a zone not read is left out", "/v1/chat/completions", headersDraft, zones, unread, http.Header{
			"X-Ratelimit-Limit-Requests": {"60"}, "X-Ratelimit-Remaining-Requests": {"50"}, "X-Ratelimit-Reset-Requests": {"40s"},
			"X-Ratelimit-Limit-Tokens": {"100000"}, "X-Ratelimit-Remaining-Tokens": {"9000"}, "X-Ratelimit-Reset-Tokens": {"30s"},
		}},
		{"headers off", "/v1/chat/completions", headersOff, zones, 2, http.Header{}},
		{"an API without limit headers", "/api/chat", headersDraft, zones, 2, http.Header{}},
		{"no zone reads an LLM API", "/v1/chat/completions", headersDraft, zones[:2], 2, http.Header{}},
	} {
		h := http.Header{}
		r := httptest.NewRequest(http.MethodPost, c.path, nil)
		writeSDKHeaders(h, c.mode, r, c.zones, checks[:len(c.zones)], decisions(c.burstLeft)[:len(c.zones)])
		if got, want := fmt.Sprint(h), fmt.Sprint(c.want); got != want {
			t.Errorf("%s: %s, want %s", c.name, got, want)
		}
	}

	h := http.Header{}
	writeSDKHeaders(h, headersDraft, httptest.NewRequest(http.MethodPost, "/v1/messages", nil), zones, checks, decisions(2))
	for _, c := range []struct {
		kind, limit, left string
		reset             time.Duration
	}{{"requests", "5", "2", time.Second}, {"tokens", "100000", "9000", 30 * time.Second}} {
		prefix := "Anthropic-Ratelimit-" + strings.ToUpper(c.kind[:1]) + c.kind[1:] + "-"
		reset, err := time.Parse(time.RFC3339, h.Get(prefix+"Reset"))
		if until := time.Until(reset); h.Get(prefix+"Limit") != c.limit || h.Get(prefix+"Remaining") != c.left || err != nil || until < c.reset-time.Second || until > c.reset+time.Second {
			t.Errorf("Anthropic's %s: %v, want limit %s, remaining %s, reset %v from now", c.kind, h, c.limit, c.left, c.reset)
		}
	}
}

// TestSDKHeadersBesideTheUpstreams: reverse_proxy adds an upstream's own
// limit headers to the limiter's, and header_down -x-ratelimit-* leaves the
// limiter's alone, as docs/responses.md says.
func TestSDKHeadersBesideTheUpstreams(t *testing.T) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Ratelimit-Remaining-Tokens", "1999000")
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"usage":{"total_tokens":10}}`))
	}))
	t.Cleanup(upstream.Close)
	for _, c := range []struct {
		headerDown string
		want       int
	}{{"", 2}, {"header_down -x-ratelimit-*", 1}} {
		startCaddy(t, siteBlock(":9080", uniquePrefix(t), `
route {
	sliding_ratelimit {
		zone tokens 1d 100000 {
			cost llm 4096
			settle llm
		}
	}
	reverse_proxy `+strings.TrimPrefix(upstream.URL, "http://")+` {
		`+c.headerDown+`
	}
}`))
		res, err := http.Post(site+"v1/chat/completions", "application/json", strings.NewReader(`{"model":"m","max_tokens":10}`))
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		got := res.Header.Values("X-Ratelimit-Remaining-Tokens")
		if len(got) != c.want || got[0] == "1999000" {
			t.Errorf("%q: x-ratelimit-remaining-tokens %q, want the limiter's first and %d in all", c.headerDown, got, c.want)
		}
	}
}
