package slidingratelimit

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/redis/go-redis/v9"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/redisconn"
	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/redistest"
	"github.com/slidingratelimit/caddy-sliding-ratelimit/limiter"
)

// TestAnnouncedKeys: an announced key that is one of the backend's is
// forgotten in its deny cache; one of another prefix, zone or client leaves
// the cache alone; one of its prefix that it cannot read clears the cache,
// which is exact whatever the key meant.
func TestAnnouncedKeys(t *testing.T) {
	prefix := uniquePrefix(t)
	in := newInstance(t, `{"zones": [{"name": "ann", "window": "1m", "max_requests": 1}],
		"redis": "`+sharedRedis.URL()+`", "key_prefix": "`+prefix+`"}`)
	// The first subscription clears the cache: after it, only the
	// announcements below do.
	waitSubscribed(t, in.Handler)
	const ip = "192.0.2.61"
	send(t, "/", to(in), from(ip))
	for _, c := range []struct {
		name, key string
		forgets   bool
	}{
		{"another prefix", "other:{" + ip + "}:ann", false},
		{"another zone", prefix + "{" + ip + "}:login", false},
		{"another client", prefix + "{192.0.2.62}:ann", false},
		{"a layout of another version", prefix + "{" + ip + "}", true},
		{"the client", prefix + "{" + ip + "}:ann", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			if status := send(t, "/", to(in), from(ip)).status; status != http.StatusTooManyRequests || cached(in.Handler) != 1 {
				t.Fatalf("status %d, %d cached; want 429 and 1", status, cached(in.Handler))
			}
			in.backend.Announced(c.key, redisconn.Reset)
			want := 1
			if c.forgets {
				want = 0
			}
			if got := cached(in.Handler); got != want {
				t.Errorf("%s: %d cached after the announcement, want %d", c.key, got, want)
			}
		})
	}
}

// TestGoRedisLinesInCaddysLog: go-redis's own lines (a failed dial in an
// outage) are in Caddy's log, as its lines are, and throttled: one of a kind
// for many failed requests.
func TestGoRedisLinesInCaddysLog(t *testing.T) {
	srv := redistest.Start(t)
	logFile := startCaddy(t, `:9080 {
	sliding_ratelimit {
		window 1m
		max_requests 100
		key {http.request.header.X-Client}
		redis `+srv.URL()+`
		key_prefix `+uniquePrefix(t)+`
	}
	respond "ok"
}`)
	send(t, site, withHeader("X-Client", "before"))
	srv.Stop()
	for i := range 40 {
		send(t, site, withHeader("X-Client", "c"+strconv.Itoa(i)))
		time.Sleep(30 * time.Millisecond) // past the breaker's pauses, so that go-redis dials again
	}
	lines := logLines(t, logFile, `"logger":"go-redis"`)
	dials := logLines(t, logFile, `"logger":"go-redis"`, "failed to dial")
	if len(dials) == 0 {
		t.Fatalf("no go-redis line about the failed dials in Caddy's log; its go-redis lines: %v", lines)
	}
	if len(dials) > 2 || !strings.Contains(dials[0], `"level":"warn"`) {
		t.Errorf("go-redis dial lines in Caddy's log, want one or two warnings for 40 requests in an outage:\n%s", strings.Join(dials, "\n"))
	}
}

// TestRedisSilentAtStartSaysWhatItMeans: a Redis that answers nothing at
// load is a warning that says what the fail mode does until it answers (with
// open: every limit off), counted in config_warnings; the requests it lets
// through are counted as failed_open, which SlidingRatelimitFailingOpen
// alerts on.
func TestRedisSilentAtStartSaysWhatItMeans(t *testing.T) {
	port, err := redistest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ failMode, want string }{
		{"open", "redis not reachable at provision: requests pass unlimited (fail_mode open) until it answers"},
		{"closed", "redis not reachable at provision: requests are refused with 503 (fail_mode closed) until it answers"},
	} {
		zone := uniqueZone("silent")
		logFile := startCaddy(t, `:9080 {
	sliding_ratelimit {
		zone `+zone+` 1m 2
		redis redis://127.0.0.1:`+strconv.Itoa(port)+`/0
		fail_mode `+c.failMode+`
	}
	respond "ok"
}`)
		if lines := logLines(t, logFile, c.want); len(lines) != 1 || !strings.Contains(lines[0], `"level":"warn"`) {
			t.Errorf("fail_mode %s: warnings %v, want one saying %q", c.failMode, logLines(t, logFile, "not reachable"), c.want)
		}
		if got := scrape(t, "caddy_sliding_ratelimit_config_warnings"); got != 1 {
			t.Errorf("fail_mode %s: config_warnings = %v, want 1", c.failMode, got)
		}
		if c.failMode == "open" {
			expect(t, "a silent Redis, fail_mode open", site, []int{200, 200, 200, 200}, from("127.0.0.2"))
			if got := scrape(t, `caddy_sliding_ratelimit_decisions_total{result="failed_open",zone="`+zone+`"}`); got != 4 {
				t.Errorf("failed_open = %v, want 4", got)
			}
		}
	}
}

