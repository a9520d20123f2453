package slidingratelimit

import (
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/limiter"
)

// TestSettleHeaderFromUpstream: through Caddy, reverse_proxy and Redis, a
// request reserves 1 unit and is settled to the usage its upstream reports
// in a header or a trailer (announced or not; a trailer wins over the
// header of its name). An upstream that reports nothing or garbage leaves
// the reservation, counted in the metric; an enormous number is capped at
// max_requests, which blocks the client for the window; 0 is a refund.
func TestSettleHeaderFromUpstream(t *testing.T) {
	upstream := usageUpstream(t)
	zone := uniqueZone("tokens")
	startCaddy(t, `
:9080 {
	sliding_ratelimit {
		zone `+zone+` 1m 100 {
			settle header X-Usage
			key {http.request.header.X-Client}
		}
		redis `+sharedRedis.URL()+`
		key_prefix `+uniquePrefix(t)+`
	}
	reverse_proxy `+upstream+`
}`)
	fallbacks := 0
	for _, c := range []struct {
		name     string
		ask      map[string][]string
		want     int64
		fallback bool
	}{
		{"header", map[string][]string{"X-Test-Usage": {"30"}}, 30, false},
		{"trailer", map[string][]string{"X-Test-Trailer": {"20"}}, 20, false},
		{"late-trailer", map[string][]string{"X-Test-Late-Trailer": {"25"}}, 25, false},
		{"streamed-trailer", map[string][]string{"X-Test-Trailer": {"45"}, "X-Test-Bytes": {"3000"}, "X-Test-Chunk": {"100"}}, 45, false},
		{"trailer-wins", map[string][]string{"X-Test-Usage": {"10"}, "X-Test-Trailer": {"40"}}, 40, false},
		{"zero", map[string][]string{"X-Test-Usage": {"0"}}, 0, false},
		{"error-status", map[string][]string{"X-Test-Usage": {"12"}, "X-Test-Status": {"500"}}, 12, false},
		{"none", nil, 1, true},
		{"garbage", map[string][]string{"X-Test-Usage": {"lots"}}, 1, true},
		{"negative", map[string][]string{"X-Test-Usage": {"-5"}}, 1, true},
		{"fraction", map[string][]string{"X-Test-Usage": {"1.5"}}, 1, true},
		{"enormous", map[string][]string{"X-Test-Usage": {"99999999999999999999"}}, 100, false},
	} {
		client := "c-" + c.name
		res := send(t, site, from("127.0.0.2"), withHeader("X-Client", client), withHeaders(c.ask))
		if !strings.HasPrefix(res.header.Get("RateLimit"), `"`+zone+`";r=99;`) {
			t.Errorf("%s: RateLimit %q, want r=99: the reservation of 1", c.name, res.header.Get("RateLimit"))
		}
		if got := unitsUsed(t, zone, client, c.want); got != c.want {
			t.Errorf("%s: %d units used after the response, want %d", c.name, got, c.want)
		}
		if c.fallback {
			fallbacks++
		}
	}
	if got := testutil.ToFloat64(limiterMetrics.settleFallbacks.WithLabelValues(zone)); got != float64(fallbacks) {
		t.Errorf("settle_fallbacks_total %v, want %d", got, fallbacks)
	}
	// A charge of the whole budget blocks the client for the window.
	res := send(t, site, from("127.0.0.2"), withHeader("X-Client", "c-enormous"))
	if retry, _ := strconv.Atoi(res.header.Get("Retry-After")); res.status != http.StatusTooManyRequests || retry < 55 {
		t.Errorf("after a charge of the whole budget: %d, Retry-After %q; want 429 for about the window", res.status, res.header.Get("Retry-After"))
	}
	if s := adminState(t, zone, "c-header"); s.Unit != "units" || s.Remaining != 70 {
		t.Errorf("admin state %+v, want 70 units remaining", s)
	}
}

// TestSettleWithCountStatus: count_status is the case of settling where the
// status makes the cost zero: a response whose status the zone does not
// count costs nothing, whatever its upstream reports; one it counts costs
// what its upstream reports.
func TestSettleWithCountStatus(t *testing.T) {
	upstream := usageUpstream(t)
	zone := uniqueZone("ok")
	startCaddy(t, `
:9080 {
	sliding_ratelimit {
		zone `+zone+` 1m 100 {
			settle header X-Usage
			count_status 2xx
			key {http.request.header.X-Client}
		}
		redis `+sharedRedis.URL()+`
		key_prefix `+uniquePrefix(t)+`
	}
	reverse_proxy `+upstream+`
}`)
	send(t, site, withHeader("X-Client", "a"), withHeader("X-Test-Usage", "40"), withHeader("X-Test-Status", "503"))
	if got := unitsUsed(t, zone, "a", 0); got != 0 {
		t.Errorf("a 503 with a usage of 40: %d units, want 0", got)
	}
	send(t, site, withHeader("X-Client", "a"), withHeader("X-Test-Usage", "40"))
	if got := unitsUsed(t, zone, "a", 40); got != 40 {
		t.Errorf("a 200 with a usage of 40: %d units, want 40", got)
	}
}

