package slidingratelimit

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/redistest"
)

// gate is an upstream, or an instance's next handler, that holds every
// request until it is let through (or its client leaves): requests in
// flight for as long as a test needs them.
type gate struct {
	mu      sync.Mutex
	inside  map[string]int // requests in flight, by client
	release chan struct{}  // one receive lets one request through
}

func newGate() *gate {
	return &gate{inside: make(map[string]int), release: make(chan struct{})}
}

func (g *gate) hold(client string, r *http.Request, w http.ResponseWriter) {
	g.mu.Lock()
	g.inside[client]++
	g.mu.Unlock()
	defer func() {
		g.mu.Lock()
		g.inside[client]--
		g.mu.Unlock()
	}()
	select {
	case <-g.release:
		w.WriteHeader(http.StatusOK)
	case <-r.Context().Done():
	}
}

// ServeHTTP serves as an upstream of reverse_proxy, which names the client
// in X-Forwarded-For.
func (g *gate) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	g.hold(r.Header.Get("X-Forwarded-For"), r, w)
}

// next is g as an instance's next handler.
func (g *gate) next() caddyhttp.Handler {
	return caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		host, _, _ := net.SplitHostPort(r.RemoteAddr)
		g.hold(host, r, w)
		return nil
	})
}

// waitInside waits until n requests of client are in flight.
func (g *gate) waitInside(t *testing.T, client string, n int) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		g.mu.Lock()
		got := g.inside[client]
		g.mu.Unlock()
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d requests of %s in flight, want %d", got, client, n)
		}
	}
}

// TestConcurrencyAcrossInstances: clients on 127.0.0.2 and 127.0.0.3 may
// each run two requests at once, over two instances on one Redis: a third
// is denied on either instance with 429, Retry-After 1 and the draft's
// concurrent-requests headers, the other client is not affected, and a
// request that ends gives its slot back at once.
func TestConcurrencyAcrossInstances(t *testing.T) {
	upstream, second := newGate(), newGate()
	srv := httptest.NewServer(upstream)
	defer srv.Close()
	prefix := uniquePrefix(t)
	startCaddy(t, siteBlock(":9080", prefix, `
	sliding_ratelimit {
		zone reports {
			concurrent 2
		}
	}
	reverse_proxy `+strings.TrimPrefix(srv.URL, "http://")+``))
	other := newInstance(t, `{"zones": [{"name": "reports", "concurrent": 2}],
		"redis": "`+sharedRedis.URL()+`?client_name=b", "key_prefix": "`+prefix+`"}`)
	inUse := `caddy_sliding_ratelimit_leases_in_use{zone="reports"}`
	clients := []string{"127.0.0.2", "127.0.0.3"}
	var wg sync.WaitGroup
	results := make(chan int, 8)
	for _, ip := range clients {
		wg.Add(2)
		go func() { defer wg.Done(); results <- send(t, site, from(ip)).status }()
		go func() {
			defer wg.Done()
			results <- send(t, "/", from(ip), to(other), withNext(second.next())).status
		}()
		upstream.waitInside(t, ip, 1)
		second.waitInside(t, ip, 1)
	}
	if got := scrape(t, inUse); got != 4 {
		t.Errorf("%s = %v with four requests running, want 4", inUse, got)
	}
	for _, ip := range clients {
		for _, res := range []answer{send(t, site, from(ip)), send(t, "/", from(ip), to(other), withNext(okHandler))} {
			if res.status != http.StatusTooManyRequests {
				t.Errorf("%s's third request: status %d, want 429", ip, res.status)
			}
			if got := res.header.Get("Retry-After"); got != "1" {
				t.Errorf("%s's third request: Retry-After %q, want 1", ip, got)
			}
			if got, want := res.header.Get("RateLimit-Policy"), `"reports";q=2;qu="concurrent-requests"`; got != want {
				t.Errorf("RateLimit-Policy %q, want %q", got, want)
			}
			if got, want := res.header.Get("RateLimit"), `"reports";r=0`; got != want {
				t.Errorf("RateLimit %q, want %q", got, want)
			}
		}
	}
	state := adminState(t, "reports", "127.0.0.2")
	if state.LeasesHeld == nil || *state.LeasesHeld != 2 || state.LeasesHeldHere == nil || *state.LeasesHeldHere != 1 || state.Remaining != 0 {
		t.Errorf("admin view of 127.0.0.2: %+v, want 2 leases held, 1 of them through the handler that answers", state)
	}

	// One request ends: its slot is free at once, for that client only.
	upstream.release <- struct{}{}
	if s := <-results; s != http.StatusOK {
		t.Errorf("a request let through: status %d", s)
	}
	freed := ""
	for _, ip := range clients {
		upstream.mu.Lock()
		if upstream.inside[ip] == 0 {
			freed = ip
		}
		upstream.mu.Unlock()
	}
	for _, ip := range clients {
		want := http.StatusTooManyRequests
		if ip == freed {
			want = http.StatusOK
		}
		if s := send(t, "/", from(ip), to(other), withNext(okHandler)).status; s != want {
			t.Errorf("%s after one of the four requests ended: status %d, want %d", ip, s, want)
		}
	}
	for range 3 {
		select {
		case upstream.release <- struct{}{}:
		case second.release <- struct{}{}:
		}
	}
	wg.Wait()
	close(results)
	for s := range results {
		if s != http.StatusOK {
			t.Errorf("a running request ended with status %d", s)
		}
	}
	if got := scrape(t, inUse); got != 0 {
		t.Errorf("%s = %v after every request ended, want 0", inUse, got)
	}
	for _, ip := range clients {
		if state := adminState(t, "reports", ip); *state.LeasesHeld != 0 {
			t.Errorf("%s holds %d leases after its requests ended, want 0: released, not left to expire", ip, *state.LeasesHeld)
		}
	}
}

