//go:build soak

package slidingratelimit

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/redisconn"
	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/redistest"
)

// TestSoak runs Caddy in this process for SOAK_DURATION (default 10m) under
// mixed load, reloading its config every 30s and restarting Redis (empty)
// every 2 minutes, and prints each minute the process's RSS, its goroutines,
// Redis's connections and the fail-mode counts. Afterwards it checks that
// fresh keys are limited exactly, and writes the figures to SOAK.md. Run it
// with `make soak`; it is not part of `make test`.
func TestSoak(t *testing.T) {
	duration := 10 * time.Minute
	if s := os.Getenv("SOAK_DURATION"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			t.Fatalf("SOAK_DURATION: %v", err)
		}
		duration = d
	}
	const (
		maxRequests  = 50
		window       = "10s"
		reloadEvery  = 30 * time.Second
		restartEvery = 2 * time.Minute
	)
	srv := redistest.Start(t)
	port, err := redistest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	// Two configs that differ in what a reload must carry over: the fail
	// mode and the header style.
	config := func(variant int) []byte {
		failMode, headers := failClosed, headersDraft
		if variant%2 == 1 {
			failMode, headers = failLocal, headersLegacy
		}
		return []byte(fmt.Sprintf(`{
	"admin": {"disabled": true},
	"logging": {"logs": {"default": {"level": "ERROR"}}},
	"apps": {"http": {"grace_period": 1000000000, "servers": {"soak": {
		"listen": [%q],
		"routes": [{"handle": [
			{"handler": "sliding_ratelimit", "window": %q, "max_requests": %d,
			 "redis": %q, "key_prefix": "soak:", "timeout": "100ms",
			 "fail_mode": %q, "headers": %q},
			{"handler": "static_response", "body": "ok"}
		]}]
	}}}}
}`, addr, window, maxRequests, srv.URL(), failMode, headers))
	}
	if err := caddy.Load(config(0), true); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = caddy.Stop() })

	var statuses [600]atomic.Int64
	var transportErrors atomic.Int64
	get := func(c *http.Client) int {
		res, err := c.Get("http://" + addr + "/")
		if err != nil {
			transportErrors.Add(1)
			return 0
		}
		res.Body.Close()
		if res.StatusCode < len(statuses) {
			statuses[res.StatusCode].Add(1)
		}
		return res.StatusCode
	}
	stop := make(chan struct{})
	var load sync.WaitGroup
	// Mixed load: four clients flooding (mostly denied, from the deny
	// cache), twenty under their limit (five requests a second each).
	for i := range 24 {
		c := soakClient("127.0.0." + strconv.Itoa(10+i))
		pause := time.Duration(0)
		if i >= 4 {
			pause = 200 * time.Millisecond
		}
		load.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				get(c)
				time.Sleep(pause)
			}
		})
	}

	rdb := srv.Client(t)
	var rows []string
	header := "| minute | RSS MB | goroutines | Redis connections | requests | 200 | 429 | 503 | failed closed | local | reloads | Redis restarts |"
	rows = append(rows, header, "|---|---|---|---|---|---|---|---|---|---|---|---|")
	t.Log(header)
	start := time.Now()
	reloads, restarts := 0, 0
	nextReload, nextRestart, nextReport := start.Add(reloadEvery), start.Add(restartEvery), start.Add(time.Minute)
	for time.Since(start) < duration {
		time.Sleep(time.Second)
		now := time.Now()
		if now.After(nextReload) {
			reloads++
			if err := caddy.Load(config(reloads), true); err != nil {
				t.Errorf("reload %d: %v", reloads, err)
			}
			nextReload = nextReload.Add(reloadEvery)
		}
		if now.After(nextRestart) {
			restarts++
			srv.Restart(t)
			nextRestart = nextRestart.Add(restartEvery)
		}
		if now.After(nextReport) {
			total := int64(0)
			for i := range statuses {
				total += statuses[i].Load()
			}
			row := fmt.Sprintf("| %d | %.0f | %d | %d | %d | %d | %d | %d | %.0f | %.0f | %d | %d |",
				int(time.Since(start).Round(time.Minute)/time.Minute), rssMB(), runtime.NumGoroutine(), redisConnections(rdb),
				total, statuses[200].Load(), statuses[429].Load(), statuses[503].Load(),
				testutil.ToFloat64(limiterMetrics.decisions.WithLabelValues(defaultZone, resultFailedClosed)),
				testutil.ToFloat64(limiterMetrics.decisions.WithLabelValues(defaultZone, resultLocalAllowed))+
					testutil.ToFloat64(limiterMetrics.decisions.WithLabelValues(defaultZone, resultLocalDenied)),
				reloads, restarts)
			rows = append(rows, row)
			t.Log(row)
			nextReport = nextReport.Add(time.Minute)
		}
	}
	close(stop)
	load.Wait()

	// Exactness on fresh keys, once Redis decides again.
	probe := soakClient("127.0.0.200")
	for deadline := time.Now().Add(10 * time.Second); ; {
		if res, err := probe.Get("http://" + addr + "/"); err == nil {
			res.Body.Close()
			if res.Header.Get("RateLimit") != "" || res.Header.Get("X-RateLimit-Limit") != "" {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("no decision by Redis within 10s after the load")
		}
		time.Sleep(50 * time.Millisecond)
	}
	var exact []string
	var wrong atomic.Int64
	var clients sync.WaitGroup
	for i := range 10 {
		c := soakClient("127.0.0." + strconv.Itoa(210+i))
		clients.Go(func() {
			var admitted atomic.Int64
			var burst sync.WaitGroup
			for range maxRequests + 20 {
				burst.Go(func() {
					if res, err := c.Get("http://" + addr + "/"); err == nil {
						res.Body.Close()
						if res.StatusCode == http.StatusOK {
							admitted.Add(1)
						}
					}
				})
			}
			burst.Wait()
			if admitted.Load() != maxRequests {
				wrong.Add(1)
				t.Errorf("fresh client %d: %d of %d admitted, want exactly %d", i, admitted.Load(), maxRequests+20, maxRequests)
			}
		})
	}
	clients.Wait()
	exact = append(exact, fmt.Sprintf("Afterwards, 10 fresh clients sent %d requests each at once: %d of them got other than exactly %d admitted.",
		maxRequests+20, wrong.Load(), maxRequests))
	t.Log(exact[0])

	report := fmt.Sprintf(`%v of mixed load on Caddy with this module in one process (%s, GOMAXPROCS %d): four clients
flooding and twenty at five requests a second, limit %d per %s, fail_mode alternating closed and local;
a config reload every %v and a Redis restart (empty) every %v. Written by `+"`make soak`"+`.

%s

%d transport errors (connections closed by reloads). %s
`, duration, runtime.Version(), runtime.GOMAXPROCS(0), maxRequests, window, reloadEvery, restartEvery,
		strings.Join(rows, "\n"), transportErrors.Load(), exact[0])
	writeSoakSection(t, "Mixed load", report)
}

