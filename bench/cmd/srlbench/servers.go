package main

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// proc is a server we started and must stop: Caddy or redis-server.
type proc struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	done    chan struct{} // closed when the process has exited
}

// start runs argv in its own process group with output to logPath. Its own
// group keeps a terminal's Ctrl-C away from it, so we stop it in order; the
// Linux parent-death signal stops it even if we are killed outright.
func start(name, logPath string, env []string, argv ...string) (*proc, error) {
	f, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, logPath: logPath, done: make(chan struct{})}
	go func() {
		cmd.Wait()
		f.Close()
		close(p.done)
	}()
	return p, nil
}

// stop asks the process group to terminate (Caddy and Redis both shut down
// cleanly on SIGTERM) and kills it if it has not exited after 10s.
func (p *proc) stop() {
	select {
	case <-p.done:
		return
	default:
	}
	pgid := -p.cmd.Process.Pid
	syscall.Kill(pgid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		syscall.Kill(pgid, syscall.SIGKILL)
		<-p.done
	}
}

// waitReady polls ready until it succeeds, the process exits, or 30s pass.
func (p *proc) waitReady(ctx context.Context, ready func() error) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := ready()
		if err == nil {
			return nil
		}
		select {
		case <-p.done:
			return fmt.Errorf("%s exited during start-up; its log ends:\n%s", p.name, tail(p.logPath, 15))
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready after 30s (%v); its log ends:\n%s", p.name, err, tail(p.logPath, 15))
		}
	}
}

// startRedis starts a redis-server on a free loopback port with persistence
// off (a benchmark must not fork for RDB saves mid-run) and returns its URL.
// dir holds its config and log, one directory per server.
func startRedis(ctx context.Context, dir string) (*proc, string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, "", err
	}
	port, err := freePort()
	if err != nil {
		return nil, "", err
	}
	// A config file, not flags: `save ""` as a flag differs across versions.
	conf := filepath.Join(dir, "redis.conf")
	text := fmt.Sprintf("bind 127.0.0.1\nport %d\nsave \"\"\nappendonly no\ndir %q\ndaemonize no\n", port, dir)
	if err := os.WriteFile(conf, []byte(text), 0o644); err != nil {
		return nil, "", err
	}
	p, err := start("redis-server", filepath.Join(dir, "redis.log"), nil, "redis-server", conf)
	if err != nil {
		return nil, "", err
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	rc := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer rc.Close()
	err = p.waitReady(ctx, func() error { return rc.Ping(ctx).Err() })
	if err != nil {
		p.stop()
		return nil, "", err
	}
	say("redis-server on %s (pid %d)", addr, p.cmd.Process.Pid)
	return p, "redis://" + addr, nil
}

// sites are the base URLs Caddy serves.
type sites struct {
	plain   string // respond "ok" 200
	limited string // the same behind sliding_ratelimit, limitedMax per minute per X-Client
	far     string // the same as limited, with Redis reached through the 1 ms proxy
	local   string // the same as limited, without Redis: the in-process store
	admin   string // Caddy's admin endpoint (metrics, pprof)
	// memory is one site per memory size, in the order of memSizes.
	memory []string
	// extra are the scenarios' own sites, by scenario slug.
	extra map[string]string
}

// extraSite is a limited site of a scenario's own.
type extraSite struct {
	comment string
	// body returns the site's directives, one per line, on the Redis of
	// redisURL.
	body func(redisURL string) []string
}

// extraSites are the scenarios' own sites, in the order of scenarios.
func extraSites() (slugs []string, ss []*extraSite) {
	for _, sc := range scenarios {
		if sc.site != nil {
			slugs, ss = append(slugs, sc.slug), append(ss, sc.site)
		}
	}
	return slugs, ss
}

// limitedMax is max_requests of the limited sites, and the anchor's limit.
const limitedMax = 1000

