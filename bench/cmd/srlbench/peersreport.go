package main

import (
	"fmt"
	"math"
	"time"
)

// anchorStats are the anchor's medians over its runs.
type anchorStats struct {
	runs              int
	rps               float64
	redisPerDecision  float64 // INFO cpu
	scriptPerDecision float64 // commandstats
	callsPerDecision  float64
	denied            float64
}

func anchorStatsOf(runs []anchorResult) anchorStats {
	med := func(f func(anchorResult) float64) float64 {
		xs := make([]float64, len(runs))
		for i, a := range runs {
			xs[i] = f(a)
		}
		return median(xs)
	}
	return anchorStats{
		runs:              len(runs),
		rps:               med(anchorResult.rps),
		redisPerDecision:  med(func(a anchorResult) float64 { return a.redis.cpuUsecPer(float64(a.decisions)) }),
		scriptPerDecision: med(func(a anchorResult) float64 { return a.redis.scriptUsecPer(float64(a.decisions)) }),
		callsPerDecision:  med(func(a anchorResult) float64 { return float64(a.redis.scriptCalls) / float64(a.decisions) }),
		denied:            med(func(a anchorResult) float64 { return float64(a.denied) / float64(a.decisions) }),
	}
}

// seedStats are the seed's medians over its runs.
type seedStats struct {
	runs             int
	rps, denied      float64
	p50, p99         time.Duration
	redisPerRequest  float64 // its own Redis, INFO cpu
	serverPerRequest float64 // its Node.js process
}

func seedStatsOf(runs []seedResult) seedStats {
	med := func(f func(seedResult) float64) float64 {
		xs := make([]float64, len(runs))
		for i, s := range runs {
			xs[i] = f(s)
		}
		return median(xs)
	}
	return seedStats{
		runs:             len(runs),
		rps:              med(func(s seedResult) float64 { return s.wrk.rps() }),
		denied:           med(func(s seedResult) float64 { return s.wrk.deniedShare() }),
		p50:              time.Duration(med(func(s seedResult) float64 { return float64(s.wrk.p50) })),
		p99:              time.Duration(med(func(s seedResult) float64 { return float64(s.wrk.p99) })),
		redisPerRequest:  med(func(s seedResult) float64 { return s.redis.cpuUsecPer(float64(s.wrk.requests)) }),
		serverPerRequest: med(func(s seedResult) float64 { return s.wrk.caddyUsecPerRequest() }),
	}
}