// TestRedisACLUser: an ACL user and password from the URL, taken from an
// environment placeholder, work; a wrong password fails the config with
// Redis's own answer, which does not carry the password.
func TestRedisACLUser(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client(t)
	ctx := context.Background()
	if err := admin.Do(ctx, "ACL", "SETUSER", "limiter", "on", ">s3cret-pw", "~srl:*", "+@all").Err(); err != nil {
		t.Fatal(err)
	}
	if err := admin.Do(ctx, "ACL", "SETUSER", "default", "off").Err(); err != nil {
		t.Fatal(err)
	}

	t.Setenv("SRL_TEST_REDIS_URL", "redis://limiter:s3cret-pw@"+srv.Addr()+"/0")
	good := newInstance(t, `{"window": "1m", "max_requests": 2, "redis": "{env.SRL_TEST_REDIS_URL}", "fail_mode": "closed"}`)
	for i, want := range []int{http.StatusOK, http.StatusOK, http.StatusTooManyRequests} {
		if status := send(t, "/", to(good), from("192.0.2.5")).status; status != want {
			t.Fatalf("request %d as the ACL user: %d, want %d", i+1, status, want)
		}
	}

	err := provisionError(t, `{"window": "1m", "max_requests": 2, "redis": "redis://limiter:wrong-pw@`+srv.Addr()+`/0", "fail_mode": "closed"}`)
	if err == nil || !strings.Contains(err.Error(), "WRONGPASS") {
		t.Fatalf("wrong password: provision error %v, want one with Redis's WRONGPASS", err)
	}
	if strings.Contains(err.Error(), "wrong-pw") {
		t.Errorf("error carries the password: %v", err)
	}
}

// TestFailClosedOutageDoesNotFloodTheLog: Redis frozen under load with
// fail_mode closed. Each request gets a 503 with Retry-After; the log gets the
// module's own failure line at most once a second, not an error-level line
// per request from Caddy's error path. With handle_errors, the 503 is still
// shaped there, and Caddy logs those handled errors at debug level only.
func TestFailClosedOutageDoesNotFloodTheLog(t *testing.T) {
	for _, c := range []struct {
		name, errors, body string
	}{
		{"without handle_errors", "", ""},
		{"with handle_errors", `
	handle_errors {
		respond "shaped {err.status_code}" {err.status_code}
	}`, "shaped 503"},
	} {
		t.Run(c.name, func(t *testing.T) {
			srv := redistest.Start(t)
			logFile := startCaddy(t, `
:9080 {
	sliding_ratelimit {
		window 1m
		max_requests 1000
		redis `+srv.URL()+`
		timeout 100ms
		fail_mode closed
	}
	respond "ok"`+c.errors+`
}`)
			expect(t, "Redis up", site, []int{200}, from("127.0.0.2"))
			if err := srv.Freeze(); err != nil {
				t.Fatal(err)
			}
			defer srv.Thaw()

			// Workers are goroutines, where send may not end the test: they
			// send through the client it uses.
			client := clientAt(t, "127.0.0.2")
			const workers, each = 4, 200
			type answer struct {
				status           int
				retryAfter, body string
			}
			answers := make(chan answer, workers*each)
			start := time.Now()
			var wg sync.WaitGroup
			for range workers {
				wg.Go(func() {
					for range each {
						res, err := client.Get(site)
						if err != nil {
							t.Error(err)
							return
						}
						body, _ := io.ReadAll(res.Body)
						res.Body.Close()
						answers <- answer{res.StatusCode, res.Header.Get("Retry-After"), string(body)}
					}
				})
			}
			wg.Wait()
			elapsed := time.Since(start)
			close(answers)
			n, wrong := 0, 0
			for a := range answers {
				n++
				if a.status != http.StatusServiceUnavailable || a.retryAfter != "1" || a.body != c.body {
					if wrong++; wrong == 1 {
						t.Errorf("answer %d: %d, Retry-After %q, body %q; want 503, Retry-After 1, body %q", n, a.status, a.retryAfter, a.body, c.body)
					}
				}
			}
			if wrong > 0 {
				t.Errorf("%d of %d answers wrong", wrong, n)
			}

			// The throttled failure line comes at once, then at most once a
			// second.
			most := int(elapsed/time.Second) + 1
			errorLines := logLines(t, logFile, `"level":"error"`)
			if len(errorLines) > most {
				t.Errorf("%d error-level log lines for %d fail-closed answers in %v, want at most %d: %s",
					len(errorLines), n, elapsed.Round(time.Millisecond), most, strings.Join(errorLines[:min(len(errorLines), 3)], "\n"))
			}
			if lines := logLines(t, logFile, `"logger":"http.log.error"`); len(lines) > 0 {
				t.Errorf("%d lines of Caddy's error log at INFO and above, want none: %s", len(lines), lines[0])
			}
			if lines := logLines(t, logFile, `"level":"error"`, "rate limit store unavailable"); len(lines) == 0 {
				t.Error("no line says the store is unavailable")
			}
			t.Logf("%d answers of 503 in %v: %d error-level log lines", n, elapsed.Round(time.Millisecond), len(errorLines))
		})
	}
}

