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

// redisDelta is what Redis did during one limited run.
type redisDelta struct {
	scriptCalls int64 // EVAL/EVALSHA/... calls: round trips from Caddy
	scriptUsec  int64 // time Redis spent in them
	allCalls    int64 // every command, including those inside scripts, except our INFO
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
