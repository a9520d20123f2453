// Command srlbench measures Caddy with the sliding_ratelimit handler against
// plain Caddy on this machine and writes BENCHMARKS.md plus a bar chart of the
// throughput ratios (BENCHMARKS.svg) next to it.
//
// Run it from the repository root with `make bench` (it runs
// `cd bench && go run ./cmd/srlbench $(BENCH_FLAGS)`); `make bench
// BENCH_FLAGS=-quick` is a smoke test of the tool itself.
//
// What it does, in order:
//  1. checks that wrk and redis-server exist (apt-get installs them when root);
//  2. builds ../caddy with `make -C .. build`, the same xcaddy build users get;
//  3. starts its own redis-server (no persistence), an in-process proxy that
//     puts it 1 ms away, and one Caddy that answers "ok" on a plain port and
//     on limited ports;
//  4. measures memory per client at its limit at 60, 1,000 and 10,000
//     admissions, and of a 30-day spend budget, each on its own site and
//     zone (-only memory runs this alone);
//  5. starts the seed peer (Express + ioredis, on its own Redis) if its
//     folder and Node.js are there;
//  6. loads the plain and the limited port in turn with wrk for each scenario,
//     reading Redis INFO commandstats and INFO cpu around every limited run;
//     each many clients run is followed by a run of the anchor peer
//     (go-redis/redis_rate, driven from this process on the same Redis) and
//     one of the seed;
//  7. adds a site whose zone has a wait and keeps its clients' requests in
//     flight, held for their slots (waits.go);
//  8. adds four sites that proxy streamed LLM answers, the last the AI
//     gateway recipe (cost llm + settle llm), and loads each in turn
//     (llm.go, gateway.go);
//  9. runs the limiter's BenchmarkFallbackObserve: what fail_mode local
//     keeps per client, and what keeping it costs (failmode.go);
//  10. writes the report and stops everything, also on Ctrl-C.
//
// Paths in flags are relative to bench/, where `make bench` runs it.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// config is what the flags set.
type config struct {
	runs        int
	duration    time.Duration
	warmup      time.Duration
	settle      time.Duration
	connections int
	threads     int
	out         string
	quick       bool
	cpuprofile  string
	profiled    string
	repo        string
	limiter     string   // extra subdirectives for the limited sites, separated by ';'
	seed        string   // the seed peer's folder; "" is seedRelPath from repo
	only        []string // scenario slugs to run alone, without the other phases or a report
	args        []string // the command line, for the report
}