// TestSettleOneMoreCall: a request of a zone that settles costs one more
// script call after the response, even when its usage is what it reserved
// (the cost then moves to when the response ended), and no announcement
// when it costs more than it reserved, nor when it costs less while the
// zone had room for another request (nobody can have been denied); one whose reservation stands (no settle)
// costs none more; and count zones cost what they did.
func TestSettleOneMoreCall(t *testing.T) {
	prefix := uniquePrefix(t)
	rc := sharedRedis.Client(t)
	for _, c := range []struct {
		name           string
		zone, usage    string
		calls, publish int64
	}{
		{"count zone", `"window": "1m", "max_requests": 1000000`, "", 1, 0},
		{"cost", `"window": "1m", "max_requests": 1000000, "cost": "3"`, "", 1, 0},
		{"settled up", `"window": "1m", "max_requests": 1000000, "settle": {"header": "X-Usage"}`, "7", 2, 0},
		{"settled to the reservation", `"window": "1m", "max_requests": 1000000, "cost": "7", "settle": {"header": "X-Usage"}`, "7", 2, 0},
		{"settled down", `"window": "1m", "max_requests": 1000000, "cost": "9", "settle": {"header": "X-Usage"}`, "7", 2, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			in := newInstance(t, `{`+c.zone+`, "redis": "`+sharedRedis.URL()+`", "key_prefix": "`+prefix+`", "timeout": "1s"}`)
			next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
				if c.usage != "" {
					w.Header().Set("X-Usage", c.usage)
				}
				w.WriteHeader(http.StatusOK)
				return nil
			})
			// The first call of a process may load the script (NOSCRIPT,
			// then EVAL): not counted.
			send(t, "/", to(in), from("192.0.2.99"), withNext(next))
			const requests = 20
			calls, publishes := commandCalls(t, rc, "evalsha", "eval"), commandCalls(t, rc, "publish")
			for i := range requests {
				if status := send(t, "/", to(in), from("192.0.2."+strconv.Itoa(100+i)), withNext(next)).status; status != 200 {
					t.Fatalf("request %d: %d", i+1, status)
				}
			}
			if got := commandCalls(t, rc, "evalsha", "eval") - calls; got != c.calls*requests {
				t.Errorf("%d script calls for %d requests, want %d each", got, requests, c.calls)
			}
			if got := commandCalls(t, rc, "publish") - publishes; got != c.publish*requests {
				t.Errorf("%d announcements for %d requests, want %d each", got, requests, c.publish)
			}
		})
	}
}

// commandCalls is how many calls of the commands the shared Redis has run
// (INFO commandstats).
func commandCalls(t testing.TB, rc *redis.Client, names ...string) int64 {
	t.Helper()
	info, err := rc.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	var total int64
	for _, line := range strings.Split(info, "\n") {
		for _, name := range names {
			if rest, ok := strings.CutPrefix(line, "cmdstat_"+name+":calls="); ok {
				n, _ := strconv.ParseInt(rest[:strings.IndexByte(rest, ',')], 10, 64)
				total += n
			}
		}
	}
	return total
}

// TestSettleDownLiftsADenialElsewhere: two instances on one Redis. Requests
// in flight on one reserve a client's whole budget, so the other denies the
// client and caches the denial; when the responses report that they cost
// less than they reserved, the settle announces it, and the other instance
// admits the client at once instead of for the rest of the window.
func TestSettleDownLiftsADenialElsewhere(t *testing.T) {
	prefix := uniquePrefix(t)
	zone := uniqueZone("est")
	config := `{"zones": [{"name": "` + zone + `", "window": "10m", "max_requests": 100, "cost": "50", "settle": {"header": "X-Usage"}}],
		"redis": "` + sharedRedis.URL() + `", "key_prefix": "` + prefix + `", "timeout": "1s"}`
	a := newInstance(t, config)
	b := newInstance(t, config[:len(config)-1]+`, "redis": "`+sharedRedis.URL()+`?client_name=b"}`)
	release := make(chan struct{})
	held := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		<-release
		w.Header().Set("X-Usage", "10")
		w.WriteHeader(http.StatusOK)
		return nil
	})
	var inFlight sync.WaitGroup
	for range 2 {
		inFlight.Add(1)
		go func() { defer inFlight.Done(); send(t, "/", to(b), from("192.0.2.60"), withNext(held)) }()
	}
	deadline := time.Now().Add(5 * time.Second)
	for unitsHeld(t, b, zone, "192.0.2.60") < 100 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	checkDenialLifted(t, a, "/", "192.0.2.60", zone, release, &inFlight)
}

