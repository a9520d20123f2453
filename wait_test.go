package slidingratelimit

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/redis/go-redis/v9"
)

// admissionTimes returns the admission times a sliding-log key of a count
// zone holds, oldest first, in microseconds of Redis's clock: what the
// store recorded, promised admissions at their future times included. It
// reads the ring as limiter/limit.lua lays it out (and
// limiter/ringlayout_test.go checks): a small count ring (tag 4), cap and
// head (u8 each) and 18 header bytes in all, or a count ring (tag 3), cap
// and head (u32 each) and 122 bytes of header and mirror; the count (u32)
// at byte 9 in both; then cap entries of 6 bytes, each a time in
// microseconds modulo 2^48, read as the one nearest to now.
func admissionTimes(t *testing.T, c *redis.Client, key string) []int64 {
	t.Helper()
	ctx := context.Background()
	v, err := c.Get(ctx, key).Bytes()
	if err != nil {
		t.Fatalf("reading %s: %v", key, err)
	}
	now, err := c.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(v) < 18 {
		t.Fatalf("%s: %d bytes, not a ring", key, len(v))
	}
	header, capacity, head, count := 0, 0, 0, int(binary.BigEndian.Uint32(v[9:]))
	switch v[0] {
	case 4:
		header, capacity, head = 18, int(v[1]), int(v[2])
	case 8: // 4 with the count a u8 and the max of the newest record
		header, capacity, head, count = 18, int(v[1]), int(v[2]), int(v[9])
	case 3, 7: // 7: 3 with the max of the newest record after the header
		header, capacity, head = 122+6*int(v[0]/7), int(binary.BigEndian.Uint32(v[1:])), int(binary.BigEndian.Uint32(v[5:]))
	}
	if header == 0 || len(v) != header+6*capacity || count > capacity {
		t.Fatalf("%s: not a count ring of a layout this test reads (version %d, %d bytes, cap %d, count %d)", key, v[0], len(v), capacity, count)
	}
	const mod48 = 1 << 48
	base := now.UnixMicro() - mod48/4*3
	times := make([]int64, count)
	for i := range times {
		off := header + 6*((head+i)%capacity)
		var b [8]byte
		copy(b[2:], v[off:off+6])
		times[i] = base + ((int64(binary.BigEndian.Uint64(b[:]))-base)%mod48+mod48)%mod48
	}
	return times
}

// checkPacing checks that admission times (microseconds, oldest first)
// never put more than max admissions in any span of window, which is the
// limit's promise, and returns the gaps between each admission and the
// one max after it (exactly the window when requests waited for the oldest
// to age out).
func checkPacing(t *testing.T, what string, times []int64, max int, window time.Duration) []time.Duration {
	t.Helper()
	var gaps []time.Duration
	for i := 0; i+max < len(times); i++ {
		gap := time.Duration(times[i+max]-times[i]) * time.Microsecond
		gaps = append(gaps, gap)
		if gap < window {
			t.Errorf("%s: admissions %d and %d are %v apart: %d admissions within %v, want at most %d",
				what, i+1, i+max+1, gap, max+1, window, max)
		}
	}
	return gaps
}

// docCaddyfile returns the caddyfile block of a docs page that contains
// marker, so that a test runs the very Caddyfile the page shows.
func docCaddyfile(t *testing.T, page, marker string) string {
	t.Helper()
	doc, err := os.ReadFile(page)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fences(string(doc)) {
		if f.lang == "caddyfile" && strings.Contains(f.text, marker) {
			return f.text
		}
	}
	t.Fatalf("%s has no caddyfile block with %q", page, marker)
	return ""
}

// arrivals is an upstream, or the next handler of an instance, that records
// when each request reaches it, by client, in microseconds of the wall
// clock, which Redis's TIME reads too.
type arrivals struct {
	mu       sync.Mutex
	byClient map[string][]int64
}

func (a *arrivals) record(client string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.byClient == nil {
		a.byClient = make(map[string][]int64)
	}
	a.byClient[client] = append(a.byClient[client], time.Now().UnixMicro())
}

// of returns the arrivals of a client.
func (a *arrivals) of(client string) []int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.byClient[client])
}

// ServeHTTP serves as an upstream of reverse_proxy, which names the client
// in X-Forwarded-For.
func (a *arrivals) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	a.record(r.Header.Get("X-Forwarded-For"))
	w.WriteHeader(http.StatusOK)
}

// next is a as an instance's next handler.
func (a *arrivals) next() caddyhttp.Handler {
	return caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		host, _, _ := net.SplitHostPort(r.RemoteAddr)
		a.record(host)
		w.WriteHeader(http.StatusOK)
		return nil
	})
}

// checkHeld checks that no request went on before its admission time: since
// each request arrives no earlier than its own admission, before the k-th
// admission (microseconds, oldest first) at most k-1 requests may have
// arrived. admissions may lack the oldest of the requests' (a ring drops
// what aged out when it records another), each of which may have arrived
// before any of those kept.
func checkHeld(t *testing.T, what string, admissions, arrived []int64) {
	t.Helper()
	dropped := len(arrived) - len(admissions)
	for k, at := range admissions {
		early := 0
		for _, a := range arrived {
			if a < at {
				early++
			}
		}
		if early > dropped+k {
			t.Errorf("%s: %d requests went on before admission %d, want at most %d: a held request went on before its slot", what, early, dropped+k+1, dropped+k)
		}
	}
}

