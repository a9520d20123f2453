package slidingratelimit

import (
	"context"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
)

// eventRecorder is an events handler module for tests: it records the
// exceeded events it is sent.
type eventRecorder struct{}

var recordedEvents struct {
	sync.Mutex
	data []map[string]any
}

func (eventRecorder) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "events.handlers.sliding_ratelimit_test_recorder",
		New: func() caddy.Module { return new(eventRecorder) },
	}
}

func (eventRecorder) Handle(_ context.Context, e caddy.Event) error {
	recordedEvents.Lock()
	defer recordedEvents.Unlock()
	recordedEvents.data = append(recordedEvents.data, e.Data)
	return nil
}

func init() { caddy.RegisterModule(eventRecorder{}) }

// observedConfig is a JSON config with one limited site, an events app that
// records exceeded events, and Caddy's metrics.
func observedConfig(zone, prefix, body string) string {
	return `{
	"admin": {"listen": "localhost:2999"},
	"apps": {
		"events": {"subscriptions": [{
			"events": ["sliding_ratelimit.exceeded"],
			"handlers": [{"handler": "sliding_ratelimit_test_recorder"}]
		}]},
		"http": {
			"http_port": 9080,
			"grace_period": 1,
			"servers": {"srv0": {
				"listen": [":9080"],
				"metrics": {},
				"routes": [{"handle": [
					{"handler": "sliding_ratelimit", "zones": [{"name": "` + zone + `", "window": "10s", "max_requests": 3}],
					 "key": "{http.request.header.X-Client}",
					 "redis": "` + sharedRedis.URL() + `", "key_prefix": "` + prefix + `"},
					{"handler": "static_response", "body": "` + body + `"}
				]}]
			}}
		}
	}
}`
}

// scrape returns the value of one series on the admin endpoint's /metrics.
func scrape(t *testing.T, series string) float64 {
	t.Helper()
	res, err := http.Get("http://localhost:2999/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	text, _ := io.ReadAll(res.Body)
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(series) + ` (\S+)$`).FindSubmatch(text)
	if m == nil {
		return 0
	}
	v, err := strconv.ParseFloat(string(m[1]), 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func TestMetricsAndEvents(t *testing.T) {
	zone := "m" + strconv.FormatInt(time.Now().UnixNano()%1e9, 36)
	prefix := uniquePrefix(t)
	startCaddy(t, observedConfig(zone, prefix, "v1"), asJSON())
	recordedEvents.Lock()
	recordedEvents.data = nil
	recordedEvents.Unlock()

	// 3 admitted, then 4 denied: the first denial from Redis, 3 from the
	// deny cache.
	for i := 0; i < 7; i++ {
		send(t, "http://localhost:9080/", withHeader("X-Client", "watched"))
	}
	series := func(result string) string {
		return `caddy_sliding_ratelimit_decisions_total{result="` + result + `",zone="` + zone + `"}`
	}
	hits := `caddy_sliding_ratelimit_deny_cache_hits_total{zone="` + zone + `"}`
	check := func(when string, allowed, denied, cacheHits float64) {
		t.Helper()
		if got := scrape(t, series("allowed")); got != allowed {
			t.Errorf("%s: allowed = %v, want %v", when, got, allowed)
		}
		if got := scrape(t, series("denied")); got != denied {
			t.Errorf("%s: denied = %v, want %v", when, got, denied)
		}
		if got := scrape(t, hits); got != cacheHits {
			t.Errorf("%s: deny cache hits = %v, want %v", when, got, cacheHits)
		}
	}
	check("after 7 requests", 3, 4, 3)
	if got := scrape(t, "caddy_sliding_ratelimit_redis_duration_seconds_count"); got < 4 {
		t.Errorf("redis_duration_seconds_count = %v, want at least the 4 Redis calls", got)
	}

	// Once per block: one event for the four denials.
	recordedEvents.Lock()
	events := append([]map[string]any(nil), recordedEvents.data...)
	recordedEvents.Unlock()
	if len(events) != 1 {
		t.Fatalf("%d exceeded events for one block, want 1: %v", len(events), events)
	}
	if events[0]["zone"] != zone {
		t.Errorf("event data %v, want zone %s", events[0], zone)
	}
	if retry, _ := events[0]["retry_after"].(float64); retry <= 0 || retry > 10 {
		t.Errorf("event retry_after %v, want in (0, 10] seconds", events[0]["retry_after"])
	}
	for _, e := range events {
		for k, v := range e {
			if s, ok := v.(string); ok && strings.Contains(s, "watched") {
				t.Errorf("event field %s carries the client key", k)
			}
		}
	}

	// A reload keeps the counts, and counting goes on. The new config has a
	// new, empty deny cache, so its first denial comes from Redis.
	startCaddy(t, observedConfig(zone, prefix, "v2"), asJSON())
	check("after a reload", 3, 4, 3)
	send(t, "http://localhost:9080/", withHeader("X-Client", "watched"))
	send(t, "http://localhost:9080/", withHeader("X-Client", "watched"))
	check("after a reload and two more denials", 3, 6, 4)
}
