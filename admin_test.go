package slidingratelimit

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/adminapi"
	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/clientkey"
	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/redistest"
	"github.com/slidingratelimit/caddy-sliding-ratelimit/limiter"
)

// adminDo sends a request to the admin API of the test Caddy. path is sent
// as it is, escapes included.
func adminDo(t *testing.T, method, path string) (int, []byte) {
	t.Helper()
	a := send(t, adminURL+path, withMethod(method))
	return a.status, []byte(a.body)
}

// adminState GETs a client's state and fails the test unless it is a 200.
func adminState(t *testing.T, zone, escapedKey string) adminapi.KeyState {
	t.Helper()
	return adminKeyCall[adminapi.KeyState](t, http.MethodGet, zone, escapedKey)
}

// adminReset DELETEs a client and fails the test unless it is a 200.
func adminReset(t *testing.T, zone, escapedKey string) adminapi.ResetAnswer {
	t.Helper()
	return adminKeyCall[adminapi.ResetAnswer](t, http.MethodDelete, zone, escapedKey)
}

// adminKeyCall sends method to a client's admin path and decodes the JSON
// answer, failing the test unless it is a 200.
func adminKeyCall[T any](t *testing.T, method, zone, escapedKey string) T {
	t.Helper()
	status, body := adminDo(t, method, "/sliding_ratelimit/zones/"+zone+"/keys/"+escapedKey)
	if status != http.StatusOK {
		t.Fatalf("%s %s/%s: status %d %s", method, zone, escapedKey, status, body)
	}
	var answer T
	if err := json.Unmarshal(body, &answer); err != nil {
		t.Fatalf("%s %s/%s: %v in %s", method, zone, escapedKey, err, body)
	}
	return answer
}

// serveAdmin calls the admin handler directly, as Caddy's admin server
// would, and returns the status and body it would send.
func serveAdmin(method, target string) (int, string) {
	r := &http.Request{Method: method, URL: &url.URL{Path: target}, Header: http.Header{}}
	if u, err := url.Parse(target); err == nil {
		r.URL = u
	}
	w := httptest.NewRecorder()
	err := new(AdminAPI).serveKey(w, r)
	if err != nil {
		var apiErr caddy.APIError
		if !errors.As(err, &apiErr) {
			return http.StatusInternalServerError, err.Error()
		}
		return apiErr.HTTPStatus, apiErr.Error()
	}
	return w.Code, w.Body.String()
}

