package slidingratelimit

import (
	"context"
	"encoding/binary"
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
// limiter/ringlayout_test.go checks): version 4, cap and head (u8 each)
// and 18 header bytes in all, or version 3, cap and head (u32 each) and 122
// bytes of header and mirror; the count (u32) at byte 9 in both; then cap
// entries of 6 bytes, each a time in microseconds modulo 2^48, read as the
// one nearest to now.
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
	times := admissionsOf(t, prefix+"{127.0.0.2}:default:1s:10", 11, 20)
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
// and neither client's admissions count against the other.
func TestWaitsExactAcrossInstances(t *testing.T) {
	upstream, second := new(arrivals), new(arrivals)
	srv := httptest.NewServer(upstream)
	defer srv.Close()
	prefix := uniquePrefix(t)
	startCaddy(t, `
:9080 {
	sliding_ratelimit {
		zone paced 1s 5 {
			wait 1s
		}
		redis `+sharedRedis.URL()+`
		key_prefix `+prefix+`
	}
	reverse_proxy `+strings.TrimPrefix(srv.URL, "http://")+`
}`)
	other := newInstance(t, `{"zones": [{"name": "paced", "window": "1s", "max_requests": 5, "wait": "1s"}],
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
		times := admissionsOf(t, prefix+"{"+ip+"}:paced:1s:5", 6, 10)
		gaps := checkPacing(t, ip, times, 5, time.Second)
		t.Logf("%s: admission i+5 after admission i: %v", ip, gaps)
		checkHeld(t, ip, times, append(upstream.of(ip), second.of(ip)...))
	}
}

// TestWaitOnlyIfEveryZoneWaits: a request waits only if every zone that
// applies to it has a wait; a zone without one admits now or not at all.
// The admin API shows how long a request now would wait.
func TestWaitOnlyIfEveryZoneWaits(t *testing.T) {
	startCaddy(t, `
:9080 {
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
		redis `+sharedRedis.URL()+`
		key_prefix `+uniquePrefix(t)+`
	}
	respond "ok"
}`)
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
