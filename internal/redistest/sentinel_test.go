package redistest

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestSentinelFailover checks what tests of a sentinel-backed limiter rely
// on: the URL works with go-redis, Failover really moves the master, the
// client follows it, and data written before it survives.
func TestSentinelFailover(t *testing.T) {
	start := time.Now()
	s := StartSentinel(t)
	t.Logf("primary, replica and sentinel up in %s: %s", time.Since(start).Round(time.Millisecond), s.URL())

	opts, err := redis.ParseFailoverURL(s.URL())
	if err != nil {
		t.Fatalf("ParseFailoverURL(%q): %v", s.URL(), err)
	}
	if opts.MasterName != s.MasterName() || !slices.Equal(opts.SentinelAddrs, []string{s.SentinelAddr()}) {
		t.Fatalf("ParseFailoverURL(%q) = master %q sentinels %v", s.URL(), opts.MasterName, opts.SentinelAddrs)
	}
	c := redis.NewFailoverClient(opts)
	t.Cleanup(func() { c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	first := s.Master()
	if first != s.Addrs()[0] {
		t.Fatalf("Master() = %q, want the primary %s", first, s.Addrs()[0])
	}
	if err := c.Set(ctx, "before", "1", 0).Err(); err != nil {
		t.Fatalf("SET through the failover client: %v", err)
	}
	// Replication is asynchronous: make sure the replica has the key before
	// it is promoted.
	if n, err := c.Wait(ctx, 1, 2000).Result(); err != nil || n != 1 {
		t.Fatalf("WAIT 1 replica = %d, %v", n, err)
	}

	failoverStart := time.Now()
	s.Failover(t)
	second := s.Master()
	t.Logf("failover %s -> %s in %s", first, second, time.Since(failoverStart).Round(time.Millisecond))
	if second == first || !slices.Contains(s.Addrs(), second) {
		t.Fatalf("after Failover Master() = %q (was %q), want the other of %v", second, first, s.Addrs())
	}
	// Failover leaves the old master a replica, so nothing is written to it.
	oldDirect := redis.NewClient(&redis.Options{Addr: first})
	t.Cleanup(func() { oldDirect.Close() })
	if err := oldDirect.Set(ctx, "stray", "x", 0).Err(); err == nil || !strings.HasPrefix(err.Error(), "READONLY") {
		t.Fatalf("SET on the old master %s after Failover: err = %v, want READONLY", first, err)
	}
	setGetEventually(t, ctx, c, "after", "2")
	if got, err := c.Get(ctx, "before").Result(); err != nil || got != "1" {
		t.Fatalf("GET before = %q, %v; want the value written before the failover", got, err)
	}
	// The client writes to the new master, not the demoted one.
	direct := redis.NewClient(&redis.Options{Addr: second})
	t.Cleanup(func() { direct.Close() })
	if got, err := direct.Get(ctx, "after").Result(); err != nil || got != "2" {
		t.Fatalf("GET after on new master %s = %q, %v", second, got, err)
	}

	// Failing back works too: Failover waits for the sentinel to see the
	// demoted server resynced before asking it to promote.
	failoverStart = time.Now()
	s.Failover(t)
	if got := s.Master(); got != first {
		t.Fatalf("after the second Failover Master() = %q, want %q", got, first)
	}
	t.Logf("fail back %s -> %s in %s", second, first, time.Since(failoverStart).Round(time.Millisecond))
	setGetEventually(t, ctx, c, "back", "3")
}

// setGetEventually retries SET/GET for a few seconds: right after a
// failover the client may still hold connections to the demoted master
// (READONLY) until the sentinel's +switch-master reaches it.
func setGetEventually(t *testing.T, ctx context.Context, c *redis.Client, key, val string) {
	t.Helper()
	var err error
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if err = c.Set(ctx, key, val, 0).Err(); err != nil {
			continue
		}
		var got string
		if got, err = c.Get(ctx, key).Result(); err == nil && got == val {
			return
		}
	}
	t.Fatalf("SET/GET %s through the failover client after failover: %v", key, err)
}

// TestSentinelClose checks that Close leaves none of the three processes
// running.
func TestSentinelClose(t *testing.T) {
	s, err := NewSentinel()
	if err != nil {
		t.Fatal(err)
	}
	nodes := append(s.Addrs(), s.SentinelAddr())
	s.Close()
	s.Close() // twice is fine
	for _, a := range nodes {
		if n := s.Node(a); n == nil || n.cmd != nil {
			t.Errorf("%s: process still recorded after Close", a)
		}
	}
}

// TestMissingBinaries checks that a machine without Redis gets a failure
// that says what to install, not a skip or a bare "executable not found".
func TestMissingBinaries(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	if _, err := NewCluster(3); err == nil || !strings.Contains(err.Error(), "apt-get install") {
		t.Errorf("NewCluster without redis on PATH: err = %v, want install instructions", err)
	}
	if _, err := NewSentinel(); err == nil || !strings.Contains(err.Error(), "apt-get install") {
		t.Errorf("NewSentinel without redis on PATH: err = %v, want install instructions", err)
	}
}
