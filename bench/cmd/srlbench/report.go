package main

import (
	"bytes"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"
)

// pair is one run of a scenario on each port, with Redis's counters around
// the limited run.
type pair struct {
	plain, limited wrkResult
	redis          redisDelta
	decisions      decisions // the limiter's counters during the limited run
}

// failedOpenShare is the share of limited requests the fail mode passed
// without a decision by Redis (deadline exceeded, circuit breaker open):
// they make the limited port look faster than it is. NaN when the module
// exports no decision metrics.
func (p pair) failedOpenShare() float64 {
	if len(p.decisions) == 0 {
		return math.NaN()
	}
	return p.decisions["failed_open"] / float64(p.limited.requests)
}

func (p pair) ratio() float64 { return p.limited.rps() / p.plain.rps() }

// callsPerRequest is script calls (round trips to Redis) per request wrk
// completed on the limited port.
func (p pair) callsPerRequest() float64 {
	return float64(p.redis.scriptCalls) / float64(p.limited.requests)
}

// callsPerDenied is script calls per denied request: the bot target says
// a denied client must cost (almost) no Redis call.
func (p pair) callsPerDenied() float64 {
	if p.limited.status == 0 {
		return math.NaN()
	}
	return float64(p.redis.scriptCalls) / float64(p.limited.status)
}

func (p pair) allCallsPerRequest() float64 {
	return float64(p.redis.allCalls) / float64(p.limited.requests)
}

// decided is the number of decisions the limiter made during the limited
// run (every result of decisions_total, deny cache hits included: they are
// decisions too, only cheap ones), or wrk's completed requests when the
// module exports no such metric.
func (p pair) decided() float64 {
	var n float64
	for k, v := range p.decisions {
		if k != "deny_cache_hits" {
			n += v
		}
	}
	if n == 0 {
		return float64(p.limited.requests)
	}
	return n
}

// redisUsecPerDecision is Redis's CPU time (INFO cpu) per decision.
func (p pair) redisUsecPerDecision() float64 { return p.redis.cpuUsecPer(p.decided()) }

// scriptUsecPerDecision is the time Redis spent inside script calls
// (commandstats) per decision: the part of the above that is the script.
func (p pair) scriptUsecPerDecision() float64 { return p.redis.scriptUsecPer(p.decided()) }

// caddyCPURatio is Caddy's CPU per limited request over that per plain one.
func (p pair) caddyCPURatio() float64 {
	return p.limited.caddyUsecPerRequest() / p.plain.caddyUsecPerRequest()
}

type scenarioResult struct {
	sc   scenario
	runs []pair
	// The peers' runs, one after each run of the many clients scenario.
	anchors []anchorResult
	seeds   []seedResult
}

// stats are a scenario's medians over its runs.
type stats struct {
	plainRPS, limitedRPS      float64
	ratio, ratioMin, ratioMax float64
	p50Plain, p50Limited      time.Duration
	p99Plain, p99Limited      time.Duration
	denied                    float64 // share of limited responses >= 400
	failedOpen                float64 // share of limited requests passed by the fail mode
	callsPerReq, callsPerDeny float64
	usecPerCall               float64
	redisPerDecision          float64 // Redis CPU us per decision (INFO cpu)
	scriptPerDecision         float64 // us inside script calls per decision (commandstats)
	caddyPlain, caddyLimited  float64 // Caddy CPU us per request
	caddyRatio                float64 // median of the per-run ratios limited/plain
	socketPlain, socketLim    int64   // wrk socket errors, summed over runs
}

// addedP99 is what the limiter adds to the 99th percentile.
func (s stats) addedP99() time.Duration { return s.p99Limited - s.p99Plain }

