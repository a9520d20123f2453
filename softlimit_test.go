package slidingratelimit

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/limiter"
)

// softSeries is the soft limit counter of zone.
func softSeries(zone string) string {
	return `caddy_sliding_ratelimit_soft_limit_reached_total{zone="` + zone + `"}`
}

// warned reports whether an answer's RateLimit item of zone carries the
// soft limit's parameter.
func warned(a answer, zone string) bool {
	for _, item := range strings.Split(a.header.Get("RateLimit"), ", ") {
		if strings.HasPrefix(item, `"`+zone+`";`) {
			return strings.HasSuffix(item, ";srl-warn")
		}
	}
	return false
}

// TestSoftLimitAtTheShare: a zone of max 10 with warn 80%. The 8th request
// takes the client to the share: one log line, the metric 1. It and the 9th
// and 10th carry srl-warn, and only the 8th counts; the 11th is denied,
// without srl-warn. Another client reaches it on its own. In a zone of
// units the share is of units.
func TestSoftLimitAtTheShare(t *testing.T) {
	api, tokens := uniqueZone("soft"), uniqueZone("softunits")
	logFile := startCaddy(t, siteBlock(":9080", uniquePrefix(t), fmt.Sprintf(`
	sliding_ratelimit {
		key {http.request.header.X-Client}
		zone %s 1m 10 {
			warn 80%%
			match {
				path /api/*
			}
		}
		zone %s 1m 100 {
			cost {http.request.header.X-Cost}
			warn 80%%
			match {
				path /tokens/*
			}
		}
	}
	respond "ok"`, api, tokens)))

	for i := 1; i <= 11; i++ {
		res := send(t, site+"api/x", withHeader("X-Client", "s1"))
		if want := i <= 10; (res.status == http.StatusOK) != want {
			t.Fatalf("request %d: status %d", i, res.status)
		}
		if got, want := warned(res, api), i >= 8 && i <= 10; got != want {
			t.Errorf("request %d: RateLimit %q, srl-warn %v, want %v", i, res.header.Get("RateLimit"), got, want)
		}
		if got, want := scrape(t, softSeries(api)), float64(min(max(i-7, 0), 1)); got != want {
			t.Errorf("after request %d: %s = %v, want %v", i, softSeries(api), got, want)
		}
	}
	lines := logLines(t, logFile, `"soft limit reached"`, `"zone":"`+api+`"`)
	if len(lines) != 1 {
		t.Fatalf("%d soft limit lines, want 1: %q", len(lines), lines)
	}
	for _, field := range []string{`"use":8`, `"limit":10`, `"share":0.8`, `"warn_percent":80`} {
		if !strings.Contains(lines[0], field) {
			t.Errorf("soft limit line %s lacks %s", lines[0], field)
		}
	}
	if strings.Contains(lines[0], "s1") {
		t.Errorf("soft limit line %s carries the client key without log_keys", lines[0])
	}

	// Another client, its own use.
	for i := 1; i <= 8; i++ {
		send(t, site+"api/x", withHeader("X-Client", "s2"))
	}
	if got := scrape(t, softSeries(api)); got != 2 {
		t.Errorf("after a second client's 8th request: %s = %v, want 2", softSeries(api), got)
	}

	// Units: 30 + 30 is 60 of 100; the next 30 takes it to 90, past 80; 5
	// more stay above it and do not count again.
	for i, step := range []struct {
		cost string
		warn bool
	}{{"30", false}, {"30", false}, {"30", true}, {"5", true}} {
		res := send(t, site+"tokens/x", withHeader("X-Client", "s3"), withHeader("X-Cost", step.cost))
		if got := warned(res, tokens); res.status != http.StatusOK || got != step.warn {
			t.Errorf("units, request %d: %d %q, want 200 and srl-warn %v", i+1, res.status, res.header.Get("RateLimit"), step.warn)
		}
	}
	if got := scrape(t, softSeries(tokens)); got != 1 {
		t.Errorf("units: %s = %v, want 1", softSeries(tokens), got)
	}
	if lines := logLines(t, logFile, `"soft limit reached"`, `"zone":"`+tokens+`"`, `"use":90`, `"unit":"units"`); len(lines) != 1 {
		t.Errorf("units: %d lines of use 90 in units, want 1", len(lines))
	}
}

