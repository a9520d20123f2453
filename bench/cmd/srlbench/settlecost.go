package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
)

// The settle-cost phase: why the settled (units) path's Redis CPU goal
// cannot be met by a settle that is a request of its own. The limiter's
// BenchmarkRedisCPUPerDecision/units runs the units load on the store alone
// (10,000 clients, 32 callers, each request allowed against a budget it never
// reaches) and follows each allow with nothing, with a request the script
// answers without touching the ring, with a peek of the ring, or with the
// settle: Redis's CPU per request of each, against the allow alone, tells
// what a second request costs before it does anything.
const (
	settleCostBench = "BenchmarkRedisCPUPerDecision"
	settleCostCount = 5
)

// settleCostModes are the benchmark's units sub-benchmarks, in the order
// reported, with what each sends after an allow.
var settleCostModes = []struct{ name, then string }{
	{"allow", "nothing"},
	{"empty", "an empty request"},
	{"peek", "a peek"},
	{"settle", "the settle"},
}

// settleCostState is the benchmark's medians over its runs, by mode, or why
// it was not measured.
type settleCostState struct {
	runs        int
	cpuPerReq   map[string]float64 // Redis CPU µs per request, by mode
	notMeasured error
	command     string
}

// measureSettleCost runs the benchmark in the repository, settleCostCount
// times: each run takes the modes in turn, so that a slower spell of the
// machine falls on all of them rather than on one (-count would run each
// mode's runs back to back).
func measureSettleCost(ctx context.Context, cfg config) settleCostState {
	args := []string{"test", "-run", "^$", "-bench", "^" + settleCostBench + "$/^units$/", "-benchtime", "1x", "./limiter"}
	st := settleCostState{command: "go " + strings.Join(args, " ")}
	say("settle cost: %s, %d times", st.command, settleCostCount)
	var all strings.Builder
	for range settleCostCount {
		out, err := goInRepo(ctx, cfg, args)
		if err != nil {
			st.notMeasured = err
			say("settle cost: not measured: %v", st.notMeasured)
			return st
		}
		all.WriteString(out)
	}
	parsed, err := parseSettleCostBench(all.String())
	if err != nil {
		st.notMeasured = err
		say("settle cost: not measured: %v", err)
		return st
	}
	parsed.command = st.command
	say("settle cost: Redis CPU us per request %v (medians of %d runs)", parsed.cpuPerReq, parsed.runs)
	return parsed
}

// parseSettleCostBench reads the medians of `go test -bench` output lines
// such as
//
//	BenchmarkRedisCPUPerDecision/units/settle-2   1   985551103 ns/op   17.60 cpu-µs/decision   7.977 decisions/call   14.69 script-µs/decision
//
// read as words: the test's redis-server logs to the same output, and its
// lines may fall between a benchmark's name and its figures. Every mode must
// have a result, and every result a cpu-µs/decision.
func parseSettleCostBench(out string) (settleCostState, error) {
	byMode := map[string][]float64{}
	prefix := settleCostBench + "/units/"
	mode := "" // the benchmark whose figures come next
	words := strings.Fields(out)
	for i, w := range words {
		switch {
		case strings.HasPrefix(w, prefix) && (i == 0 || words[i-1] != "BENCH:"): // not the heading of its log
			if mode != "" {
				return settleCostState{}, fmt.Errorf("%s: no cpu-µs/decision for units/%s", settleCostBench, mode)
			}
			mode, _, _ = strings.Cut(strings.TrimPrefix(w, prefix), "-")
		case w == "cpu-µs/decision" && mode != "":
			v, err := strconv.ParseFloat(words[i-1], 64)
			if err != nil {
				return settleCostState{}, fmt.Errorf("%s: units/%s: %q is not a number", settleCostBench, mode, words[i-1])
			}
			byMode[mode] = append(byMode[mode], v)
			mode = ""
		}
	}
	if mode != "" {
		return settleCostState{}, fmt.Errorf("%s: no cpu-µs/decision for units/%s", settleCostBench, mode)
	}
	st := settleCostState{cpuPerReq: map[string]float64{}}
	for _, m := range settleCostModes {
		xs := byMode[m.name]
		if len(xs) == 0 {
			return settleCostState{}, fmt.Errorf("no %s/units/%s result in the output: %s", settleCostBench, m.name, truncate(strings.TrimSpace(tailLines(out, 5)), 300))
		}
		st.cpuPerReq[m.name] = median(xs)
		if st.runs == 0 || len(xs) < st.runs {
			st.runs = len(xs)
		}
	}
	return st, nil
}

// settleCostSection reports the phase: each mode's Redis CPU per request,
// and against the allow alone.
func (r report) settleCostSection(p func(string, ...any)) {
	st := r.settleCost
	if st.runs == 0 && st.notMeasured == nil {
		return
	}
	p("## What a settle costs Redis")
	p("")
	p("The units load on the store alone, without Caddy: 10,000 clients, 32 concurrent callers whose requests the")
	p("store batches, each request allowed (1 unit reserved against a budget it never reaches) and then followed")
	p("by a second request of the same zone, or by none: an empty request (one the script answers without")
	p("reading or writing the ring), a peek (one that reads the ring and writes nothing), or the settle of the")
	p("request's real cost (1 to 50 units). Redis CPU (INFO cpu) per request, medians of %d runs. Run in the", max(st.runs, 1))
	p("repository, after the load, as `%s`, once per run (each run takes the four in turn).", st.command)
	p("")
	if st.notMeasured != nil {
		p("Not measured: %s", truncate(st.notMeasured.Error(), 400))
		p("")
		return
	}
	allow := st.cpuPerReq["allow"]
	p("| each allow followed by | Redis CPU us per request | against the allow alone |")
	p("|---|--:|--:|")
	for _, m := range settleCostModes {
		p("| %s | %s | %sx |", m.then, num(st.cpuPerReq[m.name], 2), num(st.cpuPerReq[m.name]/allow, 2))
	}
	p("")
	p("A second request costs Redis its share of a script call and of the call's reading and replying before it")
	p("does anything: the empty request's row is the least any settle that is a request of its own can cost,")
	if empty := st.cpuPerReq["empty"] / allow; empty > goalUnitsRedisVsMany {
		p("and at %.2fx it is above the %.1fx the units goal (Targets) allows a settled request.", empty, goalUnitsRedisVsMany)
	} else {
		p("%.2fx against the %.1fx the units goal (Targets) allows a settled request.", empty, goalUnitsRedisVsMany)
	}
	p("")
}