// peersSection compares the module, under the many clients load, with the
// anchor and the seed measured beside it.
func (r report) peersSection(p func(string, ...any)) {
	many, ok := r.many()
	if !ok {
		return
	}
	ms := many.stats()
	a := anchorStatsOf(many.anchors)
	sd := seedStatsOf(many.seeds)
	c := r.cfg
	p("## Peers")
	p("")
	p("After each many clients run the bench runs, %s each:", c.duration)
	p("")
	p("- **redis_rate**: go-redis/redis_rate v10 `Allow` (GCRA, approximate; `redis_rate.PerMinute(%d)`, the limited", limitedMax)
	p("  site's limit), called by this tool from %d goroutines (one Redis connection each, as wrk's -c%d) on the", c.connections, c.connections)
	p("  same redis-server as the limited site, each call on the next of %s keys. No HTTP: it shows what Redis", thousands(anchorKeys))
	p("  pays per decision for a limiter that sends one script call per decision.")
	if r.seedSkip != nil {
		p("- **seed** (the Express + ioredis limiter of the article this project started from): **not run**: %v.", r.seedSkip)
	} else {
		p("- **seed**: the limiter of the article this project started from, its Express + ioredis sliding-window")
		p("  log as printed there ([how this module differs](docs/how-it-works.md#compared-with-the-article-this-started-from);")
		p("  its code: shared/peers/seed-express): a sorted set in a MULTI, denials recorded too, %d a minute per", seedMax)
		p("  X-Client on `GET %s`, copied, `npm install`ed and run with Node.js on its own redis-server, loaded with", seedPath)
		p("  the many clients wrk script (same keys, -t%d -c%d).", c.threads, c.connections)
	}
	p("")
	p("| | decisions/s | 429s | p50 | p99 | Redis CPU us/decision (INFO cpu) | in scripts us/decision (commandstats) | Redis round trips/decision | server CPU us/req |")
	p("|---|--:|--:|--:|--:|--:|--:|--:|--:|")
	p("| this module, many clients (HTTP through Caddy) | %s | %.1f%% | %s | %s | %s | %s | %.3f | %s |",
		thousands(ms.limitedRPS), 100*ms.denied, ms0(ms.p50Limited), ms0(ms.p99Limited), num(ms.redisPerDecision, 1), num(ms.scriptPerDecision, 1),
		ms.callsPerReq, num(ms.caddyLimited, 1))
	if a.runs > 0 {
		p("| redis_rate v10 (Go calls, no HTTP) | %s | %.1f%% | | | %s | %s | %.3f | |",
			thousands(a.rps), 100*a.denied, num(a.redisPerDecision, 1), num(a.scriptPerDecision, 1), a.callsPerDecision)
	}
	if sd.runs > 0 {
		p("| seed, Express + ioredis (HTTP through Node.js) | %s | %.1f%% | %s | %s | %s | | 1 MULTI | %s |",
			thousands(sd.rps), 100*sd.denied, ms0(sd.p50), ms0(sd.p99), num(sd.redisPerRequest, 1), num(sd.serverPerRequest, 1))
	}
	p("")
	if a.runs > 0 {
		p("Redis CPU per decision, this module / redis_rate: **%.2fx** (target <= %.1f).", ms.redisPerDecision/a.redisPerDecision, targetRedisVsAnchor)
	}
	if sd.runs > 0 {
		p("Requests/s, this module / the seed: **%.1fx** (target >= %.0f).", ms.limitedRPS/sd.rps, targetSeedTimes)
	}
	p("")
	p("server CPU us/req: Caddy's (for the seed, Node.js's) CPU time per request. The seed's Redis CPU is its own")
	p("redis-server's, per request (its MULTI also records denials). redis_rate's decisions/s is bounded by this")
	p("tool's Go client on the same 2 CPUs, not by Redis; compare its Redis CPU per decision.")
	p("")
}

// peersPerRun lists every peer run.
func (r report) peersPerRun(p func(string, ...any)) {
	many, ok := r.many()
	if !ok || len(many.anchors) == 0 {
		return
	}
	p("Peers, after each many clients run:")
	p("")
	p("| run | redis_rate decisions/s | Redis CPU us/decision | script calls/decision | errors | CPUs: Redis / this tool / other | seed req/s | seed 429s | seed Redis CPU us/req | CPUs seed run: Node.js / Redis / wrk / other |")
	p("|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
	for i, a := range many.anchors {
		seedCols := "n/a | n/a | n/a | n/a"
		if i < len(many.seeds) {
			s := many.seeds[i]
			sc := s.wrk.cpu
			seedCols = fmt.Sprintf("%s | %.1f%% | %s | %.2f / %.2f / %.2f / %.2f", thousands(s.wrk.rps()), 100*s.wrk.deniedShare(),
				num(s.redis.cpuUsecPer(float64(s.wrk.requests)), 1), sc.caddy, sc.redis, sc.wrk, sc.other)
		}
		p("| %d | %s | %s | %.3f | %d | %.2f / %.2f / %.2f | %s |", i+1, thousands(a.rps()), num(a.redis.cpuUsecPer(float64(a.decisions)), 1),
			float64(a.redis.scriptCalls)/float64(a.decisions), a.errors, a.cpu.redis, a.cpu.self, a.cpu.other, seedCols)
	}
	p("")
}

// ms0 is ms, or blank for a zero (not measured) latency.
func ms0(d time.Duration) string {
	if d == 0 || math.IsNaN(float64(d)) {
		return ""
	}
	return ms(d)
}