// leaseExpiries returns the expiry times (microseconds of Redis's clock) of
// the leases a concurrency zone's key holds, and Redis's time now: the
// zone's state is a sorted set of lease ids scored by expiry
// (limiter/limit.lua).
func leaseExpiries(t *testing.T, key string) (expiries []int64, now int64) {
	t.Helper()
	return leaseExpirieson(t, sharedRedis.Client(t), key)
}

// leaseExpirieson is leaseExpiries on the Redis of c.
func leaseExpirieson(t *testing.T, c *redis.Client, key string) (expiries []int64, now int64) {
	t.Helper()
	ctx := context.Background()
	zs, err := c.ZRangeWithScores(ctx, key, 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, z := range zs {
		expiries = append(expiries, int64(z.Score))
	}
	tm, err := c.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	return expiries, tm.UnixMicro()
}

// upgrader is an upstream that switches to a raw echo protocol on request
// (a WebSocket as reverse_proxy sees one): the connection runs until the
// client closes it.
var upgrader = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	conn, rw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return
	}
	defer conn.Close()
	rw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
	rw.Flush()
	buf := make([]byte, 64)
	for {
		n, err := rw.Read(buf)
		if err != nil {
			return
		}
		rw.Write(buf[:n])
		rw.Flush()
	}
})

// openUpgraded asks Caddy on site for an upgraded connection from ip and
// returns it with the status of the answer; the connection is nil unless
// the status is 101.
func openUpgraded(t *testing.T, ip string) (net.Conn, int) {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 5 * time.Second}
	conn, err := d.Dial("tcp", "127.0.0.1:9080")
	if err != nil {
		t.Fatal(err)
	}
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	req, _ := http.NewRequest(http.MethodGet, site+"ws", nil)
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", "websocket")
	if err := req.Write(conn); err != nil {
		t.Fatal(err)
	}
	res, err := http.ReadResponse(bufio.NewReader(conn), req)
	if err != nil {
		t.Fatalf("reading the answer to an upgrade: %v", err)
	}
	if res.StatusCode != http.StatusSwitchingProtocols {
		conn.Close()
		return nil, res.StatusCode
	}
	return conn, res.StatusCode
}

// echo sends a message on an upgraded connection and reads it back.
func echo(t *testing.T, conn net.Conn) {
	t.Helper()
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := conn.Write([]byte("ping")); err != nil {
		t.Fatalf("writing on the upgraded connection: %v", err)
	}
	buf := make([]byte, 4)
	if _, err := io.ReadFull(conn, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("reading the echo: %q, %v", buf, err)
	}
}

