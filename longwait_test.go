package slidingratelimit

import (
	"net/http"
	"sync"
	"testing"
	"time"
)

// TestWaitLongerThanTheWindow: ten requests at once from one client (a real
// second address) against 2 a second with a wait of 3.5s, over two
// instances on one Redis: eight go through, paced two a second at the slots
// Redis promised (the last ones more than a window after the first), and
// two get a 429 at once, not after waiting.
func TestWaitLongerThanTheWindow(t *testing.T) {
	prefix := uniquePrefix(t)
	startCaddy(t, `
:9080 {
	sliding_ratelimit {
		zone line 1s 2 {
			wait 3500ms
		}
		redis `+sharedRedis.URL()+`
		key_prefix `+prefix+`
	}
	respond "ok"
}`)
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
	times := admissionsOf(t, prefix+"{"+ip+"}:line:1s:2", 2, 8)
	gaps := checkPacing(t, ip, times, 2, time.Second)
	t.Logf("admission i+2 after admission i: %v; held %v", gaps, took)
	if len(times) == 8 {
		if spread := time.Duration(times[7]-times[0]) * time.Microsecond; spread < 3*time.Second {
			t.Errorf("the 8 admissions span %v, want at least 3s (slots at 0, 1, 2 and 3s)", spread)
		}
	}
}
