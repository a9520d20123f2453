package main

import (
	"context"
	"fmt"
	"math"
	"strings"
)

// The AI gateway site of the llm scenario: the recipe of docs/ai-gateway.md
// as written (its JSON is what `caddy adapt` makes of the recipe's
// Caddyfile), on the scenario's load, beside the same reverse_proxy without
// the limiter. Each call reserves what its request body allows (`cost llm`
// reads the body before the call goes on) and is charged the usage of the
// stream's last event (`settle llm` reads the stream as it passes). The
// calls cycle through llmKeys API keys, so that none is refused.
const (
	gatewaySite = "gateway"
	// gatewayZone is the recipe's zone of tokens.
	gatewayZone = "tokens"
	// targetGatewayRatio: calls/s with the recipe over calls/s without it.
	targetGatewayRatio = 0.85
	// gatewayUsage is the total_tokens of the upstream's usage event.
	gatewayUsage = 80
)

// gatewayLimiter is the recipe's sliding_ratelimit handler on redisURL.
func gatewayLimiter(redisURL, keyPrefix string) map[string]any {
	return map[string]any{
		"handler": "sliding_ratelimit",
		"key":     "{http.request.header.Authorization}",
		"zones": []any{
			map[string]any{"name": gatewayZone, "window": "1m", "max_requests": 100_000,
				"cost_llm": map[string]any{"default": 4096}, "settle": map[string]any{"llm": true}},
			map[string]any{"name": "calls", "window": "1m", "max_requests": 60},
			map[string]any{"name": "inflight", "concurrent": 2},
		},
		"redis":      redisURL,
		"key_prefix": keyPrefix,
	}
}

// zoneCounters are one zone's counters from Caddy's /metrics: decisions by
// result ("allowed", "denied"), "units" (units_total), "settle_fallbacks"
// and "body_refusals" (all reasons).
type zoneCounters map[string]float64

func readZoneCounters(ctx context.Context, admin, zone string) (zoneCounters, error) {
	body, err := httpGet(ctx, admin+"/metrics")
	if err != nil {
		return nil, err
	}
	return parseZoneCounters(string(body), zone), nil
}

// parseZoneCounters reads the Prometheus text format of /metrics for the
// series whose zone label is zone.
func parseZoneCounters(body, zone string) zoneCounters {
	c := make(zoneCounters)
	forEachSample(body, func(name string, labels map[string]string, v float64) {
		if labels["zone"] != zone {
			return
		}
		switch strings.TrimPrefix(name, "caddy_sliding_ratelimit_") {
		case "decisions_total":
			c[labels["result"]] += v
		case "units_total":
			c["units"] += v
		case "settle_fallbacks_total":
			c["settle_fallbacks"] += v
		case "body_refusals_total":
			c["body_refusals"] += v
		}
	})
	return c
}

func (after zoneCounters) sub(before zoneCounters) zoneCounters { return subCounts(after, before) }

// bodyKB is the body bytes of a run's counted calls, request and response,
// per call, in KB of 1,024 bytes.
func (l llmRun) bodyKBPerCall() float64 {
	if l.calls == 0 {
		return math.NaN()
	}
	return float64(l.reqBytes+l.respBytes) / 1024 / float64(l.calls)
}

// gatewayStats are the AI gateway's figures, medians over the rounds of the
// scenario (a round loads each site once).
type gatewayStats struct {
	rounds                    int
	ratio, ratioMin, ratioMax float64
	// reqBytes and respBytes are the body bytes per call.
	reqBytes, respBytes float64
	// cpuPerKB is the gateway site's Caddy CPU per KB of body; addedPerKB
	// the part of it the limiter adds over the site without it.
	cpuPerKB, addedPerKB float64
	// chargedPerCall is the tokens each admitted call paid.
	chargedPerCall float64
	// Summed over the runs.
	fallbacks, refusals, denied float64
	other                       int64
}