// waitSubscribed waits until the reset subscriber of a handler's connection
// has subscribed once: its first subscription clears the deny caches.
func waitSubscribed(t *testing.T, h *Handler) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		if h.backend.conn.Subscriptions() > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("reset subscriber not subscribed after 5s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// registered returns the newest handler registered with the zone.
func registered(t *testing.T, zone string) *Handler {
	t.Helper()
	hs, _ := withZone(zone)
	if len(hs) == 0 {
		t.Fatalf("no handler registered with zone %s", zone)
	}
	return hs[0]
}

// cacheHits is how many denials the deny caches of the handlers with a zone
// of that name have answered (its deny_cache_hits_total series).
func cacheHits(zone string) float64 {
	return testutil.ToFloat64(limiterMetrics.denyCacheHits.WithLabelValues(zone))
}

// cached is how many denials h's deny cache holds.
func cached(h *Handler) int {
	_, total := h.backend.blocked(0)
	return total
}

func TestAdminGetCountsWithoutConsuming(t *testing.T) {
	startCaddy(t, siteBlock("http://localhost:9080", uniquePrefix(t), `
	sliding_ratelimit {
		key {http.request.header.X-Client}
		zone adm_get 1m 5
		zone adm_get_ctr 1m 10 {
			algorithm counter
		}
	}
	respond "ok"`))
	s := adminState(t, "adm_get", "alice")
	if want := (adminapi.KeyState{Zone: "adm_get", Identity: "adm_get", Key: "=alice", Limit: 5, WindowSeconds: 60, Algorithm: "log", Unit: "requests", Remaining: 5}); s != want {
		t.Errorf("fresh key: %+v, want %+v", s, want)
	}

	for i := 1; i <= 3; i++ {
		if res := send(t, "http://localhost:9080/", withHeader("X-Client", "alice")); res.status != http.StatusOK {
			t.Fatalf("request %d: status %d", i, res.status)
		}
	}
	for i := 0; i < 2; i++ {
		s = adminState(t, "adm_get", "alice")
		if s.Count != 3 || s.Remaining != 2 || s.RetryAfterSeconds != 0 {
			t.Errorf("GET %d after 3 requests: count %d remaining %d retry %g, want 3, 2, 0", i+1, s.Count, s.Remaining, s.RetryAfterSeconds)
		}
		if s.ResetSeconds <= 0 || s.ResetSeconds > 60 {
			t.Errorf("GET %d after 3 requests: reset_seconds %g, want in (0, 60]", i+1, s.ResetSeconds)
		}
	}
	c := adminState(t, "adm_get_ctr", "alice")
	if c.Algorithm != "counter" || c.Count != 3 || c.Remaining != 7 || c.Limit != 10 {
		t.Errorf("counter zone after 3 requests: %+v, want algorithm counter, count 3, remaining 7, limit 10", c)
	}

	// The GETs consumed nothing: exactly two more are admitted.
	for i, want := range []int{200, 200, 429, 429} {
		if res := send(t, "http://localhost:9080/", withHeader("X-Client", "alice")); res.status != want {
			t.Fatalf("request %d after the GETs: status %d, want %d", i+4, res.status, want)
		}
	}
	s = adminState(t, "adm_get", "alice")
	if s.Count != 5 || s.Remaining != 0 || s.RetryAfterSeconds <= 0 || s.RetryAfterSeconds > 60 || s.ResetSeconds != s.RetryAfterSeconds {
		t.Errorf("blocked key: %+v, want count 5, remaining 0, retry_after = reset_seconds in (0, 60]", s)
	}
}

func TestAdminDeleteUnblocksAtOnce(t *testing.T) {
	startCaddy(t, siteBlock("http://localhost:9080", uniquePrefix(t), `
	sliding_ratelimit {
		key {http.request.header.X-Client}
		zone adm_del 1m 2
	}
	respond "ok"`))
	waitSubscribed(t, registered(t, "adm_del"))
	hits := cacheHits("adm_del")
	for i, want := range []int{200, 200, 429, 429} {
		if res := send(t, "http://localhost:9080/", withHeader("X-Client", "bob")); res.status != want {
			t.Fatalf("request %d: status %d, want %d", i+1, res.status, want)
		}
	}
	if cacheHits("adm_del") == hits {
		t.Fatal("the second 429 did not come from the deny cache; the test would not cross it")
	}
	if got := adminReset(t, "adm_del", "bob"); got != (adminapi.ResetAnswer{Reset: true, Zone: "adm_del", Key: "=bob"}) {
		t.Errorf("DELETE answered %+v", got)
	}
	if s := adminState(t, "adm_del", "bob"); s.Count != 0 || s.Remaining != 2 {
		t.Errorf("after DELETE: count %d remaining %d, want 0 and 2", s.Count, s.Remaining)
	}
	if res := send(t, "http://localhost:9080/", withHeader("X-Client", "bob")); res.status != http.StatusOK {
		t.Fatalf("right after DELETE: status %d, want 200", res.status)
	}
	// A key never seen resets fine too.
	adminReset(t, "adm_del", "nobody")
}

// TestAdminResetReachesOtherInstance: instance B shares Redis with the
// caddytest Caddy (A) through its own Redis client and is not in the
// process registry, so only Redis pub/sub can clear its deny cache.
func TestAdminResetReachesOtherInstance(t *testing.T) {
	prefix := uniquePrefix(t)
	startCaddy(t, siteBlock("http://localhost:9080", prefix, `
	sliding_ratelimit {
		zone adm_far 1m 3
	}
	respond "ok"`))
	b := newInstance(t, `{
		"zones": [{"name": "adm_far", "window": "1m", "max_requests": 3}],
		"redis": "`+sharedRedis.URL()+`?client_name=adm_far_b",
		"key_prefix": "`+prefix+`"}`)
	if !handlers.remove(b.Handler) {
		t.Fatal("instance B was not registered")
	}
	if b.backend.conn.Client() == registered(t, "adm_far").backend.conn.Client() {
		t.Fatal("A and B share a Redis client; the test needs two")
	}
	waitSubscribed(t, b.Handler)
	waitSubscribed(t, registered(t, "adm_far"))

	const ip = "203.0.113.9"
	for i, want := range []int{200, 200, 200, 429} {
		if status := send(t, "/", to(b), from(ip)).status; status != want {
			t.Fatalf("B, request %d: status %d, want %d", i+1, status, want)
		}
	}
	// Only B serves: the zone's hits are B's.
	hits := cacheHits("adm_far")
	if status := send(t, "/", to(b), from(ip)).status; status != http.StatusTooManyRequests || cacheHits("adm_far") != hits+1 {
		t.Fatalf("B, request 5: status %d, cache hits %v -> %v; want a 429 from the deny cache", status, hits, cacheHits("adm_far"))
	}
	if s := adminState(t, "adm_far", ip); s.Count != 3 {
		t.Errorf("A sees count %d of B's admissions, want 3", s.Count)
	}

	start := time.Now()
	adminReset(t, "adm_far", ip)
	deleted := time.Now()
	var admitted time.Time
	polls := 0
	for time.Since(deleted) < 100*time.Millisecond {
		polls++
		if status := send(t, "/", to(b), from(ip)).status; status == http.StatusOK {
			admitted = time.Now()
			break
		}
		time.Sleep(100 * time.Microsecond)
	}
	if admitted.IsZero() {
		t.Fatalf("B still denies the key 100ms after the DELETE returned (cache entries %d)", cached(b.Handler))
	}
	t.Logf("DELETE took %s; B admitted the key %s after it returned (request %d), %s after it was sent",
		deleted.Sub(start), admitted.Sub(deleted), polls, admitted.Sub(start))
}

// TestAdminResubscribeClearsDenyCache: announcements made while a
// subscriber is disconnected are lost, so a resubscription must drop the
// deny cache.
func TestAdminResubscribeClearsDenyCache(t *testing.T) {
	name := "adm_resub_" + strings.TrimSuffix(uniquePrefix(t), ":")
	b := newInstance(t, `{
		"zones": [{"name": "adm_resub", "window": "1m", "max_requests": 1}],
		"redis": "`+sharedRedis.URL()+`?client_name=`+name+`",
		"key_prefix": "`+uniquePrefix(t)+`"}`)
	waitSubscribed(t, b.Handler)
	send(t, "/", to(b), from("192.0.2.1"))
	if status := send(t, "/", to(b), from("192.0.2.1")).status; status != http.StatusTooManyRequests || cached(b.Handler) != 1 {
		t.Fatalf("status %d, cache entries %d; want 429 and 1", status, cached(b.Handler))
	}

	// Kill B's subscriber connection, as a network error would.
	rdb := sharedRedis.Client(t)
	list, err := rdb.ClientList(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	killed := 0
	for _, line := range strings.Split(list, "\n") {
		// The subscriber holds two channels: resets and heartbeats.
		if strings.Contains(line, " name="+name+" ") && strings.Contains(line, " sub=2 ") {
			id := strings.Fields(line)[0] // id=N
			if err := rdb.Do(context.Background(), "CLIENT", "KILL", "ID", strings.TrimPrefix(id, "id=")).Err(); err != nil {
				t.Fatal(err)
			}
			killed++
		}
	}
	if killed != 1 {
		t.Fatalf("found %d subscriber connections named %s, want 1:\n%s", killed, name, list)
	}
	deadline := time.Now().Add(5 * time.Second)
	for cached(b.Handler) != 0 {
		if time.Now().After(deadline) {
			t.Fatal("deny cache still holds the denial 5s after the subscriber lost its connection")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if n := b.backend.conn.Subscriptions(); n < 2 {
		t.Errorf("%d subscriptions, want a resubscription", n)
	}
}

func TestAdminInProcessStore(t *testing.T) {
	startCaddy(t, `
http://localhost:9080 {
	sliding_ratelimit {
		key {http.request.header.X-Client}
		zone adm_mem 1m 2
	}
	respond "ok"
}`)
	client := "mem-" + strings.TrimSuffix(uniquePrefix(t), ":")
	for i, want := range []int{200, 200, 429, 429} {
		if res := send(t, "http://localhost:9080/", withHeader("X-Client", client)); res.status != want {
			t.Fatalf("request %d: status %d, want %d", i+1, res.status, want)
		}
	}
	if s := adminState(t, "adm_mem", client); s.Count != 2 || s.Remaining != 0 || s.RetryAfterSeconds <= 0 {
		t.Errorf("blocked: %+v, want count 2, remaining 0, a retry time", s)
	}
	adminReset(t, "adm_mem", client)
	// No pub/sub here: the deny cache was cleared directly.
	if res := send(t, "http://localhost:9080/", withHeader("X-Client", client)); res.status != http.StatusOK {
		t.Fatalf("after DELETE: status %d, want 200", res.status)
	}
	if s := adminState(t, "adm_mem", client); s.Count != 1 {
		t.Errorf("after DELETE and one request: count %d, want 1", s.Count)
	}
}

func TestAdminKeysRoundTrip(t *testing.T) {
	startCaddy(t, siteBlock("http://localhost:9080", uniquePrefix(t), `
	sliding_ratelimit {
		key {http.request.header.X-Client}
		ipv4_prefix 24
		zone adm_keys 1m 5
	}
	respond "ok"`))
	long := strings.Repeat("k", 100)
	for _, c := range []struct {
		name, client string
		paths        []string // escaped as sent
		stored       string
	}{
		// A value that looks like an address is named with the value mark,
		// as the zone stores it; without it, the name is the client address
		// a key fell back to.
		{"ipv6 value grouped by /64", "2001:db8:1:2::7",
			[]string{"=2001:db8:1:2::/64", "=2001:db8:1:2::99", "%3D2001%3Adb8%3A1%3A2%3A%3A%2F64", "=2001:db8:1:2::%2F64"}, "=2001:db8:1:2::/64"},
		{"ipv4 value grouped by /24", "198.51.100.7",
			[]string{"=198.51.100.200", "=198.51.100.0/24", "=198.51.100.0%2F24"}, "=198.51.100.0/24"},
		{"fallback address grouped by /24", "", []string{"127.0.0.1", "127.0.0.0/24", "127.0.0.0%2F24", "127.0.0.200"}, "127.0.0.0/24"},
		{"slashes", "team/a/b", []string{"team/a/b", "team%2Fa%2Fb", "=team/a/b"}, "=team/a/b"},
		{"double slash", "a//b", []string{"a%2F%2Fb"}, "=a//b"},
		{"keys in key", "x/keys/y", []string{"x/keys/y"}, "=x/keys/y"},
		{"space and percent", "a b%c", []string{"a%20b%25c"}, "=a b%c"},
		{"unicode", "ключ", []string{url.PathEscape("ключ")}, "=ключ"},
		{"long key hashed", long, []string{long, url.PathEscape(hashedKey("=" + long))}, hashedKey("=" + long)},
	} {
		t.Run(c.name, func(t *testing.T) {
			if res := send(t, "http://localhost:9080/", withHeader("X-Client", c.client)); res.status != http.StatusOK {
				t.Fatalf("request: status %d", res.status)
			}
			for _, p := range c.paths {
				s := adminState(t, "adm_keys", p)
				if s.Count != 1 || s.Key != c.stored {
					t.Errorf("GET %s: count %d key %q, want 1 and %q", p, s.Count, s.Key, c.stored)
				}
			}
			if got := adminReset(t, "adm_keys", c.paths[0]); got.Key != c.stored {
				t.Errorf("DELETE %s: key %q, want %q", c.paths[0], got.Key, c.stored)
			}
			if s := adminState(t, "adm_keys", c.paths[len(c.paths)-1]); s.Count != 0 {
				t.Errorf("after DELETE: count %d, want 0", s.Count)
			}
		})
	}
}

func TestAdminErrors(t *testing.T) {
	deadPort, err := redistest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	startCaddy(t, `
http://localhost:9080 {
	sliding_ratelimit {
		redis `+sharedRedis.URL()+`
		key_prefix `+uniquePrefix(t)+`
		zone adm_err 1m 5
	}
	respond "ok"
}
http://localhost:9081 {
	sliding_ratelimit {
		redis redis://127.0.0.1:`+strconv.Itoa(deadPort)+`
		zone adm_down 1m 5
	}
	respond "ok"
}`)
	for _, c := range []struct {
		method, path string
		status       int
		message      string
	}{
		{"GET", "/sliding_ratelimit/zones/adm_nope/keys/a", 404, `unknown zone "adm_nope"`},
		{"DELETE", "/sliding_ratelimit/zones/adm_nope/keys/a", 404, `unknown zone "adm_nope"`},
		{"GET", "/sliding_ratelimit/", 400, "malformed path"},
		{"POST", "/sliding_ratelimit/zones", 405, "use GET"},
		{"GET", "/sliding_ratelimit/zones/", 400, "malformed path"},
		{"GET", "/sliding_ratelimit/zones/adm_err", 400, "malformed path"},
		{"GET", "/sliding_ratelimit/zones/adm_err/keys", 400, "malformed path"},
		{"GET", "/sliding_ratelimit/zones/adm_err/keys/", 400, "malformed path"},
		{"GET", "/sliding_ratelimit/zones/adm_err/key/a", 400, "malformed path"},
		{"GET", "/sliding_ratelimit/zones/adm%2Ferr/x/keys/a", 400, "malformed path"},
		{"POST", "/sliding_ratelimit/zones/adm_err/keys/a", 405, "use GET or DELETE"},
		{"PUT", "/sliding_ratelimit/zones/adm_err/keys/a", 405, "use GET or DELETE"},
		{"GET", "/sliding_ratelimit/zones/adm_down/keys/a", 503, "zone adm_down: reading"},
		{"DELETE", "/sliding_ratelimit/zones/adm_down/keys/a", 503, "zone adm_down: resetting"},
		{"GET", "/sliding_ratelimit/blocked?limit=-1", 400, "limit must be a whole number"},
		{"GET", "/sliding_ratelimit/blocked?limit=ten", 400, "limit must be a whole number"},
		{"POST", "/sliding_ratelimit/blocked", 405, "use GET"},
		{"DELETE", "/sliding_ratelimit/blocked", 405, "use GET"},
		{"GET", "/sliding_ratelimit/blocked/x", 400, "malformed path"},
	} {
		status, body := adminDo(t, c.method, c.path)
		var answer struct {
			Error string `json:"error"`
		}
		_ = json.Unmarshal(body, &answer)
		if status != c.status || !strings.Contains(answer.Error, c.message) {
			t.Errorf("%s %s: %d %s, want %d with %q", c.method, c.path, status, body, c.status, c.message)
		}
	}
}

func TestAdminParseKeyPath(t *testing.T) {
	for _, c := range []struct {
		path, zone, key, err string
	}{
		{"/sliding_ratelimit/zones/z/keys/k", "z", "k", ""},
		{"/sliding_ratelimit/zones/z/keys/2001:db8::/64", "z", "2001:db8::/64", ""},
		{"/sliding_ratelimit/zones/z/keys/a%2F%2Fb", "z", "a//b", ""},
		{"/sliding_ratelimit/zones/keys/keys/keys/", "keys", "keys/", ""},
		{"/sliding_ratelimit/zones/z%2E/keys/%2E%2E", "z.", "..", ""},
		{"/sliding_ratelimit/zones/z/keys/%zz", "", "", "malformed key"},
		{"/sliding_ratelimit/zones/%zz/keys/k", "", "", "malformed zone"},
		{"/sliding_ratelimit/zones/z/keys/", "", "", "malformed path"},
		{"/sliding_ratelimit/zones//keys/k", "", "", "malformed path"},
		{"/sliding_ratelimit/zones/a/b/keys/k", "", "", "malformed path"},
		{"/sliding_ratelimit/zone/z/keys/k", "", "", "malformed path"},
		{"/sliding_ratelimit/zones/z/keys", "", "", "malformed path"},
	} {
		zone, key, err := parseKeyPath(c.path)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%s: error %v, want one with %q", c.path, err, c.err)
			}
			continue
		}
		if err != nil || zone != c.zone || key != c.key {
			t.Errorf("%s: %q %q %v, want %q %q", c.path, zone, key, err, c.zone, c.key)
		}
	}
}

// TestAdminResetAcrossInstancesOnCluster: the subscriber and PUBLISH work
// through cluster clients (Redis Cluster forwards PUBLISH to every node, so
// it does not matter which node each client subscribed on).
func TestAdminResetAcrossInstancesOnCluster(t *testing.T) {
	cluster := redistest.StartCluster(t, 3)
	testResetAcrossInstances(t, "cluster", cluster.URL()+"&")
}

// TestAdminResetAcrossInstancesOnSentinel: the same through a failover
// client.
func TestAdminResetAcrossInstancesOnSentinel(t *testing.T) {
	sentinel := redistest.StartSentinel(t)
	testResetAcrossInstances(t, "sentinel", sentinel.URL()+"&")
}

// testResetAcrossInstances provisions instances A (registered) and B (not)
// on the topology and resets through A's admin handler.
func testResetAcrossInstances(t *testing.T, topology, urlWithQuery string) {
	prefix := uniquePrefix(t)
	config := func(name string) string {
		return `{
			"zones": [{"name": "adm_topo", "window": "1m", "max_requests": 2}],
			"redis_topology": "` + topology + `",
			"redis": "` + urlWithQuery + `client_name=` + name + `",
			"key_prefix": "` + prefix + `", "timeout": "1s"}`
	}
	a := newInstance(t, config("adm_topo_a"))
	b := newInstance(t, config("adm_topo_b"))
	handlers.remove(b.Handler)
	waitSubscribed(t, b.Handler)
	waitSubscribed(t, registered(t, "adm_topo"))

	const ip = "192.0.2.44"
	for i, want := range []int{200, 200, 429, 429} {
		if status := send(t, "/", to(b), from(ip)).status; status != want {
			t.Fatalf("B, request %d: status %d, want %d", i+1, status, want)
		}
	}
	if status := send(t, "/", to(a), from(ip)).status; status != http.StatusTooManyRequests {
		t.Fatalf("A: status %d, want 429 (shared limit)", status)
	}
	if status, body := serveAdmin(http.MethodDelete, "/sliding_ratelimit/zones/adm_topo/keys/"+ip); status != http.StatusOK {
		t.Fatalf("DELETE: %d %s", status, body)
	}
	deleted := time.Now()
	for {
		if status := send(t, "/", to(b), from(ip)).status; status == http.StatusOK {
			t.Logf("%s: B admitted the key %s after the DELETE returned", topology, time.Since(deleted))
			break
		}
		if time.Since(deleted) > 500*time.Millisecond {
			t.Fatalf("%s: B still denies the key 500ms after the DELETE", topology)
		}
		time.Sleep(100 * time.Microsecond)
	}
}

// TestAdminBadPathsNeverPanic feeds the admin handler hostile paths, with a
// handler (in-process store) registered so that they reach the store.
func TestAdminBadPathsNeverPanic(t *testing.T) {
	newInstance(t, `{"zones": [{"name": "adm_fuzz", "window": "1m", "max_requests": 3}], "ipv4_prefix": 8, "ipv6_prefix": 1}`)
	for _, target := range adminPathSeeds {
		for _, method := range []string{"GET", "DELETE", "PATCH", ""} {
			status, _ := serveAdmin(method, target)
			if status != 200 && status != 400 && status != 404 && status != 405 {
				t.Errorf("%s %q: status %d", method, target, status)
			}
		}
	}
}

var adminPathSeeds = []string{
	"", "/", "/sliding_ratelimit", "/sliding_ratelimit/", "/sliding_ratelimit/zones/",
	"/sliding_ratelimit/zones//keys/", "/sliding_ratelimit/zones/adm_fuzz/keys/",
	"/sliding_ratelimit/zones/adm_fuzz/keys/%", "/sliding_ratelimit/zones/adm_fuzz/keys/%%",
	"/sliding_ratelimit/zones/adm_fuzz/keys/%00", "/sliding_ratelimit/zones/adm_fuzz/keys/%7B%7D",
	"/sliding_ratelimit/zones/adm_fuzz/keys/{}", "/sliding_ratelimit/zones/adm_fuzz/keys/#x",
	"/sliding_ratelimit/zones/adm_fuzz/keys/::", "/sliding_ratelimit/zones/adm_fuzz/keys/::ffff:1.2.3.4",
	"/sliding_ratelimit/zones/adm_fuzz/keys/fe80::1%25eth0", "/sliding_ratelimit/zones/adm_fuzz/keys/1.2.3.4/99",
	"/sliding_ratelimit/zones/adm_fuzz/keys/" + strings.Repeat("%41", 5000),
	"/sliding_ratelimit/zones/" + strings.Repeat("z", 5000) + "/keys/a",
	"/sliding_ratelimit/zones/adm_fuzz/keys/../../..", "/sliding_ratelimit/zones/adm_fuzz/keys/a?b=c#d",
	"/sliding_ratelimit/zones/adm_fuzz/keys/\x00\xff\r\n",
}

// hashedKey is the stored form of a key too long to keep.
func hashedKey(key string) string { return limiter.BoundKey(key) }

func FuzzAdminKeyPath(f *testing.F) {
	for _, s := range adminPathSeeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, target string) {
		zone, key, err := parseKeyPath(target)
		if err == nil && (zone == "" || key == "") {
			t.Errorf("%q: parsed to zone %q key %q without an error", target, zone, key)
		}
		if err == nil {
			tmpl := clientkey.Parse("{http.request.header.X}")
			if stored := tmpl.StoredKey(key, 24, 64); stored == "" || len(stored) > 64 {
				t.Errorf("%q: stored key %q, want 1 to %d bytes", target, stored, 64)
			}
		}
		serveAdmin(http.MethodGet, target)
	})
}