func main() {
	var cfg config
	flag.IntVar(&cfg.runs, "runs", 5, "runs per scenario and server (plain and limited alternate); medians are reported")
	flag.DurationVar(&cfg.duration, "duration", 10*time.Second, "length of one wrk run")
	flag.DurationVar(&cfg.warmup, "warmup", 3*time.Second, "length of the unmeasured warm-up run on each port")
	flag.DurationVar(&cfg.settle, "settle", 20*time.Second, "before each run, wait up to this long for other processes to use under 0.25 CPUs")
	flag.IntVar(&cfg.connections, "connections", 50, "wrk connections (-c)")
	flag.IntVar(&cfg.threads, "threads", 1, "wrk threads (-t); wrk shares the CPUs with Caddy and Redis")
	flag.StringVar(&cfg.out, "out", "../BENCHMARKS.md", "report to write; the chart goes next to it with the extension .svg")
	flag.BoolVar(&cfg.quick, "quick", false, "smoke-test the tool: 1 run of 3s, 1s warm-up, 3s settle")
	flag.StringVar(&cfg.cpuprofile, "cpuprofile", "", "save a Caddy CPU profile of one extra limited run to this file")
	flag.StringVar(&cfg.profiled, "profile-scenario", "many", "scenario of the -cpuprofile run: many, bot, mixed, local, far or units")
	flag.StringVar(&cfg.repo, "repo", "..", "repository root (where the Makefile builds ./caddy)")
	flag.StringVar(&cfg.limiter, "limiter", "", "extra sliding_ratelimit subdirectives for the limited sites, separated by ';' (e.g. 'timeout 50ms')")
	flag.StringVar(&cfg.seed, "seed", "", "folder of the seed peer (default: ../shared/peers/seed-express relative to -repo; skipped if absent)")
	only := flag.String("only", "", "run only these scenarios (comma-separated: many, bot, mixed, local, far, units, memory for the memory phase, llm for the LLM streams and the AI gateway, settlecost for what a settle costs Redis), print their runs and write no report: for comparing builds")
	flag.Parse()
	cfg.args = os.Args[1:]
	if *only != "" {
		cfg.only = strings.Split(*only, ",")
		for _, slug := range cfg.only {
			if !slices.Contains(phaseSlugs, slug) && !slices.ContainsFunc(scenarios, func(sc scenario) bool { return sc.slug == slug }) {
				fmt.Fprintf(os.Stderr, "srlbench: -only: no scenario %q\n", slug)
				os.Exit(2)
			}
		}
	}
	if cfg.quick {
		cfg.runs, cfg.duration, cfg.warmup, cfg.settle = 1, 3*time.Second, time.Second, 3*time.Second
	}
	if cfg.runs < 1 || cfg.duration < time.Second || cfg.connections < 1 || cfg.threads < 1 {
		fmt.Fprintln(os.Stderr, "srlbench: -runs, -connections and -threads must be at least 1, -duration at least 1s")
		os.Exit(2)
	}

	// Ctrl-C cancels ctx: the running wrk is killed and the deferred stops in
	// run shut down Caddy and Redis before we exit.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, cfg)
	interrupted := ctx.Err() != nil // before stop, which cancels ctx
	stop()
	if err != nil {
		if interrupted {
			fmt.Fprintln(os.Stderr, "srlbench: interrupted; stopped Caddy and Redis")
			os.Exit(130)
		}
		fmt.Fprintln(os.Stderr, "srlbench:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, cfg config) error {
	if err := ensureTools(); err != nil {
		return err
	}
	say("building Caddy with the module: make -C %s build", cfg.repo)
	if err := runPassthrough(ctx, "make", "-C", cfg.repo, "build"); err != nil {
		return fmt.Errorf("make build: %w", err)
	}
	tmp, err := os.MkdirTemp("", "srlbench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	// Run a private copy: others may rebuild ../caddy while we measure.
	caddyBin := filepath.Join(tmp, "caddy")
	if err := copyFile(filepath.Join(cfg.repo, "caddy"), caddyBin); err != nil {
		return err
	}
	machine := describeMachine(caddyBin, cfg.repo)

	rds, redisURL, err := startRedis(ctx, filepath.Join(tmp, "redis"))
	if err != nil {
		return err
	}
	defer rds.stop()
	rc := redisClient(redisURL)
	defer rc.Close()
	far, err := startFarProxy(redisURL)
	if err != nil {
		return err
	}
	defer far.stop()
	var rtt roundTrips
	if rtt.direct, err = pingRTT(ctx, redisURL, 50); err != nil {
		return err
	}
	if rtt.far, err = pingRTT(ctx, far.url, 50); err != nil {
		return err
	}
	say("Redis round trip (median of 50 PINGs): %s direct, %s through the latency proxy", rtt.direct, rtt.far)

	cdy, site, err := startCaddy(ctx, caddyBin, tmp, redisURL, far.url, limiterOptions(cfg.limiter))
	if err != nil {
		return err
	}
	defer cdy.stop()
	meter := &cpuMeter{caddyPid: cdy.cmd.Process.Pid, redisPid: rds.cmd.Process.Pid}

	// runSc runs one scenario, the floor script's on a Caddy of its own.
	runSc := func(sc scenario, scripts map[string]string, peers *peerRunner) (scenarioResult, error) {
		if sc.floor {
			return runFloor(ctx, cfg, rc, meter.redisPid, sc, scripts[sc.slug], scripts[warmupSlug], filepath.Join(tmp, "floor"), redisURL, far.url)
		}
		return runScenario(ctx, cfg, rc, meter, sc, scripts[sc.slug], site, peers)
	}
	// Memory first, while Redis holds nothing else: later scenarios leave
	// thousands of keys whose expiry would move used_memory mid-measurement.
	if len(cfg.only) > 0 {
		if slices.Contains(cfg.only, memorySlug) {
			if _, err := measureMemories(ctx, cfg, rc, site); err != nil {
				return err
			}
		}
		if err := runOnly(ctx, cfg, tmp, site, runSc); err != nil {
			return err
		}
		if slices.Contains(cfg.only, settleCostSlug) {
			measureSettleCost(ctx, cfg)
		}
		if slices.Contains(cfg.only, llmSlug) {
			llm, err := runLLM(ctx, cfg, meter, site.admin, redisURL)
			if err != nil {
				return fmt.Errorf("llm: %w", err)
			}
			rep := report{cfg: cfg, llm: llm}
			say("llm medians: AI gateway / no limiter %.3f; Caddy CPU us/call: %s", rep.gatewayStats().ratio, rep.llmCPUs())
		}
		return nil
	}
	mems, err := measureMemories(ctx, cfg, rc, site)
	if err != nil {
		return err
	}

	scripts, err := writeScripts(tmp)
	if err != nil {
		return err
	}
	if err := warmUp(ctx, cfg, scripts, site); err != nil {
		return err
	}

	// The seed runs beside the many clients scenario, so it sees the same
	// machine; it is stopped before the other scenarios.
	seed, seedSkip, err := startSeed(ctx, cfg, tmp)
	if err != nil {
		return err
	}
	if seedSkip != nil {
		say("seed: skipped: %v", seedSkip)
	} else {
		defer seed.stop()
		if _, err := runWrk(ctx, cfg, nil, cfg.warmup, scripts[warmupSlug], seed.url); err != nil {
			return fmt.Errorf("seed warm-up: %w", err)
		}
	}

	var results []scenarioResult
	for _, sc := range scenarios {
		var peers *peerRunner
		if sc.slug == manySlug {
			peers = &peerRunner{redisAddr: strings.TrimPrefix(redisURL, "redis://"), rc: rc, meter: meter, seed: seed, script: scripts[sc.slug]}
		}
		res, err := runSc(sc, scripts, peers)
		if err != nil {
			return fmt.Errorf("%s: %w", sc.name, err)
		}
		results = append(results, res)
		if seed != nil && sc.slug == manySlug {
			seed.stop()
		}
	}

	naive, err := startNaive(ctx, redisURL, far.url)
	if err != nil {
		return err
	}
	defer naive.stop()
	for _, url := range []string{naive.plain, naive.near, naive.far} {
		if _, err := runWrk(ctx, cfg, nil, cfg.warmup, scripts[warmupSlug], url+"/"); err != nil {
			return fmt.Errorf("naive peer warm-up: %w", err)
		}
	}
	naiveRes, err := runNaive(ctx, cfg, meter, naive, scripts[manySlug])
	if err != nil {
		return err
	}
	naive.stop()

	waits, err := runWaits(ctx, cfg, rc, meter, site.admin, redisURL)
	if err != nil {
		return fmt.Errorf("waits: %w", err)
	}
	llm, err := runLLM(ctx, cfg, meter, site.admin, redisURL)
	if err != nil {
		return fmt.Errorf("llm: %w", err)
	}
	failMode := measureFailMode(ctx, cfg)
	settleCost := measureSettleCost(ctx, cfg)

	profileNote := ""
	if cfg.cpuprofile != "" {
		if err := profileRun(ctx, cfg, scripts, site); err != nil {
			return fmt.Errorf("cpu profile: %w", err)
		}
		profileNote = cfg.cpuprofile
	}

	rep := report{cfg: cfg, machine: machine, results: results, mems: mems, profile: profileNote, seedSkip: seedSkip, rtt: rtt, waits: waits, naive: naiveRes, llm: llm, failMode: failMode, settleCost: settleCost}
	rep.caddyErrors = readCaddyErrors(cdy.logPath)
	return rep.write()
}

// warmUp runs the unmeasured warm-up on each of Caddy's ports.
func warmUp(ctx context.Context, cfg config, scripts map[string]string, site sites) error {
	say("warm-up: %s on each port", cfg.warmup)
	for _, url := range append([]string{site.plain, site.limited, site.far, site.local}, site.extraURLs()...) {
		if _, err := runWrk(ctx, cfg, nil, cfg.warmup, scripts[warmupSlug], url+"/"); err != nil {
			return fmt.Errorf("warm-up: %w", err)
		}
	}
	return nil
}

// runOnly runs the scenarios of -only, after a warm-up of their ports, and
// prints each one's medians, and the CPU each process took in each run.
func runOnly(ctx context.Context, cfg config, tmp string, site sites, runSc func(scenario, map[string]string, *peerRunner) (scenarioResult, error)) error {
	if !slices.ContainsFunc(scenarios, func(sc scenario) bool { return slices.Contains(cfg.only, sc.slug) }) && cfg.cpuprofile == "" {
		return nil // the memory phase alone
	}
	scripts, err := writeScripts(tmp)
	if err != nil {
		return err
	}
	if err := warmUp(ctx, cfg, scripts, site); err != nil {
		return err
	}
	for _, sc := range scenarios {
		if !slices.Contains(cfg.only, sc.slug) {
			continue
		}
		res, err := runSc(sc, scripts, nil)
		if err != nil {
			return fmt.Errorf("%s: %w", sc.name, err)
		}
		var busy []string
		for _, p := range res.runs {
			c := p.limited.cpu
			busy = append(busy, fmt.Sprintf("%.2f+%.2f+%.2f+%.2f+%.2f", c.caddy, c.redis, c.wrk, c.self, c.other))
		}
		st := res.stats()
		say("%-12s medians: ratio %.3f, Redis %.1f us/decision, Caddy CPU/req %.2fx plain, %.3f script calls/req, p50 added %s, p99 added %s; CPUs caddy+redis+wrk+self+other per run %v",
			sc.name, st.ratio, st.redisPerDecision, st.caddyRatio, st.callsPerReq, st.addedP50(), st.addedP99(), busy)
	}
	if cfg.cpuprofile == "" {
		return nil
	}
	return profileRun(ctx, cfg, scripts, site)
}

// roundTrips are Redis's PING times at start-up, direct and through the
// latency proxy.
type roundTrips struct{ direct, far time.Duration }

// memWorkers is the memory phase's concurrent requests.
const memWorkers = 8

// memorySlug names the memory phase for -only: it runs alone, first, and
// prints what each size measured.
const memorySlug = "memory"

// llmSlug names the LLM streams and the AI gateway for -only, and
// settleCostSlug the settle-cost phase.
const (
	llmSlug        = "llm"
	settleCostSlug = "settlecost"
)

// phaseSlugs are what -only takes beside the scenarios.
var phaseSlugs = []string{memorySlug, llmSlug, settleCostSlug}

// measureMemories runs the memory phase: each size on its own site, in
// turn, saying what it measured.
func measureMemories(ctx context.Context, cfg config, rc *redis.Client, site sites) ([]memResult, error) {
	var mems []memResult
	for i, size := range memSizes {
		clients := size.clients
		if cfg.quick {
			clients = max(2, clients/quickMemDivisor)
		}
		say("memory: %d requests for each of %d clients on %s", size.max, clients, site.memory[i])
		mem, err := measureMemory(ctx, rc, site.memory[i], size, clients, memWorkers)
		if err != nil {
			return nil, fmt.Errorf("memory phase, %s: %w", size.label(), err)
		}
		say("memory: %s: %.0f bytes per client (used_memory delta / clients), MEMORY USAGE %.0f bytes per client, %d / %d admitted, %s",
			size.label(), mem.bytesPerClient(), mem.usagePerClient(), mem.admitted, mem.clients*mem.size.max, mem.elapsed.Round(time.Second))
		mems = append(mems, mem)
	}
	return mems, nil
}

// peerRunner runs the peers' runs that go with each run of the many
// clients scenario: the anchor on the same Redis, and the seed if it runs.
type peerRunner struct {
	redisAddr string
	rc        *redis.Client
	meter     *cpuMeter
	seed      *seedPeer // nil: skipped
	script    string
}

func (pr *peerRunner) run(ctx context.Context, cfg config, res *scenarioResult) error {
	pr.meter.settle(ctx, cfg.settle)
	a, err := runAnchor(ctx, pr.redisAddr, pr.rc, pr.meter, cfg.connections, cfg.duration)
	if err != nil {
		return fmt.Errorf("redis_rate: %w", err)
	}
	res.anchors = append(res.anchors, a)
	line := fmt.Sprintf("redis_rate %6.0f decisions/s, Redis %.1f us/decision", a.rps(), a.redis.cpuUsecPer(float64(a.decisions)))
	if pr.seed != nil {
		sr, err := pr.seed.run(ctx, cfg, pr.script)
		if err != nil {
			return fmt.Errorf("seed: %w", err)
		}
		res.seeds = append(res.seeds, sr)
		line += fmt.Sprintf("; seed %6.0f req/s (%.1f%% 429)", sr.wrk.rps(), 100*sr.wrk.deniedShare())
	}
	say("%-12s peers: %s", "", line)
	return nil
}

// runScenario runs one scenario cfg.runs times on each port, alternating
// which port goes first so that slow drift (Redis growth, a neighbour's
// build) does not always favour the same side. With peers, each run is
// followed by the peers' runs.
func runScenario(ctx context.Context, cfg config, rc *redis.Client, meter *cpuMeter, sc scenario, script string, site sites, peers *peerRunner) (scenarioResult, error) {
	res := scenarioResult{sc: sc}
	limitedURL := site.limited
	switch {
	case sc.far:
		limitedURL = site.far
	case sc.local:
		limitedURL = site.local
	case sc.site != nil:
		limitedURL = site.extra[sc.slug]
	}
	for i := 0; i < cfg.runs; i++ {
		var p pair
		plain := func() error {
			meter.settle(ctx, cfg.settle)
			r, err := runWrk(ctx, cfg, meter, cfg.duration, script, site.plain+"/")
			p.plain = r
			return err
		}
		limited := func() error {
			if len(sc.prime) > 0 {
				// Bots send about as fast as the limit refills (1000 a minute
				// each in the mixed scenario), so push them to max_requests
				// before every limited run: they are over it from its start.
				if _, _, err := sendAll(ctx, limitedURL, sc.prime, limitedMax, 4); err != nil {
					return fmt.Errorf("pushing bots to the limit: %w", err)
				}
			}
			meter.settle(ctx, cfg.settle)
			before, err := readRedis(ctx, rc)
			if err != nil {
				return err
			}
			decBefore, err := readDecisions(ctx, site.admin)
			if err != nil {
				return err
			}
			r, err := runWrk(ctx, cfg, meter, cfg.duration, script, limitedURL+"/")
			if err != nil {
				return err
			}
			after, err := readRedis(ctx, rc)
			if err != nil {
				return err
			}
			decAfter, err := readDecisions(ctx, site.admin)
			if err != nil {
				return err
			}
			p.limited, p.redis, p.decisions = r, after.sub(before), decAfter.sub(decBefore)
			return nil
		}
		order := []func() error{plain, limited}
		if i%2 == 1 {
			order[0], order[1] = limited, plain
		}
		for _, f := range order {
			if err := f(); err != nil {
				return res, err
			}
		}
		say("%-12s run %d/%d: plain %6.0f req/s, limited %6.0f req/s (ratio %.2f, %.1f%% 429, Redis %s us/decision, Caddy CPU/req %.2fx plain, %.1f%% failed open, other processes %.2f/%.2f CPUs)",
			sc.name, i+1, cfg.runs, p.plain.rps(), p.limited.rps(), p.ratio(), 100*p.limited.deniedShare(), num(p.redisUsecPerDecision(), 1),
			p.caddyCPURatio(), 100*p.failedOpenShare(), p.plain.cpu.other, p.limited.cpu.other)
		res.runs = append(res.runs, p)
		if peers != nil {
			if err := peers.run(ctx, cfg, &res); err != nil {
				return res, err
			}
		}
	}
	return res, nil
}

// profileRun fetches a CPU profile from Caddy's admin endpoint during an
// extra limited run of one scenario. It is not one of the measured runs:
// profiling costs a few percent, which would bias the medians.
func profileRun(ctx context.Context, cfg config, scripts map[string]string, site sites) error {
	script, ok := scripts[cfg.profiled]
	if !ok {
		return fmt.Errorf("-profile-scenario %q: want many, bot, mixed, local, far or units", cfg.profiled)
	}
	secs := int(cfg.duration.Seconds()) - 1
	if secs < 1 {
		secs = 1
	}
	say("cpu profile: %ds of Caddy during an extra %s limited run -> %s", secs, cfg.profiled, cfg.cpuprofile)
	type fetched struct {
		data []byte
		err  error
	}
	ch := make(chan fetched, 1)
	go func() {
		data, err := httpGet(ctx, fmt.Sprintf("%s/debug/pprof/profile?seconds=%d", site.admin, secs))
		ch <- fetched{data, err}
	}()
	url := site.limited
	switch cfg.profiled {
	case "far":
		url = site.far
	case "local":
		url = site.local
	default:
		if u, ok := site.extra[cfg.profiled]; ok {
			url = u
		}
	}
	_, werr := runWrk(ctx, cfg, nil, cfg.duration, script, url+"/")
	f := <-ch
	if werr != nil {
		return werr
	}
	if f.err != nil {
		return f.err
	}
	return os.WriteFile(cfg.cpuprofile, f.data, 0o644)
}

// ensureTools makes sure wrk and redis-server are on PATH, installing the
// Debian packages when we are root on a machine with apt-get.
func ensureTools() error {
	missing := func() []string {
		var m []string
		for _, p := range []string{"wrk", "redis-server"} {
			if _, err := exec.LookPath(p); err != nil {
				m = append(m, p)
			}
		}
		return m
	}
	m := missing()
	if len(m) == 0 {
		return nil
	}
	pkgs := []string{"wrk", "redis-server", "redis-tools"}
	howTo := "install them: sudo apt-get install -y " + strings.Join(pkgs, " ") + " (Debian/Ubuntu), brew install wrk redis (macOS)"
	if _, err := exec.LookPath("apt-get"); err != nil || os.Geteuid() != 0 {
		return fmt.Errorf("not found on PATH: %s; %s", strings.Join(m, ", "), howTo)
	}
	say("installing with apt-get: %s", strings.Join(pkgs, " "))
	install := append([]string{"install", "-y"}, pkgs...)
	// A fresh machine has no package lists yet: update once, then retry.
	if aptGet(install...) != nil {
		if err := aptGet("update"); err != nil {
			return fmt.Errorf("apt-get update: %w; %s", err, howTo)
		}
		if err := aptGet(install...); err != nil {
			return fmt.Errorf("apt-get install: %w; %s", err, howTo)
		}
	}
	if m := missing(); len(m) > 0 {
		return fmt.Errorf("still not on PATH after apt-get: %s", strings.Join(m, ", "))
	}
	return nil
}

func aptGet(args ...string) error {
	cmd := exec.Command("apt-get", args...)
	cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	return cmd.Run()
}

// copyFile copies an executable.
func copyFile(from, to string) error {
	data, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	return os.WriteFile(to, data, 0o755)
}

// runPassthrough runs a command with our stdout and stderr.
func runPassthrough(ctx context.Context, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	return cmd.Run()
}

// httpGet returns the body of a 200 response.
func httpGet(ctx context.Context, url string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return body, nil
}

// say prints a progress line to stderr, so stdout carries only the report.
func say(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "srlbench: "+format+"\n", args...)
}

// limiterOptions splits the -limiter flag into subdirective lines.
func limiterOptions(flagValue string) []string {
	var out []string
	for _, o := range strings.Split(flagValue, ";") {
		if o = strings.TrimSpace(o); o != "" {
			out = append(out, o)
		}
	}
	return out
}
