package slidingratelimit

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestParseCount(t *testing.T) {
	for _, c := range []struct {
		in   string
		want int64
		ok   bool
	}{
		{"0", 0, true},
		{"7", 7, true},
		{"007", 7, true},
		{"9007199254740992", maxCount, true},
		{"9007199254740993", maxCount, true},
		{"99999999999999999999", maxCount, true},
		{"", 0, false},
		{"-5", 0, false},
		{"+5", 0, false},
		{" 5", 0, false},
		{"5 ", 0, false},
		{"1e9", 0, false},
		{"5.0", 0, false},
		{"0x10", 0, false},
		{"NaN", 0, false},
		{"5,7", 0, false},
		{"٥", 0, false},
	} {
		if n, ok := parseCount(c.in); n != c.want || ok != c.ok {
			t.Errorf("parseCount(%q) = %d, %v; want %d, %v", c.in, n, ok, c.want, c.ok)
		}
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
	logFile := startCaddy(t, `
:9080 {
	sliding_ratelimit {
		zone `+zone+` 1m 100 {
			cost {http.request.header.X-Cost}
			key {http.request.header.X-Client}
		}
		redis `+sharedRedis.URL()+`
		key_prefix `+uniquePrefix(t)+`
	}
	respond "ok"
	handle_errors 429 {
		respond "cost {http.sliding_ratelimit.cost} of {http.sliding_ratelimit.limit} {http.sliding_ratelimit.unit}, retry after {http.sliding_ratelimit.retry_after}" 429
	}
}`)
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
	startCaddy(t, `
:9080 {
	sliding_ratelimit {
		window 1m
		max_requests 25
		cost 10
		redis `+sharedRedis.URL()+`
		key_prefix `+uniquePrefix(t)+`
	}
	respond "ok"
}`)
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
	logFile := startCaddy(t, `
:9080 {
	map {path} {price} {
		/export 10
		default 1
	}
	sliding_ratelimit {
		zone `+zone+` 1m 30 {
			cost {price}
		}
		redis `+sharedRedis.URL()+`
		key_prefix `+uniquePrefix(t)+`
	}
	respond "ok"
}`)
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