// admissionsOf reads the admission times of key, which must hold those of
// at least min of the want requests (the ring drops aged-out ones at a
// later record, which a busy machine may reach after the window).
func admissionsOf(t *testing.T, key string, min, want int) []int64 {
	t.Helper()
	times := admissionTimes(t, sharedRedis.Client(t), key)
	if len(times) < min || len(times) > want {
		t.Fatalf("Redis holds %d admissions at %s, want %d (at least %d)", len(times), key, want, min)
	}
	return times
}

// TestWebhooksRecipe runs the recipe of docs/waits.md: a sender bursts 20
// deliveries (POSTs with a JSON body) against 10 per second with wait 2s, 10 to each of two instances
// (real Caddy and a handler provisioned alone, on one Redis): all 20 go
// through, none is denied, and the admission times Redis recorded are
// paced exactly by the window.
func TestWebhooksRecipe(t *testing.T) {
	upstream, second := new(arrivals), new(arrivals)
	srv := httptest.NewServer(upstream)
	defer srv.Close()
	prefix := uniquePrefix(t)
	recipe := docCaddyfile(t, "docs/waits.md", "wait 2s")
	config := strings.NewReplacer(
		"hooks.example.com", ":9080",
		"{env.REDIS_URL}", sharedRedis.URL()+"\n\t\tkey_prefix "+prefix,
		"127.0.0.1:3000", strings.TrimPrefix(srv.URL, "http://"),
	).Replace(recipe)
	startCaddy(t, config)
	other := newInstance(t, `{"window": "1s", "max_requests": 10, "wait": "2s",
		"redis": "`+sharedRedis.URL()+`?client_name=b", "key_prefix": "`+prefix+`"}`)
	waited := `caddy_sliding_ratelimit_wait_seconds_count{zone="default"}`
	before := scrape(t, waited)

	sender := from("127.0.0.2")
	statuses := make([]int, 20)
	var wg sync.WaitGroup
	for i := range statuses {
		wg.Add(1)
		go func() {
			defer wg.Done()
			delivery := withBody("application/json", `{"delivery": `+strconv.Itoa(i)+`}`)
			if i%2 == 0 {
				statuses[i] = send(t, site+"hook", sender, withMethod(http.MethodPost), delivery).status
			} else {
				statuses[i] = send(t, "/hook", sender, withMethod(http.MethodPost), delivery, to(other), withNext(second.next())).status
			}
		}()
	}
	wg.Wait()
	for i, s := range statuses {
		if s != http.StatusOK {
			t.Errorf("request %d: status %d, want 200 (held for its slot, not denied)", i+1, s)
		}
	}
	times := admissionsOf(t, prefix+"{127.0.0.2}:default", 11, 20)
	gaps := checkPacing(t, "sender", times, 10, time.Second)
	t.Logf("admission i+10 after admission i: %v", gaps)
	checkHeld(t, "sender", times, append(upstream.of("127.0.0.2"), second.of("127.0.0.2")...))
	// The second ten wait for the first ten to age out; fewer when some are
	// decided after that (a busy machine), never more.
	if got := scrape(t, waited) - before; got < 1 || got > 10 {
		t.Errorf("%s grew by %v, want up to 10: the second ten wait for the first ten to age out", waited, got)
	}
	if got := len(upstream.of("127.0.0.2")); got != 10 {
		t.Errorf("the Caddy instance passed %d requests upstream, want its 10", got)
	}
}

// TestWaitsExactAcrossInstances: two clients (real second and third
// addresses) burst twice their limit, each over two instances on one
// Redis: every request is held for its slot rather than denied, none goes
// on before its slot, each client's admissions are paced by the window,
// and neither client's admissions count against the other. The wait is
// more than one window: admissions decided in one script call are recorded
// a microsecond apart (times strictly increase), so a request that waits on
// the second of them, in the same call, needs a window and a microsecond.
func TestWaitsExactAcrossInstances(t *testing.T) {
	upstream, second := new(arrivals), new(arrivals)
	srv := httptest.NewServer(upstream)
	defer srv.Close()
	prefix := uniquePrefix(t)
	startCaddy(t, siteBlock(":9080", prefix, `
	sliding_ratelimit {
		zone paced 1s 5 {
			wait 2s
		}
	}
	reverse_proxy `+strings.TrimPrefix(srv.URL, "http://")+``))
	other := newInstance(t, `{"zones": [{"name": "paced", "window": "1s", "max_requests": 5, "wait": "2s"}],
		"redis": "`+sharedRedis.URL()+`?client_name=b", "key_prefix": "`+prefix+`"}`)
	clients := []string{"127.0.0.2", "127.0.0.3"}
	statuses := make([][]int, len(clients))
	var wg sync.WaitGroup
	for c, ip := range clients {
		statuses[c] = make([]int, 10)
		for i := range statuses[c] {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if i%2 == 0 {
					statuses[c][i] = send(t, site, from(ip)).status
				} else {
					statuses[c][i] = send(t, "/", from(ip), to(other), withNext(second.next())).status
				}
			}()
		}
	}
	wg.Wait()
	for c, ip := range clients {
		for i, s := range statuses[c] {
			if s != http.StatusOK {
				t.Errorf("%s, request %d: status %d, want 200", ip, i+1, s)
			}
		}
		// Its 10, none of the other client's.
		times := admissionsOf(t, prefix+"{"+ip+"}:paced", 6, 10)
		gaps := checkPacing(t, ip, times, 5, time.Second)
		t.Logf("%s: admission i+5 after admission i: %v", ip, gaps)
		checkHeld(t, ip, times, append(upstream.of(ip), second.of(ip)...))
	}
}

