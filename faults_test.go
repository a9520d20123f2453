package slidingratelimit

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/redistest"
)

// The tests in this file put a fault proxy between Caddy and a Redis of their
// own and check what clients get while the network misbehaves. Timings are
// logged; the bounds they are checked against are loose, since a noisy
// machine only makes answers slower.

// faultTimeout is the timeout of the sites under test.
const faultTimeout = 100 * time.Millisecond

// faultRedis starts a Redis and a fault proxy in front of it.
func faultRedis(t *testing.T) (*redistest.Server, *redistest.FaultProxy) {
	t.Helper()
	srv := redistest.Start(t)
	return srv, redistest.StartFaultProxy(t, srv.Addr())
}

// faultSite is one site on port 9080 (any host), limited through redisURL.
func faultSite(t *testing.T, redisURL, failMode string, maxRequests int) string {
	return fmt.Sprintf(`
http://:9080 {
	sliding_ratelimit {
		window 1m
		max_requests %d
		redis %s
		key_prefix %s
		timeout %s
		fail_mode %s
	}
	respond "ok"
}`, maxRequests, redisURL, uniquePrefix(t), faultTimeout, failMode)
}

// faultClient sends requests to the test Caddy from one loopback address, so
// that Caddy sees it as its own client IP.
type faultClient struct {
	ip   string
	http *http.Client
}

// newFaultClient returns a client on 127.0.0.n.
func newFaultClient(t *testing.T, n int) *faultClient {
	t.Helper()
	ip := "127.0.0." + strconv.Itoa(n)
	dialer := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 5 * time.Second}
	// No keep-alive: a connection kept from before a config load may be
	// closed under the next request by the server the load replaced.
	transport := &http.Transport{DialContext: dialer.DialContext, DisableKeepAlives: true}
	t.Cleanup(transport.CloseIdleConnections)
	return &faultClient{ip: ip, http: &http.Client{Transport: transport, Timeout: 10 * time.Second}}
}

// faultAnswer is what one request got.
type faultAnswer struct {
	status int
	// rateLimit is the RateLimit header: set by a decision of Redis (or, in
	// fail_mode local, of the in-process store), absent when failing open.
	rateLimit string
	took      time.Duration
	err       error
}

