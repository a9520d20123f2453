package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
)

// The fail-mode state phase: what `fail_mode local` keeps per client and
// what keeping it costs. The limiter remembers what Redis last said of each
// client it saw (limiter/fallback.go), so that an outage starts from those
// counts; every decision Redis answers updates it (Fallback.Observe).
// BenchmarkFallbackObserve measures both, in the limiter's own test binary:
// the heap per remembered client and the time of one Observe. The phase runs
// it after the load, so it measures no one else's run, and the report sets
// the time beside the Caddy CPU of a limited request of many clients.
const (
	failModeBench = "BenchmarkFallbackObserve"
	failModeCount = 5
)

// failModeState is the benchmark's medians over its runs, or why it was
// not measured.
type failModeState struct {
	runs             int
	bytesPerClient   float64
	nsPerObserve     float64
	allocsPerObserve float64
	notMeasured      error
	command          string
}

// measureFailMode runs the benchmark in the repository.
func measureFailMode(ctx context.Context, cfg config) failModeState {
	args := []string{"test", "-run", "^$", "-bench", "^" + failModeBench + "$", "-benchmem", "-count", strconv.Itoa(failModeCount), "./limiter"}
	st := failModeState{command: "go " + strings.Join(args, " ")}
	say("fail-mode state: %s", st.command)
	out, err := goInRepo(ctx, cfg, args)
	if err != nil {
		st.notMeasured = err
		say("fail-mode state: not measured: %v", st.notMeasured)
		return st
	}
	parsed, err := parseFailModeBench(out)
	if err != nil {
		st.notMeasured = err
		say("fail-mode state: not measured: %v", err)
		return st
	}
	parsed.command = st.command
	say("fail-mode state: %.0f bytes per remembered client, %.0f ns per Observe (medians of %d runs)", parsed.bytesPerClient, parsed.nsPerObserve, parsed.runs)
	return parsed
}

// parseFailModeBench reads the medians of `go test -bench` output lines
// such as
//
//	BenchmarkFallbackObserve-2   4955481   239.7 ns/op   176.1 bytes/client   0 B/op   0 allocs/op
//
// Every line must give ns/op and bytes/client.
func parseFailModeBench(out string) (failModeState, error) {
	var ns, bytes, allocs []float64
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) < 2 || (f[0] != failModeBench && !strings.HasPrefix(f[0], failModeBench+"-")) {
			continue
		}
		metrics := map[string]float64{}
		// After the name and the iterations: pairs of value and unit.
		for i := 2; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				return failModeState{}, fmt.Errorf("%s: %q is not a number in %q", failModeBench, f[i], line)
			}
			metrics[f[i+1]] = v
		}
		n, okNs := metrics["ns/op"]
		b, okBytes := metrics["bytes/client"]
		if !okNs || !okBytes {
			return failModeState{}, fmt.Errorf("%s: no ns/op or bytes/client in %q", failModeBench, line)
		}
		ns, bytes = append(ns, n), append(bytes, b)
		if a, ok := metrics["allocs/op"]; ok {
			allocs = append(allocs, a)
		}
	}
	if len(ns) == 0 {
		return failModeState{}, fmt.Errorf("no %s result in the output: %s", failModeBench, truncate(strings.TrimSpace(tailLines(out, 5)), 300))
	}
	return failModeState{runs: len(ns), nsPerObserve: median(ns), bytesPerClient: median(bytes), allocsPerObserve: median(allocs)}, nil
}

// failModeSection reports the phase, the time of an Observe as a share of
// many clients' Caddy CPU per limited request.
func (r report) failModeSection(p func(string, ...any)) {
	st := r.failMode
	if st.runs == 0 && st.notMeasured == nil {
		return
	}
	p("## Fail-mode state")
	p("")
	p("With `fail_mode local` the limiter remembers, per client it saw recently, what Redis last said of it")
	p("(count and reset, limiter/fallback.go), so that an outage starts from those counts rather than from fresh")
	p("limits; every decision Redis answers updates that memory. `%s` fills it with as many clients as it", failModeBench)
	p("keeps and measures the heap they take, then the time of one update of a remembered client (`Observe`). Run")
	p("in the repository, after the load, as `%s`.", st.command)
	p("")
	if st.notMeasured != nil {
		p("Not measured: %s", truncate(st.notMeasured.Error(), 400))
		p("")
		return
	}
	share := "n/a (no many clients run)"
	if many, ok := r.many(); ok {
		if us := many.stats().caddyLimited; us > 0 {
			share = fmt.Sprintf("%.1f%% of %s us", 100*st.nsPerObserve/1e3/us, num(us, 1))
		}
	}
	p("| | median of %d runs |", st.runs)
	p("|---|--:|")
	p("| bytes per remembered client | %s |", num(st.bytesPerClient, 1))
	p("| ns per Observe (every decision Redis answers) | %s |", num(st.nsPerObserve, 1))
	p("| allocations per Observe | %s |", num(st.allocsPerObserve, 0))
	p("| share of a limited request's Caddy CPU (many clients) | %s |", share)
	p("")
	p("The share sets the time of one Observe beside Caddy's CPU per limited request of the many clients scenario")
	p("(Results), measured with `fail_mode open`, which keeps no such memory.")
	p("")
}
