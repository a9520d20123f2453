package main

import (
	"fmt"
	"time"
)

// far is the Redis 1 ms away scenario's result.
func (r report) far() (scenarioResult, bool) {
	for _, res := range r.results {
		if res.sc.far {
			return res, true
		}
	}
	return scenarioResult{}, false
}

// naiveRows are the rows of the naive peer's section: this module's many
// clients and Redis 1 ms away scenarios, and the naive peer's ports under
// the same load.
func (r report) naiveRows() []struct {
	name string
	s    stats
} {
	type row = struct {
		name string
		s    stats
	}
	if len(r.naive.near) == 0 {
		return nil
	}
	naive := func(runs []pair) stats { return scenarioResult{runs: runs}.stats() }
	var rows []row
	if many, ok := r.many(); ok {
		rows = append(rows, row{"this module, Redis on this host", many.stats()})
	}
	rows = append(rows, row{"naive, Redis on this host", naive(r.naive.near)})
	if far, ok := r.far(); ok {
		rows = append(rows, row{"this module, Redis 1 ms away", far.stats()})
	}
	return append(rows, row{"naive, Redis 1 ms away", naive(r.naive.far)})
}

// naiveSection compares the module with the naive peer: throughput kept,
// and the latency each adds, near and far.
func (r report) naiveSection(p func(string, ...any)) {
	rows := r.naiveRows()
	if rows == nil {
		return
	}
	p("## Naive peer")
	p("")
	p("What most Redis rate limiters do: go-redis/redis_rate v10 `Allow` (`redis_rate.PerMinute(%d)`) on the", limitedMax)
	p("request's X-Client, one script call per request from a pool of %d connections, behind a small Go HTTP server", naivePool)
	p("in this tool's process (its CPU is this tool's), with a plain port that answers at once, a limited port on")
	p("the same redis-server and one through the same 1 ms latency proxy. wrk loads them with the many clients")
	p("script (-t%d -c%d, %d runs of %s, rotating which port goes first). Its plain port is its own unlimited", r.cfg.threads, r.cfg.connections, r.cfg.runs, r.cfg.duration)
	p("throughput: the ratio and the p50 added are each one's own limited against its own plain.")
	p("")
	p("| | plain req/s | limited req/s | ratio | p50 plain | p50 limited | p50 added | p99 added |")
	p("|---|--:|--:|--:|--:|--:|--:|--:|")
	for _, row := range rows {
		s := row.s
		p("| %s | %s | %s | %.2f | %s | %s | %s | %s |", row.name, thousands(s.plainRPS), thousands(s.limitedRPS), s.ratio,
			ms(s.p50Plain), ms(s.p50Limited), ms(s.addedP50()), ms(s.addedP99()))
	}
	p("")
}

// naiveTargets are the targets against the naive peer: a p50 added no more
// than its, and a ratio at least its, near and far.
func (r report) naiveTargets(row func(target, measured string, ok bool)) {
	rows := r.naiveRows()
	for i := 0; i+1 < len(rows); i += 2 {
		mod, naive := rows[i].s, rows[i+1].s
		where := rows[i+1].name[len("naive, "):]
		row(fmt.Sprintf("p50 added <= the naive peer's (%s)", where),
			fmt.Sprintf("%s against %s", ms(mod.addedP50()), ms(naive.addedP50())), mod.addedP50() <= naive.addedP50())
		row(fmt.Sprintf("ratio >= the naive peer's (%s)", where),
			fmt.Sprintf("%.2f against %.2f", mod.ratio, naive.ratio), mod.ratio >= naive.ratio)
	}
}

// addedP50 is what the limiter adds to the median.
func (s stats) addedP50() time.Duration { return s.p50Limited - s.p50Plain }
