package slidingratelimit

import (
	"context"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"
)

// TestWaitFloodIsBounded: a flood of requests that would each wait gets at
// most max_waiting of them held; the rest are answered at once with 429,
// so a flood cannot pile up held connections, and every held request ends
// at its slot.
func TestWaitFloodIsBounded(t *testing.T) {
	startCaddy(t, `
:9080 {
	sliding_ratelimit {
		key {http.request.header.X-Client}
		zone flood 4s 1 {
			wait 4s
		}
		max_waiting 5
		redis `+sharedRedis.URL()+`
		key_prefix `+uniquePrefix(t)+`
	}
	respond "ok"
}`)
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
	startCaddy(t, `
:9080 {
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
		redis `+sharedRedis.URL()+`
		key_prefix `+uniquePrefix(t)+`
	}
	respond "ok"
}`, withGlobals("servers {\n\ttimeouts {\n\t\twrite 3s\n\t}\n}"))
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
	startCaddy(t, `
:9080 {
	sliding_ratelimit {
		key {http.request.header.X-Client}
		zone left 3s 1 {
			wait 3s
		}
		redis `+sharedRedis.URL()+`
		key_prefix `+uniquePrefix(t)+`
	}
	respond "ok"
}`)
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
