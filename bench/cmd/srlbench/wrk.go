package main

import (
	"context"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// scenario is one load pattern. Its wrk script picks each request's
// X-Client header, the key the limited site limits by. The plain and the
// limited port get the same script, so the client's own cost cancels out.
type scenario struct {
	name   string
	slug   string
	target float64 // minimum throughput ratio limited/plain (from the issue); NaN: none
	about  string
	// far runs the limited side on the site whose Redis is 1 ms away.
	far bool
	// local runs the limited side on the site without Redis (the
	// in-process store).
	local bool
	// floor runs both sides on a second Caddy whose limit.lua is floor.lua
	// (floor.go).
	floor bool
	// keyLua is Lua that sets the local `key` for one request, with the
	// thread-local counters n, g and b.
	keyLua string
	// prime are keys to push to the limit before the first run, so that
	// bots are over it from the first measured second, as a real bot is.
	prime []string
	// site, when set, is a limited site of the scenario's own, which its
	// limited side runs on (a scenario file adds both, see units.go).
	site *extraSite
	// extraTarget, when set, is a row of the report's targets: the
	// scenario's stats against the many clients scenario's.
	extraTarget func(s, many stats) (target, measured string, ok bool)
}

// Keys per scenario never overlap, so one scenario's admissions cannot push
// another's keys over the limit. 10,000 good clients at ~30k req/s for 5 runs
// of 10s is ~150 requests per key per minute, far below max_requests 1000.
var scenarios = []scenario{
	{
		name: "many clients", slug: "many", target: math.NaN(), // held to the floor script (goals.go)
		about:  "10,000 distinct keys in turn, all under the limit",
		keyLua: `n = n + 1; local key = "mc-" .. (n % 10000)`,
	},
	{
		name: "one bot", slug: "bot", target: 0.95,
		about:  "every request on one key, pushed to the limit before each limited run and far over it",
		keyLua: `local key = "bot"`,
		prime:  []string{"bot"},
	},
	{
		name: "mixed", slug: "mixed", target: math.NaN(),
		about: "90% of requests from 10,000 good clients, 10% from 10 bots, each pushed to its limit before every limited run, so bots are denied except while admissions from a minute earlier age out",
		keyLua: `n = n + 1; local key
	if n % 10 == 0 then b = b + 1; key = "mxbot-" .. (b % 10) else g = g + 1; key = "mx-" .. (g % 10000) end`,
		prime: []string{"mxbot-0", "mxbot-1", "mxbot-2", "mxbot-3", "mxbot-4", "mxbot-5", "mxbot-6", "mxbot-7", "mxbot-8", "mxbot-9"},
	},
	{
		name: "in-process store", slug: "local", target: 0.92, local: true,
		about:  "the many clients load (own 10,000 keys) on a site without redis, where the limiter keeps its state in Caddy's process: the handler's own cost, with no Redis to share the CPUs with",
		keyLua: `n = n + 1; local key = "loc-" .. (n % 10000)`,
	},
	{
		name: "Redis 1 ms away", slug: "far", target: math.NaN(), far: true,
		about:  "the many clients load (own 10,000 keys) on a site whose Redis is reached through a proxy that holds every reply 1 ms, as when Redis runs on another host: what batching does with a real round trip; no throughput target",
		keyLua: `n = n + 1; local key = "far-" .. (n % 10000)`,
	},
}

// manySlug is the scenario the peers are compared with: many clients under
// their limit, the load every request of a real API's users looks like.
const manySlug = "many"

// warmupSlug names the script of the unmeasured warm-up runs (own keys).
const warmupSlug = "warmup"

var warmup = scenario{slug: warmupSlug, keyLua: `n = n + 1; local key = "warm-" .. (n % 10000); wrk.headers["X-Units"] = "1"`}

// luaTemplate is a wrk script. setup gives each thread its own starting
// point, request sets the header, and done prints one line we parse:
// summary.errors.status counts responses with status >= 400 (the 429s), which
// is cheaper than a per-response callback.
const luaTemplate = `-- Written by srlbench for the %q scenario.
local threads = 0
function setup(thread)
	thread:set("tid", threads)
	threads = threads + 1
end

local n, g, b = 0, 0, 0
function init(args)
	n = (tid or 0) * 7919
	g, b = n, n
end

function request()
	%s
	wrk.headers["X-Client"] = key
	return wrk.format()
end

function done(summary, latency, requests)
	local e = summary.errors
	io.write(string.format(
		"SRLBENCH requests=%%d duration_us=%%d p50_us=%%d p99_us=%%d status=%%d connect=%%d read=%%d write=%%d timeout=%%d\n",
		summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
		e.status, e.connect, e.read, e.write, e.timeout))
end
`

// writeScripts writes one wrk script per scenario and returns their paths by slug.
func writeScripts(dir string) (map[string]string, error) {
	paths := make(map[string]string)
	for _, sc := range append([]scenario{warmup}, scenarios...) {
		p := filepath.Join(dir, sc.slug+".lua")
		if err := os.WriteFile(p, []byte(fmt.Sprintf(luaTemplate, sc.slug, sc.keyLua)), 0o644); err != nil {
			return nil, err
		}
		paths[sc.slug] = p
	}
	return paths, nil
}

// wrkResult is what one wrk run reports.
type wrkResult struct {
	requests int64
	duration time.Duration
	p50, p99 time.Duration
	status   int64 // responses with status >= 400
	// socket errors
	connect, read, write, timeout int64
	cpu                           cpuUse
}

func (r wrkResult) rps() float64 {
	if r.duration <= 0 {
		return 0
	}
	return float64(r.requests) / r.duration.Seconds()
}

func (r wrkResult) deniedShare() float64 {
	if r.requests == 0 {
		return 0
	}
	return float64(r.status) / float64(r.requests)
}

// caddyUsecPerRequest is the server's CPU time per completed request, in
// microseconds (for the seed, its Node.js server's).
func (r wrkResult) caddyUsecPerRequest() float64 {
	if r.requests == 0 {
		return math.NaN()
	}
	return r.cpu.caddySeconds * 1e6 / float64(r.requests)
}

func (r wrkResult) socketErrors() int64 { return r.connect + r.read + r.write + r.timeout }

// runWrk loads url (with its path) for d with the script and parses its SRLBENCH line; with
// a meter it also records where the CPU time went meanwhile.
func runWrk(ctx context.Context, cfg config, meter *cpuMeter, d time.Duration, script, url string) (wrkResult, error) {
	args := []string{
		"-t" + strconv.Itoa(cfg.threads),
		"-c" + strconv.Itoa(cfg.connections),
		"-d" + strconv.Itoa(int(d.Round(time.Second).Seconds())) + "s",
		"-s", script, url,
	}
	var before cpuSnap
	if meter != nil {
		before = meter.snap()
	}
	cmd := exec.CommandContext(ctx, "wrk", args...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return wrkResult{}, fmt.Errorf("wrk %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	r, err := parseWrk(string(out))
	if err != nil {
		return r, fmt.Errorf("wrk %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	if meter != nil {
		r.cpu = meter.use(before, meter.snap(), cmd.ProcessState.UserTime()+cmd.ProcessState.SystemTime())
	}
	return r, nil
}

// parseWrk reads the line the script's done() prints.
func parseWrk(out string) (wrkResult, error) {
	var r wrkResult
	for _, line := range strings.Split(out, "\n") {
		fields, ok := strings.CutPrefix(strings.TrimSpace(line), "SRLBENCH ")
		if !ok {
			continue
		}
		v := make(map[string]int64)
		for _, f := range strings.Fields(fields) {
			name, val, _ := strings.Cut(f, "=")
			n, err := strconv.ParseInt(val, 10, 64)
			if err != nil {
				return r, fmt.Errorf("bad field %q", f)
			}
			v[name] = n
		}
		us := func(name string) time.Duration { return time.Duration(v[name]) * time.Microsecond }
		r = wrkResult{
			requests: v["requests"], duration: us("duration_us"), p50: us("p50_us"), p99: us("p99_us"),
			status: v["status"], connect: v["connect"], read: v["read"], write: v["write"], timeout: v["timeout"],
		}
		if r.requests == 0 {
			return r, fmt.Errorf("no requests completed")
		}
		return r, nil
	}
	return r, fmt.Errorf("no SRLBENCH line in the output")
}