// TestLeaseKeptForWebSocket: a WebSocket through reverse_proxy holds its
// slot for as long as it runs, well past the lease time, because its
// instance extends the lease; when it closes, the slot is released at once,
// not left to expire.
func TestLeaseKeptForWebSocket(t *testing.T) {
	srv := httptest.NewServer(upgrader)
	defer srv.Close()
	prefix := uniquePrefix(t)
	startCaddy(t, siteBlock(":9080", prefix, `
	sliding_ratelimit {
		zone ws {
			concurrent 1
			lease 2s
		}
	}
	reverse_proxy `+strings.TrimPrefix(srv.URL, "http://")+``))
	key := prefix + "{127.0.0.2}:ws:concurrent"
	lost := `caddy_sliding_ratelimit_leases_lost_total{zone="ws"}`
	lostBefore := scrape(t, lost)
	conn, status := openUpgraded(t, "127.0.0.2")
	if status != http.StatusSwitchingProtocols {
		t.Fatalf("the first WebSocket: status %d, want 101", status)
	}
	defer conn.Close()
	first, _ := leaseExpiries(t, key)
	if len(first) != 1 {
		t.Fatalf("%d leases while one WebSocket runs, want 1", len(first))
	}
	// Twice the lease time, talking all along.
	for end := time.Now().Add(4 * time.Second); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
		echo(t, conn)
	}
	if _, status := openUpgraded(t, "127.0.0.2"); status != http.StatusTooManyRequests {
		t.Errorf("a second WebSocket after twice the lease time: status %d, want 429 (the first still holds its slot)", status)
	}
	expiries, now := leaseExpiries(t, key)
	if len(expiries) != 1 || expiries[0] <= first[0] || expiries[0] <= now {
		t.Fatalf("lease expiries %v at %d, first %v: want the one lease extended, still valid", expiries, now, first)
	}
	conn.Close()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		left, now := leaseExpiries(t, key)
		if len(left) == 0 {
			if now >= expiries[0] {
				t.Errorf("the lease went at %d, after its expiry %d: it expired, it was not released", now, expiries[0])
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the lease is still held after the WebSocket closed: %v", left)
		}
	}
	conn, status = openUpgraded(t, "127.0.0.2")
	if status != http.StatusSwitchingProtocols {
		t.Fatalf("a WebSocket after the first closed: status %d, want 101", status)
	}
	conn.Close()
	if got := scrape(t, lost) - lostBefore; got != 0 {
		t.Errorf("%s grew by %v, want 0", lost, got)
	}
}

// startCaddyProcess runs a second Caddy, in a process of its own (this test
// binary as the caddy command), on the sites of caddyfile with the admin
// API off, and returns it once url answers 200. The test's end kills it.
func startCaddyProcess(t *testing.T, caddyfile, url string) *exec.Cmd {
	t.Helper()
	dir := t.TempDir()
	path := filepath.Join(dir, "Caddyfile")
	config := "{\n\tadmin off\n\tpersist_config off\n\tauto_https off\n\tgrace_period 1ns\n}\n" + caddyfile
	if err := os.WriteFile(path, []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self, "run", "--config", path, "--adapter", "caddyfile")
	cmd.Env = append(os.Environ(), caddyMainEnv+"=1", "XDG_DATA_HOME="+dir, "XDG_CONFIG_HOME="+dir)
	logs, err := os.Create(filepath.Join(dir, "caddy.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logs.Close()
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-exited
		if t.Failed() {
			out, _ := os.ReadFile(logs.Name())
			t.Logf("the second Caddy's log:\n%s", out)
		}
	})
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		res, err := http.Get(url)
		if err == nil {
			res.Body.Close()
			if res.StatusCode == http.StatusOK {
				return cmd
			}
		}
		select {
		case <-exited:
			t.Fatalf("the second Caddy exited during start-up")
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("the second Caddy does not answer %s: %v", url, err)
		}
	}
}