// TestWaitOnlyIfEveryZoneWaits: a request waits only if every zone that
// applies to it has a wait; a zone without one admits now or not at all.
// The admin API shows how long a request now would wait.
func TestWaitOnlyIfEveryZoneWaits(t *testing.T) {
	startCaddy(t, siteBlock(":9080", uniquePrefix(t), `
	sliding_ratelimit {
		key {http.request.header.X-Client}
		zone waits 3s 1 {
			wait 3s
		}
		zone nowait 3s 5 {
			match {
				path /strict
			}
		}
	}
	respond "ok"`))
	for _, c := range []string{"a", "b"} {
		if s := send(t, site+"strict", withHeader("X-Client", c)).status; s != http.StatusOK {
			t.Fatalf("client %s's first request: status %d", c, s)
		}
	}
	// nowait applies too: denied at once, not held.
	if s := send(t, site+"strict", withHeader("X-Client", "a")).status; s != http.StatusTooManyRequests {
		t.Errorf("a request that nowait applies to: status %d, want 429 (no wait without every zone's)", s)
	}
	state := adminState(t, "waits", "b")
	if state.WaitSeconds == nil || *state.WaitSeconds <= 0 || *state.WaitSeconds > 3 || state.RetryAfterSeconds != 0 || state.Remaining != 0 {
		t.Errorf("admin view of b in waits: %+v, want a request now to wait up to 3s, not to be denied", state)
	}
	// Without nowait, b's next request waits for its slot (without a wait
	// it would be denied: the zone's one slot is taken).
	if s := send(t, site, withHeader("X-Client", "b")).status; s != http.StatusOK {
		t.Errorf("b's request that only waits applies to: status %d, want 200 after its slot's wait", s)
	}
}

// TestWaitFloodIsBounded: a flood of requests that would each wait gets at
// most max_waiting of them held; the rest are answered at once with 429,
// so a flood cannot pile up held connections, and every held request ends
// at its slot.
func TestWaitFloodIsBounded(t *testing.T) {
	startCaddy(t, siteBlock(":9080", uniquePrefix(t), `
	sliding_ratelimit {
		key {http.request.header.X-Client}
		zone flood 4s 1 {
			wait 4s
		}
		max_waiting 5
	}
	respond "ok"`))
	const clients = 20
	client := func(i int) sendOption { return withHeader("X-Client", "c"+strconv.Itoa(i)) }
	for i := range clients {
		if s := send(t, site, client(i)).status; s != http.StatusOK {
			t.Fatalf("client %d's first request: status %d", i, s)
		}
	}
	held := `caddy_sliding_ratelimit_wait_seconds_count{zone="flood"}`
	full, waiting := "caddy_sliding_ratelimit_wait_room_full_total", "caddy_sliding_ratelimit_waiting"
	heldBefore, fullBefore := scrape(t, held), scrape(t, full)

	// Each client's second request would wait for its slot, 4s later.
	answers := make(chan int, clients)
	for i := range clients {
		go func() { answers <- send(t, site, client(i)).status }()
	}
	count := map[int]int{}
	for range clients - 5 {
		count[<-answers]++
	}
	// The 15 that found the room full are answered; 5 are held.
	if got := scrape(t, waiting); got != 5 {
		t.Errorf("%s = %v while the flood is held, want 5 (max_waiting)", waiting, got)
	}
	for range 5 {
		count[<-answers]++
	}
	if count[http.StatusOK] != 5 || count[http.StatusTooManyRequests] != clients-5 {
		t.Errorf("answers %v, want 5 200s (held for their slot) and %d 429s (room full)", count, clients-5)
	}
	if got := scrape(t, held) - heldBefore; got != 5 {
		t.Errorf("%s grew by %v, want 5", held, got)
	}
	if got := scrape(t, full) - fullBefore; got != clients-5 {
		t.Errorf("%s grew by %v, want %d", full, got, clients-5)
	}
	if got := scrape(t, waiting); got != 0 {
		t.Errorf("%s = %v after the flood, want 0", waiting, got)
	}
}

