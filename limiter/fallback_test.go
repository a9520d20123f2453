package limiter

import (
	"context"
	"runtime"
	"strconv"
	"testing"
	"time"
)

// fallbackFleet is n instances, each a Fallback over a MemoryStore of its
// own, as n processes, beside one RedisStore they share.
func fallbackFleet(t *testing.T, n int) (*RedisStore, []*Fallback) {
	t.Helper()
	redis := NewRedisStore(testClient, RedisOptions{KeyPrefix: testPrefix(t), Timeout: 5 * time.Second})
	t.Cleanup(func() { redis.Close() })
	fleet := make([]*Fallback, n)
	for i := range fleet {
		local := NewMemoryStore()
		t.Cleanup(func() { local.Close() })
		fleet[i] = NewFallback(local, func() int { return n })
	}
	return redis, fleet
}

// admitted counts how many of tries requests of c store s admits.
func admitted(t *testing.T, s Store, c Check, tries int) int {
	t.Helper()
	n := 0
	for range tries {
		d := make([]Decision, 1)
		if err := s.Allow(context.Background(), []Check{c}, d); err != nil {
			t.Fatal(err)
		}
		if d[0].Allowed {
			n++
		}
	}
	return n
}

// TestFallbackStartsFromRedis: two instances that saw a client spend 60 of
// 100 in Redis admit together what Redis had left, 40, while it is away, not
// 100 each; when Redis is back, what they admitted is charged to it, so the
// window that spans the outage holds no more than 100.
func TestFallbackStartsFromRedis(t *testing.T) {
	for _, alg := range []Algorithm{SlidingLog, SlidingCounter} {
		t.Run(alg.String(), func(t *testing.T) {
			redis, fleet := fallbackFleet(t, 2)
			c := Check{Zone: "z", Key: testKey(t), Limit: Limit{Window: time.Hour, Max: 100, Algorithm: alg}}
			var last []Decision
			for range 60 {
				last = make([]Decision, 1)
				if err := redis.Allow(context.Background(), []Check{c}, last); err != nil || !last[0].Allowed {
					t.Fatalf("Allow: %+v, %v", last, err)
				}
			}
			for _, f := range fleet {
				f.Observe([]Check{c}, last)
			}
			total := 0
			for _, f := range fleet {
				total += admitted(t, f, c, 100)
			}
			if total != 40 {
				t.Errorf("two instances admitted %d while Redis was away, want the 40 it had left", total)
			}
			charged := 0
			for _, f := range fleet {
				clients, err := f.Recovered(context.Background(), redis)
				if err != nil {
					t.Fatal(err)
				}
				charged += clients
			}
			if charged != 2 {
				t.Errorf("charged %d clients to Redis, want 1 per instance", charged)
			}
			if n := admitted(t, redis, c, 10); n != 0 {
				t.Errorf("Redis admitted %d more after the outage's admissions were charged, want 0", n)
			}
		})
	}
}

// TestFallbackShareOfFreshClient: a client no instance saw gets each
// instance's share of the limit, so the fleet admits the limit, not the limit
// times the instances; a zone of 1 still admits on each.
func TestFallbackShareOfFreshClient(t *testing.T) {
	_, fleet := fallbackFleet(t, 3)
	for _, tc := range []struct {
		max  int64
		want int
	}{{100, 99}, {1, 3}, {0, 0}} {
		c := Check{Zone: "z", Key: testKey(t), Limit: Limit{Window: time.Hour, Max: tc.max}}
		total := 0
		for _, f := range fleet {
			total += admitted(t, f, c, 200)
		}
		if total != tc.want {
			t.Errorf("max %d over 3 instances: %d admitted, want %d", tc.max, total, tc.want)
		}
	}
}

