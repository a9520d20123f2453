package slidingratelimit

import (
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/redistest"
)

// TestLeaseLostWithRedisData: Redis restarts (without persistence) while a
// request runs under a lease: the lease is gone long before its lease time
// could run out. The keeper's next extension finds it gone, and the log
// says what happened (the store lost its data), not that the store was away
// too long; store_errors_total{reason="data_lost"} counts it.
func TestLeaseLostWithRedisData(t *testing.T) {
	srv := redistest.Start(t)
	upstream := newGate()
	backend := httptest.NewServer(upstream)
	defer backend.Close()
	logFile := startCaddy(t, `
:9080 {
	sliding_ratelimit {
		zone flight {
			concurrent 1
			lease 3s
		}
		redis `+srv.URL()+`
	}
	reverse_proxy `+strings.TrimPrefix(backend.URL, "http://")+`
}`)
	dataLost := `caddy_sliding_ratelimit_store_errors_total{reason="data_lost"}`
	before := scrape(t, dataLost)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		send(t, site, from("127.0.0.2"))
	}()
	defer wg.Wait()
	upstream.waitInside(t, "127.0.0.2", 1)
	srv.Restart(t)
	// The lease is extended a third of its lease time after it was taken:
	// within a second of the restart.
	counted := pollUntil(5*time.Second, func() bool { return scrape(t, dataLost) > before })
	upstream.release <- struct{}{}
	lines := logLines(t, logFile, "lease")
	t.Logf("the log about the lease: %q", lines)
	if !counted {
		t.Errorf("%s did not grow after a restart took the lease", dataLost)
	}
	if got := logLines(t, logFile, "lease was gone from the store before its lease time ran out: the store lost its data"); len(got) != 1 {
		t.Errorf("%d lines saying the store lost its data, want 1", len(got))
	}
	if got := logLines(t, logFile, "away for more than half the lease time"); len(got) != 0 {
		t.Errorf("the log blames the store's absence for a lease it lost with its data: %q", got)
	}
}
