package slidingratelimit

import (
	"context"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/redistest"
)

// flood sends n concurrent requests from one client spread over instances and
// counts the answers by status.
func flood(t *testing.T, instances []*instance, n int, clientIP string) map[int]int {
	var (
		mu     sync.Mutex
		counts = make(map[int]int)
		wg     sync.WaitGroup
		start  = make(chan struct{})
	)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(in *instance) {
			defer wg.Done()
			<-start
			status := send(t, "/", to(in), from(clientIP)).status
			mu.Lock()
			counts[status]++
			mu.Unlock()
		}(instances[i%len(instances)])
	}
	close(start)
	wg.Wait()
	return counts
}

func TestExactAcrossInstances(t *testing.T) {
	prefix := uniquePrefix(t)
	var instances []*instance
	for i := 0; i < 3; i++ {
		instances = append(instances, newInstance(t, `{
			"window": "1m", "max_requests": 50,
			"redis": "`+sharedRedis.URL()+`?client_name=instance`+strconv.Itoa(i)+`",
			"key_prefix": "`+prefix+`", "timeout": "2s", "fail_mode": "closed"}`))
	}
	counts := flood(t, instances, 600, "192.0.2.10")
	if counts[http.StatusOK] != 50 || counts[http.StatusTooManyRequests] != 550 {
		t.Errorf("600 concurrent requests over 3 instances, max 50: got %v, want exactly 50 x 200 and 550 x 429", counts)
	}
}

func TestExactAcrossInstancesOnCluster(t *testing.T) {
	cluster := redistest.StartCluster(t, 3)
	prefix := uniquePrefix(t)
	var instances []*instance
	for i := 0; i < 3; i++ {
		instances = append(instances, newInstance(t, `{
			"window": "1m", "max_requests": 50,
			"redis_topology": "cluster",
			"redis": "`+cluster.URL()+`&client_name=instance`+strconv.Itoa(i)+`",
			"key_prefix": "`+prefix+`", "timeout": "2s", "fail_mode": "closed"}`))
	}
	counts := flood(t, instances, 600, "192.0.2.10")
	if counts[http.StatusOK] != 50 || counts[http.StatusTooManyRequests] != 550 {
		t.Errorf("600 concurrent requests over 3 instances on a cluster, max 50: got %v, want exactly 50 x 200 and 550 x 429", counts)
	}

	// 1,000 clients spread over every master.
	perMaster := make(map[string]int)
	for i := 0; i < 1000; i++ {
		ip := "198.51." + strconv.Itoa(i/250) + "." + strconv.Itoa(i%250)
		if status := send(t, "/", to(instances[i%3]), from(ip)).status; status != http.StatusOK {
			t.Fatalf("client %s: status %d", ip, status)
		}
		perMaster[cluster.MasterOf(prefix+"{"+ip+"}:default")]++
	}
	if len(perMaster) != 3 {
		t.Errorf("1,000 clients landed on %d masters, want all 3: %v", len(perMaster), perMaster)
	}
	for master, n := range perMaster {
		if n < 200 {
			t.Errorf("master %s holds %d of 1,000 clients, want a fair share", master, n)
		}
	}
}

// TestZonesAcrossSlotsOnCluster: zones keyed by different headers live in
// different slots; a denial by one zone must refund the other.
func TestZonesAcrossSlotsOnCluster(t *testing.T) {
	cluster := redistest.StartCluster(t, 3)
	prefix := uniquePrefix(t)
	in := newInstance(t, `{
		"redis_topology": "cluster", "redis": "`+cluster.URL()+`",
		"key_prefix": "`+prefix+`", "timeout": "2s", "fail_mode": "closed",
		"key": "{http.request.header.X-Client}",
		"zones": [
			{"name": "burst", "window": "1m", "max_requests": 3},
			{"name": "hourly", "window": "1h", "max_requests": 5, "key": "{http.request.header.Authorization}"}
		]}`)
	request := func(client, token string) (int, http.Header) {
		res := send(t, "/", to(in), from("203.0.113.1"), withHeader("X-Client", client), withHeader("Authorization", token))
		return res.status, res.header
	}
	if cluster.MasterOf(prefix+"{c3}:burst") == cluster.MasterOf(prefix+"{tok}:hourly") {
		t.Log("c3 and tok share a master; the refund still crosses slots")
	}
	for i, client := range []string{"c1", "c1", "c1", "c2", "c2"} {
		if status, _ := request(client, "tok"); status != http.StatusOK {
			t.Fatalf("admission %d: status %d", i+1, status)
		}
	}
	if status, _ := request("c3", "tok"); status != http.StatusTooManyRequests {
		t.Fatalf("sixth request of the token: status %d, want 429", status)
	}
	card, err := admissionsKept(context.Background(), cluster.Client(t), prefix+"{c3}:burst")
	if err != nil {
		t.Fatal(err)
	}
	if card != 0 {
		t.Errorf("c3's burst holds %d admissions after hourly denied across slots, want 0 (refunded)", card)
	}
	if status, h := request("c3", "other"); status != http.StatusOK || h.Get("RateLimit") != `"burst";r=2;t=60, "hourly";r=4;t=3600` {
		t.Errorf("c3 with another token: %d %q, want 200 \"burst\";r=2;t=60, \"hourly\";r=4;t=3600", status, h.Get("RateLimit"))
	}
}