// TestLeasesOfAKilledInstanceExpire: a Caddy process killed while two
// requests of a client run through it never releases their leases; the
// client gets its slots back on the other instance when the leases expire,
// a lease time after the last extension, and not before.
func TestLeasesOfAKilledInstanceExpire(t *testing.T) {
	upstream := newGate()
	srv := httptest.NewServer(upstream)
	defer srv.Close()
	prefix := uniquePrefix(t)
	const lease = 3 * time.Second
	limiter := `
	sliding_ratelimit /jobs* {
		zone jobs {
			concurrent 2
			lease 3s
		}
	}`
	startCaddy(t, siteBlock(":9080", prefix, limiter+"\n\trespond \"ok\""))
	doomed := startCaddyProcess(t, siteBlock(":9180", prefix, limiter+"\n\treverse_proxy /jobs* "+strings.TrimPrefix(srv.URL, "http://")+"\n\trespond /ready \"ok\"")+"\n",
		"http://127.0.0.1:9180/ready")

	client := clientAt(t, "127.0.0.2")
	for range 2 {
		go func() {
			// Cut off when the process dies.
			if res, err := client.Get("http://127.0.0.1:9180/jobs"); err == nil {
				res.Body.Close()
			}
		}()
	}
	upstream.waitInside(t, "127.0.0.2", 2)
	if s := send(t, site+"jobs", from("127.0.0.2")).status; s != http.StatusTooManyRequests {
		t.Fatalf("a third job on the other instance while two run: status %d, want 429", s)
	}

	if err := doomed.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	upstream.waitInside(t, "127.0.0.2", 0)
	key := prefix + "{127.0.0.2}:jobs:concurrent"
	expiries, killed := leaseExpiries(t, key)
	if len(expiries) != 2 {
		t.Fatalf("%d leases after the kill, want the 2 it never released", len(expiries))
	}
	if expiries[1]-killed > lease.Microseconds() {
		t.Errorf("a lease expires %v after the kill, more than the lease time %v", time.Duration(expiries[1]-killed)*time.Microsecond, lease)
	}
	// Each answer is checked against Redis's clock around it: denied only
	// while both leases are valid, admitted only once one has expired.
	denials := 0
	for deadline := time.Now().Add(lease + 5*time.Second); ; time.Sleep(100 * time.Millisecond) {
		_, before := leaseExpiries(t, key)
		res := send(t, site+"jobs", from("127.0.0.2"))
		_, after := leaseExpiries(t, key)
		if res.status == http.StatusOK {
			if after < expiries[0] {
				t.Errorf("admitted by %d, before the first lease expired at %d", after, expiries[0])
			}
			break
		}
		denials++
		if res.status != http.StatusTooManyRequests || before >= expiries[0] {
			t.Errorf("status %d from %d, want 429 only before the first lease expires at %d", res.status, before, expiries[0])
		}
		if time.Now().After(deadline) {
			t.Fatal("the dead instance's leases never expired")
		}
	}
	if denials == 0 {
		t.Errorf("the client was admitted at once after the kill: its slots should stay taken until the leases expire")
	}
}

// TestLeaseExtensionsAreBatched: many long requests cost the store batched
// extensions, not a script call per lease and extension: 200 requests that
// run through several extensions each take fewer script calls than there
// are requests, and every lease stays valid.
func TestLeaseExtensionsAreBatched(t *testing.T) {
	srv := redistest.Start(t)
	prefix := uniquePrefix(t)
	in := newInstance(t, `{"zones": [{"name": "long", "concurrent": 1000, "lease": "600ms"}],
		"key": "{http.request.header.X-Client}", "redis": "`+srv.URL()+`", "key_prefix": "`+prefix+`", "timeout": "1s"}`)
	const requests = 200
	upstream := newGate()
	var wg sync.WaitGroup
	for i := range requests {
		wg.Add(1)
		go func() {
			defer wg.Done()
			send(t, "/", from("127.0.0.2"), withHeader("X-Client", "c"+strconv.Itoa(i%20)), to(in), withNext(upstream.next()))
		}()
	}
	upstream.waitInside(t, "127.0.0.2", requests)
	lost := limiterMetrics.leasesLost.WithLabelValues("long")
	lostBefore := counterValue(t, lost)
	calls := func() int64 {
		info, err := srv.Client(t).Info(context.Background(), "commandstats").Result()
		if err != nil {
			t.Fatal(err)
		}
		var n int64
		for _, line := range strings.Split(info, "\n") {
			for _, cmd := range []string{"cmdstat_fcall:calls=", "cmdstat_evalsha:calls=", "cmdstat_eval:calls="} {
				if rest, ok := strings.CutPrefix(line, cmd); ok {
					c, _ := strconv.ParseInt(rest[:strings.IndexByte(rest, ',')], 10, 64)
					n += c
				}
			}
		}
		return n
	}
	before := calls()
	// Six lease times: each lease needs at least six extensions to live.
	time.Sleep(3600 * time.Millisecond)
	extensions := calls() - before
	valid := 0
	for c := range 20 {
		expiries, now := leaseExpirieson(t, srv.Client(t), prefix+"{=c"+strconv.Itoa(c)+"}:long:concurrent")
		for _, e := range expiries {
			if e > now {
				valid++
			}
		}
	}
	t.Logf("%d script calls in %v for %d running requests", extensions, 3600*time.Millisecond, requests)
	if valid != requests {
		t.Errorf("%d valid leases after six lease times, want %d", valid, requests)
	}
	if got := counterValue(t, lost) - lostBefore; got != 0 {
		t.Errorf("leases_lost_total grew by %v, want 0", got)
	}
	if extensions >= requests {
		t.Errorf("%d script calls to extend %d leases six times each, want fewer than %d: extensions are batched", extensions, requests, requests)
	}
	for range requests {
		upstream.release <- struct{}{}
	}
	wg.Wait()
}