// adminBlocked GETs the blocked list with the query (such as "?limit=1")
// and fails the test unless it is a 200.
func adminBlocked(t *testing.T, query string) adminapi.BlockedAnswer {
	t.Helper()
	status, body := adminDo(t, http.MethodGet, "/sliding_ratelimit/blocked"+query)
	if status != http.StatusOK {
		t.Fatalf("GET blocked%s: status %d %s", query, status, body)
	}
	var answer adminapi.BlockedAnswer
	if err := json.Unmarshal(body, &answer); err != nil {
		t.Fatalf("GET blocked%s: %v in %s", query, err, body)
	}
	if answer.Blocked == nil {
		t.Fatalf("GET blocked%s: no blocked list in %s", query, body)
	}
	return answer
}

// blockedEntry returns the entry of key in the zone, if listed.
func blockedEntry(answer adminapi.BlockedAnswer, zone, key string) (adminapi.BlockedClient, bool) {
	for _, b := range answer.Blocked {
		if b.Zone == zone && b.Key == key {
			return b, true
		}
	}
	return adminapi.BlockedClient{}, false
}

// blockedSites is three handlers on :9080: /ip keyed by the client address,
// /hdr by a header (both on Redis), /short by a header with a one-second
// window in process.
func blockedSites(t *testing.T) string {
	prefix := uniquePrefix(t)
	return `
:9080 {
	handle /ip {
		sliding_ratelimit {
			redis ` + sharedRedis.URL() + `
			key_prefix ` + prefix + `
			zone blk_ip 1m 1
		}
		respond "ok"
	}
	handle /hdr {
		sliding_ratelimit {
			redis ` + sharedRedis.URL() + `
			key_prefix ` + prefix + `
			key {http.request.header.X-Client}
			zone blk_hdr 1m 2
		}
		respond "ok"
	}
	handle /short {
		sliding_ratelimit {
			key {http.request.header.X-Client}
			zone blk_short 1s 1
		}
		respond "ok"
	}
}`
}

