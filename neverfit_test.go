package slidingratelimit

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/redistest"
)

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
