package slidingratelimit

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/redistest"
)

// TestRedisMemoryPolicyWarnings: at start, a Redis whose policy would evict
// limit state when full (allkeys-*), or that refuses writes once full
// (noeviction with a maxmemory), is a warning that says what to do; a Redis
// without a maxmemory, or with volatile-ttl, is none.
func TestRedisMemoryPolicyWarnings(t *testing.T) {
	srv := redistest.Start(t)
	rc := srv.Client(t)
	for _, c := range []struct {
		policy, maxmemory string
		warning           string
	}{
		{"noeviction", "0", ""},
		{"noeviction", "50mb", "refuses writes once it reaches maxmemory (maxmemory-policy noeviction)"},
		{"allkeys-lru", "50mb", "evicts any key when it is full (maxmemory-policy allkeys-lru)"},
		{"allkeys-lfu", "50mb", "evicts any key when it is full (maxmemory-policy allkeys-lfu)"},
		{"allkeys-lru", "0", ""},
		{"volatile-ttl", "50mb", ""},
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
				for _, want := range []string{`"level":"warn"`, c.warning, "volatile-ttl", "more memory"} {
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