// TestWaitCutToServerTimeouts: a request is never held past the server's
// write timeout: one whose slot comes too late is denied at once, and one
// whose slot comes in time is held and answered.
func TestWaitCutToServerTimeouts(t *testing.T) {
	startCaddy(t, siteBlock(":9080", uniquePrefix(t), `
	sliding_ratelimit {
		key {http.request.header.X-Client}
		zone long 5s 1 {
			wait 5s
			match {
				path /long
			}
		}
		zone short 2s 1 {
			wait 2s
			match {
				path /short
			}
		}
	}
	respond "ok"`), withGlobals("servers {\n\ttimeouts {\n\t\twrite 3s\n\t}\n}"))
	for _, c := range []struct {
		path string
		want int
	}{
		// A slot 5s away is past the 3s write timeout: denied, not cut off.
		{"long", http.StatusTooManyRequests},
		// A slot 2s away is within it: held, then answered.
		{"short", http.StatusOK},
	} {
		if s := send(t, site+c.path, withHeader("X-Client", c.path)).status; s != http.StatusOK {
			t.Fatalf("%s: first request: status %d", c.path, s)
		}
		res := send(t, site+c.path, withHeader("X-Client", c.path))
		if res.status != c.want {
			t.Errorf("%s: second request: status %d, want %d", c.path, res.status, c.want)
		}
		if res.status == http.StatusTooManyRequests && res.header.Get("Retry-After") == "" {
			t.Errorf("%s: a 429 without Retry-After", c.path)
		}
	}
}

// TestAbandonedWaitGivesSlotBack: a held request whose client goes away
// gives back the slot it was promised, so the next request can have it.
func TestAbandonedWaitGivesSlotBack(t *testing.T) {
	startCaddy(t, siteBlock(":9080", uniquePrefix(t), `
	sliding_ratelimit {
		key {http.request.header.X-Client}
		zone left 3s 1 {
			wait 3s
		}
	}
	respond "ok"`))
	me := withHeader("X-Client", "leaver")
	if s := send(t, site, me).status; s != http.StatusOK {
		t.Fatalf("first request: status %d", s)
	}
	abandoned := `caddy_sliding_ratelimit_waits_abandoned_total{zone="left"}`
	before := scrape(t, abandoned)

	// The second request is held for the slot 3s away; its client leaves.
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, site, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-Client", "leaver")
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if res, err := clientAt(t, "127.0.0.1").Do(req); err == nil {
			res.Body.Close()
			t.Errorf("the leaving request got an answer: %s", res.Status)
		}
	}()
	for deadline := time.Now().Add(2 * time.Second); scrape(t, "caddy_sliding_ratelimit_waiting") == 0; {
		if time.Now().After(deadline) {
			t.Fatal("the second request was never held")
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	wg.Wait()
	for deadline := time.Now().Add(5 * time.Second); scrape(t, abandoned) == before; {
		if time.Now().After(deadline) {
			t.Fatalf("%s did not grow: the server did not see the client leave", abandoned)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Its slot is free again: the third request waits for it. Had the slot
	// stayed taken, the third would need 6s, more than its wait: a 429.
	if s := send(t, site, me).status; s != http.StatusOK {
		t.Errorf("the request after the one that left: status %d, want 200 (the slot given back)", s)
	}
}

// TestCommandShowsWaitsAndLeases: `caddy sliding-ratelimit status` prints
// the wait of a request now in a zone with a wait, and the leases a client
// holds in a concurrency zone, on every instance and on this one.
func TestCommandShowsWaitsAndLeases(t *testing.T) {
	upstream := newGate()
	srv := newUpstream(t, upstream)
	startCaddy(t, siteBlock(":9080", uniquePrefix(t), `
	sliding_ratelimit {
		key {http.request.header.X-Client}
		zone paced 1m 1 {
			wait 1m
			match {
				path /paced
			}
		}
		zone jobs {
			concurrent 3
			match {
				path /jobs
			}
		}
	}
	reverse_proxy /jobs `+srv+`
	respond /paced "ok"`))
	me := withHeader("X-Client", "cli")
	if s := send(t, site+"paced", me).status; s != http.StatusOK {
		t.Fatalf("the paced request: status %d", s)
	}
	out, err := runCommand(t, "status", "--zone", "paced", "--key", "cli", "--address", "localhost:2999")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 5 || strings.TrimSpace(lines[3]) != "WAIT NOW" || !strings.HasSuffix(lines[4], "s") {
		t.Errorf("status of a zone with a wait printed:\n%s", out)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		send(t, site+"jobs", me, from("127.0.0.2"))
	}()
	upstream.waitInside(t, "127.0.0.2", 1)
	out, err = runCommand(t, "status", "--zone", "jobs", "--key", "cli", "--address", "localhost:2999")
	if err != nil {
		t.Fatal(err)
	}
	lines = strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 5 || strings.Join(strings.Fields(lines[3]), " ") != "LEASES HELD ON THIS INSTANCE" ||
		strings.Join(strings.Fields(lines[4]), " ") != "1 1" || !strings.HasPrefix(strings.Join(strings.Fields(lines[1]), " "), "jobs jobs:concurrent =cli 1 2 ") {
		t.Errorf("status of a concurrency zone with one request running printed:\n%s", out)
	}
	upstream.release <- struct{}{}
	<-done
}

// newUpstream serves h on a loopback port for the test and returns its
// host:port.
func newUpstream(t *testing.T, h http.Handler) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &http.Server{Handler: h}
	go s.Serve(l)
	t.Cleanup(func() { s.Close() })
	return l.Addr().String()
}

// TestLeasesWithFailModeLocal: while Redis is away, fail_mode local takes,
// extends and releases leases in the in-process store, with the same
// limit.
func TestLeasesWithFailModeLocal(t *testing.T) {
	port, err := freeLoopbackPort()
	if err != nil {
		t.Fatal(err)
	}
	in := newInstance(t, `{"zones": [{"name": "local_jobs", "concurrent": 1, "lease": "300ms"}],
		"redis": "redis://127.0.0.1:`+strconv.Itoa(port)+`", "fail_mode": "local", "key_prefix": "`+uniquePrefix(t)+`"}`)
	upstream := newGate()
	done := make(chan int)
	go func() { done <- send(t, "/", from("127.0.0.2"), to(in), withNext(upstream.next())).status }()
	upstream.waitInside(t, "127.0.0.2", 1)
	// Three lease times: the lease lives only if the keeper extends it in
	// the store that took it.
	time.Sleep(900 * time.Millisecond)
	if s := send(t, "/", from("127.0.0.2"), to(in), withNext(okHandler)).status; s != http.StatusTooManyRequests {
		t.Errorf("a second request while the first runs: status %d, want 429", s)
	}
	upstream.release <- struct{}{}
	if s := <-done; s != http.StatusOK {
		t.Errorf("the first request: status %d", s)
	}
	if s := send(t, "/", from("127.0.0.2"), to(in), withNext(okHandler)).status; s != http.StatusOK {
		t.Errorf("a request after the first ended: status %d, want 200 (its lease released)", s)
	}
}

// freeLoopbackPort returns a port nothing listens on a moment ago.
func freeLoopbackPort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// TestReportModeHoldsNothing: in mode report a request that would wait
// goes on at once; its admission is still recorded at its slot's time.
// The wait is more than the window for the reason
// TestWaitsExactAcrossInstances gives.
func TestReportModeHoldsNothing(t *testing.T) {
	prefix := uniquePrefix(t)
	in := newInstance(t, `{"window": "10s", "max_requests": 2, "wait": "15s", "mode": "report",
		"redis": "`+sharedRedis.URL()+`", "key_prefix": "`+prefix+`"}`)
	arrived := new(arrivals)
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if s := send(t, "/", from("127.0.0.2"), to(in), withNext(arrived.next())).status; s != http.StatusOK {
				t.Errorf("status %d, want 200", s)
			}
		}()
	}
	wg.Wait()
	times := admissionsOf(t, prefix+"{127.0.0.2}:default", 4, 4)
	// Two admissions wait 10s for the window; every request went on at once.
	if last := arrived.of("127.0.0.2"); len(last) != 4 || slices.Max(last) >= times[2] {
		t.Errorf("arrivals %v, admissions %v: want all four gone on before the promised slots", last, times)
	}
}