// validateCaddyfile adapts a Caddyfile and provisions it as Caddy would
// before serving it, without serving it.
func validateCaddyfile(t *testing.T, caddyfile string) error {
	t.Helper()
	cfgJSON, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(caddyfile), nil)
	if err != nil {
		t.Fatalf("adapt: %v", err)
	}
	return caddy.Validate(mustConfig(t, cfgJSON))
}

func mustConfig(t *testing.T, cfgJSON []byte) *caddy.Config {
	t.Helper()
	cfg := new(caddy.Config)
	if err := caddy.StrictUnmarshalJSON(cfgJSON, cfg); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// TestRedisRefusalsFailTheConfig: what no retry can fix is reported at
// provision in Redis's own words, instead of a config that loads and then
// fails every request (open: no limit at all).
func TestRedisRefusalsFailTheConfig(t *testing.T) {
	notRedis := httptest.NewServer(http.NotFoundHandler())
	t.Cleanup(notRedis.Close)
	for _, c := range []struct {
		name, url, want string
	}{
		{"database index out of range", "redis://" + sharedRedis.Addr() + "/99", "DB index is out of range"},
		{"not a redis server", "redis://" + strings.TrimPrefix(notRedis.URL, "http://") + "/0", "redis"},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := validateCaddyfile(t, `
:0 {
	sliding_ratelimit {
		window 1m
		max_requests 5
		redis `+c.url+`
	}
	respond "ok"
}`)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("provision error %v, want one containing %q", err, c.want)
			}
			if strings.Contains(err.Error(), "unexpected type") {
				t.Errorf("a decoding error stands for Redis's answer: %v", err)
			}
		})
	}
}

// TestUnreachableRedisStillLoads: a Redis that is down at provision may come
// up later; the config loads and the fail mode answers meanwhile.
func TestUnreachableRedisStillLoads(t *testing.T) {
	down := redistest.Start(t)
	url := down.URL()
	down.Stop()
	in := newInstance(t, `{"window": "1m", "max_requests": 2, "redis": "`+url+`", "fail_mode": "closed", "timeout": "50ms"}`)
	if status := send(t, "/", to(in), from("192.0.2.7")).status; status != http.StatusServiceUnavailable {
		t.Fatalf("redis down, fail_mode closed: %d, want 503", status)
	}
}

// TestRedisMemoryPolicyWarnings: at start, a Redis whose policy would evict
// limit state when full (allkeys-*, volatile-*) is a warning that says what
// keeps limits (noeviction, and memory); a Redis without a maxmemory, or
// with noeviction, is none.
func TestRedisMemoryPolicyWarnings(t *testing.T) {
	srv := redistest.Start(t)
	rc := srv.Client(t)
	for _, c := range []struct {
		policy, maxmemory string
		warning           string
	}{
		{"noeviction", "0", ""},
		{"noeviction", "50mb", ""},
		{"allkeys-lru", "50mb", "evicts the limiter's keys when it is full (maxmemory-policy allkeys-lru)"},
		{"allkeys-lfu", "50mb", "evicts the limiter's keys when it is full (maxmemory-policy allkeys-lfu)"},
		{"allkeys-lru", "0", ""},
		{"volatile-ttl", "50mb", "evicts the limiter's keys when it is full (maxmemory-policy volatile-ttl)"},
	} {
		t.Run(c.policy+"/"+c.maxmemory, func(t *testing.T) {
			ctx := context.Background()
			if err := rc.ConfigSet(ctx, "maxmemory-policy", c.policy).Err(); err != nil {
				t.Fatal(err)
			}
			if err := rc.ConfigSet(ctx, "maxmemory", c.maxmemory).Err(); err != nil {
				t.Fatal(err)
			}
			logFile := startCaddy(t, `
:9080 {
	sliding_ratelimit {
		window 1m
		max_requests 10
		redis `+srv.URL()+`
	}
	respond "ok"
}`)
			lines := logLines(t, logFile, "maxmemory")
			switch {
			case c.warning == "" && len(lines) != 0:
				t.Errorf("warnings %q, want none", lines)
			case c.warning != "" && len(lines) != 1:
				t.Errorf("%d warnings about maxmemory, want 1: %q", len(lines), lines)
			case c.warning != "":
				for _, want := range []string{`"level":"warn"`, c.warning, "set maxmemory-policy noeviction", "memory of every client"} {
					if !strings.Contains(lines[0], want) {
						t.Errorf("warning %s, want it to say %q", lines[0], want)
					}
				}
			}
		})
	}
}