// TestSettleAfterAnAbortedStream: a client that stops reading a streamed
// response and hangs up makes reverse_proxy abort the handler chain with a
// panic (http.ErrAbortHandler); the bytes sent until then are paid for all
// the same, so hanging up early is no way around a bandwidth limit.
func TestSettleAfterAnAbortedStream(t *testing.T) {
	upstream := usageUpstream(t)
	zone := uniqueZone("stream")
	startCaddy(t, `
:9080 {
	sliding_ratelimit {
		zone `+zone+` 1h 1000000000 {
			settle bytes
		}
		redis `+sharedRedis.URL()+`
		key_prefix `+uniquePrefix(t)+`
	}
	reverse_proxy `+upstream+` {
		flush_interval -1
	}
}`)
	req, err := http.NewRequest(http.MethodGet, site, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-Test-Bytes", strconv.Itoa(64<<20))
	req.Header.Set("X-Test-Chunk", strconv.Itoa(64<<10))
	req.Header.Set("X-Test-Chunk-Delay", "2ms")
	res, err := clientAt(t, "127.0.0.4").Do(req)
	if err != nil {
		t.Fatal(err)
	}
	const read = 256 << 10
	if _, err := io.CopyN(io.Discard, res.Body, read); err != nil {
		t.Fatal(err)
	}
	// Closing a body not read to its end closes the connection.
	res.Body.Close()
	deadline := time.Now().Add(10 * time.Second)
	var used int64
	for time.Now().Before(deadline) {
		if used = adminState(t, zone, "127.0.0.4").Count; used > 1 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if used < read || used >= 64<<20 {
		t.Errorf("a client that hung up after %d bytes of a 64 MiB stream was charged %d bytes, want at least what it read and less than the whole", read, used)
	}
}

// unitsHeld reads, through an instance's backend, the units its zone of that
// name holds for a client key (an address, or "=value").
func unitsHeld(t *testing.T, in *instance, zone, key string) int64 {
	t.Helper()
	for _, z := range in.zones {
		if z.Name == zone {
			_, used, err := in.backend.peek(context.Background(), limiter.Check{Zone: z.identity, Key: key, Limit: z.limit})
			if err != nil {
				t.Fatal(err)
			}
			return used
		}
	}
	t.Fatalf("no zone %s", zone)
	return 0
}

// TestSettleInProcess: without Redis, the in-process store settles as Redis
// does: a client is charged its usage and denied once its budget is spent.
func TestSettleInProcess(t *testing.T) {
	in := newInstance(t, `{"window": "1m", "max_requests": 20, "settle": {"header": "X-Usage"}}`)
	usage := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		w.Header().Set("X-Usage", "8")
		w.WriteHeader(http.StatusOK)
		return nil
	})
	for i, want := range []int{200, 200, 200, 429} {
		if got := send(t, "/", to(in), from("192.0.2.80"), withNext(usage)).status; got != want {
			t.Errorf("request %d: %d, want %d", i+1, got, want)
		}
	}
	if held := unitsHeld(t, in, "default", "192.0.2.80"); held != 24 {
		t.Errorf("%d units held, want 24", held)
	}
}

// TestSettleReadsAUsageHiddenFromClients: a site that keeps its upstream's
// usage header from clients (`header -X-Usage`, deferred until the status
// goes out, by a handler that runs before the limiter) is still charged the
// usage.
func TestSettleReadsAUsageHiddenFromClients(t *testing.T) {
	upstream := usageUpstream(t)
	zone := uniqueZone("hidden")
	startCaddy(t, `
:9080 {
	header -X-Usage
	sliding_ratelimit {
		zone `+zone+` 1m 100 {
			settle header X-Usage
		}
		redis `+sharedRedis.URL()+`
		key_prefix `+uniquePrefix(t)+`
	}
	reverse_proxy `+upstream+`
}`)
	res := send(t, site, from("127.0.0.5"), withHeader("X-Test-Usage", "33"))
	if v := res.header.Values("X-Usage"); res.status != http.StatusOK || len(v) != 0 {
		t.Fatalf("%d with X-Usage %q, want 200 without it", res.status, v)
	}
	if got := unitsUsed(t, zone, "127.0.0.5", 33); got != 33 {
		t.Errorf("%d units used, want the 33 the upstream reported", got)
	}
}