// siteBlock is one site of the bench's Caddyfile: the same response on every
// site, so the only difference between plain and limited is the handler. No
// site has a `log` directive: access logs would dominate a response this small.
func siteBlock(comment string, port int, limiter []string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "\n# %s\n:%d {\n\tbind 127.0.0.1\n", comment, port)
	if len(limiter) > 0 {
		b.WriteString("\tsliding_ratelimit {\n")
		for _, l := range limiter {
			b.WriteString("\t\t" + l + "\n")
		}
		b.WriteString("\t}\n")
	}
	b.WriteString("\trespond \"ok\" 200\n}\n")
	return b.String()
}

// caddyfile is the whole configuration. extra are the -limiter subdirectives,
// added to both limited sites (not to the memory sites, whose figures must
// stay comparable across runs).
func caddyfile(s sites, ports []int, redisURL, farURL string, extra []string) string {
	limited := func(redis string) []string {
		options := []string{"window 1m", fmt.Sprintf("max_requests %d", limitedMax), "key {http.request.header.X-Client}"}
		if redis != "" {
			options = append(options, "redis "+redis)
		}
		return append(options, extra...)
	}
	text := fmt.Sprintf("{\n\tadmin 127.0.0.1:%d\n\tpersist_config off\n\tauto_https off\n}\n", ports[0])
	text += siteBlock("Plain: the baseline.", ports[1], nil)
	text += siteBlock("Limited: the same response behind the rate limiter.", ports[2], limited(redisURL))
	text += siteBlock(fmt.Sprintf("Limited, with Redis %d ms away (through the latency proxy).", farLatencyMs), ports[3], limited(farURL))
	text += siteBlock("Limited, without Redis: the in-process store.", ports[4], limited(""))
	for i, ms := range memSizes {
		// A long window: no key of an earlier size expires while a later
		// size is measured, however slow the machine.
		text += siteBlock(fmt.Sprintf("Memory phase, %s admissions per client: its own zone and key_prefix, so its keys can be counted apart.", ms.label()),
			ports[5+i], ms.options(redisURL))
	}
	_, own := extraSites()
	for i, es := range own {
		text += fmt.Sprintf("\n# %s\n:%d {\n\tbind 127.0.0.1\n\t%s\n}\n", es.comment, ports[5+len(memSizes)+i], strings.Join(es.body(redisURL), "\n\t"))
	}
	return text
}

