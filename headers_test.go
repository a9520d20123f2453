package slidingratelimit

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

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
