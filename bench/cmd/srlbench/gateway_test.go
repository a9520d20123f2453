package main

import (
	"encoding/json"
	"fmt"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestParseZoneCounters(t *testing.T) {
	body := `# HELP caddy_sliding_ratelimit_units_total Units.
caddy_sliding_ratelimit_decisions_total{result="allowed",zone="tokens"} 10
caddy_sliding_ratelimit_decisions_total{result="denied",zone="tokens"} 2
caddy_sliding_ratelimit_decisions_total{result="allowed",zone="calls"} 12
caddy_sliding_ratelimit_decisions_total{result="allowed",zone="default"} 99
caddy_sliding_ratelimit_units_total{zone="tokens"} 800
caddy_sliding_ratelimit_units_total{zone="default"} 5
caddy_sliding_ratelimit_settle_fallbacks_total{zone="tokens"} 1
caddy_sliding_ratelimit_body_refusals_total{reason="slow",zone="tokens"} 3
caddy_sliding_ratelimit_body_refusals_total{reason="not_json",zone="tokens"} 4
caddy_http_requests_total{server="srv0"} 99
`
	got := parseZoneCounters(body, "tokens")
	want := zoneCounters{"allowed": 10, "denied": 2, "units": 800, "settle_fallbacks": 1, "body_refusals": 7}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("parseZoneCounters = %v, want %v (only the tokens zone's)", got, want)
	}
	if d := got.sub(zoneCounters{"allowed": 4, "units": 320}); d["allowed"] != 6 || d["units"] != 480 || d["denied"] != 2 {
		t.Errorf("sub = %v", d)
	}
}

// TestLLMSites: every site proxies the same way, and the gateway's limiter
// is the recipe's.
func TestLLMSites(t *testing.T) {
	handlers := map[string][]map[string]any{}
	for _, site := range llmSites {
		data, err := llmSite(site, 8000, "127.0.0.1:9", "redis://r:1")
		if err != nil {
			t.Fatal(err)
		}
		var srv struct {
			Routes []struct{ Handle []map[string]any }
		}
		if err := json.Unmarshal(data, &srv); err != nil {
			t.Fatal(err)
		}
		handlers[site] = srv.Routes[0].Handle
	}
	proxy := handlers["plain"][0]
	if len(handlers["plain"]) != 1 || proxy["handler"] != "reverse_proxy" {
		t.Fatalf("plain site: %v", handlers["plain"])
	}
	for _, site := range llmSites[1:] {
		h := handlers[site]
		if len(h) != 2 || h[0]["handler"] != "sliding_ratelimit" || !reflect.DeepEqual(h[1], proxy) {
			t.Errorf("%s: %v, want the limiter then the plain site's proxy %v", site, h, proxy)
		}
	}
	gw, _ := json.Marshal(handlers[gatewaySite][0])
	for _, want := range []string{`"cost_llm":{"default":4096}`, `"settle":{"llm":true}`, `"name":"tokens"`, `"max_requests":100000`,
		`"name":"calls"`, `"max_requests":60`, `"concurrent":2`, `"key":"{http.request.header.Authorization}"`} {
		if !strings.Contains(string(gw), want) {
			t.Errorf("the gateway's limiter lacks %s: %s", want, gw)
		}
	}
	var req map[string]any
	if err := json.Unmarshal([]byte(llmRequest), &req); err != nil {
		t.Fatalf("llmRequest is not JSON: %v", err)
	}
	for _, k := range []string{"model", "messages", "max_completion_tokens", "stream", "stream_options"} {
		if _, ok := req[k]; !ok {
			t.Errorf("llmRequest lacks %s", k)
		}
	}
	if k := llmAPIKey("9999"); len(k) <= 64 || len(k) != len(llmAPIKey("1")) {
		t.Errorf("API keys %q: want the same length, over 64 bytes", k)
	}
}

func TestGatewayStats(t *testing.T) {
	run := func(site string, calls int64, cpuSeconds float64, metrics zoneCounters) llmRun {
		return llmRun{site: site, calls: calls, elapsed: time.Second, cpu: cpuUse{caddySeconds: cpuSeconds},
			reqBytes: calls * 512, respBytes: calls * 1536, metrics: metrics}
	}
	m := func(allowed float64) zoneCounters {
		return zoneCounters{"allowed": allowed, "units": allowed * gatewayUsage}
	}
	// Three rounds; the gateway's ratios are 0.9, 0.8 and 1.0.
	r := report{llm: []llmRun{
		run("plain", 1000, 0.1, nil), run("header", 1, 1, nil), run("json", 1, 1, nil), run(gatewaySite, 900, 0.18, m(900)),
		run("plain", 1000, 0.1, nil), run("header", 1, 1, nil), run("json", 1, 1, nil), run(gatewaySite, 800, 0.16, m(800)),
		run("plain", 1000, 0.1, nil), run("header", 1, 1, nil), run("json", 1, 1, nil), run(gatewaySite, 1000, 0.2, m(1000)),
	}}
	s := r.gatewayStats()
	// 2 KB per call; 200 us per call against 100: 100 us per KB, 50 added.
	for _, c := range []struct {
		name      string
		got, want float64
	}{{"ratio", s.ratio, 0.9}, {"min", s.ratioMin, 0.8}, {"max", s.ratioMax, 1}, {"request bytes", s.reqBytes, 512}, {"response bytes", s.respBytes, 1536},
		{"CPU per KB", s.cpuPerKB, 100}, {"added per KB", s.addedPerKB, 50}, {"charged", s.chargedPerCall, gatewayUsage}} {
		if math.Abs(c.got-c.want) > 1e-9 {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	r.cfg.duration = time.Second
	r.llmSection(p)
	r.gatewaySection(p)
	r.gatewayTarget(func(target, measured string, ok bool) { p("| %s | %s | %v |", target, measured, ok) })
	for _, want := range []string{"| calls/s | 1,000 | 1 | 1 | 900 |", "| 0.90 (0.80-1.00) |", "| 512 + 1,536 bytes |", "| 100.00 us |", "| 50.00 us |",
		"AI gateway: calls/s >= 0.85 of the same reverse_proxy without the limiter | 0.90 (0.80-1.00) | true |"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("the report lacks %q:\n%s", want, b.String())
		}
	}
}