// denyUntilBlocked sends requests until one is denied and returns its
// Retry-After in seconds.
func denyUntilBlocked(t *testing.T, rawURL string, opts ...sendOption) float64 {
	t.Helper()
	for i := 0; i < 10; i++ {
		a := send(t, rawURL, opts...)
		if a.status == http.StatusTooManyRequests {
			retry, err := strconv.ParseFloat(a.header.Get("Retry-After"), 64)
			if err != nil {
				t.Fatalf("%s: Retry-After %q: %v", rawURL, a.header.Get("Retry-After"), err)
			}
			return retry
		}
		if a.status != http.StatusOK {
			t.Fatalf("%s: status %d", rawURL, a.status)
		}
	}
	t.Fatalf("%s: not denied after 10 requests", rawURL)
	return 0
}

func TestAdminBlockedList(t *testing.T) {
	startCaddy(t, blockedSites(t))
	two, three := from("127.0.0.2"), from("127.0.0.3")
	long := strings.Repeat("L", 100)
	told := map[string]float64{
		"127.0.0.2":           denyUntilBlocked(t, site+"ip", two),
		"=abc":                denyUntilBlocked(t, site+"hdr", three, withHeader("X-Client", "abc")),
		hashedKey("=" + long): denyUntilBlocked(t, site+"hdr", three, withHeader("X-Client", long)),
	}
	// Admitted, never denied: not blocked.
	expect(t, "127.0.0.3 on /ip", site+"ip", []int{200}, three)
	expect(t, "X-Client fine on /hdr", site+"hdr", []int{200}, three, withHeader("X-Client", "fine"))

	all := adminBlocked(t, "")
	if all.Count != 3 || len(all.Blocked) != 3 {
		t.Fatalf("blocked: count %d, %d listed, want 3 and 3: %+v", all.Count, len(all.Blocked), all.Blocked)
	}
	want := map[string]adminapi.BlockedClient{
		"127.0.0.2":           {Zone: "blk_ip", Identity: "blk_ip", Key: "127.0.0.2"},
		"=abc":                {Zone: "blk_hdr", Identity: "blk_hdr", Key: "=abc"},
		hashedKey("=" + long): {Zone: "blk_hdr", Identity: "blk_hdr", Key: hashedKey("=" + long)},
	}
	for i, got := range all.Blocked {
		w, ok := want[got.Key]
		if !ok || got.Zone != w.Zone || got.Identity != w.Identity {
			t.Errorf("entry %d: %+v, want one of %+v", i, got, want)
			continue
		}
		// Retry-After is the wait rounded up when it was told; the list's
		// is the wait now, a little later.
		if r := told[got.Key]; got.RetryAfterSeconds > r || got.RetryAfterSeconds < r-10 {
			t.Errorf("%s: retry_after_seconds %g, told Retry-After %g", got.Key, got.RetryAfterSeconds, r)
		}
		if i > 0 && got.RetryAfterSeconds > all.Blocked[i-1].RetryAfterSeconds {
			t.Errorf("entry %d waits %g, longer than entry %d's %g", i, got.RetryAfterSeconds, i-1, all.Blocked[i-1].RetryAfterSeconds)
		}
	}

	for _, c := range []struct {
		query  string
		listed int
	}{{"?limit=1", 1}, {"?limit=2", 2}, {"?limit=0", 0}, {"?limit=1000", 3}} {
		got := adminBlocked(t, c.query)
		if got.Count != 3 || len(got.Blocked) != c.listed {
			t.Errorf("%s: count %d, %d listed, want 3 and %d", c.query, got.Count, len(got.Blocked), c.listed)
		}
		for i := range got.Blocked {
			if got.Blocked[i].Key != all.Blocked[i].Key {
				t.Errorf("%s: entry %d is %s, want %s (the longest waits first)", c.query, i, got.Blocked[i].Key, all.Blocked[i].Key)
			}
		}
	}

	adminReset(t, "blk_hdr", "abc")
	after := adminBlocked(t, "")
	if _, ok := blockedEntry(after, "blk_hdr", "=abc"); ok || after.Count != 2 {
		t.Errorf("after DELETE of abc: count %d, %+v; want 2 without =abc", after.Count, after.Blocked)
	}
	if _, ok := blockedEntry(after, "blk_ip", "127.0.0.2"); !ok {
		t.Errorf("after DELETE of abc: 127.0.0.2 no longer listed: %+v", after.Blocked)
	}
}