// TestJSONRulesOfWaitsAndLeases: a JSON config with a wrong wait, bound,
// concurrency or lease gets the Caddyfile's words, naming the field and
// the zone.
func TestJSONRulesOfWaitsAndLeases(t *testing.T) {
	for _, c := range []struct{ config, want string }{
		{`{"window": "1m", "max_requests": 5, "wait": "-1s"}`, "wait must not be negative, got -1s"},
		{`{"window": "1m", "max_requests": 5, "wait": "1s", "algorithm": "counter"}`, "wait needs algorithm log: a counter cannot promise a later slot (wait 1s)"},
		{`{"window": "1s", "max_requests": 5, "wait": "17s"}`, "wait 17s is longer than 16 windows of 1s, the most a request may wait"},
		{`{"wait": "20s", "zones": [{"name": "a", "window": "1s", "max_requests": 1}]}`, "zone a: wait 20s is longer than 16 windows of 1s"},
		{`{"window": "1m", "max_requests": 5, "max_waiting": -3}`, "max_waiting must be at least 1, got -3"},
		{`{"zones": [{"name": "a", "window": "1m", "max_requests": 1, "wait": "-2s"}]}`, "zone a: wait must not be negative, got -2s"},
		{`{"zones": [{"name": "a", "window": "1m", "max_requests": 10, "algorithm": "counter", "wait": "2s"}]}`, "zone a: wait needs algorithm log"},
		{`{"zones": [{"name": "r", "concurrent": -1}]}`, "zone r: concurrent must be at least 1, got -1"},
		{`{"zones": [{"name": "r", "lease": "1m"}]}`, "zone r: concurrent must be at least 1, got 0 (lease goes with concurrent)"},
		{`{"zones": [{"name": "r", "concurrent": 2, "lease": "-1s"}]}`, "zone r: lease must not be negative, got -1s"},
		{`{"zones": [{"name": "r", "concurrent": 2, "window": "1m"}]}`, "zone r: a concurrency zone counts requests in flight, not in a window: remove window (or concurrent)"},
		{`{"zones": [{"name": "r", "concurrent": 2, "count_status": [401]}]}`, "zone r: a concurrency zone counts requests in flight, not in a window: remove count_status (or concurrent)"},
		{`{"zones": [{"name": "r", "concurrent": 2, "algorithm": "log"}]}`, `zone r: a concurrency zone takes no algorithm, got "log"`},
		{`{"zones": [{"name": "r", "concurrent": 2, "wait": "1s"}]}`, "zone r: a concurrency zone takes no wait"},
		{`{"zones": [{"name": "r", "concurrent": 2, "cost": "5"}]}`, "zone r: a concurrency zone counts requests in flight, not in a window: remove cost (or concurrent)"},
		{`{"zones": [{"name": "r", "concurrent": 2, "settle": {"bytes": true}}]}`, "remove settle (or concurrent)"},
		{`{"zones": [{"name": "r", "concurrent": 2, "max_requests_from": "{http.request.header.X-Quota}"}]}`, "remove max_requests_from (or concurrent)"},
		{`{"zones": [{"name": "r", "concurrent": 2, "key": "{http.request.header.X"}]}`, `zone r: key "{http.request.header.X": the placeholder`},
	} {
		err := provisionError(t, c.config)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want one containing %q", c.config, err, c.want)
		}
	}
	// A top-level wait is the default of zones of algorithm log only: a
	// counter or concurrency zone that sets none is not an error, and does
	// not wait. Nor do a top-level cost and settle apply to a concurrency
	// zone: its requests in flight count one each, whatever they cost.
	in := newInstance(t, `{"wait": "1s", "cost": "3", "settle": {"header": "X-Usage"}, "zones": [{"name": "c", "window": "1m", "max_requests": 10, "algorithm": "counter"},
		{"name": "r", "concurrent": 2}, {"name": "l", "window": "1m", "max_requests": 10}]}`)
	for i, want := range []string{"0s", "0s", "1s"} {
		if got := in.zones[i].wait.String(); got != want {
			t.Errorf("zone %s waits %s, want %s", in.zones[i].Name, got, want)
		}
	}
	if r := in.zones[1]; r.Cost != "" || r.Settle != nil || r.units != nil || r.unit() != unitConcurrentRequests {
		t.Errorf("concurrency zone r: cost %q, settle %v, units %v, unit %s; want none of the handler's, in concurrent-requests", r.Cost, r.Settle, r.units, r.unit())
	}
}