// counterValue reads a counter of this process's collectors.
func counterValue(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// TestLostLeaseIsCountedAlone: when a running request's lease is gone from
// the store before its extension (here deleted by hand, as a long outage
// would let it expire), the keeper counts that lease as lost, and only
// that one: the others extended with it stay valid.
func TestLostLeaseIsCountedAlone(t *testing.T) {
	srv := redistest.Start(t)
	prefix := uniquePrefix(t)
	in := newInstance(t, `{"zones": [{"name": "gone", "concurrent": 5, "lease": "600ms"}],
		"key": "{http.request.header.X-Client}", "redis": "`+srv.URL()+`", "key_prefix": "`+prefix+`", "timeout": "1s"}`)
	upstream := newGate()
	var wg sync.WaitGroup
	for _, c := range []string{"a", "b", "c"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			send(t, "/", from("127.0.0.2"), withHeader("X-Client", c), to(in), withNext(upstream.next()))
		}()
	}
	upstream.waitInside(t, "127.0.0.2", 3)
	lost := limiterMetrics.leasesLost.WithLabelValues("gone")
	before := counterValue(t, lost)
	key := func(c string) string { return prefix + "{=" + c + "}:gone:concurrent" }
	if err := srv.Client(t).Del(context.Background(), key("b")).Err(); err != nil {
		t.Fatal(err)
	}
	// Three lease times: several extensions of each.
	time.Sleep(1800 * time.Millisecond)
	if got := counterValue(t, lost) - before; got != 1 {
		t.Errorf("leases_lost_total grew by %v, want 1 (b's)", got)
	}
	for _, c := range []string{"a", "c"} {
		expiries, now := leaseExpirieson(t, srv.Client(t), key(c))
		if len(expiries) != 1 || expiries[0] <= now {
			t.Errorf("%s's lease: %v at %d, want one, still valid", c, expiries, now)
		}
	}
	for range 3 {
		upstream.release <- struct{}{}
	}
	wg.Wait()
}

// TestLeaseKeptAcrossReload: a request that runs on after its config is
// replaced (its handler cleaned up, a new one on the same Redis) keeps its
// slot: the old handler's keeper extends it until the request ends, then
// the slot is released.
func TestLeaseKeptAcrossReload(t *testing.T) {
	prefix := uniquePrefix(t)
	config := `{"zones": [{"name": "held", "concurrent": 1, "lease": "600ms"}],
		"redis": "` + sharedRedis.URL() + `", "key_prefix": "` + prefix + `"}`
	old := newInstance(t, config)
	upstream := newGate()
	done := make(chan int)
	go func() { done <- send(t, "/", from("127.0.0.2"), to(old), withNext(upstream.next())).status }()
	upstream.waitInside(t, "127.0.0.2", 1)
	// The reload: the new config's handler first, then the old one goes.
	current := newInstance(t, config)
	if err := old.Cleanup(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1800 * time.Millisecond) // three lease times
	key := prefix + "{127.0.0.2}:held:concurrent"
	if expiries, now := leaseExpiries(t, key); len(expiries) != 1 || expiries[0] <= now {
		t.Fatalf("the running request's lease: %v at %d, want one, still valid three lease times after the reload", expiries, now)
	}
	if s := send(t, "/", from("127.0.0.2"), to(current), withNext(okHandler)).status; s != http.StatusTooManyRequests {
		t.Errorf("a request to the new config while the old one's runs: status %d, want 429", s)
	}
	upstream.release <- struct{}{}
	if s := <-done; s != http.StatusOK {
		t.Errorf("the running request: status %d", s)
	}
	if expiries, _ := leaseExpiries(t, key); len(expiries) != 0 {
		t.Errorf("%d leases after the request ended, want 0: released", len(expiries))
	}
	if s := send(t, "/", from("127.0.0.2"), to(current), withNext(okHandler)).status; s != http.StatusOK {
		t.Errorf("a request after the old one ended: status %d, want 200", s)
	}
}