// TestAdminBlockedEnds: an entry leaves the list when its block ends.
func TestAdminBlockedEnds(t *testing.T) {
	startCaddy(t, blockedSites(t))
	client := "short-" + strings.TrimSuffix(uniquePrefix(t), ":")
	headers := map[string][]string{"X-Client": {client}}
	if retry := denyUntilBlocked(t, site+"short", from("127.0.0.2"), withHeaders(headers)); retry != 1 {
		t.Errorf("Retry-After %g, want 1 in a 1s window", retry)
	}
	got, ok := blockedEntry(adminBlocked(t, ""), "blk_short", "="+client)
	if !ok || got.Identity != "blk_short" || got.RetryAfterSeconds <= 0 || got.RetryAfterSeconds > 1 {
		t.Fatalf("while blocked: %+v listed %v, want blk_short with a wait in (0, 1]", got, ok)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		answer := adminBlocked(t, "")
		if _, ok := blockedEntry(answer, "blk_short", "="+client); !ok {
			if answer.Count != 0 {
				t.Errorf("after the block ended: count %d, want 0: %+v", answer.Count, answer.Blocked)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("still listed 10s after a 1s block began")
		}
		time.Sleep(50 * time.Millisecond)
	}
	expect(t, "after the block ended", site+"short", []int{200}, from("127.0.0.2"), withHeaders(headers))
}

// TestAdminBlockedSharedZone: two handlers with the same zone both hold a
// client, which is listed and counted once.
func TestAdminBlockedSharedZone(t *testing.T) {
	prefix := uniquePrefix(t)
	handler := `
		sliding_ratelimit {
			zone blk_shared 1m 1
		}
		respond "ok"`
	startCaddy(t, siteBlock(":9080", prefix, `
	handle /a {`+handler+`
	}
	handle /b {`+handler+`
	}`))
	client := from("127.0.0.2")
	expect(t, "/a then /b", site+"a", []int{200, 429}, client)
	expect(t, "/b, denied by Redis", site+"b", []int{429}, client)
	hs, _ := withZone("blk_shared")
	if len(hs) != 2 || cached(hs[0]) != 1 || cached(hs[1]) != 1 {
		t.Fatalf("%d handlers with the zone; want 2, each holding the client", len(hs))
	}
	answer := adminBlocked(t, "")
	if answer.Count != 1 || len(answer.Blocked) != 1 || answer.Blocked[0].Key != "127.0.0.2" || answer.Blocked[0].Identity != "blk_shared" {
		t.Errorf("blocked: %+v, want 127.0.0.2 once", answer)
	}
}

// zonesSite has two sites: one shares zone api with the other, which also
// has a concurrency zone and a per-tenant quota.
func zonesSite(t *testing.T) string {
	prefix := uniquePrefix(t)
	return siteBlock(":9080", prefix, `
	sliding_ratelimit {
		key {http.request.header.X-Client}
		zone api 1m 100
		zone reports {
			concurrent 2
		}
		zone tenants {
			window 1h
			max_requests {http.vars.quota} 1000
			wait 2s
		}
	}
	respond "ok"`) + siteBlock(":9081", prefix, `
	sliding_ratelimit {
		key {http.request.header.X-Client}
		zone api 1m 100
	}
	respond "ok"`) + "\n"
}

// TestZonesListing: GET /sliding_ratelimit/zones and `caddy
// sliding-ratelimit zones` list the running zones; an unknown zone's error
// names them; the path in an error reads as written.
func TestZonesListing(t *testing.T) {
	startCaddy(t, zonesSite(t))
	res := send(t, adminURL+"/sliding_ratelimit/zones")
	var answer adminapi.ZonesAnswer
	if res.status != http.StatusOK || json.Unmarshal([]byte(res.body), &answer) != nil {
		t.Fatalf("GET zones: %d %s", res.status, res.body)
	}
	want := []adminapi.ZoneInfo{
		{Name: "api", Identity: "api", Limit: 100, WindowSeconds: 60, Algorithm: "log", Unit: "requests", Key: "{http.request.header.X-Client}", Handlers: 2},
		{Name: "reports", Identity: "reports:concurrent", Limit: 2, Algorithm: "concurrency", Unit: "concurrent-requests", Key: "{http.request.header.X-Client}", Handlers: 1},
		{Name: "tenants", Identity: "", Limit: 1000, LimitFrom: "{http.vars.quota}", WindowSeconds: 3600, Algorithm: "log", Unit: "requests", Key: "{http.request.header.X-Client}", WaitSeconds: 2, Handlers: 1},
	}
	if len(answer.Zones) != len(want) {
		t.Fatalf("GET zones: %s, want %d zones", res.body, len(want))
	}
	for i, w := range want {
		got := answer.Zones[i]
		if w.Identity == "" {
			w.Identity = got.Identity // a per-tenant zone's identity is the zone's own business
		}
		if got != w {
			t.Errorf("zone %d: %+v, want %+v", i, got, w)
		}
	}

	res = send(t, adminURL+"/sliding_ratelimit/zones/apl/keys/a")
	if res.status != http.StatusNotFound || !strings.Contains(res.body, `unknown zone \"apl\": no sliding_ratelimit handler has a zone of that name; the zones are api, reports, tenants`) {
		t.Errorf("unknown zone: %d %s, want 404 naming the zones", res.status, res.body)
	}
	res = send(t, adminURL+"/sliding_ratelimit/zones/api")
	if res.status != http.StatusBadRequest || !strings.Contains(res.body, "want /sliding_ratelimit/zones/{zone}/keys/{key}, /sliding_ratelimit/zones or /sliding_ratelimit/blocked") ||
		strings.Contains(res.body, `\u003c`) {
		t.Errorf("malformed path: %d %s, want the paths as written", res.status, res.body)
	}

	out, status := runCaddy(t, "sliding-ratelimit", "zones", "--address", "localhost:2999")
	for _, line := range []string{
		"ZONE     IDENTITY",
		"api      api ",
		"reports  reports:concurrent",
		"tenants ",
		"{http.vars.quota} (fallback 1000)",
	} {
		if !strings.Contains(out, line) {
			t.Errorf("caddy sliding-ratelimit zones: no %q in\n%s", line, out)
		}
	}
	if status != 0 {
		t.Errorf("caddy sliding-ratelimit zones: exit status %d", status)
	}
}

// TestAdminResetWithoutChannels: a Redis user without the channels' right
// resets a client all the same (200), and the answer says that the other
// instances were not told.
func TestAdminResetWithoutChannels(t *testing.T) {
	srv := redistest.Start(t)
	url := srv.UserURL(t, "nochannels", "~*", "+@all", "-function")
	startCaddy(t, `:9080 {
	sliding_ratelimit {
		zone adm_nopub 1m 1 {
			key {http.request.header.X-Who}
		}
		redis `+url+`
		key_prefix `+uniquePrefix(t)+`
	}
	respond "ok"
}`)
	get := func() int {
		req, _ := http.NewRequest(http.MethodGet, site, nil)
		req.Header.Set("X-Who", "carol")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		return res.StatusCode
	}
	if a, b := get(), get(); a != 200 || b != 429 {
		t.Fatalf("statuses %d, %d; want 200, 429", a, b)
	}
	got := adminReset(t, "adm_nopub", "carol")
	if !got.Reset || !strings.Contains(got.Unannounced, "NOPERM") {
		t.Errorf("reset answer %+v: want reset, and unannounced saying NOPERM", got)
	}
	if status := get(); status != 200 {
		t.Errorf("after the reset: %d, want 200", status)
	}
}
