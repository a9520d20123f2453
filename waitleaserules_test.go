package slidingratelimit

import (
	"strings"
	"testing"
)

// TestJSONRulesOfWaitsAndLeases: a JSON config with a wrong wait, bound,
// concurrency or lease gets the Caddyfile's words, naming the field and
// the zone.
func TestJSONRulesOfWaitsAndLeases(t *testing.T) {
	for _, c := range []struct{ config, want string }{
		{`{"window": "1m", "max_requests": 5, "wait": "-1s"}`, "wait must not be negative, got -1s"},
		{`{"window": "1m", "max_requests": 5, "wait": "1s", "algorithm": "counter"}`, "wait needs algorithm log: a counter cannot promise a later slot (wait 1s)"},
		{`{"window": "1s", "max_requests": 5, "wait": "17s"}`, "wait 17s is longer than 16 windows of 1s, the most a request may wait"},
		{`{"wait": "20s", "zones": [{"name": "a", "window": "1s", "max_requests": 1}]}`, "zone a: wait 20s is longer than 16 windows of 1s"},
		{`{"window": "1m", "max_requests": 5, "max_waiting": -3}`, "max_waiting must be at least 1, got -3"},
		{`{"zones": [{"name": "a", "window": "1m", "max_requests": 1, "wait": "-2s"}]}`, "zone a: wait must not be negative, got -2s"},
		{`{"zones": [{"name": "a", "window": "1m", "max_requests": 10, "algorithm": "counter", "wait": "2s"}]}`, "zone a: wait needs algorithm log"},
		{`{"zones": [{"name": "r", "concurrent": -1}]}`, "zone r: concurrent must be at least 1, got -1"},
		{`{"zones": [{"name": "r", "lease": "1m"}]}`, "zone r: concurrent must be at least 1, got 0 (lease goes with concurrent)"},
		{`{"zones": [{"name": "r", "concurrent": 2, "lease": "-1s"}]}`, "zone r: lease must not be negative, got -1s"},
		{`{"zones": [{"name": "r", "concurrent": 2, "window": "1m"}]}`, "zone r: a concurrency zone counts requests in flight, not in a window: remove window (or concurrent)"},
		{`{"zones": [{"name": "r", "concurrent": 2, "count_status": [401]}]}`, "zone r: a concurrency zone counts requests in flight, not in a window: remove count_status (or concurrent)"},
		{`{"zones": [{"name": "r", "concurrent": 2, "algorithm": "log"}]}`, `zone r: a concurrency zone takes no algorithm, got "log"`},
		{`{"zones": [{"name": "r", "concurrent": 2, "wait": "1s"}]}`, "zone r: a concurrency zone takes no wait"},
		{`{"zones": [{"name": "r", "concurrent": 2, "cost": "5"}]}`, "zone r: a concurrency zone counts requests in flight, not in a window: remove cost (or concurrent)"},
		{`{"zones": [{"name": "r", "concurrent": 2, "settle": {"bytes": true}}]}`, "remove settle (or concurrent)"},
		{`{"zones": [{"name": "r", "concurrent": 2, "max_requests_from": "{http.request.header.X-Quota}"}]}`, "remove max_requests_from (or concurrent)"},
		{`{"zones": [{"name": "r", "concurrent": 2, "key": "{http.request.header.X"}]}`, `zone r: key "{http.request.header.X": the placeholder`},
	} {
		err := provisionError(t, c.config)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want one containing %q", c.config, err, c.want)
		}
	}
	// A top-level wait is the default of zones of algorithm log only: a
	// counter or concurrency zone that sets none is not an error, and does
	// not wait. Nor do a top-level cost and settle apply to a concurrency
	// zone: its requests in flight count one each, whatever they cost.
	in := newInstance(t, `{"wait": "1s", "cost": "3", "settle": {"header": "X-Usage"}, "zones": [{"name": "c", "window": "1m", "max_requests": 10, "algorithm": "counter"},
		{"name": "r", "concurrent": 2}, {"name": "l", "window": "1m", "max_requests": 10}]}`)
	for i, want := range []string{"0s", "0s", "1s"} {
		if got := in.zones[i].wait.String(); got != want {
			t.Errorf("zone %s waits %s, want %s", in.zones[i].Name, got, want)
		}
	}
	if r := in.zones[1]; r.Cost != "" || r.Settle != nil || r.units != nil || r.unit() != unitConcurrentRequests {
		t.Errorf("concurrency zone r: cost %q, settle %v, units %v, unit %s; want none of the handler's, in concurrent-requests", r.Cost, r.Settle, r.units, r.unit())
	}
}

// TestConcurrencyZoneIdentity: a concurrency zone's state is named by its
// name and how many requests may run at once, not by its lease time, so
// that instances with different lease times share its slots.
func TestConcurrencyZoneIdentity(t *testing.T) {
	for _, c := range []struct{ config, want string }{
		{`{"zones": [{"name": "reports", "concurrent": 2}]}`, "reports:concurrent:2"},
		{`{"zones": [{"name": "reports", "concurrent": 2, "lease": "10s"}]}`, "reports:concurrent:2"},
		{`{"zones": [{"name": "dl", "concurrent": 10, "key": "{http.request.header.X-Api-Key}"}]}`, "dl:concurrent:10"},
	} {
		in := newInstance(t, c.config)
		if got := in.zones[0].identity; got != c.want {
			t.Errorf("%s: identity %q, want %q", c.config, got, c.want)
		}
	}
}