// TestSettleLongStreamCountsFromItsEnd: through Caddy, reverse_proxy and
// Redis, a stream longer than the window (about 3s in a zone of 2s) that
// sends the whole budget is charged when it ends, in a sliding log and in
// a counter: the admin API shows the budget spent and the client's next
// call is denied. The log lets the client in again once a window has
// passed since the stream ended (a counter, sooner: it is approximate).
func TestSettleLongStreamCountsFromItsEnd(t *testing.T) {
	upstream := usageUpstream(t)
	for _, c := range []struct{ algorithm, ip string }{{"log", "127.0.0.5"}, {"counter", "127.0.0.6"}} {
		t.Run(c.algorithm, func(t *testing.T) {
			zone := uniqueZone("long")
			startCaddy(t, `
:9080 {
	sliding_ratelimit {
		zone `+zone+` 2s 1000 {
			settle bytes
			algorithm `+c.algorithm+`
		}
		redis `+sharedRedis.URL()+`
		key_prefix `+uniquePrefix(t)+`
	}
	reverse_proxy `+upstream+` {
		flush_interval -1
	}
}`)
			stream := withHeaders(map[string][]string{"X-Test-Bytes": {"1000"}, "X-Test-Chunk": {"100"}, "X-Test-Chunk-Delay": {"300ms"}})
			start := time.Now()
			if res := send(t, site, from(c.ip), stream); res.status != http.StatusOK || len(res.body) != 1000 {
				t.Fatalf("the stream: %d, %d bytes", res.status, len(res.body))
			}
			ended := time.Now()
			if took := ended.Sub(start); took < 2500*time.Millisecond {
				t.Fatalf("the stream took %v, want longer than the window", took)
			}
			if used := unitsUsed(t, zone, c.ip, 1000); used < 999 {
				t.Errorf("after a stream of 1000 bytes longer than the window: %d bytes charged, want 1000", used)
			}
			res := send(t, site, from(c.ip))
			if res.status != http.StatusTooManyRequests || res.header.Get("Retry-After") == "" {
				t.Fatalf("right after the stream: %d, Retry-After %q; want 429", res.status, res.header.Get("Retry-After"))
			}
			if c.algorithm != "log" {
				return
			}
			// Let in again a window after the end (polled: the machine may be slow).
			deadline := time.Now().Add(10 * time.Second)
			for send(t, site, from(c.ip)).status != http.StatusOK {
				if time.Now().After(deadline) {
					t.Fatal("still denied 10s after the stream ended")
				}
				time.Sleep(50 * time.Millisecond)
			}
			if waited := time.Since(ended); waited < 1500*time.Millisecond {
				t.Errorf("let in again %v after the stream ended, want about the window (2s)", waited)
			}
		})
	}
}

// TestSettleDownAnnouncesOnlyWhenFull: through Caddy and Redis, a zone that
// reserves 10,000,000 bytes and settles to the bytes sent announces nothing
// while its client has room (200 small responses: at most one PUBLISH in a
// hundred settles); once the client's budget is spent, a settle down is
// announced, so a denial cached elsewhere still lifts (see
// TestSettleDownLiftsADenialElsewhere).
func TestSettleDownAnnouncesOnlyWhenFull(t *testing.T) {
	zone := uniqueZone("reserve")
	startCaddy(t, `
:9080 {
	sliding_ratelimit {
		zone `+zone+` 1m 1000000000 {
			cost 10000000
			settle bytes
		}
		redis `+sharedRedis.URL()+`
		key_prefix `+uniquePrefix(t)+`
	}
	respond "hello"
}`)
	rc := sharedRedis.Client(t)
	send(t, site, from("127.0.0.8")) // loads the script
	publishes := commandCalls(t, rc, "publish")
	const requests = 200
	for i := range requests {
		if res := send(t, site, from("127.0.0.8")); res.status != http.StatusOK {
			t.Fatalf("request %d: %d", i+1, res.status)
		}
	}
	got := commandCalls(t, rc, "publish") - publishes
	t.Logf("%d PUBLISH for %d settled requests", got, requests)
	if got > requests/100 {
		t.Errorf("%d announcements for %d requests settled down while nobody was denied, want at most %d", got, requests, requests/100)
	}
}