func TestSentinelFailover(t *testing.T) {
	sentinel := redistest.StartSentinel(t)
	in := newInstance(t, `{
		"window": "1m", "max_requests": 1000,
		"redis_topology": "sentinel", "redis": "`+sentinel.URL()+`",
		"key_prefix": "`+uniquePrefix(t)+`", "timeout": "500ms", "fail_mode": "closed"}`)
	for i := 0; i < 5; i++ {
		if status := send(t, "/", to(in), from("192.0.2.7")).status; status != http.StatusOK {
			t.Fatalf("before failover, request %d: status %d", i+1, status)
		}
	}
	before := sentinel.Master()
	sentinel.Failover(t)
	if after := sentinel.Master(); after == before {
		t.Fatalf("master still %s after failover", after)
	}
	// During the switch the fail mode may apply; then decisions come back.
	deadline := time.Now().Add(10 * time.Second)
	for {
		res := send(t, "/", to(in), from("192.0.2.7"))
		status, h := res.status, res.header
		if status == http.StatusOK && h.Get("RateLimit") != "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no decision 10s after failover, last status %d", status)
		}
		time.Sleep(50 * time.Millisecond)
	}
	for i := 0; i < 50; i++ {
		if status := send(t, "/", to(in), from("192.0.2.7")).status; status != http.StatusOK {
			t.Fatalf("after failover, request %d: status %d", i+1, status)
		}
	}
}