func (r scenarioResult) stats() stats {
	med := func(f func(pair) float64) float64 {
		xs := make([]float64, len(r.runs))
		for i, p := range r.runs {
			xs[i] = f(p)
		}
		return median(xs)
	}
	dur := func(f func(pair) time.Duration) time.Duration {
		return time.Duration(med(func(p pair) float64 { return float64(f(p)) }))
	}
	s := stats{
		plainRPS:          med(func(p pair) float64 { return p.plain.rps() }),
		limitedRPS:        med(func(p pair) float64 { return p.limited.rps() }),
		ratio:             med(pair.ratio),
		ratioMin:          math.Inf(1),
		ratioMax:          math.Inf(-1),
		p50Plain:          dur(func(p pair) time.Duration { return p.plain.p50 }),
		p50Limited:        dur(func(p pair) time.Duration { return p.limited.p50 }),
		p99Plain:          dur(func(p pair) time.Duration { return p.plain.p99 }),
		p99Limited:        dur(func(p pair) time.Duration { return p.limited.p99 }),
		denied:            med(func(p pair) float64 { return p.limited.deniedShare() }),
		failedOpen:        med(pair.failedOpenShare),
		callsPerReq:       med(pair.callsPerRequest),
		callsPerDeny:      med(pair.callsPerDenied),
		usecPerCall:       med(func(p pair) float64 { return p.redis.usecPerCall() }),
		redisPerDecision:  med(pair.redisUsecPerDecision),
		scriptPerDecision: med(pair.scriptUsecPerDecision),
		caddyPlain:        med(func(p pair) float64 { return p.plain.caddyUsecPerRequest() }),
		caddyLimited:      med(func(p pair) float64 { return p.limited.caddyUsecPerRequest() }),
		caddyRatio:        med(pair.caddyCPURatio),
	}
	for _, p := range r.runs {
		s.ratioMin = min(s.ratioMin, p.ratio())
		s.ratioMax = max(s.ratioMax, p.ratio())
		s.socketPlain += p.plain.socketErrors()
		s.socketLim += p.limited.socketErrors()
	}
	return s
}

// median of xs; NaNs (no denied requests) sort first and are skipped.
func median(xs []float64) float64 {
	xs = slices.DeleteFunc(slices.Clone(xs), math.IsNaN)
	if len(xs) == 0 {
		return math.NaN()
	}
	slices.Sort(xs)
	mid := len(xs) / 2
	if len(xs)%2 == 1 {
		return xs[mid]
	}
	return (xs[mid-1] + xs[mid]) / 2
}

// machine is what the numbers were measured on.
type machine struct {
	nproc                                                   int
	cpu, kernel, goVersion, caddy, source, redis, wrk, date string
}

func describeMachine(caddyBin, repo string) machine {
	m := machine{
		nproc:     runtime.NumCPU(),
		goVersion: runtime.Version() + " " + runtime.GOOS + "/" + runtime.GOARCH,
		date:      time.Now().UTC().Format("2006-01-02 15:04 UTC"),
		kernel:    firstLine(output("uname", "-srm")),
		caddy:     firstLine(output(caddyBin, "version")),
		redis:     redisVersion(output("redis-server", "--version")),
		source:    sourceState(repo),
		wrk:       firstLine(output("wrk", "-v")), // prints its version, exits 1
	}
	m.wrk, _, _ = strings.Cut(m.wrk, " Copyright")
	if info, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(info), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.cpu = strings.TrimSpace(v)
				break
			}
		}
	}
	return m
}

// redisVersion turns "Redis server v=7.0.15 sha=... malloc=jemalloc-5.3.0
// bits=64 ..." into "7.0.15 (jemalloc-5.3.0)".
func redisVersion(s string) string {
	var v, malloc string
	for _, f := range strings.Fields(s) {
		if x, ok := strings.CutPrefix(f, "v="); ok {
			v = x
		}
		if x, ok := strings.CutPrefix(f, "malloc="); ok {
			malloc = x
		}
	}
	if v == "" {
		return firstLine(s)
	}
	return v + " (" + malloc + ")"
}

// sourceState says which code ./caddy was built from: others edit the module
// while benchmarks run, so a commit alone would not say it. Read-only git
// commands only (git status would refresh the index).
func sourceState(repo string) string {
	head := output("git", "-C", repo, "rev-parse", "--short", "HEAD")
	if head == "" || strings.Contains(head, " ") {
		return "unknown (not a git checkout)"
	}
	changed := exec.Command("git", "-C", repo, "diff", "--quiet", "HEAD", "--", ".", ":!bench", ":!BENCHMARKS.*").Run() != nil
	untracked := output("git", "-C", repo, "ls-files", "--others", "--exclude-standard", "--", "*.go", "*.lua") != ""
	if changed || untracked {
		return "commit " + head + " plus uncommitted changes (the working tree at the time of the run)"
	}
	return "commit " + head
}

