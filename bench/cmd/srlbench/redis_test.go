package main

import (
	"context"
	"strings"
	"testing"
	"time"
)

// startTestRedis starts a redis-server of the test's own with the bench's
// helper, so the helper is what is tested too.
func startTestRedis(t *testing.T) (*proc, string) {
	t.Helper()
	p, url, err := startRedis(context.Background(), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.stop)
	return p, url
}

// TestAnchorCountsEveryDecision runs redis_rate briefly and checks that the
// Redis figures the report divides by the decisions come from the same calls.
func TestAnchorCountsEveryDecision(t *testing.T) {
	rds, url := startTestRedis(t)
	rc := redisClient(url)
	defer rc.Close()
	meter := &cpuMeter{redisPid: rds.cmd.Process.Pid}
	a, err := runAnchor(context.Background(), strings.TrimPrefix(url, "redis://"), rc, meter, 4, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if a.decisions == 0 || a.errors != 0 {
		t.Fatalf("decisions %d, errors %d", a.decisions, a.errors)
	}
	// One EVALSHA per decision; a call cut off by the end of the run may have
	// reached Redis without being counted, one per worker at most.
	if got := a.redis.scriptCalls; got < a.decisions || got > a.decisions+4 {
		t.Errorf("script calls %d for %d decisions", got, a.decisions)
	}
	if a.redis.cpuSeconds <= 0 {
		t.Errorf("Redis CPU %v s over %d decisions", a.redis.cpuSeconds, a.decisions)
	}
	if a.denied != 0 {
		t.Errorf("%d of %d denied: the anchor's keys must stay under the limit, like the many clients'", a.denied, a.decisions)
	}
	keys, err := rc.Keys(context.Background(), "rate:rr-*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if want := min(int(a.decisions), anchorKeys); len(keys) < want-1 || len(keys) > want+1 {
		t.Errorf("%d keys for %d decisions, want about %d (one per client)", len(keys), a.decisions, want)
	}
}

// TestFarProxyDelaysReplies checks that the far site's Redis really is
// farther: a reply through the proxy takes at least the toxic's latency (a
// lower bound, which no load on the machine can break).
func TestFarProxyDelaysReplies(t *testing.T) {
	_, url := startTestRedis(t)
	far, err := startFarProxy(url)
	if err != nil {
		t.Fatal(err)
	}
	defer far.stop()
	rc := redisClient(far.url)
	defer rc.Close()
	ctx := context.Background()
	if err := rc.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	for range 5 {
		start := time.Now()
		got, err := rc.Get(ctx, "k").Result()
		if err != nil || got != "v" {
			t.Fatalf("GET through the proxy: %q, %v", got, err)
		}
		if d := time.Since(start); d < farLatencyMs*time.Millisecond {
			t.Errorf("a round trip through the proxy took %s, less than %d ms", d, farLatencyMs)
		}
	}
	rtt, err := pingRTT(ctx, far.url, 5)
	if err != nil {
		t.Fatal(err)
	}
	if rtt < farLatencyMs*time.Millisecond {
		t.Errorf("pingRTT through the proxy = %s, less than %d ms", rtt, farLatencyMs)
	}
}

// TestRedisCPUReadsAServer checks INFO cpu against a real server: the
// counters grow with work.
func TestRedisCPUReadsAServer(t *testing.T) {
	_, url := startTestRedis(t)
	rc := redisClient(url)
	defer rc.Close()
	ctx := context.Background()
	before, err := readRedis(ctx, rc)
	if err != nil {
		t.Fatal(err)
	}
	pipe := rc.Pipeline()
	for i := range 20000 {
		pipe.Set(ctx, "k", i, 0)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	after, err := readRedis(ctx, rc)
	if err != nil {
		t.Fatal(err)
	}
	d := after.sub(before)
	if d.cpuSeconds <= 0 {
		t.Errorf("INFO cpu did not grow over 20,000 SETs: %v s", d.cpuSeconds)
	}
	if d.allCalls < 20000 {
		t.Errorf("commandstats counted %d calls, want at least 20,000", d.allCalls)
	}
}
