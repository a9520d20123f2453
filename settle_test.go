package slidingratelimit

import (
	"bufio"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"
	"golang.org/x/crypto/bcrypt"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/llmtest"
	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/redistest"
	"github.com/slidingratelimit/caddy-sliding-ratelimit/limiter"
)

// TestSettleHeaderFromUpstream: through Caddy, reverse_proxy and Redis, a
// request reserves 1 unit and is settled to the usage its upstream reports
// in a header or a trailer (announced or not; a trailer wins over the
// header of its name). An upstream that reports nothing or garbage leaves
// the reservation, counted in the metric; a usage above max_requests is
// charged in full, and blocks the client until it ages out; 0 is a refund.
func TestSettleHeaderFromUpstream(t *testing.T) {
	upstream := usageUpstream(t)
	zone := uniqueZone("tokens")
	startCaddy(t, siteBlock(":9080", uniquePrefix(t), `
	sliding_ratelimit {
		zone `+zone+` 1m 100 {
			settle header X-Usage
			key {http.request.header.X-Client}
		}
	}
	reverse_proxy `+upstream+``))
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
		{"above-max", map[string][]string{"X-Test-Usage": {"150"}}, 150, false},
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
	// A charge above the budget blocks the client until it ages out.
	res := send(t, site, from("127.0.0.2"), withHeader("X-Client", "c-above-max"))
	if retry, _ := strconv.Atoi(res.header.Get("Retry-After")); res.status != http.StatusTooManyRequests || retry < 55 || retry > 60 {
		t.Errorf("after a charge of 150 of a budget of 100: %d, Retry-After %q; want 429 for about the window", res.status, res.header.Get("Retry-After"))
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
	startCaddy(t, siteBlock(":9080", uniquePrefix(t), `
	sliding_ratelimit {
		zone `+zone+` 1m 100 {
			settle header X-Usage
			count_status 2xx
			key {http.request.header.X-Client}
		}
	}
	reverse_proxy `+upstream+``))
	send(t, site, withHeader("X-Client", "a"), withHeader("X-Test-Usage", "40"), withHeader("X-Test-Status", "503"))
	if got := unitsUsed(t, zone, "a", 0); got != 0 {
		t.Errorf("a 503 with a usage of 40: %d units, want 0", got)
	}
	send(t, site, withHeader("X-Client", "a"), withHeader("X-Test-Usage", "40"))
	if got := unitsUsed(t, zone, "a", 40); got != 40 {
		t.Errorf("a 200 with a usage of 40: %d units, want 40", got)
	}
}

// TestSettleOneMoreCall: a request of a zone that settles costs at most one
// more script call after the response (fewer when its settle rides in the
// next decision's call), even when its usage is what it reserved (the cost
// then moves to when the response ended), and no announcement
// when it costs more than it reserved, nor when it costs less while the
// zone had room for another request (nobody can have been denied); one whose reservation stands (no settle)
// costs none more; and count zones cost what they did.
func TestSettleOneMoreCall(t *testing.T) {
	prefix := uniquePrefix(t)
	rc := sharedRedis.Client(t)
	for _, c := range []struct {
		name        string
		zone, usage string
		calls       int64
	}{
		{"count zone", `"window": "1m", "max_requests": 1000000`, "", 1},
		{"cost", `"window": "1m", "max_requests": 1000000, "cost": "3"`, "", 1},
		{"settled up", `"window": "1m", "max_requests": 1000000, "settle": {"header": "X-Usage"}`, "7", 2},
		{"settled to the reservation", `"window": "1m", "max_requests": 1000000, "cost": "7", "settle": {"header": "X-Usage"}`, "7", 2},
		{"settled down", `"window": "1m", "max_requests": 1000000, "cost": "9", "settle": {"header": "X-Usage"}`, "7", 2},
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
			// The first calls of a process may go as the script (EVALSHA,
			// NOSCRIPT, then EVAL) while the library loads: not counted.
			send(t, "/", to(in), from("192.0.2.99"), withNext(next))
			in.settled()
			const requests = 20
			announcements := rc.Subscribe(context.Background(), "sliding_ratelimit:resets")
			defer announcements.Close()
			if _, err := announcements.Receive(context.Background()); err != nil {
				t.Fatal(err)
			}
			calls := commandCalls(t, rc, "fcall", "evalsha", "eval")
			for i := range requests {
				if status := send(t, "/", to(in), from("192.0.2."+strconv.Itoa(100+i)), withNext(next)).status; status != 200 {
					t.Fatalf("request %d: %d", i+1, status)
				}
			}
			in.settled()
			got := commandCalls(t, rc, "fcall", "evalsha", "eval") - calls
			if c.calls == 1 && got != requests || c.calls == 2 && (got <= requests || got > 2*requests) {
				t.Errorf("%d script calls for %d requests, want %d each (a settle: at most one more)", got, requests, c.calls)
			}
			select {
			case m := <-announcements.Channel():
				t.Errorf("an announcement (%q) for %d requests whose settles need none", m.Payload, requests)
			case <-time.After(200 * time.Millisecond):
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
	startCaddy(t, siteBlock(":9080", uniquePrefix(t), `
	sliding_ratelimit {
		zone `+zone+` 1h 1000000000 {
			settle bytes
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
	// A zone of its own: the in-process store outlives the handler, as it
	// outlives a reload, so a run with -count above 1 finds the last one's.
	zone := uniqueZone("inprocess")
	in := newInstance(t, `{"zones": [{"name": "`+zone+`", "window": "1m", "max_requests": 20, "settle": {"header": "X-Usage"}}]}`)
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
	if held := unitsHeld(t, in, zone, "192.0.2.80"); held != 24 {
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
	startCaddy(t, siteBlock(":9080", uniquePrefix(t), `
	header -X-Usage
	sliding_ratelimit {
		zone `+zone+` 1m 100 {
			settle header X-Usage
		}
	}
	reverse_proxy `+upstream+``))
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
			startCaddy(t, siteBlock(":9080", uniquePrefix(t), `
	sliding_ratelimit {
		zone `+zone+` 2s 1000 {
			settle bytes
			algorithm `+c.algorithm+`
		}
	}
	reverse_proxy `+upstream+` {
		flush_interval -1
	}`))
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
	startCaddy(t, siteBlock(":9080", uniquePrefix(t), `
	sliding_ratelimit {
		zone `+zone+` 1m 1000000000 {
			cost 10000000
			settle bytes
		}
	}
	respond "hello"`))
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

// TestSettleJSONThroughCaddy: real Caddy in front of the stand-in LLM API
// charges each call exactly the usage the API reported, in every shape, as
// a document and as a stream; a stream without usage, one the upstream
// breaks off, one the client leaves, and a compressed body keep their
// reservation and count as fallbacks.
func TestSettleJSONThroughCaddy(t *testing.T) {
	api := llmtest.Start(t)
	upstream := api.Addr()
	gz := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Encoding", "gzip")
		zw := gzip.NewWriter(w)
		zw.Write([]byte(`{"usage": {"prompt_tokens": 1, "completion_tokens": 2}}`))
		zw.Close()
	}))
	t.Cleanup(gz.Close)
	startCaddy(t, siteBlock(":9080", uniquePrefix(t), `
	route /gz/* {
		sliding_ratelimit {
			key {http.request.header.Authorization}
			zone gztokens 1m 100000 {
				cost 500
				settle json usage.prompt_tokens usage.completion_tokens
			}
		}
		reverse_proxy `+strings.TrimPrefix(gz.URL, "http://")+`
	}
	route /v1/* {
		sliding_ratelimit {
			key {http.request.header.Authorization}
			zone sjtokens 1m 100000 {
				cost 500
				settle json usage.prompt_tokens usage.completion_tokens usage.input_tokens usage.output_tokens response.usage.input_tokens response.usage.output_tokens
			}
		}
		reverse_proxy `+upstream+`
	}`), withGlobals(`
servers {
	metrics
}`))
	fallbacks := func() float64 {
		return scrape(t, `caddy_sliding_ratelimit_settle_fallbacks_total{zone="sjtokens"}`)
	}
	bodies := map[string]string{
		"/v1/chat/completions": `{"model": "m", "max_tokens": 30, "messages": [{"role": "user", "content": "say hello"}]%s}`,
		"/v1/responses":        `{"model": "m", "max_output_tokens": 30, "input": "say hello"%s}`,
		"/v1/messages":         `{"model": "m", "max_tokens": 30, "messages": [{"role": "user", "content": "say hello"}]%s}`,
	}
	n := 0
	for path, body := range bodies {
		for _, stream := range []string{"", `, "stream": true, "stream_options": {"include_usage": true}`} {
			n++
			key := fmt.Sprintf("Bearer sk-%d", n)
			before := fallbacks()
			a := send(t, site+strings.TrimPrefix(path, "/"), withMethod(http.MethodPost), withHeader("Authorization", key), withBody("application/json", fmt.Sprintf(body, stream)))
			reported, _ := api.Usage(key)
			if a.status != http.StatusOK || reported == 0 {
				t.Fatalf("%s%s: status %d, %d tokens reported; body %s", path, stream, a.status, reported, a.body)
			}
			if got := unitsUsed(t, "sjtokens", key, reported); got != reported {
				t.Errorf("%s%s: %d tokens charged, want the %d reported", path, stream, got, reported)
			}
			if got := fallbacks() - before; got != 0 {
				t.Errorf("%s%s: %v settle fallbacks, want none", path, stream, got)
			}
		}
	}

	reserved := func(what, key string) {
		t.Helper()
		if got := unitsUsed(t, "sjtokens", key, 500); got != 500 {
			t.Errorf("%s: %d tokens charged, want the reservation 500", what, got)
		}
	}
	before := fallbacks()
	chat := site + "v1/chat/completions"
	a := send(t, chat, withMethod(http.MethodPost), withHeader("Authorization", "Bearer sk-nousage"),
		withBody("application/json", `{"model": "m", "max_tokens": 30, "messages": [{"content": "hi"}], "stream": true}`))
	if a.status != http.StatusOK || !strings.Contains(a.body, "data: [DONE]") {
		t.Fatalf("a stream without usage: status %d, body %q", a.status, a.body)
	}
	reserved("a stream without usage", "Bearer sk-nousage")

	// The upstream breaks off after message_start, which carries usage
	// (input tokens, and 1 output token): what was read is not the call's.
	req, _ := http.NewRequest(http.MethodPost, site+"v1/messages", strings.NewReader(`{"model": "m", "max_tokens": 30, "messages": [{"content": "hi"}], "stream": true}`))
	req.Header.Set("Authorization", "Bearer sk-cut")
	req.Header.Set("X-Test-Cut", "1")
	res, err := clientAt(t, "127.0.0.1").Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if b, err := io.ReadAll(res.Body); err == nil || !strings.Contains(string(b), "message_start") {
		t.Errorf("a stream the upstream broke off: read %q, %v; want message_start and an error", b, err)
	}
	res.Body.Close()
	reserved("a stream the upstream broke off", "Bearer sk-cut")

	// The client reads message_start and leaves.
	req, _ = http.NewRequest(http.MethodPost, site+"v1/messages", strings.NewReader(`{"model": "m", "max_tokens": 30, "messages": [{"content": "hi"}], "stream": true}`))
	req.Header.Set("Authorization", "Bearer sk-left")
	req.Header.Set("X-Test-Pause", "300ms")
	res, err = clientAt(t, "127.0.0.2").Do(req)
	if err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(res.Body).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "event: message_start") {
		t.Fatalf("first line of the stream %q, %v", line, err)
	}
	res.Body.Close()
	reservedSoon(t, "Bearer sk-left")
	if got := fallbacks() - before; got != 3 {
		t.Errorf("%v settle fallbacks, want 3", got)
	}

	key := "Bearer sk-gz"
	send(t, site+"gz/x", withMethod(http.MethodPost), withHeader("Authorization", key), withBody("application/json", `{}`))
	if got := unitsUsed(t, "gztokens", key, 500); got != 500 {
		t.Errorf("a gzip body: %d tokens charged, want the reservation 500", got)
	}
}

// reservedSoon waits for the stream the client left to end (the API's
// pauses) and checks that it paid its reservation, 500.
func reservedSoon(t *testing.T, key string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		st := adminState(t, "sjtokens", key)
		if st.Count == 500 {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("a stream the client left: %d tokens charged, want the reservation 500", st.Count)
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestSettleJSONPassesStreamsOn: the first event of a stream reaches the
// client while the upstream still holds the next; the client's bytes are
// the upstream's.
func TestSettleJSONPassesStreamsOn(t *testing.T) {
	release := make(chan struct{})
	first := "data: {\"choices\": [{\"delta\": {\"content\": \"Hel\"}}]}\n\n"
	last := "data: {\"usage\": {\"total_tokens\": 17}}\n\ndata: [DONE]\n\n"
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.Write([]byte(first))
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-time.After(20 * time.Second):
		}
		w.Write([]byte(last))
	}))
	t.Cleanup(up.Close)
	startCaddy(t, siteBlock(":9080", uniquePrefix(t), `
	sliding_ratelimit {
		key {http.request.header.Authorization}
		zone sjpass 1m 1000 {
			settle json usage.total_tokens
		}
	}
	reverse_proxy `+strings.TrimPrefix(up.URL, "http://")+``))
	req, _ := http.NewRequest(http.MethodPost, site, nil)
	req.Header.Set("Authorization", "k")
	res, err := clientAt(t, "127.0.0.1").Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	buf := make([]byte, len(first))
	got := make(chan string, 1)
	go func() {
		n, _ := io.ReadFull(res.Body, buf)
		got <- string(buf[:n])
	}()
	select {
	case s := <-got:
		if s != first {
			t.Fatalf("first event %q, want %q", s, first)
		}
	case <-time.After(15 * time.Second):
		close(release)
		t.Fatal("the first event did not reach the client while the upstream held the next")
	}
	close(release)
	rest, _ := io.ReadAll(res.Body)
	if string(rest) != last {
		t.Errorf("rest of the stream %q, want %q", rest, last)
	}
	if used := unitsUsed(t, "sjpass", "k", 17); used != 17 {
		t.Errorf("%d units charged, want 17", used)
	}
	// The zone's state is named by what it settles to: a zone of that name
	// that settles otherwise keeps its own.
	if s := adminState(t, "sjpass", "k"); s.Unit != "units" || s.Identity != "sjpass:json-usage.total_tokens" {
		t.Errorf("admin state %+v, want unit units and identity sjpass:json-usage.total_tokens", s)
	}
}

// loginHandler is a next handler that stands for basic_auth on an instance
// provisioned apart: it returns error 401 unless the password is right.
var loginHandler = caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
	if _, pw, ok := r.BasicAuth(); !ok || pw != "right" {
		return caddyhttp.Error(http.StatusUnauthorized, nil)
	}
	w.WriteHeader(http.StatusOK)
	return nil
})

func basicAuth(password string) http.Header {
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.SetBasicAuth("alice", password)
	return http.Header{"Authorization": r.Header["Authorization"]}
}

// TestCountStatusBehindBasicAuth: two instances on one Redis limit failed
// logins only: good logins never count, three failures spread over both
// block the client everywhere (the right password too), another client is
// not affected.
func TestCountStatusBehindBasicAuth(t *testing.T) {
	hash, err := bcrypt.GenerateFromPassword([]byte("right"), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	prefix := uniquePrefix(t)
	startCaddy(t, siteBlock(":9080", prefix, `
	sliding_ratelimit {
		zone login 10m 3 {
			count_status 401
		}
	}
	basic_auth {
		alice `+string(hash)+`
	}
	respond "welcome"`))
	other := newInstance(t, `{"zones": [{"name": "login", "window": "10m", "max_requests": 3, "count_status": [401]}],
		"redis": "`+sharedRedis.URL()+`?client_name=b", "key_prefix": "`+prefix+`"}`)
	client := from("127.0.0.2")
	good, bad := basicAuth("right"), basicAuth("wrong")

	for i := 0; i < 12; i++ {
		expect(t, "good login on the Caddy", site, []int{200}, client, withHeaders(good))
		if status := send(t, "/login", to(other), from("127.0.0.2"), withHeaders(good), withNext(loginHandler)).status; status != 200 {
			t.Fatalf("good login %d on the other instance: %d", i+1, status)
		}
	}
	if n := kept(t, prefix, "127.0.0.2", "login:401"); n != 0 {
		t.Fatalf("24 good logins left %d counted, want 0", n)
	}
	expect(t, "bad login 1 on the Caddy", site, []int{401}, client, withHeaders(bad))
	if status := send(t, "/login", to(other), from("127.0.0.2"), withHeaders(bad), withNext(loginHandler)).status; status != 401 {
		t.Fatalf("bad login 2 on the other instance: %d, want 401", status)
	}
	expect(t, "bad login 3 on the Caddy", site, []int{401}, client, withHeaders(bad))
	expect(t, "the right password after three failures", site, []int{429}, client, withHeaders(good))
	if status := send(t, "/login", to(other), from("127.0.0.2"), withHeaders(good), withNext(loginHandler)).status; status != 429 {
		t.Errorf("the right password on the other instance: %d, want 429", status)
	}
	expect(t, "another client", site, []int{200}, from("127.0.0.3"), withHeaders(good))
	if n := kept(t, prefix, "127.0.0.2", "login:401"); n != 3 {
		t.Errorf("%d counted, want the 3 failures", n)
	}
}

// kept reads how many admissions Redis holds for a client in a zone.
func kept(t *testing.T, prefix, key, identity string) int64 {
	t.Helper()
	n, err := admissionsKept(context.Background(), sharedRedis.Client(t), prefix+"{"+key+"}:"+identity)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestCountStatusConcurrent: however many requests run at once, never more
// than max_requests responses stay counted, and a client whose slots are all
// reserved is denied while they are in flight, then admitted again when they
// are given back (also on an instance that cached the denial).
func TestCountStatusConcurrent(t *testing.T) {
	prefix := uniquePrefix(t)
	config := `{"zones": [{"name": "c", "window": "10m", "max_requests": 3, "count_status": [4]}],
		"redis": "` + sharedRedis.URL() + `", "key_prefix": "` + prefix + `"}`
	a := newInstance(t, config)
	b := newInstance(t, config[:len(config)-1]+`, "timeout": "1s"}`)
	var failures atomic.Int64
	slow := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		time.Sleep(20 * time.Millisecond)
		if r.Header.Get("X-Fail") != "" {
			failures.Add(1)
			return caddyhttp.Error(http.StatusForbidden, nil)
		}
		w.WriteHeader(http.StatusOK)
		return nil
	})
	var wg sync.WaitGroup
	var counted atomic.Int64
	for i := 0; i < 60; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			in := a
			if i%2 == 1 {
				in = b
			}
			header := http.Header{}
			if i%3 == 0 {
				header.Set("X-Fail", "1")
			}
			if status := send(t, "/login", to(in), from("192.0.2.30"), withHeaders(header), withNext(slow)).status; status == http.StatusForbidden {
				counted.Add(1)
			}
		}(i)
	}
	wg.Wait()
	if n := kept(t, prefix, "192.0.2.30", "c:4xx"); n > 3 || n != counted.Load() {
		t.Errorf("%d counted in Redis, %d 403s answered: want the same, at most 3", n, counted.Load())
	}

	// Three successful requests in flight on b hold every slot of a fresh
	// client: a denies it and caches the denial; when b gives the slots
	// back, a admits it again at once.
	release := make(chan struct{})
	held := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		<-release
		w.WriteHeader(http.StatusOK)
		return nil
	})
	var inFlight sync.WaitGroup
	for range 3 {
		inFlight.Add(1)
		go func() { defer inFlight.Done(); send(t, "/login", to(b), from("192.0.2.31"), withNext(held)) }()
	}
	deadline := time.Now().Add(5 * time.Second)
	for kept(t, prefix, "192.0.2.31", "c:4xx") < 3 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	checkDenialLifted(t, a, "/login", "192.0.2.31", "c", release, &inFlight)
}

// checkDenialLifted: while requests of ip that another instance admitted
// are held, two requests to a for path are denied, the second from a's deny
// cache; once release lets the held requests end (inFlight), what they
// gave back is announced, and a admits ip again within two seconds instead
// of for the rest of the window.
func checkDenialLifted(t *testing.T, a *instance, path, ip, zone string, release chan struct{}, inFlight *sync.WaitGroup) {
	t.Helper()
	// Only a decides meanwhile: the zone's cache hits are a's.
	hits := cacheHits(zone)
	for i := range 2 {
		if status := send(t, path, to(a), from(ip)).status; status != http.StatusTooManyRequests {
			t.Fatalf("with the requests held elsewhere, request %d on a: %d, want 429", i+1, status)
		}
	}
	if cacheHits(zone) == hits {
		t.Fatal("the second denial did not come from a's deny cache; the test would not cross it")
	}
	close(release)
	inFlight.Wait()
	deadline := time.Now().Add(2 * time.Second)
	status := 0
	for time.Now().Before(deadline) {
		if status = send(t, path, to(a), from(ip)).status; status == http.StatusOK {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	if status != http.StatusOK {
		t.Errorf("after the held requests gave back what they took on another instance: a answers %d, want 200", status)
	}
}

// TestCountStatusForms: a status written by respond, a class, zones with and
// without count_status on one request, on Redis and the in-process store.
func TestCountStatusForms(t *testing.T) {
	for _, store := range []struct{ name, redis string }{
		{"redis", "redis " + sharedRedis.URL() + "\n\t\tkey_prefix " + uniquePrefix(t)},
		{"in-process", ""},
	} {
		t.Run(store.name, func(t *testing.T) {
			startCaddy(t, `
:9080 {
	sliding_ratelimit {
		zone errors 1m 2 {
			count_status 4xx
		}
		zone all 1m 5
		`+store.redis+`
	}
	respond /missing* 404
	respond /forbidden* 403
	respond /ok* 200
}`)
			client := from("127.0.0." + map[string]string{"redis": "4", "in-process": "5"}[store.name])
			expect(t, "ok", site+"ok", []int{200, 200}, client)
			expect(t, "404 and 403, counted by both zones", site+"missing", []int{404}, client)
			expect(t, "403", site+"forbidden", []int{403}, client)
			// errors is full (2 of 2); all holds 4 of 5.
			expect(t, "ok with the errors zone full", site+"ok", []int{429}, client)
		})
	}
}

// TestCountStatusOnCluster: refunds reach the right slot on Redis Cluster.
func TestCountStatusOnCluster(t *testing.T) {
	cluster := redistest.StartCluster(t, 3)
	in := newInstance(t, `{"zones": [
		{"name": "fails", "window": "1m", "max_requests": 2, "count_status": [401]},
		{"name": "by_header", "window": "1m", "max_requests": 100, "key": "{http.request.header.X-User}", "count_status": [401]}],
		"redis": "`+cluster.URL()+`", "redis_topology": "cluster", "timeout": "1s"}`)
	good, bad := basicAuth("right"), basicAuth("wrong")
	good.Set("X-User", "u1")
	bad.Set("X-User", "u1")
	for i := 0; i < 10; i++ {
		if status := send(t, "/login", to(in), from("192.0.2.40"), withHeaders(good), withNext(loginHandler)).status; status != 200 {
			t.Fatalf("good login %d: %d", i+1, status)
		}
	}
	for i, want := range []int{401, 401, 429} {
		if status := send(t, "/login", to(in), from("192.0.2.40"), withHeaders(bad), withNext(loginHandler)).status; status != want {
			t.Errorf("bad login %d: %d, want %d", i+1, status, want)
		}
	}
}

// TestBandwidthRecipe is the recipe of docs/bandwidth.md with a budget of
// 10,000 bytes an hour instead of a gigabyte: file_server's responses are
// charged their bytes (served by sendfile, past Write), a request is
// admitted while the window has room for its reservation of 1 byte and
// then pays in full, a HEAD costs nothing, a range costs its bytes, and a
// file larger than the budget is charged the budget, which blocks the
// client for the hour.
func TestBandwidthRecipe(t *testing.T) {
	root := t.TempDir()
	for name, size := range map[string]int{"small.bin": 4000, "big.bin": 30000} {
		if err := os.WriteFile(filepath.Join(root, name), []byte(strings.Repeat("b", size)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	zone := uniqueZone("bandwidth")
	startCaddy(t, siteBlock(":9080", uniquePrefix(t), `
	sliding_ratelimit {
		zone `+zone+` 1h 10000 {
			settle bytes
		}
	}
	root * `+root+`
	file_server`))
	small, big := site+"small.bin", site+"big.bin"
	a := from("127.0.0.2")
	res := send(t, small, a, withMethod(http.MethodHead))
	if got, want := res.header.Get("RateLimit-Policy"), `"`+zone+`";q=10000;qu="content-bytes";w=3600`; got != want {
		t.Errorf("RateLimit-Policy %q, want %q", got, want)
	}
	if got := unitsUsed(t, zone, "127.0.0.2", 0); got != 0 {
		t.Errorf("a HEAD request was charged %d bytes, want 0", got)
	}
	send(t, small, a, withHeader("Range", "bytes=0-99"))
	if got := unitsUsed(t, zone, "127.0.0.2", 100); got != 100 {
		t.Errorf("a range of 100 bytes was charged %d, want 100", got)
	}
	for i, want := range []struct {
		status int
		used   int64
	}{{200, 4100}, {200, 8100}, {200, 12100}, {429, 12100}} {
		res := send(t, small, a)
		if res.status != want.status {
			t.Errorf("download %d: status %d, want %d", i+1, res.status, want.status)
		}
		if res.status == http.StatusOK && len(res.body) != 4000 {
			t.Errorf("download %d: %d bytes, want the whole file", i+1, len(res.body))
		}
		if got := unitsUsed(t, zone, "127.0.0.2", want.used); got != want.used {
			t.Errorf("after download %d: %d bytes charged, want %d", i+1, got, want.used)
		}
	}

	b := from("127.0.0.3")
	if res := send(t, big, b); res.status != http.StatusOK || len(res.body) != 30000 {
		t.Errorf("a file larger than the budget: %d, %d bytes; want it whole (admitted on a reservation of 1)", res.status, len(res.body))
	}
	if got := unitsUsed(t, zone, "127.0.0.3", 30000); got != 30000 {
		t.Errorf("a 30,000-byte file was charged %d, want all of it, 30000", got)
	}
	res = send(t, small, b)
	if retry, _ := strconv.Atoi(res.header.Get("Retry-After")); res.status != http.StatusTooManyRequests || retry < 3500 {
		t.Errorf("after a charge above the budget: %d, Retry-After %q; want 429 for about the hour", res.status, res.header.Get("Retry-After"))
	}
	if s := adminState(t, zone, "127.0.0.3"); s.Unit != "content-bytes" || s.Identity != zone+":bytes" {
		t.Errorf("admin state %+v, want unit content-bytes and identity %s:bytes", s, zone)
	}
}

// TestBandwidthKeyStaysSmall: through Caddy and Redis, one client of a
// bandwidth budget of 10^9 bytes an hour requesting a 1-byte file 3,000
// times keeps a Redis key of a few KB, not one entry per request (36 KB and
// growing before): admissions close in time merge, and the budget is still
// charged in full.
func TestBandwidthKeyStaysSmall(t *testing.T) {
	root := t.TempDir()
	if err := os.WriteFile(filepath.Join(root, "one.bin"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	zone, prefix := uniqueZone("tiny"), uniquePrefix(t)
	startCaddy(t, siteBlock(":9080", prefix, `
	sliding_ratelimit {
		zone `+zone+` 1h 1000000000 {
			settle bytes
		}
	}
	root * `+root+`
	file_server`))
	const requests = 3000
	for i := range requests {
		if res := send(t, site+"one.bin", from("127.0.0.9")); res.status != http.StatusOK {
			t.Fatalf("request %d: %d", i+1, res.status)
		}
	}
	key := prefix + "{127.0.0.9}:" + zone + ":bytes"
	size, err := sharedRedis.Client(t).MemoryUsage(context.Background(), key).Result()
	if err != nil {
		t.Fatalf("MEMORY USAGE %s: %v", key, err)
	}
	t.Logf("%d admissions of 1 byte: MEMORY USAGE %d bytes", requests, size)
	if size > 16<<10 {
		t.Errorf("one client's key takes %d bytes after %d admissions, want at most 16 KB", size, requests)
	}
	if used := unitsUsed(t, zone, "127.0.0.9", requests); used != requests {
		t.Errorf("%d bytes charged, want %d", used, requests)
	}
}

// TestReservationHoldsPastWindow: a call longer than its zone's window
// keeps its reservation until it is settled, in both stores: while a 3 s
// response of a 2 s window runs, another call that fits only without its
// reservation is refused, after the reservation's admission has left the
// window; once it ends, its usage counts from then.
func TestReservationHoldsPastWindow(t *testing.T) {
	upstream := usageUpstream(t)
	for _, store := range []string{"redis", "memory"} {
		t.Run(store, func(t *testing.T) {
			zone := uniqueZone("long")
			block := `
	sliding_ratelimit {
		zone ` + zone + ` 2s 100 {
			cost 60
			settle header X-Usage
			key {http.request.header.X-Client}
		}
	}
	reverse_proxy ` + upstream
			if store == "redis" {
				startCaddy(t, siteBlock(":9080", uniquePrefix(t), block))
			} else {
				startCaddy(t, "\n:9080 {"+block+"\n}")
			}
			start := time.Now()
			done := make(chan answer, 1)
			go func() {
				// Three bytes a second apart, then a usage of 50.
				done <- send(t, site, withHeader("X-Client", "streamer"), withHeader("X-Test-Trailer", "50"),
					withHeader("X-Test-Bytes", "3"), withHeader("X-Test-Chunk", "1"), withHeader("X-Test-Chunk-Delay", "1s"))
			}()
			time.Sleep(2500*time.Millisecond - time.Since(start))
			if res := send(t, site, withHeader("X-Client", "streamer")); res.status != http.StatusTooManyRequests {
				t.Errorf("2.5 s into a 3 s call of a 2 s window: %d, want 429: its reservation of 60 still holds room", res.status)
			}
			if res := <-done; res.status != http.StatusOK {
				t.Fatalf("the long call: %d", res.status)
			}
			ended := time.Now()
			if got := unitsUsed(t, zone, "streamer", 50); got != 50 {
				t.Errorf("after the long call: %d units used, want its usage, 50", got)
			}
			if res := send(t, site, withHeader("X-Client", "streamer")); res.status != http.StatusTooManyRequests && time.Since(ended) < 2*time.Second {
				t.Errorf("just after the long call: %d, want 429 (50 used + 60 > 100)", res.status)
			}
		})
	}
}

// TestSettleHoldsNoResponse: a settle that gives units back is queued
// before the handler returns and answered after it: a Redis reached two
// seconds late holds neither the response nor (with HTTP/1.1) the
// connection's next request, and the client's next decision, queued after
// the settle, sees it. A settle that charges more than was reserved is
// answered before the response ends, so that the client's next request,
// through another instance whose Redis is reached at once, counts it.
func TestSettleHoldsNoResponse(t *testing.T) {
	srv, proxy := faultRedis(t)
	prefix := uniquePrefix(t)
	config := `{"window": "1m", "max_requests": 100, "cost": "30", "settle": {"header": "X-Usage"}, "key_prefix": "` + prefix + `", "timeout": "5s", "redis": `
	in := newInstance(t, config+`"redis://`+proxy.Addr()+`"}`)
	direct := newInstance(t, config+`"`+srv.URL()+`"}`)
	var late atomic.Bool
	usage := func(units string) caddyhttp.Handler {
		return caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
			if late.CompareAndSwap(false, true) {
				// The decision is made; what is sent to Redis next
				// reaches it 2s late.
				proxy.Latency(t, redistest.Upstream, 2*time.Second, 0)
			}
			w.Header().Set("X-Usage", units)
			w.WriteHeader(http.StatusOK)
			return nil
		})
	}
	start := time.Now()
	if res := send(t, "/", to(in), from("192.0.2.7"), withNext(usage("20"))); res.status != http.StatusOK {
		t.Fatalf("status %d, want 200", res.status)
	}
	if took := time.Since(start); took > time.Second {
		t.Errorf("the response took %v: it waited for its settle, which reaches Redis 2s late", took)
	}
	// The next decision goes after the settle: 20 of 100 spent, so a
	// request that reserves 30 sees 50 left (40 had it missed the settle).
	res := send(t, "/", to(in), from("192.0.2.7"), withNext(usage("45")))
	if got := res.header.Get("RateLimit"); !strings.Contains(got, ";r=50;") {
		t.Errorf("the decision after the settle: RateLimit %q, want r=50", got)
	}
	// 20 + 45 spent: through the other instance, a request that reserves
	// 30 sees 5 left (20, had the response not waited for the settle of
	// 45, which reaches Redis 2s late).
	if got := send(t, "/", to(direct), from("192.0.2.7"), withNext(usage("0"))).header.Get("RateLimit"); !strings.Contains(got, ";r=5;") {
		t.Errorf("through another instance after the settle of 45: RateLimit %q, want r=5", got)
	}
	in.settled()
	direct.settled()
}