// TestLeaseReleasedWhenTheClientHangsUp: a client that hangs up in the
// middle of a streamed response (reverse_proxy then aborts the handler
// chain) gives its slot back at once, not after the lease time: with one
// slot, its next request is admitted while the lease of the first would
// still run for a minute.
func TestLeaseReleasedWhenTheClientHangsUp(t *testing.T) {
	upstream := usageUpstream(t)
	zone := uniqueZone("hangup")
	startCaddy(t, siteBlock(":9080", uniquePrefix(t), `
	sliding_ratelimit {
		zone `+zone+` {
			concurrent 1
			lease 1m
		}
	}
	reverse_proxy `+upstream+` {
		flush_interval -1
	}`))
	req, err := http.NewRequest(http.MethodGet, site, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-Test-Bytes", strconv.Itoa(64<<20))
	req.Header.Set("X-Test-Chunk", strconv.Itoa(64<<10))
	req.Header.Set("X-Test-Chunk-Delay", "2ms")
	res, err := clientAt(t, "127.0.0.5").Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.CopyN(io.Discard, res.Body, 64<<10); err != nil {
		t.Fatal(err)
	}
	if s := send(t, site, from("127.0.0.5")).status; s != http.StatusTooManyRequests {
		t.Fatalf("a second request while the stream runs: status %d, want 429", s)
	}
	// Closing a body not read to its end closes the connection.
	res.Body.Close()
	status := 0
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if status = send(t, site, from("127.0.0.5")).status; status == http.StatusOK {
			break
		}
	}
	if status != http.StatusOK {
		t.Errorf("after the client hung up: status %d, want 200 within seconds (the lease given back, not left to expire)", status)
	}
}

// TestLeaseLostWithRedisData: Redis restarts (without persistence) while a
// request runs under a lease: the lease is gone long before its lease time
// could run out. The keeper's next extension finds it gone, and the log
// says what happened (the store lost its data), not that the store was away
// too long; store_errors_total{reason="data_lost"} counts it.
func TestLeaseLostWithRedisData(t *testing.T) {
	srv := redistest.Start(t)
	upstream := newGate()
	backend := httptest.NewServer(upstream)
	defer backend.Close()
	logFile := startCaddy(t, `
:9080 {
	sliding_ratelimit {
		zone flight {
			concurrent 1
			lease 3s
		}
		redis `+srv.URL()+`
	}
	reverse_proxy `+strings.TrimPrefix(backend.URL, "http://")+`
}`)
	dataLost := `caddy_sliding_ratelimit_store_errors_total{reason="data_lost"}`
	before := scrape(t, dataLost)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		send(t, site, from("127.0.0.2"))
	}()
	defer wg.Wait()
	upstream.waitInside(t, "127.0.0.2", 1)
	srv.Restart(t)
	// The lease is extended a third of its lease time after it was taken:
	// within a second of the restart.
	counted := pollUntil(5*time.Second, func() bool { return scrape(t, dataLost) > before })
	upstream.release <- struct{}{}
	lines := logLines(t, logFile, "lease")
	t.Logf("the log about the lease: %q", lines)
	if !counted {
		t.Errorf("%s did not grow after a restart took the lease", dataLost)
	}
	if got := logLines(t, logFile, "lease was gone from the store before its lease time ran out: the store lost its data"); len(got) != 1 {
		t.Errorf("%d lines saying the store lost its data, want 1", len(got))
	}
	if got := logLines(t, logFile, "away for more than half the lease time"); len(got) != 0 {
		t.Errorf("the log blames the store's absence for a lease it lost with its data: %q", got)
	}
}
