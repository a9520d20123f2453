package redistest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestCluster checks what tests of a cluster-backed limiter rely on: the
// URL works with go-redis, and hash-tagged keys really land on every master.
func TestCluster(t *testing.T) {
	start := time.Now()
	c := StartCluster(t, 3)
	t.Logf("3-master cluster up in %s: %s", time.Since(start).Round(time.Millisecond), c.URL())

	addrs := c.Addrs()
	if len(addrs) != 3 {
		t.Fatalf("Addrs() = %v, want 3 nodes", addrs)
	}
	for _, a := range addrs {
		if c.Node(a) == nil {
			t.Errorf("Node(%q) = nil", a)
		}
	}
	if c.Node("127.0.0.1:1") != nil {
		t.Error("Node of an address outside the cluster is not nil")
	}

	opts, err := redis.ParseClusterURL(c.URL())
	if err != nil {
		t.Fatalf("ParseClusterURL(%q): %v", c.URL(), err)
	}
	if !slices.Equal(opts.Addrs, addrs) {
		t.Fatalf("ParseClusterURL(%q).Addrs = %v, want %v", c.URL(), opts.Addrs, addrs)
	}
	cc := redis.NewClusterClient(opts)
	t.Cleanup(func() { cc.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	if err := c.Client(t).Set(ctx, "{via-Client}", "ok", time.Minute).Err(); err != nil {
		t.Fatalf("SET through Client(): %v", err)
	}
	if got, err := cc.Get(ctx, "{via-Client}").Result(); err != nil || got != "ok" {
		t.Fatalf("GET {via-Client} = %q, %v", got, err)
	}
	written := map[string]int64{c.MasterOf("{via-Client}"): 1}

	// 1,000 hash tags: the servers' own slot map must put a fair share on
	// each master, and the client must route each key to that same master.
	perMaster := map[string]int{}
	for i := range 1000 {
		key := fmt.Sprintf("{client-%d}:window", i)
		m := c.MasterOf(key)
		if !slices.Contains(addrs, m) {
			t.Fatalf("MasterOf(%q) = %q, not one of %v", key, m, addrs)
		}
		perMaster[m]++
		routed, err := cc.MasterForKey(ctx, key)
		if err != nil {
			t.Fatalf("MasterForKey(%q): %v", key, err)
		}
		if got := routed.Options().Addr; got != m {
			t.Fatalf("client routes %q to %s, MasterOf says %s", key, got, m)
		}
		if i%50 == 0 {
			written[m]++
			if err := cc.Set(ctx, key, i, time.Minute).Err(); err != nil {
				t.Fatalf("SET %s: %v", key, err)
			}
			if got, err := cc.Get(ctx, key).Int(); err != nil || got != i {
				t.Fatalf("GET %s = %d, %v; want %d", key, got, err, i)
			}
		}
	}
	t.Logf("keys per master: %v", perMaster)
	if len(perMaster) != 3 {
		t.Fatalf("1,000 hash tags landed on %d masters, want 3: %v", len(perMaster), perMaster)
	}
	for m, n := range perMaster {
		// Slots are split in thirds; 200 is far below any plausible share.
		if n < 200 {
			t.Errorf("master %s owns only %d of 1,000 keys", m, n)
		}
	}

	// The keys written through the URL's client are stored on the masters
	// MasterOf named (the cluster is otherwise empty).
	for _, a := range addrs {
		direct := redis.NewClient(&redis.Options{Addr: a})
		n, err := direct.DBSize(ctx).Result()
		direct.Close()
		if err != nil {
			t.Fatalf("DBSIZE on %s: %v", a, err)
		}
		if n != written[a] {
			t.Errorf("%s holds %d keys, MasterOf put %d there", a, n, written[a])
		}
	}
}

// TestClusterNode checks that Node gives the process serving a key, so a
// test can make exactly that master unresponsive or restart it.
func TestClusterNode(t *testing.T) {
	c := StartCluster(t, 3)
	ctx := context.Background()
	key := "{frozen}:k"
	m := c.MasterOf(key)
	var other string
	for i := 0; other == ""; i++ {
		k := fmt.Sprintf("{other-%d}:k", i)
		if c.MasterOf(k) != m {
			other = k
		}
	}
	cc := redis.NewClusterClient(&redis.ClusterOptions{
		Addrs:        c.Addrs(),
		MaxRedirects: -1,
		DialTimeout:  300 * time.Millisecond,
		ReadTimeout:  300 * time.Millisecond,
	})
	t.Cleanup(func() { cc.Close() })
	if err := cc.Set(ctx, key, "v", 0).Err(); err != nil {
		t.Fatal(err)
	}

	// Freeze well under the 2s node timeout, so the cluster never marks the
	// node failed and needs no time to recover.
	n := c.Node(m)
	if err := n.Freeze(); err != nil {
		t.Fatal(err)
	}
	frozenErr := cc.Get(ctx, key).Err()
	otherErr := cc.Set(ctx, other, "v", time.Minute).Err()
	if err := n.Thaw(); err != nil {
		t.Fatal(err)
	}
	var ne net.Error
	if !errors.As(frozenErr, &ne) || !ne.Timeout() {
		t.Errorf("GET %s on frozen master %s: err = %v, want a timeout", key, m, frozenErr)
	}
	if otherErr != nil {
		t.Errorf("SET %s on another master while %s is frozen: %v", other, m, otherErr)
	}
	if err := c.WaitHealthy(5 * time.Second); err != nil {
		t.Fatal(err)
	}

	// A restarted node comes back empty but with its slots (nodes.conf kept).
	n.Restart(t)
	if err := c.WaitHealthy(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	if got := c.MasterOf(key); got != m {
		t.Fatalf("after restart MasterOf(%q) = %s, want %s", key, got, m)
	}
	var err error
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if err = cc.Get(ctx, key).Err(); errors.Is(err, redis.Nil) {
			break
		}
	}
	if !errors.Is(err, redis.Nil) {
		t.Fatalf("GET %s after restarting %s: err = %v, want redis.Nil (data gone)", key, m, err)
	}
}

// TestClusterClose checks that Close leaves no node running: a test that
// fails half-way must not leak redis-server processes.
func TestClusterClose(t *testing.T) {
	c, err := NewCluster(3)
	if err != nil {
		t.Fatal(err)
	}
	addrs := c.Addrs()
	c.Close()
	c.Close() // twice is fine
	for _, a := range addrs {
		if conn, err := net.DialTimeout("tcp", a, 200*time.Millisecond); err == nil {
			conn.Close()
			t.Errorf("%s still accepts connections after Close", a)
		}
		if s := c.Node(a); s.cmd != nil {
			t.Errorf("%s: process still recorded after Close", a)
		}
	}
	if _, err := NewCluster(2); err == nil {
		t.Error("NewCluster(2) succeeded; redis-cli needs 3 masters")
	}
}