// TestFrozenRedisUnderLoad freezes Redis (SIGSTOP) while requests flow and
// checks each fail mode answers every request in time, that the breaker
// stops calling Redis, and that exact decisions return after SIGCONT.
func TestFrozenRedisUnderLoad(t *testing.T) {
	const timeout = 100 * time.Millisecond
	for _, c := range []struct {
		mode string
		want int
	}{
		{"open", http.StatusOK},
		{"closed", http.StatusServiceUnavailable},
		{"local", http.StatusOK},
	} {
		t.Run(c.mode, func(t *testing.T) {
			srv := redistest.Start(t)
			in := newInstance(t, `{
				"window": "1m", "max_requests": 5,
				"key": "{http.request.header.X-Client}",
				"redis": "`+srv.URL()+`", "timeout": "100ms", "fail_mode": "`+c.mode+`"}`)
			if status := send(t, "/", to(in), from("192.0.2.1")).status; status != http.StatusOK {
				t.Fatalf("Redis up: status %d", status)
			}
			if err := srv.Freeze(); err != nil {
				t.Fatal(err)
			}
			var (
				slowest  atomic.Int64
				statuses sync.Map
				wg       sync.WaitGroup
				stop     = time.Now().Add(1500 * time.Millisecond)
			)
			for g := 0; g < 4; g++ {
				wg.Add(1)
				go func(g int) {
					defer wg.Done()
					for n := 0; time.Now().Before(stop); n++ {
						client := "load-" + strconv.Itoa(g)
						start := time.Now()
						status := send(t, "/", to(in), from("192.0.2.1"), withHeader("X-Client", client)).status
						took := time.Since(start)
						for old := slowest.Load(); int64(took) > old && !slowest.CompareAndSwap(old, int64(took)); old = slowest.Load() {
						}
						counts, _ := statuses.LoadOrStore(client, &sync.Map{})
						v, _ := counts.(*sync.Map).LoadOrStore(status, new(atomic.Int64))
						v.(*atomic.Int64).Add(1)
						// About 4,000 requests a second in all: load, without
						// starving the timers this test measures on 2 cores.
						time.Sleep(time.Millisecond)
					}
				}(g)
			}
			wg.Wait()
			if got, limit := time.Duration(slowest.Load()), timeout+50*time.Millisecond; got > limit {
				t.Errorf("slowest answer while frozen: %s, want within %s", got, limit)
			}
			statuses.Range(func(client, counts any) bool {
				counts.(*sync.Map).Range(func(status, n any) bool {
					count := n.(*atomic.Int64).Load()
					switch {
					case c.mode == "local" && status.(int) == http.StatusOK && count != 5:
						t.Errorf("%s: %d admitted by the local store, want exactly 5 (the per-instance limit)", client, count)
					case c.mode == "local" && status.(int) != http.StatusOK && status.(int) != http.StatusTooManyRequests:
						t.Errorf("%s: %d answers %d", client, count, status)
					case c.mode != "local" && status.(int) != c.want:
						t.Errorf("%s: %d answers %d, want only %d", client, count, status, c.want)
					}
					return true
				})
				return true
			})
			if got := in.backend.conn.Breaker().State().String(); got != "open" {
				t.Errorf("breaker %s while Redis is frozen, want open", got)
			}
			if got := testutil.ToFloat64(limiterMetrics.circuitState.WithLabelValues(in.backend.conn.Label())); got != 1 {
				t.Errorf("circuit_state metric %v while open, want 1", got)
			}
			// Open: no Redis call, so an answer takes far less than the timeout.
			start := time.Now()
			send(t, "/", to(in), from("192.0.2.1"), withHeader("X-Client", "probe-free"))
			if took := time.Since(start); took > timeout/2 {
				t.Errorf("answer with the breaker open took %s: Redis was called", took)
			}

			if err := srv.Thaw(); err != nil {
				t.Fatal(err)
			}
			thawed := time.Now()
			for {
				res := send(t, "/", to(in), from("192.0.2.1"), withHeader("X-Client", "after-thaw"))
				status, h := res.status, res.header
				// Redis decides again once the breaker has closed; such a
				// decision carries the RateLimit header (fail open does not).
				// Calls that timed out while Redis was frozen may still run
				// when it resumes, so the count need not be fresh.
				if in.backend.conn.Breaker().State().String() == "closed" && h.Get("RateLimit") != "" {
					t.Logf("decisions by Redis %s after SIGCONT: %d %s", time.Since(thawed).Round(time.Millisecond), status, h.Get("RateLimit"))
					if got := testutil.ToFloat64(limiterMetrics.circuitState.WithLabelValues(in.backend.conn.Label())); got != 0 {
						t.Errorf("circuit_state metric %v after recovery, want 0", got)
					}
					break
				}
				if time.Since(thawed) > 2*time.Second {
					t.Fatalf("no exact decision within 2s of SIGCONT: %d %q", status, h.Get("RateLimit"))
				}
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
}

// TestRedisLosesState: killed and restarted empty, SCRIPT FLUSH, FLUSHALL.
// Decisions resume with no reload; while Redis is away only the fail mode
// answers.
func TestRedisLosesState(t *testing.T) {
	srv := redistest.Start(t)
	in := newInstance(t, `{
		"window": "1m", "max_requests": 3,
		"redis": "`+srv.URL()+`", "timeout": "100ms", "fail_mode": "closed"}`)
	rdb := srv.Client(t)
	ctx := context.Background()
	expectFresh := func(fault string) {
		t.Helper()
		deadline := time.Now().Add(3 * time.Second)
		for {
			res := send(t, "/", to(in), from("192.0.2.99"))
			status, h := res.status, res.header
			if status == http.StatusOK {
				if got := h.Get("RateLimit"); got != `"default";r=2;t=60` {
					t.Errorf("%s: first decision %q, want a fresh window", fault, got)
				}
				return
			}
			if status != http.StatusServiceUnavailable || time.Now().After(deadline) {
				t.Fatalf("%s: status %d, want decisions to resume (503 only while away)", fault, status)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	use := func() {
		for i := 0; i < 3; i++ {
			send(t, "/", to(in), from("192.0.2.99"))
		}
		if status := send(t, "/", to(in), from("192.0.2.99")).status; status != http.StatusTooManyRequests {
			t.Fatalf("fourth request: %d, want 429", status)
		}
	}

	use()
	if err := rdb.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	// Still blocked (state kept): only the script cache went.
	in.backend.cache.Clear()
	if status := send(t, "/", to(in), from("192.0.2.99")).status; status != http.StatusTooManyRequests {
		t.Errorf("after SCRIPT FLUSH: %d, want 429 from Redis (NOSCRIPT handled)", status)
	}

	if err := rdb.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	in.backend.cache.Clear() // an operator's flush is a reset: see docs/redis.md
	expectFresh("after FLUSHALL")

	use()
	in.backend.cache.Clear()
	srv.Restart(t)
	expectFresh("after a restart")
}