// TestRedisFullOOM: a Redis filled to its maxmemory with noeviction refuses
// the limiter's writes (OOM). Every request gets the fail mode (open: 200),
// store_errors_total{reason="oom"} counts the refusals, and the log stays
// bounded: a line a second about the full Redis, not one per request, and
// no more than a few lines a second in all.
func TestRedisFullOOM(t *testing.T) {
	srv := redistest.Start(t)
	rc := srv.Client(t)
	ctx := context.Background()
	logFile := startCaddy(t, `
:9080 {
	sliding_ratelimit {
		key {http.request.header.X-Client}
		window 1m
		max_requests 1000
		redis `+srv.URL()+`
	}
	respond "ok"
}`)
	for _, kv := range [][2]string{{"maxmemory-policy", "noeviction"}, {"maxmemory", "4mb"}} {
		if err := rc.ConfigSet(ctx, kv[0], kv[1]).Err(); err != nil {
			t.Fatal(err)
		}
	}
	value := strings.Repeat("v", 64<<10)
	for i := 0; ; i++ {
		err := rc.Set(ctx, fmt.Sprintf("fill:%d", i), value, 0).Err()
		if err != nil && strings.HasPrefix(err.Error(), "OOM") {
			break
		}
		if err != nil || i > 1000 {
			t.Fatalf("filling redis: %d values, %v", i, err)
		}
	}
	oom := `caddy_sliding_ratelimit_store_errors_total{reason="oom"}`
	before := scrape(t, oom)
	linesBefore := len(logLines(t, logFile, ""))

	start := time.Now()
	var wg sync.WaitGroup
	var mu sync.Mutex
	statuses := map[int]int{}
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; time.Since(start) < 2*time.Second; i++ {
				s := send(t, site, from("127.0.0.2"), withHeader("X-Client", fmt.Sprintf("c%d-%d", g, i))).status
				mu.Lock()
				statuses[s]++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	refused := scrape(t, oom) - before
	all := logLines(t, logFile, "")[linesBefore:]
	full := logLines(t, logFile, "redis is out of memory")
	t.Logf("%v requests in %v against a full redis; %v refusals counted as oom; %d log lines in all, %d about the full redis",
		statuses, elapsed.Round(time.Millisecond), refused, len(all), len(full))
	if statuses[http.StatusOK] == 0 || len(statuses) != 1 {
		t.Errorf("statuses %v, want every request 200 (fail_mode open)", statuses)
	}
	if refused < 1 {
		t.Errorf("%s grew by %v, want the refusals counted", oom, refused)
	}
	seconds := int(elapsed/time.Second) + 2
	if len(full) < 1 || len(full) > seconds {
		t.Errorf("%d lines about the full redis in %v, want 1 to %d (a line a second)", len(full), elapsed, seconds)
	}
	if len(all) > 4*seconds {
		t.Errorf("%d log lines in %v, want at most %d: the log of a full redis must be bounded", len(all), elapsed, 4*seconds)
	}
}

// TestRedisFullKeepsKnownClientsExact: a Redis at maxmemory with noeviction
// refuses every write, but it still answers reads: a client it holds
// spends exactly what it had left, decided in process from what Redis
// holds; a client it holds nothing of gets the fail mode (closed: 503;
// local: the in-process store). When Redis has room again, what was
// admitted meanwhile is charged to it.
func TestRedisFullKeepsKnownClientsExact(t *testing.T) {
	for _, mode := range []string{failClosed, failLocal} {
		t.Run(mode, func(t *testing.T) {
			srv := redistest.Start(t)
			rc := srv.Client(t)
			ctx := context.Background()
			startCaddy(t, `
:9080 {
	sliding_ratelimit {
		key {http.request.header.X-Client}
		window 1m
		max_requests 10
		fail_mode `+mode+`
		redis `+srv.URL()+`
	}
	respond "ok"
}`)
			count := func(client string, n int) map[int]int {
				statuses := map[int]int{}
				for range n {
					statuses[send(t, site, withHeader("X-Client", client)).status]++
				}
				return statuses
			}
			if got := count("known", 7); got[http.StatusOK] != 7 {
				t.Fatalf("before redis filled up: %v, want 7 200s", got)
			}
			fillRedis(t, rc)

			if got := count("known", 10); got[http.StatusOK] != 3 || got[http.StatusTooManyRequests] != 7 {
				t.Errorf("a client redis holds 7 of 10 of, on a full redis: %v, want 3 200s and 7 429s", got)
			}
			fresh := count("fresh", 12)
			switch mode {
			case failClosed:
				if fresh[http.StatusServiceUnavailable] != 12 {
					t.Errorf("a client redis holds nothing of, fail_mode closed: %v, want 12 503s", fresh)
				}
			case failLocal:
				if fresh[http.StatusOK] != 10 || fresh[http.StatusTooManyRequests] != 2 {
					t.Errorf("a client redis holds nothing of, fail_mode local: %v, want 10 200s and 2 429s", fresh)
				}
			}

			// Room again, and no count: what the first answer after the
			// outage charges is what was admitted in process meanwhile.
			if err := rc.FlushDB(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			if err := rc.ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
				t.Fatal(err)
			}
			send(t, site, withHeader("X-Client", "other"))
			wantUsed := map[string]int64{"known": 3, "fresh": 0}
			if mode == failLocal {
				wantUsed["fresh"] = 10
			}
			for client, want := range wantUsed {
				if got := unitsUsed(t, "default", client, want); got != want {
					t.Errorf("redis holds %d of %q after it had room again, want the %d admitted in process", got, client, want)
				}
			}
		})
	}
}

// fillRedis makes rc's Redis full: maxmemory below what it uses, with
// noeviction, so that it refuses every write (and no write frees enough to
// let the next one in); the test's end lifts the limit.
func fillRedis(t *testing.T, rc *redis.Client) {
	t.Helper()
	ctx := context.Background()
	for _, kv := range [][2]string{{"maxmemory-policy", "noeviction"}, {"maxmemory", "1"}} {
		if err := rc.ConfigSet(ctx, kv[0], kv[1]).Err(); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { _ = rc.ConfigSet(ctx, "maxmemory", "0").Err() })
}

// TestRedisOverTLS: a rediss:// URL reaches Redis over TLS (the server's TLS
// port speaks nothing else), and the server's certificate is verified unless
// the URL says skip_verify=true: a certificate the system does not trust
// fails the config.
func TestRedisOverTLS(t *testing.T) {
	srv := redistest.StartTLS(t)
	config := func(url, prefix string) string {
		return `{"window": "1m", "max_requests": 3, "fail_mode": "closed", "timeout": "1s",
			"redis": "` + url + `", "key_prefix": "` + prefix + `"}`
	}

	t.Run("certificate verified", func(t *testing.T) {
		// The server's CA is its own, not one the system trusts: no retry
		// can fix the handshake, so the config fails with the reason.
		err := provisionError(t, config(srv.TLSURL(), uniquePrefix(t)))
		if err == nil || !strings.Contains(err.Error(), "certificate signed by unknown authority") {
			t.Errorf("untrusted certificate: provision error %v, want the certificate error", err)
		}
	})

	t.Run("skip_verify", func(t *testing.T) {
		prefix := uniquePrefix(t)
		in := newInstance(t, config(srv.TLSURL()+"?skip_verify=true", prefix))
		for i, want := range []int{200, 200, 200, 429} {
			if code := send(t, "/", to(in), from("192.0.2.11")).status; code != want {
				t.Errorf("request %d over TLS: status %d, want %d", i+1, code, want)
			}
		}
		// The admissions are in Redis: read them over the plain port.
		n, err := admissionsKept(context.Background(), srv.Client(t), prefix+"{192.0.2.11}:default")
		if err != nil {
			t.Fatal(err)
		}
		if n != 3 {
			t.Errorf("Redis holds %d admissions for the client, want 3", n)
		}
	})
}

// TestLostScriptRepliesAreSentAgainOnce: a proxy between Caddy and Redis
// closes the connection instead of delivering every third script reply. The
// script ran, so Redis recorded the admission; the store sends the call
// again once, on another connection, and its reply decides the request:
// the lost call counts, and no request is admitted twice. go-redis sends
// nothing again of its own, whatever the URL says about retries, or a call
// would count more than twice.
func TestLostScriptRepliesAreSentAgainOnce(t *testing.T) {
	for _, query := range []string{"", "?max_retries=3"} {
		t.Run("url"+query, func(t *testing.T) {
			srv := redistest.Start(t)
			cutter := redistest.StartReplyCutter(t, srv.Addr())
			checkLostReplies(t, cutter.URL()+query, cutter)
		})
	}
}

// TestLostScriptRepliesOnClusterAreSentAgainOnce: the same on Redis
// Cluster, whose client would send a call again by a loop of its own
// (max_redirects), whatever max_retries says.
func TestLostScriptRepliesOnClusterAreSentAgainOnce(t *testing.T) {
	cluster := redistest.StartCluster(t, 3)
	var cutters []*redistest.ReplyCutter
	for _, c := range cluster.ThroughReplyCutters(t) {
		cutters = append(cutters, c)
	}
	for _, query := range []string{"", "&max_retries=3"} {
		t.Run("url"+query, func(t *testing.T) {
			checkLostReplies(t, "cluster "+cluster.URL()+query, cutters...)
		})
	}
}

// checkLostReplies sends requests from one client to a site on redis (the
// redis subdirective's arguments), while the cutters cut every third script
// reply, and checks that each request was decided by Redis, its call sent
// again after a lost reply (the call after a cut one is not cut), and that
// Redis holds one admission per request served and one per reply lost.
func checkLostReplies(t *testing.T, redis string, cutters ...*redistest.ReplyCutter) {
	t.Helper()
	// A timeout long enough for go-redis's retries to finish in it, as
	// they would with Redis close by.
	startCaddy(t, `
:9080 {
	sliding_ratelimit {
		zone lost 1m 1000
		redis `+redis+`
		key_prefix `+uniquePrefix(t)+`
		timeout 2s
		fail_mode closed
	}
	respond "ok"
}`)
	client := newFaultClient(t, 2)
	if a := client.get(""); a.status != http.StatusOK {
		t.Fatalf("before cutting: %+v", a)
	}
	var cutBefore, scriptsBefore int64
	for _, c := range cutters {
		cutBefore += c.Cut()
		scriptsBefore += c.Scripts()
		c.CutEvery(3)
	}
	served, failed := 1, 0
	for i := range 60 {
		switch a := client.get(""); {
		case a.err == nil && a.status == http.StatusOK && a.rateLimit != "":
			served++
		case a.err == nil && a.status == http.StatusServiceUnavailable:
			failed++
		default:
			t.Fatalf("request %d: %+v, want 200 decided by Redis or 503", i, a)
		}
	}
	var cut, scripts int64
	for _, c := range cutters {
		c.CutEvery(0)
		cut += c.Cut()
		scripts += c.Scripts()
	}
	cut -= cutBefore
	held := adminState(t, "lost", "127.0.0.2").Count
	t.Logf("%d script replies, %d cut; %d served, %d answered 503; Redis holds %d admissions", scripts-scriptsBefore, cut, served, failed, held)
	if cut == 0 {
		t.Fatal("no reply was cut")
	}
	if failed != 0 {
		t.Errorf("%d requests answered with the fail mode for %d replies cut: want none (each call sent again once, and the next reply is not cut)", failed, cut)
	}
	if held != int64(served)+cut {
		t.Errorf("Redis holds %d admissions for %d requests served and %d replies lost: want one each (a call sent more than twice counts more)", held, served, cut)
	}
}

// scriptCommands are the commands a store call can be, for commandCalls.
var scriptCommands = []string{"evalsha", "eval", "evalsha_ro", "eval_ro", "fcall", "fcall_ro"}

// TestNeverFitAnsweredInProcess: requests that cost more than a zone's max,
// the zone's own or a tenant's from a placeholder, are denied without a
// store call (Redis runs no script for them), in every zone of the request
// (the other zone records nothing), with a 429 without Retry-After, and
// logged in a line a second at most, not one each.
func TestNeverFitAnsweredInProcess(t *testing.T) {
	srv := redistest.Start(t)
	rc := srv.Client(t)
	tokens := uniqueZone("tok")
	logFile := startCaddy(t, `
:9080 {
	sliding_ratelimit {
		key {http.request.header.X-Client}
		zone `+tokens+` {
			window 1m
			max_requests {http.request.header.X-Quota} 100
			cost {http.request.header.X-Cost}
		}
		zone calls 1m 5
		redis `+srv.URL()+`
	}
	respond "ok"
}`)
	denied := limiterMetrics.decisions.WithLabelValues(tokens, resultDenied)
	deniedBefore := testutil.ToFloat64(denied)
	callsBefore := commandCalls(t, rc, scriptCommands...)

	const n = 400
	neverFit := func(i int) sendOption {
		if i%2 == 0 {
			// Above the zone's max_requests (the fallback, 100).
			return withHeaders(map[string][]string{"X-Client": {"c"}, "X-Cost": {"101"}})
		}
		// Above this tenant's max, from the placeholder.
		return withHeaders(map[string][]string{"X-Client": {"c"}, "X-Quota": {"10"}, "X-Cost": {"11"}})
	}
	start := time.Now()
	var wg sync.WaitGroup
	var mu sync.Mutex
	statuses := map[string]int{}
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := g; i < n; i += 8 {
				res := send(t, site, from("127.0.0.2"), neverFit(i))
				what := fmt.Sprintf("%d Retry-After=%q RateLimit=%s", res.status, res.header.Get("Retry-After"),
					strings.SplitAfter(res.header.Get("RateLimit"), ";")[0])
				mu.Lock()
				statuses[what]++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	calls := commandCalls(t, rc, scriptCommands...) - callsBefore
	lines := logLines(t, logFile, "cost more than the zone's max", tokens)
	t.Logf("%d never-fit requests in %v: answers %v; %d script calls; %d log lines", n, elapsed.Round(time.Millisecond), statuses, calls, len(lines))
	if want := fmt.Sprintf(`429 Retry-After="" RateLimit="%s";`, tokens); statuses[want] != n {
		t.Errorf("answers %v, want %d of %s", statuses, n, want)
	}
	if calls != 0 {
		t.Errorf("%d script calls for %d requests that can never fit, want 0", calls, n)
	}
	if got := testutil.ToFloat64(denied) - deniedBefore; got != n {
		t.Errorf("decisions_total{zone=%q,result=denied} grew by %v, want %d", tokens, got, n)
	}
	if maxLines := int(elapsed/time.Second) + 2; len(lines) < 1 || len(lines) > maxLines {
		t.Errorf("%d log lines for %d never-fit requests in %v, want 1 to %d (a line a second)", len(lines), n, elapsed, maxLines)
	}
	// Nothing was recorded in either zone: the calls zone has its five.
	res := send(t, site, from("127.0.0.2"), withHeader("X-Client", "c"), withHeader("X-Cost", "5"))
	want := fmt.Sprintf(`"calls";r=4;t=60, %q;r=95;t=60`, tokens)
	if res.status != http.StatusOK || res.header.Get("RateLimit") != want {
		t.Errorf("a request that fits after them: status %d, RateLimit %q; want 200 and %q (the never-fit ones recorded nothing)",
			res.status, res.header.Get("RateLimit"), want)
	}
}

// TestRedisUserRights: a user that may call the script by its hash but may
// neither load it nor use FUNCTION fails the config with the ACL rule to
// add (before, Caddy started and every decision failed open). A user
// without the module's channels (a new user on Redis 7 and later) loads
// with one warning, and a refund it settles is not logged as a failed
// settle though its announcement is refused.
func TestRedisUserRights(t *testing.T) {
	srv := redistest.Start(t)
	shaOnly := srv.UserURL(t, "shaonly", "~*", "&*", "+@all", "-eval", "-script", "-function")
	err := provisionError(t, `{"window": "1m", "max_requests": 2, "redis": "`+shaOnly+`"}`)
	if err == nil || !strings.Contains(err.Error(), "ACL SETUSER shaonly +evalsha +script|load") {
		t.Errorf("a user that may only EVALSHA: provision error %v, want the ACL rule to add", err)
	}

	for _, c := range []struct {
		name     string
		url      string
		warnings int64
	}{
		{"default user", srv.URL(), 0},
		{"no channels", srv.UserURL(t, "nochannels", "~*", "+@all", "-function"), 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			in := newInstance(t, `{"zones": [{"name": "login", "window": "10m", "max_requests": 1, "count_status": [401]}],
				"redis": "`+c.url+`", "key_prefix": "`+uniquePrefix(t)+`"}`)
			if got := in.warnings.logged.Load(); got != c.warnings {
				t.Errorf("%d warnings at start, want %d", got, c.warnings)
			}
			// A 200 is not counted: its refund frees the zone's only
			// room, which is announced.
			for i := range 3 {
				if status := send(t, "/", to(in), from("192.0.2.7")).status; status != http.StatusOK {
					t.Fatalf("request %d: %d, want 200", i+1, status)
				}
				in.settled()
			}
			b := in.backend
			b.settleFailures.mu.Lock()
			failed := !b.settleFailures.last.IsZero()
			b.settleFailures.mu.Unlock()
			b.unannounced.mu.Lock()
			unannounced := !b.unannounced.last.IsZero()
			b.unannounced.mu.Unlock()
			if failed {
				t.Error("settles applied in redis were logged as failed")
			}
			if want := c.warnings > 0; unannounced != want {
				t.Errorf("refunds' announcements logged as refused: %v, want %v", unannounced, want)
			}
		})
	}
}

// TestSettleRetriedUntilRedisTakesIt: a settle that Redis does not take
// (its connections refused while it runs) is sent again until Redis does,
// so a charge above the reservation is not lost: the client pays what it
// used, not what it reserved.
func TestSettleRetriedUntilRedisTakesIt(t *testing.T) {
	proxy := redistest.StartFaultProxy(t, sharedRedis.Addr())
	in := newInstance(t, `{"zones": [{"name": "retried", "window": "1m", "max_requests": 1000}],
		"redis": "`+proxy.URL()+`", "key_prefix": "`+uniquePrefix(t)+`"}`)
	z := in.zones[0]
	checks := []limiter.Check{{Zone: z.identity, Key: "=settled", Cost: 10, Limit: z.limit}}
	decisions := make([]limiter.Decision, 1)
	if _, err := in.backend.decide(context.Background(), checks, decisions); err != nil || !decisions[0].Allowed {
		t.Fatalf("decision: %+v, %v", decisions[0], err)
	}
	proxy.Disable()
	checks[0].Cost = 300
	// Charged above its reservation, the settle is answered (refused)
	// before settle returns.
	in.backend.settle(context.Background(), checks, decisions, []lowering{notLowered}, fromStore)
	proxy.Enable(t)
	var used int64
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if used = unitsHeld(t, in, "retried", "=settled"); used != 10 {
			break
		}
	}
	if used != 300 {
		t.Errorf("%d units held after a settle to 300 that Redis refused at first, want 300", used)
	}
}