// output runs a command and returns its output even when it exits non-zero.
func output(name string, args ...string) string {
	out, _ := exec.Command(name, args...).CombinedOutput()
	return strings.TrimSpace(string(out))
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return strings.TrimSpace(line)
}

// report is everything BENCHMARKS.md shows.
type report struct {
	cfg         config
	machine     machine
	results     []scenarioResult
	mems        []memResult
	caddyErrors caddyErrors
	profile     string
	seedSkip    error // why the seed did not run; nil if it did
	rtt         roundTrips
	waits       []waitsRun
	naive       naiveResult
	llm         []llmRun
	failMode    failModeState
	settleCost  settleCostState
}

// command is how to reproduce the run.
func (c config) command() string {
	args := strings.Join(c.args, " ")
	if os.Getenv("MAKELEVEL") != "" {
		if args == "" {
			return "make bench"
		}
		return "make bench BENCH_FLAGS='" + args + "'"
	}
	return strings.TrimSpace("cd bench && go run ./cmd/srlbench " + args)
}

// Targets from the issues; the goals against the floor script, the many
// clients and the naive peer are in goals.go.
const (
	targetCallsPerDen   = 0.01
	targetRedisVsAnchor = 0.5 // Redis CPU per decision, module / redis_rate
	targetSeedTimes     = 5.0 // module req/s / seed req/s, many clients
)

// targetMem is the memory target for a memory size: bytes per client, or
// per admission when perAdmission. A size with a window of its own (a
// month) is held to the ring's bound: 1,170 entries of 12 bytes and what
// Redis adds, 16 KB.
func targetMem(size memSize) (bytes float64, perAdmission bool) {
	if size.window != "" {
		return 16 << 10, false
	}
	switch size.max {
	case 60:
		return 600, false
	case 1000:
		return 10_000, false
	default:
		return 12, true
	}
}

// write prints the report and writes it and the chart.
func (r report) write() error {
	chartPath := strings.TrimSuffix(r.cfg.out, filepath.Ext(r.cfg.out)) + ".svg"
	var ratios []chartBar
	for _, res := range r.results {
		s := res.stats()
		ratios = append(ratios, chartBar{label: res.sc.name, median: s.ratio, min: s.ratioMin, max: s.ratioMax, target: res.sc.target})
	}
	title := fmt.Sprintf("Throughput with sliding_ratelimit / plain Caddy (%d CPUs, median of %d runs, min-max)", r.machine.nproc, r.cfg.runs)
	if err := os.WriteFile(chartPath, []byte(chartSVG(title, ratios)), 0o644); err != nil {
		return err
	}
	md := r.markdown(filepath.Base(chartPath))
	if err := os.WriteFile(r.cfg.out, []byte(md), 0o644); err != nil {
		return err
	}
	fmt.Print(md)
	say("wrote %s and %s", r.cfg.out, chartPath)
	return nil
}

// many is the many clients scenario's result, which the peers ran beside.
func (r report) many() (scenarioResult, bool) {
	for _, res := range r.results {
		if res.sc.slug == manySlug {
			return res, true
		}
	}
	return scenarioResult{}, false
}

