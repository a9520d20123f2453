package main

import (
	"context"
	"os"
	"strconv"
	"strings"
	"time"
)

// On a 2-core machine shared with other work (builds, test runs), a busy
// neighbour moves the numbers more than the code under test does. So every
// measured run records where the CPU time went, and each run first waits
// (up to -settle) for the machine to be quiet.

// clockTicks is USER_HZ, the unit of /proc/stat and /proc/<pid>/stat: 100 on
// every mainstream Linux.
const clockTicks = 100

// cpuMeter reads the CPU time of the machine and of our servers. For the
// seed peer, caddyPid is its Node.js server and redisPid its own Redis.
type cpuMeter struct {
	caddyPid, redisPid int
}

// cpuSnap is cumulative CPU time in clock ticks.
type cpuSnap struct {
	at                       time.Time
	busy, caddy, redis, self int64
}

// cpuUse is CPU used during one run, in cores (1.0 = one CPU all the time).
// other is everything that is not Caddy, Redis, wrk or this tool; self is
// this tool, which is the load generator of the redis_rate runs and hosts
// the proxy that puts Redis 1 ms away.
type cpuUse struct {
	caddy, redis, wrk, self, other float64
	// caddySeconds is Caddy's CPU time (user+system) during the run: divided
	// by the requests it served, the cost of one request.
	caddySeconds float64
}

func (m *cpuMeter) snap() cpuSnap {
	return cpuSnap{at: time.Now(), busy: machineBusy(), caddy: procTicks(strconv.Itoa(m.caddyPid)),
		redis: procTicks(strconv.Itoa(m.redisPid)), self: procTicks("self")}
}

// use is the CPU spent between two snapshots, wrk's own time given (it has
// exited by then, so its /proc entry is gone).
func (m *cpuMeter) use(before, after cpuSnap, wrk time.Duration) cpuUse {
	wall := after.at.Sub(before.at).Seconds()
	cores := func(ticks int64) float64 { return float64(ticks) / clockTicks / wall }
	u := cpuUse{
		caddy:        cores(after.caddy - before.caddy),
		redis:        cores(after.redis - before.redis),
		wrk:          wrk.Seconds() / wall,
		self:         cores(after.self - before.self),
		caddySeconds: float64(after.caddy-before.caddy) / clockTicks,
	}
	u.other = max(0, cores(after.busy-before.busy)-u.caddy-u.redis-u.wrk-u.self)
	return u
}

// settle waits until other processes use less than quietCores for one
// second, or until maxWait has passed; it returns the last measured load.
func (m *cpuMeter) settle(ctx context.Context, maxWait time.Duration) float64 {
	const quietCores = 0.25
	deadline := time.Now().Add(maxWait)
	waited := false
	for {
		before := m.snap()
		select {
		case <-ctx.Done():
			return 0
		case <-time.After(time.Second):
		}
		other := m.use(before, m.snap(), 0).other
		if other < quietCores || time.Now().After(deadline) {
			if waited {
				say("  other processes now use %.2f CPUs; going on", other)
			}
			return other
		}
		if !waited {
			say("  other processes use %.2f CPUs; waiting up to %s for quiet", other, maxWait)
			waited = true
		}
	}
}

// machineBusy is the non-idle time of all CPUs, from the first line of
// /proc/stat: cpu user nice system idle iowait irq softirq steal ...
func machineBusy() int64 {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(data), "\n")
	var busy int64
	for i, f := range strings.Fields(line)[1:] {
		n, _ := strconv.ParseInt(f, 10, 64)
		if i == 3 || i == 4 || i >= 8 { // idle, iowait; guest time is already in user
			continue
		}
		busy += n
	}
	return busy
}

// procTicks is a process's user+system time from /proc/<pid>/stat (fields
// 14 and 15, counted after the command name, which may contain spaces).
func procTicks(pid string) int64 {
	data, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return 0
	}
	s := string(data)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(fields) < 13 {
		return 0
	}
	utime, _ := strconv.ParseInt(fields[11], 10, 64)
	stime, _ := strconv.ParseInt(fields[12], 10, 64)
	return utime + stime
}