// remaining returns the r= value of the RateLimit header, or -1.
func (a faultAnswer) remaining() int {
	m := remainingRE.FindStringSubmatch(a.rateLimit)
	if m == nil {
		return -1
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

var remainingRE = regexp.MustCompile(`;r=(\d+);`)

// decided reports whether Redis (or the local store) decided: 200 or 429
// with a RateLimit header.
func (a faultAnswer) decided() bool {
	return a.err == nil && a.rateLimit != "" && (a.status == http.StatusOK || a.status == http.StatusTooManyRequests)
}

// get sends one GET for host (empty: any) and times it.
func (c *faultClient) get(host string) faultAnswer {
	req, err := http.NewRequest(http.MethodGet, "http://127.0.0.1:9080/", nil)
	if err != nil {
		return faultAnswer{err: err}
	}
	if host != "" {
		req.Host = host
	}
	start := time.Now()
	res, err := c.http.Do(req)
	if err != nil {
		return faultAnswer{err: err, took: time.Since(start)}
	}
	_, err = io.Copy(io.Discard, res.Body)
	res.Body.Close()
	return faultAnswer{status: res.StatusCode, rateLimit: res.Header.Get("RateLimit"), took: time.Since(start), err: err}
}

// burst sends n concurrent requests and returns their answers.
func (c *faultClient) burst(host string, n int) []faultAnswer {
	answers := make([]faultAnswer, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { answers[i] = c.get(host) })
	}
	wg.Wait()
	return answers
}

// slowest returns the longest time an answer took, and the median.
func slowest(answers []faultAnswer) (maxTook, median time.Duration) {
	took := make([]time.Duration, len(answers))
	for i, a := range answers {
		took[i] = a.took
	}
	slices.Sort(took)
	return took[len(took)-1], took[len(took)/2]
}

// TestFaultLatencyAboveTimeout: replies later than the timeout get the fail
// mode, each within about the timeout (after the breaker opens, at once), in
// every fail mode.
func TestFaultLatencyAboveTimeout(t *testing.T) {
	// What the decisions target (timeout + 50ms) is logged. On a host whose
	// CPUs run the process late a decision may wait up to five timeouts in
	// all (RedisOptions.Timeout), which bounds the check; the replies come
	// later still, so the fail mode applies however busy the host.
	const latency, bound = 10 * faultTimeout, 5*faultTimeout + 150*time.Millisecond
	for _, mode := range []string{failOpen, failClosed, failLocal} {
		t.Run(mode, func(t *testing.T) {
			_, proxy := faultRedis(t)
			const maxRequests = 20
			startCaddy(t, faultSite(t, proxy.URL(), mode, maxRequests))
			client := newFaultClient(t, 2)
			if a := client.get(""); !a.decided() || a.status != http.StatusOK {
				t.Fatalf("before the fault: %+v", a)
			}
			proxy.Latency(t, redistest.Downstream, latency, 0)

			var answers []faultAnswer
			for range 4 {
				answers = append(answers, client.burst("", 10)...)
				for range 10 {
					answers = append(answers, client.get(""))
				}
				time.Sleep(30 * time.Millisecond) // let probes happen
			}
			admitted, late := 0, 0
			for i, a := range answers {
				if a.err != nil {
					t.Fatalf("answer %d: %v", i, a.err)
				}
				if a.took > faultTimeout+50*time.Millisecond {
					late++
				}
				if a.took > bound {
					t.Errorf("answer %d took %v, want within %v", i, a.took, bound)
				}
				switch mode {
				case failOpen:
					if a.status != http.StatusOK || a.rateLimit != "" {
						t.Errorf("answer %d: %d %q, want 200 without a RateLimit header (failing open)", i, a.status, a.rateLimit)
					}
				case failClosed:
					if a.status != http.StatusServiceUnavailable {
						t.Errorf("answer %d: %d %q after %v, want 503", i, a.status, a.rateLimit, a.took)
					}
				case failLocal:
					if !a.decided() {
						t.Errorf("answer %d: %d %q, want a decision of the local store", i, a.status, a.rateLimit)
					}
					if a.status == http.StatusOK {
						admitted++
					}
				}
			}
			// The local store counts alone; the one admission Redis
			// recorded before the fault is not in it.
			if admitted > maxRequests {
				t.Errorf("%d admitted by the local store, want at most %d", admitted, maxRequests)
			}
			maxTook, median := slowest(answers)
			t.Logf("%s: %d answers with replies %v late: slowest %v, median %v, %d over timeout+50ms", mode, len(answers), latency, maxTook, median, late)
		})
	}
}

// TestFaultLatencyBelowTimeout: replies later than usual but within the
// timeout give exact decisions, never the fail mode.
func TestFaultLatencyBelowTimeout(t *testing.T) {
	for _, latency := range []time.Duration{20 * time.Millisecond, 50 * time.Millisecond} {
		t.Run(latency.String(), func(t *testing.T) {
			_, proxy := faultRedis(t)
			const maxRequests = 8
			startCaddy(t, faultSite(t, proxy.URL(), failClosed, maxRequests))
			// Before the latency: load the script and open the
			// pipelines' connections, as a running server has. A new
			// connection pays a round trip more for its handshake, which
			// with replies 50ms late and a 100ms timeout does not fit.
			warmUp(t)
			proxy.Latency(t, redistest.Downstream, latency, 0)
			// Clients one after another, and then several at once.
			for n := 2; n <= 3; n++ {
				client := newFaultClient(t, n)
				for i := 1; i <= maxRequests+2; i++ {
					a := client.get("")
					wantStatus, wantR := http.StatusOK, maxRequests-i
					if i > maxRequests {
						wantStatus, wantR = http.StatusTooManyRequests, 0
					}
					if a.err != nil || a.status != wantStatus || a.remaining() != wantR {
						t.Fatalf("client %s, request %d: %d %q %v, want %d with r=%d", client.ip, i, a.status, a.rateLimit, a.err, wantStatus, wantR)
					}
				}
			}
			// Then several clients at once: 48 requests in flight, more
			// than the batcher's calls for a near Redis hold.
			const clients, burst = 4, maxRequests + 4
			var wg sync.WaitGroup
			for n := 4; n < 4+clients; n++ {
				client := newFaultClient(t, n)
				wg.Go(func() {
					var answers []faultAnswer
					for len(answers) < maxRequests+4 {
						answers = append(answers, client.burst("", burst)...)
					}
					checkClientAnswers(t, client.ip, answers, maxRequests, false)
					admitted := 0
					for _, a := range answers {
						if a.status == http.StatusOK {
							admitted++
						}
					}
					if admitted != maxRequests {
						t.Errorf("client %s: %d of %d admitted, want exactly %d", client.ip, admitted, len(answers), maxRequests)
					}
				})
			}
			wg.Wait()
		})
	}
}

// warmUp sends a request, then a burst, from 127.0.0.1, whose quota the
// tests do not look at.
func warmUp(t *testing.T) {
	t.Helper()
	client := newFaultClient(t, 1)
	// The first decision dials and loads the script, which a slow machine
	// may not finish within the timeout.
	for start := time.Now(); !client.get("").decided(); {
		if time.Since(start) > 5*time.Second {
			t.Fatal("warm-up: no decision within 5s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	for _, a := range client.burst("", 20) {
		if !a.decided() {
			t.Fatalf("warm-up: %+v", a)
		}
	}
}

// checkClientAnswers checks one client's answers against its own count: no
// 500, at most maxRequests admitted, each admission telling a remaining count
// of its own (a reply given to the wrong request would repeat one, or tell
// another client's), each denial r=0. failMode allows 503s.
func checkClientAnswers(t *testing.T, ip string, answers []faultAnswer, maxRequests int, failMode bool) (admitted int) {
	t.Helper()
	seen := make(map[int]bool)
	for i, a := range answers {
		switch {
		case a.err != nil:
			t.Errorf("client %s, answer %d: %v", ip, i, a.err)
		case a.status == http.StatusOK:
			admitted++
			r := a.remaining()
			if r < 0 || r >= maxRequests || seen[r] {
				t.Errorf("client %s, answer %d: admitted with %q, want an r below %d not told before (told %v)", ip, i, a.rateLimit, maxRequests, seen)
			}
			seen[r] = true
		case a.status == http.StatusTooManyRequests:
			if a.remaining() != 0 {
				t.Errorf("client %s, answer %d: denied with %q, want r=0", ip, i, a.rateLimit)
			}
		case a.status == http.StatusServiceUnavailable && failMode:
		default:
			t.Errorf("client %s, answer %d: status %d", ip, i, a.status)
		}
	}
	if admitted > maxRequests {
		t.Errorf("client %s: %d admitted, want at most %d", ip, admitted, maxRequests)
	}
	return admitted
}

// TestFaultBrokenReplies: fragmented replies, connections cut in the middle
// of a reply, and resets, under concurrent load from several clients: never
// more admitted than max_requests, every answer consistent with its own
// client's count, no 500, and connections and goroutines bounded.
func TestFaultBrokenReplies(t *testing.T) {
	for _, fault := range []struct {
		name string
		add  func(*testing.T, *redistest.FaultProxy) redistest.Fault
		// decides: replies still arrive, so every client gets decisions by
		// Redis (a slow machine may still time some out).
		decides bool
	}{
		{"slicer", func(t *testing.T, p *redistest.FaultProxy) redistest.Fault {
			return p.Slicer(t, redistest.Downstream, 8, 6, 10*time.Microsecond)
		}, true},
		{"limit_data", func(t *testing.T, p *redistest.FaultProxy) redistest.Fault {
			return p.LimitData(t, redistest.Downstream, 600)
		}, false},
		{"reset_peer", func(t *testing.T, p *redistest.FaultProxy) redistest.Fault {
			return p.ResetPeer(t, redistest.Upstream, 0)
		}, false},
	} {
		t.Run(fault.name, func(t *testing.T) {
			srv, proxy := faultRedis(t)
			const (
				maxRequests = 10
				clients     = 6
				rounds      = 4
			)
			startCaddy(t, faultSite(t, proxy.URL(), failClosed, maxRequests))
			goroutinesBefore := runtime.NumGoroutine()
			f := fault.add(t, proxy)

			all := make([][]faultAnswer, clients)
			var wg sync.WaitGroup
			for c := range clients {
				client := newFaultClient(t, 10+c)
				wg.Go(func() {
					for range rounds {
						all[c] = append(all[c], client.burst("", 5)...)
						time.Sleep(20 * time.Millisecond)
					}
				})
			}
			wg.Wait()
			goroutinesUnderFault := runtime.NumGoroutine()
			proxy.RemoveFault(t, f)

			failed := 0
			for c, answers := range all {
				ip := "127.0.0." + strconv.Itoa(10+c)
				admitted := checkClientAnswers(t, ip, answers, maxRequests, true)
				if fault.decides && admitted == 0 {
					t.Errorf("client %s: nothing admitted through fragmented replies", ip)
				}
				for _, a := range answers {
					if a.status == http.StatusServiceUnavailable {
						failed++
					}
				}
				// After the fault, Redis's count for this client: what
				// was admitted, plus admissions whose reply was lost.
				client := newFaultClient(t, 10+c)
				var more int
				deadline := time.Now().Add(5 * time.Second)
				for {
					a := client.get("")
					if a.status == http.StatusTooManyRequests {
						break
					}
					if a.status == http.StatusOK {
						more++
						continue
					}
					if time.Now().After(deadline) {
						t.Fatalf("client %s after the fault: %+v", ip, a)
					}
					time.Sleep(10 * time.Millisecond)
				}
				if admitted+more > maxRequests {
					t.Errorf("client %s: %d admitted under the fault and %d after, want at most %d in all", ip, admitted, more, maxRequests)
				}
			}

			info, err := srv.Client(t).Info(context.Background(), "clients").Result()
			if err != nil {
				t.Fatal(err)
			}
			connected := -1
			if m := regexp.MustCompile(`connected_clients:(\d+)`).FindStringSubmatch(info); m != nil {
				connected, _ = strconv.Atoi(m[1])
			}
			// go-redis's pools: 10 per CPU for commands, 10 for
			// pipelines, a subscriber, and this test's own client.
			if maxConns := 10*runtime.GOMAXPROCS(0) + 10 + 2; connected < 0 || connected > maxConns {
				t.Errorf("Redis has %d connected clients, want at most %d", connected, maxConns)
			}
			// Goroutines: Caddy's per connection and per request ones
			// come and go; a leak per failed call would be hundreds.
			if goroutinesUnderFault > goroutinesBefore+clients*5*2+200 {
				t.Errorf("%d goroutines under the fault, %d before", goroutinesUnderFault, goroutinesBefore)
			}
			t.Logf("%s: %d requests from %d clients, %d answered 503; %d Redis connections; goroutines %d before, %d under the fault",
				fault.name, clients*rounds*5, clients, failed, connected, goroutinesBefore, goroutinesUnderFault)
		})
	}
}

// TestFaultRecovery: after a fault is removed, decisions come from Redis again
// within about 200ms (checked against a looser bound), and a burst sent at the
// first of them gets no fail-mode answer.
func TestFaultRecovery(t *testing.T) {
	const (
		target = 200 * time.Millisecond
		bound  = 600 * time.Millisecond
	)
	for _, fault := range []struct {
		name string
		add  func(*testing.T, *redistest.FaultProxy) (remove func())
	}{
		{"replies dropped", func(t *testing.T, p *redistest.FaultProxy) func() {
			f := p.Timeout(t, redistest.Downstream, 0)
			return func() { p.RemoveFault(t, f) }
		}},
		{"replies late", func(t *testing.T, p *redistest.FaultProxy) func() {
			f := p.Latency(t, redistest.Downstream, 3*faultTimeout, 0)
			return func() { p.RemoveFault(t, f) }
		}},
		{"connection refused", func(t *testing.T, p *redistest.FaultProxy) func() {
			p.Disable()
			return func() { p.Enable(t) }
		}},
	} {
		t.Run(fault.name, func(t *testing.T) {
			_, proxy := faultRedis(t)
			startCaddy(t, faultSite(t, proxy.URL(), failClosed, 1_000_000))
			warmUp(t)
			client := newFaultClient(t, 2)
			remove := fault.add(t, proxy)
			// Three seconds of light load: the breaker opens and probes
			// (about 30 times), and go-redis's pools see their
			// connections and dials fail.
			for stop := time.Now().Add(3 * time.Second); time.Now().Before(stop); {
				for i, a := range client.burst("", 5) {
					if a.err != nil || a.status != http.StatusServiceUnavailable {
						t.Fatalf("under the fault, answer %d: %d %v, want 503", i, a.status, a.err)
					}
				}
				time.Sleep(20 * time.Millisecond)
			}

			remove()
			removed := time.Now()
			var first time.Duration
			for {
				a := client.get("")
				if a.decided() {
					first = time.Since(removed)
					break
				}
				if a.err != nil || a.status != http.StatusServiceUnavailable {
					t.Fatalf("after removing the fault: %d %v, want 503 or a decision", a.status, a.err)
				}
				if time.Since(removed) > 5*time.Second {
					t.Fatal("no decision by Redis within 5s of removing the fault")
				}
				time.Sleep(5 * time.Millisecond)
			}
			answers := client.burst("", 60)
			failed := 0
			for _, a := range answers {
				if !a.decided() {
					failed++
				}
			}
			maxTook, median := slowest(answers)
			t.Logf("%s: first decision by Redis %v after the fault was removed (target %v); burst of 60 at that moment: %d fail-mode answers, slowest %v, median %v",
				fault.name, first.Round(time.Millisecond), target, failed, maxTook.Round(time.Millisecond), median.Round(time.Millisecond))
			if first > bound {
				t.Errorf("first decision by Redis %v after the fault was removed, want within %v (target %v)", first, bound, target)
			}
			if failed > 0 {
				t.Errorf("burst of 60 right after recovery: %d fail-mode answers, want none", failed)
			}

			// Again, with the burst sent the moment the fault is removed:
			// the breaker is still open for what is left of its cool-down
			// (at most 100ms), so some of it may get the fail mode; it is
			// logged, and must not wait longer than a decision.
			remove = fault.add(t, proxy)
			for stop := time.Now().Add(time.Second); time.Now().Before(stop); {
				client.burst("", 5)
				time.Sleep(20 * time.Millisecond)
			}
			remove()
			answers = client.burst("", 60)
			failed = 0
			for i, a := range answers {
				if a.err != nil || (!a.decided() && a.status != http.StatusServiceUnavailable) {
					t.Errorf("burst at removal, answer %d: %d %v, want a decision or 503", i, a.status, a.err)
				}
				if !a.decided() {
					failed++
				}
			}
			maxTook, median = slowest(answers)
			t.Logf("%s: burst of 60 sent as the fault was removed: %d fail-mode answers, slowest %v, median %v",
				fault.name, failed, maxTook.Round(time.Millisecond), median.Round(time.Millisecond))
			if maxTook > faultTimeout+250*time.Millisecond {
				t.Errorf("burst at removal: slowest answer %v, want within %v", maxTook, faultTimeout+250*time.Millisecond)
			}
		})
	}
}

// TestFaultManyOutages: after many separate outages, each recovery is as
// fast as the first. go-redis counts a pool's failed dials over its whole
// life and, once they reach its pool size, stops dialing and tries again
// only once a second; one failed dial per outage adds up.
func TestFaultManyOutages(t *testing.T) {
	const bound = 600 * time.Millisecond    // the target is 200ms
	outages := 10*runtime.GOMAXPROCS(0) + 5 // more than go-redis's default pool size
	_, proxy := faultRedis(t)
	startCaddy(t, faultSite(t, proxy.URL(), failClosed, 1_000_000))
	warmUp(t)
	client := newFaultClient(t, 2)
	var took []time.Duration
	for i := range outages {
		proxy.Disable()
		for range 3 {
			if a := client.get(""); a.err != nil || a.status != http.StatusServiceUnavailable {
				t.Fatalf("outage %d: %d %v, want 503", i, a.status, a.err)
			}
			time.Sleep(20 * time.Millisecond)
		}
		proxy.Enable(t)
		enabled := time.Now()
		for !client.get("").decided() {
			if time.Since(enabled) > 5*time.Second {
				t.Fatalf("outage %d: no decision by Redis within 5s of its end", i)
			}
			time.Sleep(5 * time.Millisecond)
		}
		took = append(took, time.Since(enabled).Round(time.Millisecond))
	}
	t.Logf("%d outages: first decision by Redis after each: %v", outages, took)
	slices.Sort(took)
	if took[len(took)-1] > bound {
		t.Errorf("slowest recovery %v, want within %v (target 200ms)", took[len(took)-1], bound)
	}
}

// TestFaultRefused: with nothing listening on the Redis port, or a host that
// does not resolve, the fail mode answers in milliseconds, not after the
// timeout: the dial is refused at once and is not retried.
func TestFaultRefused(t *testing.T) {
	const bound = faultTimeout / 2 // the target is 20ms; the bug took the whole timeout
	port, err := redistest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	startCaddy(t, faultSite(t, "redis://127.0.0.1:"+strconv.Itoa(port)+"/0", failClosed, 10))
	client := newFaultClient(t, 2)
	var took []time.Duration
	for i := range 8 {
		a := client.get("")
		if a.err != nil || a.status != http.StatusServiceUnavailable {
			t.Fatalf("request %d: %d %v, want 503", i, a.status, a.err)
		}
		if a.took > bound {
			t.Errorf("request %d took %v with the connection refused, want well under the %v timeout (within %v)", i, a.took, faultTimeout, bound)
		}
		took = append(took, a.took.Round(10*time.Microsecond))
	}
	t.Logf("connection refused: answers took %v", took)
}

// TestFaultThreeSitesOneBreaker: three sites with their own limits on one
// Redis share its client's breaker: it opens after one site's worth of
// failures, not three; one circuit_state series follows it; and its opening
// and closing are logged once each.
func TestFaultThreeSitesOneBreaker(t *testing.T) {
	_, proxy := faultRedis(t)
	var sites string
	for _, host := range []string{"a.test", "b.test", "c.test"} {
		sites += fmt.Sprintf(`
http://%s:9080 {
	sliding_ratelimit {
		zone %s {
			window 1m
			max_requests 1000
		}
		redis %s
		key_prefix %s
		timeout %s
		fail_mode closed
	}
	respond "ok"
}`, host, host[:1], proxy.URL(), uniquePrefix(t)+host[:1], faultTimeout)
	}
	logFile := startCaddy(t, sites)
	hosts := []string{"a.test", "b.test", "c.test"}
	client := newFaultClient(t, 2)
	for _, host := range hosts {
		if a := client.get(host); !a.decided() {
			t.Fatalf("%s before the fault: %+v", host, a)
		}
	}

	f := proxy.Timeout(t, redistest.Downstream, 0)
	// One request at a time, to each site in turn: those before the
	// breaker opens wait for the timeout.
	slow := 0
	for i := range 15 {
		a := client.get(hosts[i%3])
		if a.err != nil || a.status != http.StatusServiceUnavailable {
			t.Fatalf("request %d under the fault: %d %v, want 503", i, a.status, a.err)
		}
		if a.took < faultTimeout/2 {
			break
		}
		slow++
	}
	if slow > 5 {
		t.Errorf("%d requests waited for the timeout before the breaker opened, want at most 5 (one breaker for the three sites)", slow)
	}
	series := circuitSeries(t, proxy.Addr())
	if len(series) != 1 || series[0] != "1" {
		t.Errorf("circuit_state series for %s while open: %q, want one, at 1", proxy.Addr(), series)
	}

	proxy.RemoveFault(t, f)
	deadline := time.Now().Add(5 * time.Second)
	for _, host := range hosts {
		for !client.get(host).decided() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: no decision within 5s of removing the fault", host)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	series = circuitSeries(t, proxy.Addr())
	if len(series) != 1 || series[0] != "0" {
		t.Errorf("circuit_state series for %s after recovery: %q, want one, at 0", proxy.Addr(), series)
	}

	logged, err := os.ReadFile(logFile)
	if err != nil {
		t.Fatal(err)
	}
	opened := strings.Count(string(logged), "redis failing: circuit breaker open")
	closed := strings.Count(string(logged), "redis answers again: circuit breaker closed")
	if opened != 1 || closed != 1 {
		t.Errorf("log has %d opening and %d closing lines, want 1 each", opened, closed)
	}
	t.Logf("%d requests waited for the timeout before the shared breaker opened; %d opening and %d closing log lines", slow, opened, closed)
}

// circuitSeries returns the values of the circuit_state series labelled with
// addr, from Caddy's metrics endpoint, and fails if any series has no redis
// label.
func circuitSeries(t *testing.T, addr string) []string {
	t.Helper()
	res, err := http.Get("http://localhost:2999/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	var values []string
	for _, line := range strings.Split(string(body), "\n") {
		name, rest, ok := strings.Cut(line, " ")
		if !ok || !strings.HasPrefix(name, "caddy_sliding_ratelimit_circuit_state") {
			continue
		}
		if !strings.Contains(name, `redis="`) {
			t.Errorf("circuit_state series without a redis label: %q", line)
		}
		if strings.Contains(name, `redis="`+addr+`"`) {
			values = append(values, rest)
		}
	}
	return values
}

// TestFaultDeadRedisLoad floods a site whose Redis receives commands but never
// answers (replies dropped) and counts the commands Redis receives (scripts,
// and the handshakes of new connections, whose replies are dropped too): the
// failures that open the breaker, then one probe per cool-down, whatever the
// flood. The count is logged per second and checked against that bound.
func TestFaultDeadRedisLoad(t *testing.T) {
	const (
		flood   = 2 * time.Second
		clients = 8
	)
	srv, proxy := faultRedis(t)
	startCaddy(t, faultSite(t, proxy.URL(), failClosed, 1_000_000))
	warmUp(t)
	rdb := srv.Client(t)
	// Commands processed, less this INFO itself.
	commands := func() int {
		info, err := rdb.Info(context.Background(), "stats").Result()
		if err != nil {
			t.Fatal(err)
		}
		m := regexp.MustCompile(`total_commands_processed:(\d+)`).FindStringSubmatch(info)
		if m == nil {
			t.Fatalf("no total_commands_processed in %q", info)
		}
		n, _ := strconv.Atoi(m[1])
		return n - 1
	}
	proxy.Timeout(t, redistest.Downstream, 0)
	before := commands()
	var requests sync.WaitGroup
	var sent, failed sync.Map
	for c := range clients {
		client := newFaultClient(t, 20+c)
		requests.Go(func() {
			n, f := 0, 0
			for stop := time.Now().Add(flood); time.Now().Before(stop); n++ {
				if a := client.get(""); a.status != http.StatusServiceUnavailable {
					f++
				}
			}
			sent.Store(c, n)
			failed.Store(c, f)
		})
	}
	requests.Wait()
	calls := commands() - before - 1 // the first INFO
	total, other := 0, 0
	sent.Range(func(_, n any) bool { total += n.(int); return true })
	failed.Range(func(_, n any) bool { other += n.(int); return true })
	if other > 0 {
		t.Errorf("%d answers were not 503", other)
	}
	// The failures that open the breaker (every client may be in flight
	// then), and at most one probe per shortest cool-down after, each with
	// a few handshake commands (HELLO, CLIENT SETINFO) on a new connection.
	bound := 4 * (5 + clients + int(flood/(25*time.Millisecond)))
	t.Logf("flood of %d requests in %v (%.0f/s) against a Redis that never answers: %d commands reached it (%.1f/s; bound %d)",
		total, flood, float64(total)/flood.Seconds(), calls, float64(calls)/flood.Seconds(), bound)
	if calls > bound {
		t.Errorf("%d commands reached a dead Redis in %v, want at most %d", calls, flood, bound)
	}
}