// TestFallbackOwesWhatSettles: a local admission settled to zero owes
// nothing; one settled higher owes its real cost.
func TestFallbackOwesWhatSettles(t *testing.T) {
	redis, fleet := fallbackFleet(t, 1)
	f := fleet[0]
	ctx := context.Background()
	refunded := Check{Zone: "z", Key: testKey(t), Limit: Limit{Window: time.Hour, Max: 1000}}
	charged := Check{Zone: "z", Key: testKey(t), Limit: Limit{Window: time.Hour, Max: 1000}, Cost: 10}
	for _, tc := range []struct {
		check Check
		real  int64
	}{{refunded, 0}, {charged, 300}} {
		d := make([]Decision, 1)
		if err := f.Allow(ctx, []Check{tc.check}, d); err != nil || !d[0].Allowed {
			t.Fatalf("Allow: %+v, %v", d, err)
		}
		settle := tc.check
		settle.Cost = tc.real
		if err := f.Settle(ctx, []Check{settle}, d); err != nil {
			t.Fatal(err)
		}
	}
	if clients, err := f.Recovered(ctx, redis); err != nil || clients != 1 {
		t.Fatalf("Recovered: %d clients, %v; want 1 (the refunded one owes nothing)", clients, err)
	}
	for _, tc := range []struct {
		check Check
		used  int64
	}{{refunded, 0}, {charged, 300}} {
		d := make([]Decision, 1)
		if err := redis.Peek(ctx, []Check{tc.check}, d); err != nil {
			t.Fatal(err)
		}
		if got := tc.check.Limit.Max - d[0].Remaining; got != tc.used {
			t.Errorf("Redis holds %d of the client after the outage, want %d", got, tc.used)
		}
	}
	if clients, _ := f.Recovered(ctx, redis); clients != 0 {
		t.Errorf("a second Recovered charged %d clients, want 0: each outage is charged once", clients)
	}
}

// TestFallbackSightedOncePerOutage: a Redis that answers only reads (full,
// noeviction) is peeked for clients no local decision of the outage started
// from; a peek does not undo what the local store counted since, and the
// next outage starts from the store's word again.
func TestFallbackSightedOncePerOutage(t *testing.T) {
	redis, fleet := fallbackFleet(t, 1)
	f := fleet[0]
	ctx := context.Background()
	c := Check{Zone: "z", Key: testKey(t), Limit: Limit{Window: time.Hour, Max: 10}}
	if n := admitted(t, redis, c, 4); n != 4 {
		t.Fatalf("Redis admitted %d of 4", n)
	}
	peek := func() []Decision {
		d := make([]Decision, 1)
		if err := redis.Peek(ctx, []Check{c}, d); err != nil {
			t.Fatal(err)
		}
		return d
	}
	if f.Seeded([]Check{c}) {
		t.Fatal("seeded before any outage")
	}
	if !f.Sighted([]Check{c}, peek()) {
		t.Fatal("a client Redis holds 4 of is not known")
	}
	if n := admitted(t, f, c, 3); n != 3 {
		t.Fatalf("local admitted %d of 3", n)
	}
	if !f.Seeded([]Check{c}) {
		t.Fatal("not seeded after a local decision")
	}
	f.Sighted([]Check{c}, peek()) // Redis still says 4: the local store knows 7
	if n := admitted(t, f, c, 10); n != 3 {
		t.Errorf("local admitted %d after a second peek, want the 3 left of 10", n)
	}
	fresh := Check{Zone: "z", Key: testKey(t), Limit: c.Limit}
	d := make([]Decision, 1)
	if err := redis.Peek(ctx, []Check{fresh}, d); err != nil {
		t.Fatal(err)
	}
	if f.Sighted([]Check{fresh}, d) {
		t.Error("a client Redis holds nothing of is known")
	}
	if _, err := f.Recovered(ctx, redis); err != nil {
		t.Fatal(err)
	}
	if f.Seeded([]Check{c}) {
		t.Error("still seeded after the outage ended")
	}
	if d := peek(); d[0].Remaining != 0 {
		t.Errorf("Redis has %d left after the outage's 6 were charged, want 0", d[0].Remaining)
	}
}

// BenchmarkFallbackObserve is what fail_mode local adds to each decision
// that Redis answers, and the memory of each client it remembers
// (bytes/client, over as many clients as it keeps).
func BenchmarkFallbackObserve(b *testing.B) {
	local := NewMemoryStore()
	defer local.Close()
	f := NewFallback(local, func() int { return 2 })
	keys := make([]string, fallbackShards*fallbackShardClients)
	for i := range keys {
		keys[i] = "198.51." + strconv.Itoa(i>>8) + "." + strconv.Itoa(i&255)
	}
	checks := []Check{{Zone: "default", Limit: Limit{Window: time.Minute, Max: 100}}}
	decisions := []Decision{{Allowed: true, Remaining: 40, Reset: time.Second}}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for _, k := range keys {
		checks[0].Key = k
		f.Observe(checks, decisions)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	perClient := float64(after.HeapAlloc-before.HeapAlloc) / float64(len(keys))
	for i := 0; b.Loop(); i++ {
		checks[0].Key = keys[i%len(keys)]
		f.Observe(checks, decisions)
	}
	b.ReportMetric(perClient, "bytes/client")
}
