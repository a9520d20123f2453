package main

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// cmdStat is one line of INFO commandstats.
type cmdStat struct {
	calls, usec int64
}

// commandStats maps a command name (evalsha, zadd, client|setinfo, ...) to
// its counters.
type commandStats map[string]cmdStat

// scriptCommands are the commands a client uses to run a script. Redis also
// counts every command a script calls inside it (ZADD, ZCARD, ...), so
// "calls per request" counts these only: the round trips Caddy makes.
var scriptCommands = []string{"eval", "evalsha", "eval_ro", "evalsha_ro", "fcall", "fcall_ro"}

// readCommandStats parses INFO commandstats, lines like
// cmdstat_evalsha:calls=12,usec=34,usec_per_call=2.83,rejected_calls=0,failed_calls=0
func readCommandStats(ctx context.Context, rc *redis.Client) (commandStats, error) {
	text, err := rc.Info(ctx, "commandstats").Result()
	if err != nil {
		return nil, fmt.Errorf("INFO commandstats: %w", err)
	}
	stats := make(commandStats)
	for _, line := range strings.Split(text, "\n") {
		name, fields, ok := strings.Cut(strings.TrimSpace(line), ":")
		name, isCmd := strings.CutPrefix(name, "cmdstat_")
		if !ok || !isCmd {
			continue
		}
		var s cmdStat
		for _, f := range strings.Split(fields, ",") {
			k, v, _ := strings.Cut(f, "=")
			switch k {
			case "calls":
				s.calls, _ = strconv.ParseInt(v, 10, 64)
			case "usec":
				s.usec, _ = strconv.ParseInt(v, 10, 64)
			}
		}
		stats[name] = s
	}
	return stats, nil
}

// redisSnap is Redis's cumulative counters at one moment.
type redisSnap struct {
	cmds commandStats
	cpu  float64 // used_cpu_sys + used_cpu_user, seconds
}

// readRedis reads the counters a run's cost is computed from.
func readRedis(ctx context.Context, rc *redis.Client) (redisSnap, error) {
	cmds, err := readCommandStats(ctx, rc)
	if err != nil {
		return redisSnap{}, err
	}
	cpu, err := redisCPU(ctx, rc)
	if err != nil {
		return redisSnap{}, err
	}
	return redisSnap{cmds: cmds, cpu: cpu}, nil
}

// redisCPU is the CPU time the Redis process has used, from INFO cpu. It
// counts all of Redis's work (reading and parsing commands, replies, the
// event loop), not only the time inside commands that commandstats measures,
// so it is what a decision really costs the Redis host.
func redisCPU(ctx context.Context, rc *redis.Client) (float64, error) {
	text, err := rc.Info(ctx, "cpu").Result()
	if err != nil {
		return 0, fmt.Errorf("INFO cpu: %w", err)
	}
	return parseRedisCPU(text)
}

// parseRedisCPU sums used_cpu_sys and used_cpu_user of an INFO cpu reply
// (the main process, not its children: persistence is off).
func parseRedisCPU(text string) (float64, error) {
	var total float64
	found := 0
	for _, line := range strings.Split(text, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || (k != "used_cpu_sys" && k != "used_cpu_user") {
			continue
		}
		x, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return 0, fmt.Errorf("INFO cpu %s: %w", k, err)
		}
		total += x
		found++
	}
	if found != 2 {
		return 0, fmt.Errorf("INFO cpu has no used_cpu_sys and used_cpu_user")
	}
	return total, nil
}

// redisDelta is what Redis did during one run.
type redisDelta struct {
	scriptCalls int64   // EVAL/EVALSHA/... calls: round trips from Caddy
	scriptUsec  int64   // time Redis spent in them
	allCalls    int64   // every command, including those inside scripts, except our INFO
	cpuSeconds  float64 // INFO cpu: the process's user+system time
}

// sub returns the counters after minus before.
func (after redisSnap) sub(before redisSnap) redisDelta {
	d := after.cmds.sub(before.cmds)
	d.cpuSeconds = after.cpu - before.cpu
	return d
}

// sub returns the counters after minus before.
func (after commandStats) sub(before commandStats) redisDelta {
	var d redisDelta
	for name, a := range after {
		b := before[name]
		if name != "info" {
			d.allCalls += a.calls - b.calls
		}
		for _, sc := range scriptCommands {
			if name == sc {
				d.scriptCalls += a.calls - b.calls
				d.scriptUsec += a.usec - b.usec
			}
		}
	}
	return d
}

// cpuUsecPer is Redis's CPU time per decision (or request), in
// microseconds; NaN without any.
func (d redisDelta) cpuUsecPer(decisions float64) float64 {
	if decisions <= 0 {
		return math.NaN()
	}
	return d.cpuSeconds * 1e6 / decisions
}

// scriptUsecPer is the time inside script calls per decision.
func (d redisDelta) scriptUsecPer(decisions float64) float64 {
	if decisions <= 0 {
		return math.NaN()
	}
	return float64(d.scriptUsec) / decisions
}

// usecPerCall is the script's mean execution time inside Redis; NaN when it
// was not called (every request answered from the deny cache).
func (d redisDelta) usecPerCall() float64 {
	if d.scriptCalls == 0 {
		return math.NaN()
	}
	return float64(d.scriptUsec) / float64(d.scriptCalls)
}

// usedMemory reads used_memory from INFO memory: bytes the allocator has
// handed to Redis, which, unlike RSS, drops as soon as data is freed.
func usedMemory(ctx context.Context, rc *redis.Client) (int64, error) {
	text, err := rc.Info(ctx, "memory").Result()
	if err != nil {
		return 0, fmt.Errorf("INFO memory: %w", err)
	}
	for _, line := range strings.Split(text, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "used_memory:"); ok {
			return strconv.ParseInt(v, 10, 64)
		}
	}
	return 0, fmt.Errorf("INFO memory has no used_memory")
}
