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

type scenarioResult struct {
	sc   scenario
	runs []pair
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
	socketPlain, socketLim    int64 // wrk socket errors, summed over runs
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
		plainRPS:     med(func(p pair) float64 { return p.plain.rps() }),
		limitedRPS:   med(func(p pair) float64 { return p.limited.rps() }),
		ratio:        med(pair.ratio),
		ratioMin:     math.Inf(1),
		ratioMax:     math.Inf(-1),
		p50Plain:     dur(func(p pair) time.Duration { return p.plain.p50 }),
		p50Limited:   dur(func(p pair) time.Duration { return p.limited.p50 }),
		p99Plain:     dur(func(p pair) time.Duration { return p.plain.p99 }),
		p99Limited:   dur(func(p pair) time.Duration { return p.limited.p99 }),
		denied:       med(func(p pair) float64 { return p.limited.deniedShare() }),
		failedOpen:   med(pair.failedOpenShare),
		callsPerReq:  med(pair.callsPerRequest),
		callsPerDeny: med(pair.callsPerDenied),
		usecPerCall:  med(func(p pair) float64 { return p.redis.usecPerCall() }),
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
	mem         memResult
	caddyErrors caddyErrors
	profile     string
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

// Targets from the issue.
const (
	targetAddedP99    = time.Millisecond
	targetCallsPerDen = 0.01
	targetMemPerKey   = 1200 // bytes (1.2 KB)
	targetUsecPerCall = 15.0
)

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
	p("One Caddy serves `respond \"ok\" 200` on two loopback ports: plain, and behind")
	p("`sliding_ratelimit { window 1m  max_requests 1000  key {http.request.header.X-Client}  redis <url> }`")
	p("with its own redis-server (no persistence). No access logs. For each scenario the two ports are loaded in")
	p("turn, %d times each, alternating which goes first; the same wrk Lua script, which sets X-Client on every", c.runs)
	p("request, drives both. Figures are medians over the runs; the ratio is the median of the per-run ratios")
	p("limited/plain, with min-max in brackets. Latencies are wrk's, over keep-alive connections. Before each run")
	p("the tool waits up to %s for other processes to use under 0.25 CPUs, and it records per run the CPU", c.settle)
	p("time of Caddy, Redis, wrk and everything else (Per run).")
	p("")
	for _, res := range r.results {
		p("- **%s**: %s.", res.sc.name, res.sc.about)
	}
	p("")
	p("## Results")
	p("")
	p("| scenario | plain req/s | limited req/s | ratio | limited 429s | failed open | p50 plain | p50 limited | p99 plain | p99 limited | Redis cmds/req | script usec/call |")
	p("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
	all := make([]stats, len(r.results))
	for i, res := range r.results {
		s := res.stats()
		all[i] = s
		p("| %s | %s | %s | %.2f (%.2f-%.2f) | %.1f%% | %s | %s | %s | %s | %s | %.3f | %s |",
			res.sc.name, thousands(s.plainRPS), thousands(s.limitedRPS), s.ratio, s.ratioMin, s.ratioMax, 100*s.denied,
			percent(s.failedOpen), ms(s.p50Plain), ms(s.p50Limited), ms(s.p99Plain), ms(s.p99Limited), s.callsPerReq, num(s.usecPerCall, 1))
	}
	p("")
	p("Redis cmds/req: script calls (EVALSHA/EVAL, i.e. round trips from Caddy) per request wrk completed on the")
	p("limited port, from INFO commandstats before and after each limited run. script usec/call: Redis's time in")
	p("those calls divided by their number (n/a: no calls). failed open: requests the limiter passed without a")
	p("Redis decision (deadline exceeded or circuit breaker open), from its decisions_total metric; they make the")
	p("limited port look faster than it is.")
	p("")
	p("![Throughput ratio limited/plain per scenario, median with min-max whiskers and the target](%s)", chartFile)
	p("")

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
		row(fmt.Sprintf("%s: ratio >= %.2f", res.sc.name, res.sc.target),
			fmt.Sprintf("%.2f (%.2f-%.2f)", s.ratio, s.ratioMin, s.ratioMax), s.ratio >= res.sc.target)
		if res.sc.slug == "bot" {
			row(fmt.Sprintf("one bot: Redis calls per denied request <= %.2f", targetCallsPerDen),
				num(s.callsPerDeny, 3), s.callsPerDeny <= targetCallsPerDen)
		}
	}
	var p99s, usecs []string
	p99ok, usecOK := true, true
	for i, res := range r.results {
		s := all[i]
		p99s = append(p99s, fmt.Sprintf("%s %+.2f ms", res.sc.name, float64(s.addedP99())/1e6))
		usecs = append(usecs, fmt.Sprintf("%s %s us", res.sc.name, num(s.usecPerCall, 1)))
		p99ok = p99ok && s.addedP99() <= targetAddedP99
		usecOK = usecOK && !(s.usecPerCall > targetUsecPerCall) // n/a (no calls) passes
	}
	row("added p99 (limited - plain) <= 1 ms, every scenario", strings.Join(p99s, ", "), p99ok)
	row("memory per active key <= 1.2 KB (1,200 bytes)",
		fmt.Sprintf("%.0f bytes (used_memory delta / keys); MEMORY USAGE of one key: %d bytes", r.mem.bytesPerKey(), r.mem.keyUsage),
		r.mem.bytesPerKey() <= targetMemPerKey)
	row("script usec_per_call <= 15 us, every scenario that calls it", strings.Join(usecs, ", "), usecOK)
	p("")

	mem := r.mem
	p("## Memory per active key")
	p("")
	p("A separate site and zone (`max_requests 60`, `window 1m`, `key_prefix %s`) on the same Caddy and Redis,", memPrefix)
	p("measured right after start-up: %d requests for each of %d keys (a Go client, 4 workers), so every key", mem.perKey, mem.keys)
	p("holds a full window of %d admissions.", mem.perKey)
	p("")
	p("| | |")
	p("|---|---|")
	p("| used_memory before / after | %d / %d bytes |", mem.before, mem.after)
	p("| per key (delta / %d) | %.0f bytes |", mem.keys, mem.bytesPerKey())
	p("| MEMORY USAGE `%s` (SAMPLES 0, type %s) | %d bytes |", mem.sampleKey, mem.sampleKeyType, mem.keyUsage)
	p("| responses 200 / other | %d / %d (expected %d / 0) |", mem.admitted, mem.other, mem.keys*mem.perKey)
	p("| keys found under `%s` | %d (expected %d) |", memPrefix, mem.keysFound, mem.keys)
	p("")

	p("## Per run")
	p("")
	p("| scenario | run | plain req/s | limited req/s | ratio | limited 429s | decisions: allowed / denied (deny cache) / failed open | script calls/req | all Redis cmds/req | script usec/call | CPUs plain run: Caddy / wrk / other | CPUs limited run: Caddy / Redis / wrk / other | wrk socket errors plain / limited |")
	p("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
	var others []float64
	var failedRuns []string
	for _, res := range r.results {
		for i, run := range res.runs {
			pc, lc, d := run.plain.cpu, run.limited.cpu, run.decisions
			others = append(others, pc.other, lc.other)
			if n := d["failed_open"]; n > 0 {
				failedRuns = append(failedRuns, fmt.Sprintf("%s run %d: %s (%.1f%%)", res.sc.name, i+1, thousands(n), 100*run.failedOpenShare()))
			}
			decided := "n/a"
			if len(d) > 0 {
				decided = fmt.Sprintf("%.0f / %.0f (%.0f) / %.0f", d["allowed"], d["denied"], d["deny_cache_hits"], d["failed_open"])
			}
			p("| %s | %d | %s | %s | %.2f | %.1f%% | %s | %.3f | %.2f | %s | %.2f / %.2f / %.2f | %.2f / %.2f / %.2f / %.2f | %d / %d |", res.sc.name, i+1,
				thousands(run.plain.rps()), thousands(run.limited.rps()), run.ratio(), 100*run.limited.deniedShare(), decided,
				run.callsPerRequest(), run.allCallsPerRequest(), num(run.redis.usecPerCall(), 1),
				pc.caddy, pc.wrk, pc.other, lc.caddy, lc.redis, lc.wrk, lc.other,
				run.plain.socketErrors(), run.limited.socketErrors())
		}
	}
	p("")
	p("all Redis cmds/req counts every command Redis executed, including those the script calls inside it")
	p("(TIME, ZREMRANGEBYSCORE, ZCARD, ...), except our own INFO. CPUs: CPU time during the run divided by its")
	p("length (1.00 = one CPU busy all the time); other = every process but Caddy, Redis, wrk and this tool.")
	p("")

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
	if len(failedRuns) > 0 {
		p("- The fail mode (open) passed requests without a Redis decision, because the deadline (timeout 100ms)")
		p("  ran out or the circuit breaker had opened after it did, in %s.", strings.Join(failedRuns, "; "))
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
	p("- wrk, Caddy and Redis share the %d CPUs, so Redis's and wrk's CPU time is taken from Caddy: the ratios", m.nproc)
	p("  are lower than on a machine where Redis runs elsewhere.")
	slices.Sort(others)
	if len(others) > 0 {
		p("- Other processes used %.2f CPUs in the median run and %.2f at most (of %d).", median(others), others[len(others)-1], m.nproc)
		if others[len(others)-1] > 0.25 {
			p("  The machine was not quiet: a run with other load has fewer CPUs for Caddy, which moves its ratio; compare")
			p("  the Per run rows before trusting one figure.")
		}
	}
	if r.profile != "" {
		p("- A CPU profile of Caddy during an extra, unmeasured %s limited run: `%s` (go tool pprof).", r.cfg.profiled, r.profile)
	}
	return b.String()
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