// TestConcurrencyZoneIdentity: a concurrency zone's state is named by its
// name and how many requests may run at once, not by its lease time, so
// that instances with different lease times share its slots.
func TestConcurrencyZoneIdentity(t *testing.T) {
	for _, c := range []struct{ config, want string }{
		{`{"zones": [{"name": "reports", "concurrent": 2}]}`, "reports:concurrent"},
		{`{"zones": [{"name": "reports", "concurrent": 2, "lease": "10s"}]}`, "reports:concurrent"},
		{`{"zones": [{"name": "dl", "concurrent": 10, "key": "{http.request.header.X-Api-Key}"}]}`, "dl:concurrent"},
	} {
		in := newInstance(t, c.config)
		if got := in.zones[0].identity; got != c.want {
			t.Errorf("%s: identity %q, want %q", c.config, got, c.want)
		}
	}
}

// TestWaitLongerThanTheWindow: ten requests at once from one client (a real
// second address) against 2 a second with a wait of 3.5s, over two
// instances on one Redis: eight go through, paced two a second at the slots
// Redis promised (the last ones more than a window after the first), and
// two get a 429 at once, not after waiting.
func TestWaitLongerThanTheWindow(t *testing.T) {
	prefix := uniquePrefix(t)
	startCaddy(t, siteBlock(":9080", prefix, `
	sliding_ratelimit {
		zone line 1s 2 {
			wait 3500ms
		}
	}
	respond "ok"`))
	other := newInstance(t, `{"zones": [{"name": "line", "window": "1s", "max_requests": 2, "wait": "3500ms"}],
		"redis": "`+sharedRedis.URL()+`?client_name=b", "key_prefix": "`+prefix+`"}`)
	const ip = "127.0.0.7"
	statuses, took := make([]int, 10), make([]time.Duration, 10)
	var wg sync.WaitGroup
	for i := range statuses {
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := time.Now()
			if i%2 == 0 {
				statuses[i] = send(t, site, from(ip)).status
			} else {
				statuses[i] = send(t, "/", from(ip), to(other)).status
			}
			took[i] = time.Since(start)
		}()
	}
	wg.Wait()
	ok, denied := 0, 0
	for i, s := range statuses {
		switch s {
		case http.StatusOK:
			ok++
		case http.StatusTooManyRequests:
			denied++
			if took[i] >= 3*time.Second {
				t.Errorf("request %d: a 429 after %v, want it at once", i+1, took[i])
			}
		default:
			t.Errorf("request %d: status %d", i+1, s)
		}
	}
	if ok != 8 || denied != 2 {
		t.Errorf("%d admitted and %d denied, want 8 and 2 (statuses %v)", ok, denied, statuses)
	}
	times := admissionsOf(t, prefix+"{"+ip+"}:line", 2, 8)
	gaps := checkPacing(t, ip, times, 2, time.Second)
	t.Logf("admission i+2 after admission i: %v; held %v", gaps, took)
	if len(times) == 8 {
		if spread := time.Duration(times[7]-times[0]) * time.Microsecond; spread < 3*time.Second {
			t.Errorf("the 8 admissions span %v, want at least 3s (slots at 0, 1, 2 and 3s)", spread)
		}
	}
}