func (r report) gatewayStats() gatewayStats {
	bySite := map[string][]llmRun{}
	for _, run := range r.llm {
		bySite[run.site] = append(bySite[run.site], run)
	}
	plain, gw := bySite["plain"], bySite[gatewaySite]
	s := gatewayStats{rounds: min(len(plain), len(gw)), ratioMin: math.Inf(1), ratioMax: math.Inf(-1)}
	var ratios, req, resp, perKB, added, charged []float64
	for k := 0; k < s.rounds; k++ {
		p, g := plain[k], gw[k]
		ratio := g.callsPerSecond() / p.callsPerSecond()
		ratios = append(ratios, ratio)
		s.ratioMin, s.ratioMax = min(s.ratioMin, ratio), max(s.ratioMax, ratio)
		if g.calls > 0 {
			req = append(req, float64(g.reqBytes)/float64(g.calls))
			resp = append(resp, float64(g.respBytes)/float64(g.calls))
		}
		kb := g.bodyKBPerCall()
		perKB = append(perKB, g.caddyUsecPerCall()/kb)
		added = append(added, (g.caddyUsecPerCall()-p.caddyUsecPerCall())/kb)
		if allowed := g.metrics["allowed"]; allowed > 0 {
			charged = append(charged, g.metrics["units"]/allowed)
		}
		s.fallbacks += g.metrics["settle_fallbacks"]
		s.refusals += g.metrics["body_refusals"]
		s.denied += g.metrics["denied"]
		s.other += g.other
	}
	s.ratio, s.reqBytes, s.respBytes = median(ratios), median(req), median(resp)
	s.cpuPerKB, s.addedPerKB, s.chargedPerCall = median(perKB), median(added), median(charged)
	return s
}

// gatewaySection reports what the recipe costs beside the same proxy
// without it; its calls/s, latencies and CPU per call are the AI gateway
// column of the LLM streams section.
func (r report) gatewaySection(p func(string, ...any)) {
	s := r.gatewayStats()
	if s.rounds == 0 {
		return
	}
	p("## AI gateway")
	p("")
	p("The recipe of docs/ai-gateway.md as written (`key {http.request.header.Authorization}`; zones `tokens 1m")
	p("100000 { cost llm 4096; settle llm }`, `calls 1m 60` and `inflight { concurrent 2 }`; the bench's Redis) in")
	p("front of the LLM streams upstream, through the same `reverse_proxy` as the site without the limiter, on the")
	p("same load: its calls/s, first event, whole answer and Caddy CPU per call are the AI gateway column above.")
	p("The calls cycle through %s API keys (bearer tokens of %d bytes, stored hashed as OpenAI's are), so none", thousands(llmKeys), len(llmAPIKey("1")))
	p("is refused. Each call reserves what its request allows (`max_completion_tokens` plus the body's bytes),")
	p("`cost llm` reading the request body before the call goes on, and is charged the usage of the stream's last")
	p("event (%d tokens), which `settle llm` reads as the stream passes. Body bytes are counted by the bench's", gatewayUsage)
	p("clients: what each sent and received. KB: 1,024 bytes. Medians of %d runs.", s.rounds)
	p("")
	p("| | |")
	p("|---|--:|")
	p("| calls/s, AI gateway / no limiter (median of the per-run ratios, min-max) | %.2f (%.2f-%.2f) |", s.ratio, s.ratioMin, s.ratioMax)
	p("| body read per call: request + response | %s + %s bytes |", thousands(s.reqBytes), thousands(s.respBytes))
	p("| Caddy CPU per KB of body read | %s us |", num(s.cpuPerKB, 2))
	p("| of which the limiter adds (its CPU per call over no limiter's, per KB) | %s us |", num(s.addedPerKB, 2))
	p("| tokens charged per admitted call (units_total / allowed, zone `tokens`) | %s |", num(s.chargedPerCall, 1))
	p("| calls charged their reservation instead (settle_fallbacks_total) | %.0f |", s.fallbacks)
	p("| calls refused: denied / body refusals; answers not 200 or cut | %.0f / %.0f; %d |", s.denied, s.refusals, s.other)
	p("")
}

// gatewayTarget is the AI gateway's row of the targets.
func (r report) gatewayTarget(row func(target, measured string, ok bool)) {
	s := r.gatewayStats()
	if s.rounds == 0 {
		return
	}
	row(fmt.Sprintf("AI gateway: calls/s >= %.2f of the same reverse_proxy without the limiter", targetGatewayRatio),
		fmt.Sprintf("%.2f (%.2f-%.2f)", s.ratio, s.ratioMin, s.ratioMax), s.ratio >= targetGatewayRatio)
}
