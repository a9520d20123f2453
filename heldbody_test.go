package slidingratelimit

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

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
	startCaddy(t, `
:9080 {
	sliding_ratelimit {
		window 2s
		max_requests 1
		wait 2s
		redis `+sharedRedis.URL()+`
		key_prefix `+uniquePrefix(t)+`
	}
	reverse_proxy `+strings.TrimPrefix(srv.URL, "http://")+`
}`)
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