// bodyEcho is an upstream that answers each request with its body, so that a
// test sees the body the next handler got, and counts the requests.
type bodyEcho struct {
	mu       sync.Mutex
	requests int
}

func (e *bodyEcho) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	e.mu.Lock()
	e.requests++
	e.mu.Unlock()
	_, _ = w.Write(body)
}

func (e *bodyEcho) count() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.requests
}

// holdPOST sends a POST with body over a connection of its own from ip and
// returns the connection without reading the answer: the request is then
// decided, and held if it waits.
func holdPOST(t *testing.T, ip, path, body string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 5 * time.Second}
	conn, err := d.Dial("tcp", "127.0.0.1:9080")
	if err != nil {
		t.Fatal(err)
	}
	_, err = fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: 127.0.0.1:9080\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
		path, len(body), body)
	if err != nil {
		t.Fatal(err)
	}
	return conn
}

// pollUntil polls cond until it holds or the deadline passes, and reports
// whether it held.
func pollUntil(within time.Duration, cond func() bool) bool {
	for deadline := time.Now().Add(within); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			return false
		}
	}
	return true
}

// TestWebhooksDroppedPOSTsGiveSlotsBack runs the webhooks recipe of
// docs/waits.md (a longer window, and max_waiting as large as the burst):
// a sender fills its window, sends ten more deliveries (POSTs with a JSON
// body), which are held for their slots, and hangs up on all ten. Each held
// POST gives its slot and its place in max_waiting back at once, so the
// sender's next ten deliveries are held in their turn and delivered, their
// bodies intact; none of the dropped ten reaches the upstream.
func TestWebhooksDroppedPOSTsGiveSlotsBack(t *testing.T) {
	upstream := new(bodyEcho)
	srv := httptest.NewServer(upstream)
	defer srv.Close()
	recipe := docCaddyfile(t, "docs/waits.md", "wait 2s")
	config := strings.NewReplacer(
		"hooks.example.com", ":9080",
		"window 1s", "window 5s",
		"wait 2s", "wait 5s\n\t\tmax_waiting 10",
		"{env.REDIS_URL}", sharedRedis.URL()+"\n\t\tkey_prefix "+uniquePrefix(t),
		"127.0.0.1:3000", strings.TrimPrefix(srv.URL, "http://"),
	).Replace(recipe)
	startCaddy(t, config)
	const sender = "127.0.0.2"
	body := func(i int) string { return fmt.Sprintf(`{"delivery": %d, "pad": %q}`, i, strings.Repeat("x", 1000)) }
	abandoned := `caddy_sliding_ratelimit_waits_abandoned_total{zone="default"}`
	before := scrape(t, abandoned)

	for i := range 10 {
		if res := send(t, site+"hook", from(sender), withMethod(http.MethodPost), withBody("application/json", body(i))); res.status != http.StatusOK {
			t.Fatalf("delivery %d filling the window: status %d", i, res.status)
		}
	}
	var conns []net.Conn
	for i := range 10 {
		conns = append(conns, holdPOST(t, sender, "/hook", body(100+i)))
	}
	if !pollUntil(3*time.Second, func() bool { return scrape(t, "caddy_sliding_ratelimit_waiting") == 10 }) {
		t.Fatalf("the ten POSTs were not all held: waiting %v", scrape(t, "caddy_sliding_ratelimit_waiting"))
	}
	for _, c := range conns {
		c.Close()
	}
	gaveBack := pollUntil(2*time.Second, func() bool { return scrape(t, abandoned)-before == 10 })
	t.Logf("after the hang-ups: %v of 10 held POSTs gave their slot back, waiting %v",
		scrape(t, abandoned)-before, scrape(t, "caddy_sliding_ratelimit_waiting"))
	if !gaveBack {
		t.Errorf("%s grew by %v, want 10: the server did not see the senders leave", abandoned, scrape(t, abandoned)-before)
	}

	// The next ten are held for the slots the dropped ten gave back: had
	// those stayed taken, or max_waiting full, they would get 429s.
	statuses := make([]int, 10)
	echoed := make([]string, 10)
	var wg sync.WaitGroup
	for i := range statuses {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res := send(t, site+"hook", from(sender), withMethod(http.MethodPost), withBody("application/json", body(200+i)))
			statuses[i], echoed[i] = res.status, res.body
		}()
	}
	wg.Wait()
	t.Logf("the next ten deliveries: %v", statuses)
	for i, s := range statuses {
		if s != http.StatusOK {
			t.Errorf("delivery %d after the hang-ups: status %d, want 200 (held for a slot given back)", 200+i, s)
		} else if echoed[i] != body(200+i) {
			t.Errorf("delivery %d: the upstream got the body %.40q..., want it intact", 200+i, echoed[i])
		}
	}
	if got := upstream.count(); got != 20 {
		t.Errorf("the upstream got %d deliveries, want 20: the ten that filled the window and the ten after the hang-ups", got)
	}
}

