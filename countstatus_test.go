package slidingratelimit

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"golang.org/x/crypto/bcrypt"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/redistest"
)

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
	startCaddy(t, `
:9080 {
	sliding_ratelimit {
		zone login 10m 3 {
			count_status 401
		}
		redis `+sharedRedis.URL()+`
		key_prefix `+prefix+`
	}
	basic_auth {
		alice `+string(hash)+`
	}
	respond "welcome"
}`)
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
	if n := kept(t, prefix, "127.0.0.2", "login:10m:3:401"); n != 0 {
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
	if n := kept(t, prefix, "127.0.0.2", "login:10m:3:401"); n != 3 {
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
	if n := kept(t, prefix, "192.0.2.30", "c:10m:3:4xx"); n > 3 || n != counted.Load() {
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
	for kept(t, prefix, "192.0.2.31", "c:10m:3:4xx") < 3 && time.Now().Before(deadline) {
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