// TestSoftLimitOnceAcrossInstances: two instances on one Redis, ten
// requests of one client at once, five on each: exactly one of them takes
// the client to the share, whichever instance serves it, and it alone
// counts. The counter is the process's, shared by both instances here, as
// Prometheus sums a fleet's.
func TestSoftLimitOnceAcrossInstances(t *testing.T) {
	zone, prefix := uniqueZone("softfleet"), uniquePrefix(t)
	startCaddy(t, siteBlock(":9080", prefix, fmt.Sprintf(`
	sliding_ratelimit {
		key {http.request.header.X-Client}
		zone %s 1m 10 {
			warn 50%%
		}
	}
	respond "ok"`, zone)))
	other := newInstance(t, fmt.Sprintf(`{"key": "{http.request.header.X-Client}", "redis": %q, "key_prefix": %q,
		"zones": [{"name": %q, "window": "1m", "max_requests": 10, "warn_percent": 50}]}`, sharedRedis.URL(), prefix, zone))

	var mu sync.Mutex
	var warnings int
	var wg sync.WaitGroup
	for i := range 10 {
		opts := []sendOption{withHeader("X-Client", "fleet")}
		if i%2 == 1 {
			opts = append(opts, to(other))
		}
		wg.Go(func() {
			res := send(t, site, opts...)
			if res.status != http.StatusOK {
				t.Errorf("status %d, want 200: ten requests fit in 10", res.status)
			}
			if warned(res, zone) {
				mu.Lock()
				warnings++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if got := scrape(t, softSeries(zone)); got != 1 {
		t.Errorf("%s = %v after ten requests on two instances, want 1", softSeries(zone), got)
	}
	// Uses 5 to 10 are at or above the share of 5.
	if warnings != 6 {
		t.Errorf("%d answers with srl-warn, want 6 (uses 5 to 10)", warnings)
	}
}

// TestSoftLimitThreshold: the share rounds up to whole units, and a
// request crosses only from below.
func TestSoftLimitThreshold(t *testing.T) {
	for _, c := range []struct {
		max     int64
		percent int
		want    int64
	}{
		{10, 80, 8}, {3, 50, 2}, {1, 80, 1}, {100, 1, 1}, {101, 99, 100}, {1<<48 - 1, 99, 278660226943549},
	} {
		if got := softThreshold(c.max, c.percent); got != c.want {
			t.Errorf("softThreshold(%d, %d) = %d, want %d", c.max, c.percent, got, c.want)
		}
	}
	z := &Zone{WarnPercent: 80}
	check := limiter.Check{Limit: limiter.Limit{Max: 10}}
	for remaining, want := range map[int64]bool{3: false, 2: true, 0: true} {
		if got := z.warns(check, limiter.Decision{Allowed: true, Remaining: remaining}); got != want {
			t.Errorf("remaining %d of 10 at 80%%: warns %v, want %v", remaining, got, want)
		}
	}
	if z.warns(check, limiter.Decision{Remaining: 0}) {
		t.Error("a denial warns")
	}
}

// TestSoftLimitAndReportRulesInJSON: the JSON fields' rules name them.
func TestSoftLimitAndReportRulesInJSON(t *testing.T) {
	for _, c := range []struct{ config, want string }{
		{`{"zones": [{"name": "a", "window": "1m", "max_requests": 10, "warn_percent": 100}]}`, "zone a: warn must be a share from 1% to 99% of max_requests, got 100%"},
		{`{"zones": [{"name": "a", "window": "1m", "max_requests": 10, "warn_percent": -1}]}`, "zone a: warn must be a share from 1% to 99%"},
		{`{"zones": [{"name": "a", "concurrent": 2, "warn_percent": 50}]}`, "zone a: a concurrency zone counts requests in flight, not in a window: remove warn (or concurrent)"},
		{`{"zones": [{"name": "a", "window": "1m", "max_requests": 10, "mode": "shadow"}]}`, `zone a: mode must be enforce or report, got "shadow"`},
		{`{"zones": [{"name": "a", "window": "1m", "max_requests": 10, "mode": "report", "wait": "1s"}]}`, "zone a: a zone in mode report never holds a request: remove wait 1s"},
		{`{"zones": [{"name": "a", "concurrent": 2, "mode": "report"}]}`, "remove mode report (or concurrent)"},
	} {
		err := provisionError(t, c.config)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want one containing %q", c.config, err, c.want)
		}
	}
	if err := provisionError(t, `{"zones": [{"name": "a", "window": "1m", "max_requests": 10, "warn_percent": 80, "mode": "report"}]}`); err != nil {
		t.Errorf("warn in a report zone: %v", err)
	}
}

// TestSoftLimitEvent: in a JSON config, a zone of max 3 with warn_percent
// 50 (2 units): the second request reaches it, and the events app's
// subscribers get one sliding_ratelimit.soft_limit event, without the
// client key; the third, above the share already, emits none.
func TestSoftLimitEvent(t *testing.T) {
	zone := uniqueZone("softev")
	config := strings.NewReplacer(
		`"events": ["sliding_ratelimit.exceeded"]`, `"events": ["sliding_ratelimit.soft_limit"]`,
		`"max_requests": 3}`, `"max_requests": 3, "warn_percent": 50}`,
	).Replace(observedConfig(zone, uniquePrefix(t), "ok"))
	if !strings.Contains(config, `"warn_percent": 50`) || !strings.Contains(config, `"sliding_ratelimit.soft_limit"`) {
		t.Fatal("observedConfig changed: the test's edits no longer apply")
	}
	startCaddy(t, config, asJSON())
	recordedEvents.Lock()
	recordedEvents.data = nil
	recordedEvents.Unlock()

	for i := 1; i <= 3; i++ {
		res := send(t, "http://localhost:9080/", withHeader("X-Client", "watched"))
		if got, want := warned(res, zone), i >= 2; res.status != http.StatusOK || got != want {
			t.Errorf("request %d: %d %q, want 200 and srl-warn %v", i, res.status, res.header.Get("RateLimit"), want)
		}
	}
	recordedEvents.Lock()
	events := append([]map[string]any(nil), recordedEvents.data...)
	recordedEvents.Unlock()
	if len(events) != 1 {
		t.Fatalf("%d soft limit events, want 1: %v", len(events), events)
	}
	e := events[0]
	if e["zone"] != zone || e["use"] != int64(2) || e["limit"] != int64(3) || e["share"] != 2.0/3 {
		t.Errorf("event data %v, want zone %s, use 2, limit 3, share 2/3", e, zone)
	}
	for k, v := range e {
		if s, ok := v.(string); ok && strings.Contains(s, "watched") {
			t.Errorf("event field %s carries the client key", k)
		}
	}
}