// soakClient sends requests from ip, on keep-alive connections.
func soakClient(ip string) *http.Client {
	dialer := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 5 * time.Second}
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: dialer.DialContext, MaxIdleConnsPerHost: 100}}
}

// rssMB returns the resident set size of this process in MB, or -1.
func rssMB() float64 {
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return -1
	}
	m := regexp.MustCompile(`VmRSS:\s+(\d+) kB`).FindSubmatch(status)
	if m == nil {
		return -1
	}
	kb, _ := strconv.Atoi(string(m[1]))
	return float64(kb) / 1024
}

// redisConnections returns Redis's connected_clients, or -1 while it is
// away.
func redisConnections(rdb *redis.Client) int {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	info, err := rdb.Info(ctx, "clients").Result()
	if err != nil {
		return -1
	}
	m := regexp.MustCompile(`connected_clients:(\d+)`).FindStringSubmatch(info)
	if m == nil {
		return -1
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// Connection storm: many clients connect at once to a zone with a wait.
// Caddy runs in this process; the clients in a child process (this test
// binary again, TestSoakStormClients), so that the RSS measured is Caddy's
// and not theirs, while both share the host's CPUs as a storm does.

// stormClientsEnv, set in the child's environment, is the address the
// clients send to; stormCountEnv how many clients connect.
const (
	stormClientsEnv = "SOAK_STORM_ADDR"
	stormCountEnv   = "SOAK_STORM_CLIENTS"
)

// stormResult is what the child reports once every client has had its
// answers: counts by status, and latencies of the first request of each
// client (connect included) and of the second (held for its slot).
type stormResult struct {
	Statuses             map[int]int
	TransportErrors      int
	FirstP50, FirstP99   time.Duration
	SecondP50, SecondP99 time.Duration
	Elapsed              time.Duration
}

// stormSample is what TestSoakStorm measures at one point.
type stormSample struct {
	label                string
	rss                  float64
	goroutines           int
	redisConns, poolConn int
	heapMB, stackMB      float64
	releasedMB           float64
}

// TestSoakStormClients is the child of TestSoakStorm: it does nothing
// unless stormClientsEnv is set.
func TestSoakStormClients(t *testing.T) {
	addr := os.Getenv(stormClientsEnv)
	if addr == "" {
		t.Skip("the clients of TestSoakStorm, run by it")
	}
	n, err := strconv.Atoi(os.Getenv(stormCountEnv))
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu     sync.Mutex
		res    = stormResult{Statuses: map[int]int{}}
		first  []time.Duration
		second []time.Duration
	)
	transports := make([]*http.Transport, n)
	start := make(chan struct{})
	var ready, done sync.WaitGroup
	for i := range n {
		tr := &http.Transport{MaxConnsPerHost: 1, MaxIdleConnsPerHost: 1, DisableCompression: true}
		transports[i] = tr
		c := &http.Client{Transport: tr, Timeout: 30 * time.Second}
		ready.Add(1)
		done.Go(func() {
			ready.Done()
			<-start
			for j := range 2 {
				req, _ := http.NewRequest("GET", "http://"+addr+"/", nil)
				req.Header.Set("X-Client", "storm-"+strconv.Itoa(i))
				t0 := time.Now()
				resp, err := c.Do(req)
				took := time.Since(t0)
				mu.Lock()
				if err != nil {
					res.TransportErrors++
				} else {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					res.Statuses[resp.StatusCode]++
					if j == 0 {
						first = append(first, took)
					} else {
						second = append(second, took)
					}
				}
				mu.Unlock()
			}
		})
	}
	ready.Wait()
	t0 := time.Now()
	close(start)
	done.Wait()
	res.Elapsed = time.Since(t0)
	res.FirstP50, res.FirstP99 = quantile(first, 0.5), quantile(first, 0.99)
	res.SecondP50, res.SecondP99 = quantile(second, 0.5), quantile(second, 0.99)
	out, _ := json.Marshal(res)
	fmt.Printf("storm %s\n", out)
	// Hold the connections open, idle, until the parent says.
	bufio.NewReader(os.Stdin).ReadString('\n')
	for _, tr := range transports {
		tr.CloseIdleConnections()
	}
	fmt.Println("closed")
}

func quantile(d []time.Duration, q float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	slices.Sort(d)
	return d[min(len(d)-1, int(float64(len(d))*q))]
}

// TestSoakStorm connects SOAK_STORM_CLIENTS clients (default 5,000) at once
// to a zone with a wait, each sending two requests on its connection (the
// second held about a second for its slot), and records how many decisions
// took the fail mode, how often the breaker opened, and Caddy's RSS before,
// at its peak, with the connections held idle and for five minutes after
// they close (SOAK_STORM_SHORT: ten seconds). It writes its row, labelled
// SOAK_STORM_LABEL ("this tree" by default), into its section of SOAK.md,
// keeping the rows of other labels. Run it with `make soak`.
func TestSoakStorm(t *testing.T) {
	clients := 5000
	if s := os.Getenv(stormCountEnv); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil {
			t.Fatalf("%s: %v", stormCountEnv, err)
		}
		clients = n
	}
	srv := redistest.Start(t)
	port, err := redistest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	config := fmt.Sprintf(`{
	"admin": {"disabled": true},
	"logging": {"logs": {"default": {"level": "ERROR"}}},
	"apps": {"http": {"servers": {"storm": {
		"listen": [%q],
		"routes": [{"handle": [
			{"handler": "sliding_ratelimit", "window": "1s", "max_requests": 1, "wait": "5s",
			 "max_waiting": %d, "key": "{http.request.header.X-Client}",
			 "redis": %q, "key_prefix": "storm:", "timeout": "100ms", "fail_mode": "open"},
			{"handler": "static_response", "body": "ok"}
		]}]
	}}}}
}`, addr, clients, srv.URL())
	if err := caddy.Load([]byte(config), true); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = caddy.Stop() })
	conn, err := redisconn.Open("", srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rdb := srv.Client(t)

	// Warm up: the script loaded, a connection or two open.
	warm := soakClient("127.0.0.1")
	for i := range 20 {
		req, _ := http.NewRequest("GET", "http://"+addr+"/", nil)
		req.Header.Set("X-Client", "warm-"+strconv.Itoa(i))
		if res, err := warm.Do(req); err == nil {
			res.Body.Close()
		}
	}
	warm.CloseIdleConnections()
	time.Sleep(2 * time.Second)

	take := func(label string) stormSample {
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		s := stormSample{label, rssMB(), runtime.NumGoroutine(), redisConnections(rdb), int(conn.Client().PoolStats().TotalConns),
			float64(m.HeapInuse) / (1 << 20), float64(m.StackInuse) / (1 << 20), float64(m.HeapReleased) / (1 << 20)}
		t.Logf("%s: RSS %.0f MB, %d goroutines, Redis connections %d (pool %d), heap in use %.0f MB, stacks %.0f MB, released %.0f MB",
			label, s.rss, s.goroutines, s.redisConns, s.poolConn, s.heapMB, s.stackMB, s.releasedMB)
		return s
	}
	failedOpen := func() float64 {
		return testutil.ToFloat64(limiterMetrics.decisions.WithLabelValues(defaultZone, resultFailedOpen))
	}
	samples := []stormSample{take("before")}
	openedBefore, failedBefore := conn.Breaker().Openings(), failedOpen()

	child := exec.Command(os.Args[0], "-test.run=^TestSoakStormClients$", "-test.v")
	child.Env = append(os.Environ(), stormClientsEnv+"="+addr, stormCountEnv+"="+strconv.Itoa(clients))
	stdin, err := child.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	child.Stderr = os.Stderr
	var peak atomic.Int64
	stopPeak := make(chan struct{})
	var sampler sync.WaitGroup
	sampler.Go(func() {
		for {
			if r := int64(rssMB()); r > peak.Load() {
				peak.Store(r)
			}
			select {
			case <-stopPeak:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	})
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	lines := bufio.NewScanner(stdout)
	var res stormResult
	for lines.Scan() {
		if js, ok := strings.CutPrefix(lines.Text(), "storm "); ok {
			if err := json.Unmarshal([]byte(js), &res); err != nil {
				t.Fatal(err)
			}
			break
		}
	}
	held := take("connections held")
	opened, failed := conn.Breaker().Openings()-openedBefore, failedOpen()-failedBefore
	decisions := 2 * clients
	t.Logf("storm: %d clients, %d requests in %v: statuses %v, %d transport errors; first request p50 %v p99 %v, second p50 %v p99 %v",
		clients, decisions, res.Elapsed.Round(time.Millisecond), res.Statuses, res.TransportErrors,
		res.FirstP50.Round(time.Millisecond), res.FirstP99.Round(time.Millisecond), res.SecondP50.Round(time.Millisecond), res.SecondP99.Round(time.Millisecond))
	t.Logf("storm: %.0f failed open (%.1f%%), breaker opened %d times, peak RSS %d MB", failed, 100*failed/float64(decisions), opened, peak.Load())
	fmt.Fprintln(stdin, "close")
	for lines.Scan() {
	}
	if err := child.Wait(); err != nil {
		t.Fatalf("clients: %v", err)
	}
	close(stopPeak)
	sampler.Wait()
	samples = append(samples, held)
	closed := time.Now()
	for _, after := range stormAfters() {
		time.Sleep(time.Until(closed.Add(after)))
		samples = append(samples, take(fmt.Sprintf("%v after", after)))
	}
	label := os.Getenv("SOAK_STORM_LABEL")
	if label == "" {
		label = "this tree"
	}
	row := fmt.Sprintf("| %s | %d | %d | %.0f | %.1f%% | %d | %v | %v | %v |",
		label, clients, decisions, failed, 100*failed/float64(decisions), opened,
		res.FirstP50.Round(time.Millisecond), res.FirstP99.Round(time.Millisecond), res.Elapsed.Round(time.Millisecond))
	memory := fmt.Sprintf("| %s | %.0f | %d |", label, samples[0].rss, peak.Load())
	for i := range 5 {
		if i+1 < len(samples) {
			memory += fmt.Sprintf(" %.0f |", samples[i+1].rss)
		} else {
			memory += " - |"
		}
	}
	memory += fmt.Sprintf(" %d | %d |", held.goroutines, held.poolConn)
	writeStormSection(t, row, memory, samples)
}

// stormAfters are the times after the clients closed their connections at
// which TestSoakStorm measures RSS; SOAK_STORM_SHORT keeps the first.
func stormAfters() []time.Duration {
	afters := []time.Duration{10 * time.Second, time.Minute, 150 * time.Second, 5 * time.Minute}
	if os.Getenv("SOAK_STORM_SHORT") != "" {
		afters = afters[:1]
	}
	return afters
}

// soakSection returns the body of SOAK.md's section heading, "" without
// one.
func soakSection(heading string) string {
	raw, err := os.ReadFile("SOAK.md")
	if err != nil {
		return ""
	}
	_, body, ok := strings.Cut(string(raw), "\n## "+heading+"\n")
	if !ok {
		return ""
	}
	body, _, _ = strings.Cut(body, "\n## ")
	return body
}

// stormRows are the table rows of the Connection storm section, by table
// and by their first cell (the run's label), as earlier runs wrote them.
func stormRows() (runs, memory map[string]string) {
	runs, memory = map[string]string{}, map[string]string{}
	body := soakSection("Connection storm")
	table := 0
	for _, line := range strings.Split(body, "\n") {
		if !strings.HasPrefix(line, "|") {
			if strings.TrimSpace(line) != "" && table%2 == 1 {
				table++
			}
			continue
		}
		if table%2 == 0 {
			table++ // the header
			continue
		}
		label := strings.TrimSpace(strings.Split(line, "|")[1])
		if strings.HasPrefix(label, "---") {
			continue
		}
		if table == 1 {
			runs[label] = line
		} else {
			memory[label] = line
		}
	}
	return runs, memory
}

// writeStormSection writes the Connection storm section of SOAK.md with
// this run's rows in place of any of the same label.
func writeStormSection(t *testing.T, run, memory string, samples []stormSample) {
	t.Helper()
	runs, mems := stormRows()
	label := strings.TrimSpace(strings.Split(run, "|")[1])
	runs[label], mems[label] = run, memory
	labels := slices.Sorted(maps.Keys(runs))
	var b strings.Builder
	fmt.Fprintf(&b, `Written by `+"`make soak`"+` (`+"`go test -tags soak -run '^TestSoakStorm$' .`"+`): clients connect at once, each on
its own connection with its own key, to a zone of `+"`max_requests 1`"+` per `+"`1s`"+` with `+"`wait 5s`"+`
(`+"`max_waiting`"+` as many as the clients), `+"`timeout 100ms`"+`, `+"`fail_mode open`"+`, Redis on this host. Each
client sends two requests, the second held about a second for its slot. Caddy runs in the test's process
(%s, GOMAXPROCS %d), the clients in a child process, on the same CPUs. A row per run, by its label
(`+"`SOAK_STORM_LABEL`"+`); rows of other labels are kept from earlier runs.

| run | clients | requests | failed open | share | breaker openings | first request p50 | first request p99 | storm took |
|---|---|---|---|---|---|---|---|---|
`, runtime.Version(), runtime.GOMAXPROCS(0))
	for _, l := range labels {
		b.WriteString(runs[l] + "\n")
	}
	b.WriteString(`
Caddy's RSS in MB: before the storm, at its peak, with every connection held open and idle, and after the
clients closed them; the goroutines and go-redis pool connections while they were held:

| run | before | peak | held | 10s after | 1m after | 2m30s after | 5m after | goroutines held | Redis pool held |
|---|---|---|---|---|---|---|---|---|---|
`)
	for _, l := range labels {
		if m, ok := mems[l]; ok {
			b.WriteString(m + "\n")
		}
	}
	b.WriteString("\nWhere the memory was, by the Go runtime, in this run (" + label + "):\n\n| when | RSS MB | heap in use MB | goroutine stacks MB | returned to the OS MB | goroutines |\n|---|---|---|---|---|---|\n")
	for _, s := range samples {
		fmt.Fprintf(&b, "| %s | %.0f | %.0f | %.0f | %.0f | %d |\n", s.label, s.rss, s.heapMB, s.stackMB, s.releasedMB, s.goroutines)
	}
	writeSoakSection(t, "Connection storm", b.String())
}