// TestHeldBodyAboveBoundNotHeld: an HTTP/1 request whose body is larger
// than the room reads before holding (64 KiB), or of unknown length
// (chunked), is decided without a wait: its client could leave unseen. It
// gets a 429 with Retry-After when its zone is full, and holds no place in
// max_waiting; a small body in the same spot is held and passed on, intact.
func TestHeldBodyAboveBoundNotHeld(t *testing.T) {
	upstream := new(bodyEcho)
	srv := httptest.NewServer(upstream)
	defer srv.Close()
	startCaddy(t, siteBlock(":9080", uniquePrefix(t), `
	sliding_ratelimit {
		window 2s
		max_requests 1
		wait 2s
	}
	reverse_proxy `+strings.TrimPrefix(srv.URL, "http://")+``))
	const sender = "127.0.0.3"
	if s := send(t, site, from(sender), withMethod(http.MethodPost), withBody("text/plain", "first")).status; s != http.StatusOK {
		t.Fatalf("first request: status %d", s)
	}
	big := strings.Repeat("b", heldBodyMax+1)
	res := send(t, site, from(sender), withMethod(http.MethodPost), withBody("text/plain", big))
	if res.status != http.StatusTooManyRequests || res.header.Get("Retry-After") == "" {
		t.Errorf("a body of %d bytes in a full window: status %d, Retry-After %q; want 429 with Retry-After (not held)",
			len(big), res.status, res.header.Get("Retry-After"))
	}
	// Chunked: http.Client sends a body of unknown length so.
	req, err := http.NewRequest(http.MethodPost, site, io.MultiReader(strings.NewReader("chunked")))
	if err != nil {
		t.Fatal(err)
	}
	chunked, err := clientAt(t, sender).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	chunked.Body.Close()
	if chunked.StatusCode != http.StatusTooManyRequests || chunked.Header.Get("Retry-After") == "" {
		t.Errorf("a chunked body in a full window: status %d, Retry-After %q; want 429 with Retry-After (not held)",
			chunked.StatusCode, chunked.Header.Get("Retry-After"))
	}
	small := strings.Repeat("s", heldBodyMax)
	if res := send(t, site, from(sender), withMethod(http.MethodPost), withBody("text/plain", small)); res.status != http.StatusOK || res.body != small {
		t.Errorf("a body of %d bytes in a full window: status %d, %d bytes upstream; want 200 (held) with the body intact",
			len(small), res.status, len(res.body))
	}
}

// failingReader gives its text, then err.
type failingReader struct {
	text io.Reader
	err  error
}

func (f failingReader) Read(p []byte) (int, error) {
	n, err := f.text.Read(p)
	if err == io.EOF {
		return n, f.err
	}
	return n, err
}

// TestReadBodyUpTo: a body within the bound is read whole; one above it is
// read up to the bound; either way the next reader gets it intact, and a
// read error comes again to the next reader.
func TestReadBodyUpTo(t *testing.T) {
	lost := errors.New("client gone")
	for _, c := range []struct {
		name      string
		body      io.Reader
		whole     bool
		err       error
		nextBody  string
		nextError error
	}{
		{"empty", strings.NewReader(""), true, nil, "", nil},
		{"within", strings.NewReader("0123456789"), true, nil, "0123456789", nil},
		{"above", strings.NewReader("0123456789ab"), false, nil, "0123456789ab", nil},
		{"far above", strings.NewReader(strings.Repeat("z", 1000)), false, nil, strings.Repeat("z", 1000), nil},
		{"failing", failingReader{strings.NewReader("0123"), lost}, false, lost, "0123", lost},
	} {
		r, err := http.NewRequest(http.MethodPost, "/", io.NopCloser(c.body))
		if err != nil {
			t.Fatal(err)
		}
		whole, err := readBodyUpTo(r, 10)
		if whole != c.whole || !errors.Is(err, c.err) {
			t.Errorf("%s: whole %v, error %v; want %v, %v", c.name, whole, err, c.whole, c.err)
		}
		next, err := io.ReadAll(r.Body)
		if string(next) != c.nextBody || !errors.Is(err, c.nextError) {
			t.Errorf("%s: the next reader got %q, %v; want %q, %v", c.name, next, err, c.nextBody, c.nextError)
		}
	}
	r, _ := http.NewRequest(http.MethodGet, "/", nil)
	if whole, err := readBodyUpTo(r, 10); !whole || err != nil || r.Body != nil {
		t.Errorf("no body: whole %v, error %v, body %v; want true, nil, nil", whole, err, r.Body)
	}
}