// startCaddy writes the Caddyfile and runs caddyBin on it until every site
// and the admin endpoint answer. limiterOptions are extra subdirectives for
// the limited sites (the -limiter flag), one per line.
func startCaddy(ctx context.Context, caddyBin, dir, redisURL, farURL string, limiterOptions []string) (*proc, sites, error) {
	extraSlugs, _ := extraSites()
	ports := make([]int, 5+len(memSizes)+len(extraSlugs))
	for i := range ports {
		p, err := freePort()
		if err != nil {
			return nil, sites{}, err
		}
		ports[i] = p
	}
	url := func(port int) string { return fmt.Sprintf("http://127.0.0.1:%d", port) }
	s := sites{admin: url(ports[0]), plain: url(ports[1]), limited: url(ports[2]), far: url(ports[3]), local: url(ports[4])}
	for i := range memSizes {
		s.memory = append(s.memory, url(ports[5+i]))
	}
	s.extra = make(map[string]string)
	for i, slug := range extraSlugs {
		s.extra[slug] = url(ports[5+len(memSizes)+i])
	}
	path := filepath.Join(dir, "Caddyfile")
	if err := os.WriteFile(path, []byte(caddyfile(s, ports, redisURL, farURL, limiterOptions)), 0o644); err != nil {
		return nil, s, err
	}
	// Caddy's own data and config directories go to the temp dir too.
	env := []string{"XDG_DATA_HOME=" + filepath.Join(dir, "data"), "XDG_CONFIG_HOME=" + filepath.Join(dir, "config")}
	p, err := start("caddy", filepath.Join(dir, "caddy.log"), env, caddyBin, "run", "--config", path, "--adapter", "caddyfile")
	if err != nil {
		return nil, s, err
	}
	err = p.waitReady(ctx, func() error {
		for _, u := range append([]string{s.plain, s.limited, s.far, s.local, s.admin + "/config/"}, s.extraURLs()...) {
			if err := getOK(ctx, u, "srlbench-ready"); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		p.stop()
		return nil, s, err
	}
	say("caddy: plain %s, limited %s, Redis %d ms away %s, memory %s, admin %s (pid %d)", s.plain, s.limited, farLatencyMs, s.far,
		strings.Join(s.memory, " "), s.admin, p.cmd.Process.Pid)
	return p, s, nil
}

// extraURLs are the scenarios' own sites.
func (s sites) extraURLs() []string {
	var urls []string
	for _, u := range s.extra {
		urls = append(urls, u)
	}
	return urls
}

// getOK sends one GET with X-Client (and X-Units, which the units site
// reports as its usage) set and wants a 200.
func getOK(ctx context.Context, url, client string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	req.Header.Set("X-Client", client)
	req.Header.Set("X-Units", "1")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return nil
}

// redisClient is a client of a server we started, for INFO and the like.
func redisClient(url string) *redis.Client {
	return redis.NewClient(&redis.Options{Addr: strings.TrimPrefix(url, "redis://")})
}

// freePort returns a loopback TCP port that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// caddyErrors summarises the error-level lines in Caddy's log, and the
// limiter's warnings: it logs store failures (fail mode applied) at most once
// a second, and the opening of its circuit breaker.
type caddyErrors struct {
	lines, canceled int // canceled: the error was a context cancellation
	first           string
}

func readCaddyErrors(logPath string) caddyErrors {
	var e caddyErrors
	f, err := os.Open(logPath)
	if err != nil {
		return e
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		limiterWarn := strings.Contains(line, `"level":"warn"`) && strings.Contains(line, "sliding_ratelimit")
		if !strings.Contains(line, `"level":"error"`) && !limiterWarn {
			continue
		}
		if e.lines == 0 {
			e.first = line
		}
		e.lines++
		if strings.Contains(line, "context canceled") {
			e.canceled++
		}
	}
	return e
}

// decisions are the limiter's decision counters from Caddy's /metrics,
// by result (allowed, denied, failed_open, ...), plus "deny_cache_hits":
// they tell how many requests Redis decided, and how many the fail mode
// passed without it (which inflates limited req/s).
type decisions map[string]float64

// readDecisions sums caddy_sliding_ratelimit_decisions_total over zones by
// its result label. An empty map means the module exports no such metric.
func readDecisions(ctx context.Context, admin string) (decisions, error) {
	body, err := httpGet(ctx, admin+"/metrics")
	if err != nil {
		return nil, err
	}
	return parseDecisions(string(body)), nil
}

// parseDecisions reads the Prometheus text format of /metrics.
func parseDecisions(body string) decisions {
	d := make(decisions)
	forEachSample(body, func(name string, labels map[string]string, v float64) {
		switch name {
		case "caddy_sliding_ratelimit_decisions_total":
			if r, ok := labels["result"]; ok {
				d[r] += v
			}
		case "caddy_sliding_ratelimit_deny_cache_hits_total":
			d["deny_cache_hits"] += v
		}
	})
	return d
}

// forEachSample calls f with each sample of a /metrics body in the
// Prometheus text format that has labels: its name, labels and value.
func forEachSample(body string, f func(name string, labels map[string]string, v float64)) {
	for _, line := range strings.Split(body, "\n") {
		name, rest, _ := strings.Cut(line, "{")
		labelText, value, _ := strings.Cut(rest, "} ")
		v, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
		if err != nil {
			continue
		}
		labels := map[string]string{}
		for _, l := range strings.Split(labelText, ",") {
			if k, lv, ok := strings.Cut(l, "="); ok {
				labels[k] = strings.Trim(lv, `"`)
			}
		}
		f(name, labels, v)
	}
}

func (after decisions) sub(before decisions) decisions { return subCounts(after, before) }

// subCounts returns after's counts less before's, name by name.
func subCounts[M ~map[string]float64](after, before M) M {
	d := make(M, len(after))
	for k, v := range after {
		d[k] = v - before[k]
	}
	return d
}

// tail returns the last n lines of a file.
func tail(path string, n int) string {
	data, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