func (r report) markdown(chartFile string) string {
	var b bytes.Buffer
	p := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	c := r.cfg

	p("# Benchmarks")
	p("")
	p("Written by `make bench` (bench/cmd/srlbench); rerun it to update this file, do not edit it by hand.")
	p("")
	p("Command: `%s` (runs per scenario and port: %d of %s; wrk -t%d -c%d).", c.command(), c.runs, c.duration, c.threads, c.connections)
	p("")
	p("## Machine")
	p("")
	p("| | |")
	p("|---|---|")
	m := r.machine
	p("| CPUs (nproc) | %d, shared by wrk, Caddy and Redis |", m.nproc)
	p("| CPU | %s |", m.cpu)
	p("| Kernel | %s |", m.kernel)
	p("| Go | %s |", m.goVersion)
	p("| Caddy | %s |", m.caddy)
	p("| Module source | %s |", m.source)
	p("| redis-server | %s |", m.redis)
	p("| wrk | %s |", m.wrk)
	p("| Date | %s |", m.date)
	p("")
	p("## Setup")
	p("")
	p("One Caddy serves `respond \"ok\" 200` on loopback ports: plain, and behind")
	p("`sliding_ratelimit { window 1m  max_requests %d  key {http.request.header.X-Client}  redis <url> }`", limitedMax)
	p("with its own redis-server (no persistence), once with Redis direct and once through an in-process Toxiproxy")
	p("whose latency toxic holds every reply from Redis %d ms (Redis 1 ms away). No access logs. For each scenario", farLatencyMs)
	p("the plain and the limited port are loaded in turn, %d times each, alternating which goes first; the same wrk", c.runs)
	p("Lua script, which sets X-Client on every request, drives both. Figures are medians over the runs; the ratio")
	p("is the median of the per-run ratios limited/plain, with min-max in brackets. Latencies are wrk's, over")
	p("keep-alive connections. Before each run the tool waits up to %s for other processes to use under 0.25", c.settle)
	p("CPUs, and it records per run the CPU time of Caddy, Redis, wrk and everything else (Per run). Each many")
	p("clients run is followed by one run of each peer (Peers).")
	p("")
	for _, res := range r.results {
		p("- **%s**: %s.", res.sc.name, res.sc.about)
	}
	p("")
	p("## Results")
	p("")
	p("| scenario | plain req/s | limited req/s | ratio | limited 429s | failed open | p50 plain | p50 limited | p99 plain | p99 limited | Redis cmds/req | script usec/call | Redis CPU us/decision | Caddy CPU us/req plain / limited (ratio) |")
	p("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
	all := make([]stats, len(r.results))
	for i, res := range r.results {
		s := res.stats()
		all[i] = s
		p("| %s | %s | %s | %.2f (%.2f-%.2f) | %.1f%% | %s | %s | %s | %s | %s | %.3f | %s | %s | %s / %s (%sx) |",
			res.sc.name, thousands(s.plainRPS), thousands(s.limitedRPS), s.ratio, s.ratioMin, s.ratioMax, 100*s.denied,
			percent(s.failedOpen), ms(s.p50Plain), ms(s.p50Limited), ms(s.p99Plain), ms(s.p99Limited), s.callsPerReq, num(s.usecPerCall, 1),
			num(s.redisPerDecision, 1), num(s.caddyPlain, 1), num(s.caddyLimited, 1), num(s.caddyRatio, 2))
	}
	p("")
	p("Redis cmds/req: script calls (FCALL, EVALSHA, EVAL: round trips from Caddy) per request wrk completed on the")
	p("limited port, from INFO commandstats before and after each limited run. script usec/call: Redis's time in")
	p("those calls divided by their number (n/a: no calls); with batching one call decides many requests. Redis CPU")
	p("us/decision: the redis-server process's CPU time (INFO cpu, used_cpu_sys + used_cpu_user) during the limited")
	p("run divided by the decisions the limiter made (its decisions_total metric, deny cache hits included); unlike")
	p("commandstats it counts reading, parsing and replying, and not the time Redis waits for a CPU (commandstats")
	p("times are wall-clock, so on shared CPUs they can exceed the CPU time). Caddy")
	p("CPU us/req: Caddy's user+system time (/proc) during the run divided by the requests wrk completed; the ratio")
	p("is the median of the per-run ratios limited/plain. failed open: requests the limiter passed without a Redis")
	p("decision (deadline exceeded or circuit breaker open), from decisions_total; they make the limited port look")
	p("faster than it is.")
	p("")
	p("![Throughput ratio limited/plain per scenario, median with min-max whiskers and the target](%s)", chartFile)
	p("")

	r.peersSection(p)
	r.naiveSection(p)

	p("## Targets")
	p("")
	p("| target | measured | |")
	p("|---|---|---|")
	row := func(target, measured string, ok bool) {
		verdict := "met"
		if !ok {
			verdict = "**missed**"
		}
		p("| %s | %s | %s |", target, measured, verdict)
	}
	for i, res := range r.results {
		s := all[i]
		if !math.IsNaN(res.sc.target) {
			row(fmt.Sprintf("%s: ratio >= %.2f", res.sc.name, res.sc.target),
				fmt.Sprintf("%.2f (%.2f-%.2f)", s.ratio, s.ratioMin, s.ratioMax), s.ratio >= res.sc.target)
		}
		if res.sc.slug == "bot" {
			row(fmt.Sprintf("one bot: Redis calls per denied request <= %.2f", targetCallsPerDen),
				num(s.callsPerDeny, 3), s.callsPerDeny <= targetCallsPerDen)
		}
		if many, ok := r.many(); ok && res.sc.extraTarget != nil {
			row(res.sc.extraTarget(s, many.stats()))
		}
	}
	if many, ok := r.many(); ok {
		ms := many.stats()
		if a := anchorStatsOf(many.anchors); a.runs > 0 {
			ratio := ms.redisPerDecision / a.redisPerDecision
			row(fmt.Sprintf("Redis CPU per decision <= %.1fx redis_rate's (many clients)", targetRedisVsAnchor),
				fmt.Sprintf("%.2fx (%s us against %s us)", ratio, num(ms.redisPerDecision, 1), num(a.redisPerDecision, 1)), ratio <= targetRedisVsAnchor)
		}
		if sd := seedStatsOf(many.seeds); sd.runs > 0 {
			times := ms.limitedRPS / sd.rps
			row(fmt.Sprintf("requests/s >= %.0fx the seed's (many clients)", targetSeedTimes),
				fmt.Sprintf("%.1fx (%s against %s)", times, thousands(ms.limitedRPS), thousands(sd.rps)), times >= targetSeedTimes)
		} else {
			row(fmt.Sprintf("requests/s >= %.0fx the seed's (many clients)", targetSeedTimes), "not measured: the seed did not run", false)
		}
	}
	r.goalRows(all, row)
	r.naiveTargets(row)
	r.gatewayTarget(row)
	for _, mem := range r.mems {
		limit, perAdmission := targetMem(mem.size)
		if perAdmission {
			row(fmt.Sprintf("memory per client at %s admissions <= %.0f bytes per admission", mem.size.label(), limit),
				fmt.Sprintf("%.1f bytes (%s bytes per client)", mem.bytesPerAdmission(), thousands(mem.bytesPerClient())), mem.bytesPerAdmission() <= limit)
		} else {
			row(fmt.Sprintf("memory per client at %s admissions <= %s bytes", mem.size.label(), thousands(limit)),
				fmt.Sprintf("%s bytes (used_memory delta / clients); MEMORY USAGE %s", thousands(mem.bytesPerClient()), thousands(mem.usagePerClient())),
				mem.bytesPerClient() <= limit)
		}
	}
	p("")

	r.farSection(p, all)
	r.floorSection(p, all)
	r.settleCostSection(p)
	r.waitsSection(p)
	r.llmSection(p)
	r.gatewaySection(p)
	r.memorySection(p)
	r.failModeSection(p)
	r.perRunSection(p)
	r.notesSection(p, all)
	return b.String()
}

// besideMany returns the stats of many clients and of the scenario is picks,
// nil where there is none: for the sections that set a scenario beside it.
func (r report) besideMany(all []stats, is func(scenario) bool) (many, other *stats) {
	for i, res := range r.results {
		switch {
		case is(res.sc):
			other = &all[i]
		case res.sc.slug == manySlug:
			many = &all[i]
		}
	}
	return many, other
}

// farSection shows what 1 ms to Redis does, beside the same load with Redis
// on this host.
func (r report) farSection(p func(string, ...any), all []stats) {
	local, far := r.besideMany(all, func(sc scenario) bool { return sc.far })
	if far == nil {
		return
	}
	p("## Redis 1 ms away")
	p("")
	p("The many clients load, with the limited site's Redis behind a proxy that holds every reply %d ms. The", farLatencyMs)
	p("plain port never calls Redis, so its column is the same server under the same load. A limiter that waited")
	p("for its own round trip on every request would hold each of wrk's %d connections at least 1 ms per request", r.cfg.connections)
	p("(at most %s req/s); one that batches shares each round trip among the requests queued meanwhile.", thousands(float64(r.cfg.connections)*1000/farLatencyMs))
	p("")
	p("| | plain | limited, Redis on this host | limited, Redis 1 ms away |")
	p("|---|--:|--:|--:|")
	if local != nil {
		p("| req/s | %s | %s | %s |", thousands(far.plainRPS), thousands(local.limitedRPS), thousands(far.limitedRPS))
		p("| ratio to plain | 1.00 | %.2f | %.2f |", local.ratio, far.ratio)
		p("| p50 | %s | %s | %s |", ms(far.p50Plain), ms(local.p50Limited), ms(far.p50Limited))
		p("| p99 | %s | %s | %s |", ms(far.p99Plain), ms(local.p99Limited), ms(far.p99Limited))
		p("| added p99 | | %+.2f ms | %+.2f ms |", float64(local.addedP99())/1e6, float64(far.addedP99())/1e6)
		p("| Redis cmds/req | | %.3f | %.3f |", local.callsPerReq, far.callsPerReq)
		p("| failed open | | %s | %s |", percent(local.failedOpen), percent(far.failedOpen))
	}
	p("")
	p("A Redis round trip (median of 50 sequential PINGs at start-up, before any load) took %.3f ms through the", float64(r.rtt.far)/1e6)
	p("proxy and %.3f ms direct: the toxic's timer and the proxy's own copying add a little to its %d ms. The", float64(r.rtt.direct)/1e6, farLatencyMs)
	p("proxy runs in the bench's own process; its CPU time is in the self column of Per run.")
	p("")
}

func (r report) memorySection(p func(string, ...any)) {
	p("## Memory per client at its limit")
	p("")
	p("One site and zone per size (`window %s`, `max_requests` = the size, a `key_prefix` of its own) on the same", memWindow)
	p("Caddy and Redis, measured one after the other right after start-up: each client sends `max_requests`")
	p("requests (a Go client, %d workers), so it holds a full window; used_memory before and after, then", memWorkers)
	p("MEMORY USAGE (SAMPLES 0) of every key under the prefix, then the keys are deleted before the next size.")
	p("Fewer clients at the larger sizes keep each size to some 60,000-100,000 requests, under about 30 s here")
	p("(-quick uses a fifth of the clients). The window is long so that no key expires during the phase.")
	p("The size with a window of its own is a month's spend budget (`window 720h`, `cost 10000`, `max_requests` =")
	p("the size x 10,000: $10 in µ$ at $0.01 a request), whose ring merges admissions once it holds 256 entries;")
	p("its requests come in a burst, so past those they merge into one entry. Spread over the month, a key holds")
	p("at most one more entry per 256th of the window (2.8 hours), and no ring passes 1,170 entries: 16 KB.")
	p("")
	p("| admissions per client | clients | used_memory before / after | per client (delta / clients) | per admission | MEMORY USAGE per client (mean) | keys per client | key type | responses 200 / other | time |")
	p("|--:|--:|--:|--:|--:|--:|--:|---|--:|--:|")
	for _, mem := range r.mems {
		p("| %s | %s | %d / %d | %s bytes | %.1f bytes | %s bytes | %.2f | %s (`%s`) | %d / %d (expected %d / 0) | %s |",
			mem.size.label(), thousands(float64(mem.clients)), mem.before, mem.after, thousands(mem.bytesPerClient()),
			mem.bytesPerAdmission(), thousands(mem.usagePerClient()), float64(mem.keysFound)/float64(mem.clients),
			mem.sampleKeyType, mem.sampleKey, mem.admitted, mem.other, mem.clients*mem.size.max, mem.elapsed.Round(100*time.Millisecond))
	}
	p("")
}

func (r report) perRunSection(p func(string, ...any)) {
	p("## Per run")
	p("")
	p("| scenario | run | plain req/s | limited req/s | ratio | limited 429s | decisions: allowed / denied (deny cache) / failed open | script calls/req | all Redis cmds/req | script usec/call | Redis CPU us/decision | Caddy CPU us/req plain / limited | CPUs plain run: Caddy / wrk / other | CPUs limited run: Caddy / Redis / wrk / self / other | wrk socket errors plain / limited |")
	p("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
	for _, res := range r.results {
		for i, run := range res.runs {
			pc, lc, d := run.plain.cpu, run.limited.cpu, run.decisions
			decided := "n/a"
			if len(d) > 0 {
				decided = fmt.Sprintf("%.0f / %.0f (%.0f) / %.0f", d["allowed"], d["denied"], d["deny_cache_hits"], d["failed_open"])
			}
			p("| %s | %d | %s | %s | %.2f | %.1f%% | %s | %.3f | %.2f | %s | %s | %s / %s | %.2f / %.2f / %.2f | %.2f / %.2f / %.2f / %.2f / %.2f | %d / %d |", res.sc.name, i+1,
				thousands(run.plain.rps()), thousands(run.limited.rps()), run.ratio(), 100*run.limited.deniedShare(), decided,
				run.callsPerRequest(), run.allCallsPerRequest(), num(run.redis.usecPerCall(), 1), num(run.redisUsecPerDecision(), 1),
				num(run.plain.caddyUsecPerRequest(), 1), num(run.limited.caddyUsecPerRequest(), 1),
				pc.caddy, pc.wrk, pc.other, lc.caddy, lc.redis, lc.wrk, lc.self, lc.other,
				run.plain.socketErrors(), run.limited.socketErrors())
		}
	}
	p("")
	p("all Redis cmds/req counts every command Redis executed, including those the script calls inside it")
	p("(TIME and the reads and writes of the log), except our own INFO. CPUs: CPU time during the run divided by")
	p("its length (1.00 = one CPU busy all the time); self = this tool (the latency proxy); other = every other")
	p("process.")
	p("")
	r.peersPerRun(p)
}

func (r report) notesSection(p func(string, ...any), all []stats) {
	p("## Notes")
	p("")
	var sockPlain, sockLim int64
	for _, s := range all {
		sockPlain += s.socketPlain
		sockLim += s.socketLim
	}
	if sockPlain+sockLim == 0 {
		p("- wrk reported no socket errors (connect, read, write, timeout) in any measured run.")
	} else {
		p("- wrk socket errors (connect+read+write+timeout) over all measured runs: plain %d, limited %d; see Per run.", sockPlain, sockLim)
	}
	var failedRuns []string
	var others []float64
	for _, res := range r.results {
		for i, run := range res.runs {
			others = append(others, run.plain.cpu.other, run.limited.cpu.other)
			if n := run.decisions["failed_open"]; n > 0 {
				failedRuns = append(failedRuns, fmt.Sprintf("%s run %d: %s (%.1f%%)", res.sc.name, i+1, thousands(n), 100*run.failedOpenShare()))
			}
		}
	}
	if len(failedRuns) > 0 {
		p("- The fail mode (open) passed requests without a Redis decision, because the deadline ran out or the")
		p("  circuit breaker had opened after it did, in %s.", strings.Join(failedRuns, "; "))
		p("  Those runs' limited req/s overstate the limiter.")
	}
	if r.caddyErrors.lines == 0 {
		p("- Caddy logged no errors, so no request was decided by the fail mode instead of Redis.")
	} else {
		p("- Caddy logged %d error line(s) or limiter warning(s), %d of them for a context canceled: a request whose", r.caddyErrors.lines, r.caddyErrors.canceled)
		p("  client (wrk, at the end of a run) closed its connection while its Redis call was in flight. The limiter")
		p("  logs store failures at most once a second, with a count. The first line:")
		p("  `%s`", truncate(r.caddyErrors.first, 300))
	}
	p("- wrk, Caddy and Redis share the %d CPUs, so Redis's and wrk's CPU time is taken from Caddy: the ratios", r.machine.nproc)
	p("  are lower than on a machine where Redis runs elsewhere.")
	slices.Sort(others)
	if len(others) > 0 {
		p("- Other processes used %.2f CPUs in the median run and %.2f at most (of %d).", median(others), others[len(others)-1], r.machine.nproc)
		if others[len(others)-1] > 0.25 {
			p("  The machine was not quiet: a run with other load has fewer CPUs for Caddy, which moves its ratio; compare")
			p("  the Per run rows before trusting one figure.")
		}
	}
	if r.profile != "" {
		p("- A CPU profile of Caddy during an extra, unmeasured %s limited run: `%s` (go tool pprof).", r.cfg.profiled, r.profile)
	}
}

// thousands formats a rate as 12,345.
func thousands(x float64) string {
	s := fmt.Sprintf("%.0f", x)
	var out []byte
	for i := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			out = append(out, ',')
		}
		out = append(out, s[i])
	}
	return string(out)
}

// num formats x with the given decimals, or n/a for NaN.
func num(x float64, decimals int) string {
	if math.IsNaN(x) {
		return "n/a"
	}
	return fmt.Sprintf("%.*f", decimals, x)
}

func percent(x float64) string {
	if math.IsNaN(x) {
		return "n/a"
	}
	return fmt.Sprintf("%.1f%%", 100*x)
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2f ms", float64(d)/1e6) }

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