// TestClientKillAdmitsNoMoreThanTheLimit: Redis kills every normal
// connection every 20 ms (CLIENT KILL TYPE normal) while 40 requests of one
// client go at once against a limit of 20, round after round. A call whose
// connection was killed may not have reached Redis: answered with the fail
// mode, it let its request through unrecorded (fail_mode open: 183 to 189
// rounds of 200 over the limit, most once five lost replies in a row had
// opened the breaker), or refused it (closed: 4,446 to 5,317 requests of
// 8,000). Sent again once, on another connection, it is decided by Redis,
// and at worst counted twice: no round admits more than the limit, and the
// fail mode answers only the requests whose second reply was lost too (a
// batch's requests at once; five such calls in a row open the breaker),
// fewer than a third of them (0 to 1,307 of 8,000 in eight runs on a busy
// machine). fail_mode closed, so that those few cannot pass
// the limit, and a timeout long enough that no deadline takes the fail
// mode: this test is about lost replies.
func TestClientKillAdmitsNoMoreThanTheLimit(t *testing.T) {
	const rounds, requests, limit = 200, 40, 20
	srv := redistest.Start(t)
	in := newInstance(t, `{"zones": [{"name": "killed", "window": "1m", "max_requests": `+strconv.Itoa(limit)+`}],
		"redis": "`+srv.URL()+`", "key_prefix": "`+uniquePrefix(t)+`", "fail_mode": "closed", "timeout": "2s"}`)
	killer := srv.Client(t)
	stop := make(chan struct{})
	var kills atomic.Int64
	var wg sync.WaitGroup
	wg.Go(func() {
		ticker := time.NewTicker(20 * time.Millisecond)
		defer ticker.Stop()
		for {
			select {
			case <-stop:
				return
			case <-ticker.C:
			}
			if n, err := killer.ClientKillByFilter(context.Background(), "TYPE", "normal").Result(); err == nil {
				kills.Add(n)
			}
		}
	})
	over, failed := 0, 0
	for round := range rounds {
		ip := "192.0.2." + strconv.Itoa(round+1)
		var admitted, refused atomic.Int64
		var rg sync.WaitGroup
		for range requests {
			rg.Go(func() {
				a := send(t, "/", to(in), from(ip))
				switch {
				case a.status == http.StatusOK:
					admitted.Add(1)
				case a.status == http.StatusServiceUnavailable:
					refused.Add(1)
				}
			})
		}
		rg.Wait()
		failed += int(refused.Load())
		if n := admitted.Load(); n > limit {
			over++
			t.Errorf("round %d: %d of %d requests admitted, limit %d", round, n, requests, limit)
		}
	}
	close(stop)
	wg.Wait()
	if kills.Load() == 0 {
		t.Fatal("no connection killed")
	}
	t.Logf("%d connections killed; %d of %d rounds over the limit; %d requests answered with the fail mode", kills.Load(), over, rounds, failed)
	if failed >= rounds*requests/3 {
		t.Errorf("%d requests of %d answered with the fail mode: want only those whose call lost its reply twice, fewer than a third", failed, rounds*requests)
	}
}
