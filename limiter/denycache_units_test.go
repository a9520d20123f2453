package limiter

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"
)

// TestDenyCacheAnswersOnlyWhatItIsSureOf: a denial for cost c under max m
// answers later requests of at least c under at most m, while their own
// wait does not reach the room; the others go to the store.
func TestDenyCacheAnswersOnlyWhatItIsSureOf(t *testing.T) {
	const room = time.Minute
	inner := &dcCounting{next: dcFunc(func(_ context.Context, checks []Check, ds []Decision) error {
		for i := range checks {
			ds[i] = Decision{Reset: room, RetryAfter: room - checks[i].Wait}
		}
		return nil
	})}
	c := NewDenyCache(inner, 100)
	denied := Check{Zone: "z", Key: "k", Limit: Limit{Window: time.Hour, Max: 10}, Cost: 5}
	dcAllow1(t, c, denied)
	for _, tc := range []struct {
		name string
		vary func(ch *Check)
		hit  bool
	}{
		{"the same", func(ch *Check) {}, true},
		{"a larger cost", func(ch *Check) { ch.Cost = 7 }, true},
		{"a smaller cost", func(ch *Check) { ch.Cost = 3 }, false},
		{"a lower max", func(ch *Check) { ch.Limit.Max = 8 }, true},
		{"a higher max", func(ch *Check) { ch.Limit.Max = 20 }, false},
		{"a wait short of the room", func(ch *Check) { ch.Wait = 30 * time.Second }, true},
		{"a wait that reaches the room", func(ch *Check) { ch.Wait = 59*time.Second + 950*time.Millisecond }, false},
		{"another algorithm", func(ch *Check) { ch.Limit.Algorithm = SlidingCounter }, false},
	} {
		ch := denied
		tc.vary(&ch)
		calls := inner.calls.Load()
		r := dcAllow1(t, c, ch)
		if r.hit != tc.hit || tc.hit && inner.calls.Load() != calls {
			t.Errorf("%s: hit %v, want %v", tc.name, r.hit, tc.hit)
		}
		if r.hit {
			// The told wait is the room less this request's own wait.
			if d := r.d; d.Allowed || d.Reset <= room-time.Second || d.RetryAfter != d.Reset-ch.Wait {
				t.Errorf("%s: %+v, want the room counted from the store's answer, less the wait %v", tc.name, d, ch.Wait)
			}
		}
	}
}

// TestDenyCacheNoLeases: a concurrency zone's denial is never cached: a
// release may come at any moment.
func TestDenyCacheNoLeases(t *testing.T) {
	inner := dcDenyAll(time.Minute)
	c := NewDenyCache(inner, 100)
	ch := Check{Zone: "inflight", Key: "k", Limit: Limit{Window: time.Minute, Max: 1, Algorithm: Concurrency}}
	for range 3 {
		if dcAllow1(t, c, ch).hit {
			t.Fatal("a lease denial was cached")
		}
	}
	if n := inner.calls.Load(); n != 3 {
		t.Errorf("%d store calls, want 3", n)
	}
}

// TestDenyCacheSettleForgets: a settle that lowers what an admission cost
// may free room: the key's denial is forgotten; a settle up is not.
func TestDenyCacheSettleForgets(t *testing.T) {
	s := NewMemoryStore()
	defer s.Close()
	c := NewDenyCache(s, 100)
	ch := Check{Zone: "z", Key: "k", Limit: Limit{Window: time.Hour, Max: 10}, Cost: 8}
	first := dcAllow1(t, c, ch).d
	if r := dcAllow1(t, c, ch); r.d.Allowed || r.hit || !dcAllow1(t, c, ch).hit {
		t.Fatalf("8 more of 10: %+v, want denied, then cached", r)
	}
	up := ch
	up.Cost = 9
	ds := []Decision{first}
	if err := c.Settle(context.Background(), []Check{up}, ds); err != nil {
		t.Fatal(err)
	}
	if !dcAllow1(t, c, ch).hit {
		t.Error("a settle up dropped the denial")
	}
	second := dcAllow1(t, c, Check{Zone: "z", Key: "k", Limit: ch.Limit, Cost: 1}).d
	down := ch
	down.Cost = 0
	if err := c.Settle(context.Background(), []Check{down}, []Decision{second}); err != nil {
		t.Fatal(err)
	}
	if r := dcAllow1(t, c, Check{Zone: "z", Key: "k", Limit: ch.Limit, Cost: 1}); r.hit || !r.d.Allowed {
		t.Errorf("after a refund: %+v, want the store's admission", r)
	}
}

// TestDenyCacheForgetIsPerShard: forgetting a key keeps denials of its own
// shard read before it from being cached, and no others: a denial of a key
// of another shard, in flight meanwhile, is cached.
func TestDenyCacheForgetIsPerShard(t *testing.T) {
	inner, entered, release := heldDenials()
	c := NewDenyCache(inner, 1000)
	a := Check{Zone: "z", Key: "a"}
	// A key of another shard than a's.
	b := Check{Zone: "z"}
	for i := 0; b.Key == "" || c.shard(b.Zone, b.Key) == c.shard(a.Zone, a.Key); i++ {
		b.Key = "b" + string(rune('a'+rand.IntN(26))) + string(rune('a'+i%26))
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		dcAllow1(t, c, a)
	}()
	<-entered
	c.Forget(b.Zone, b.Key)
	close(release)
	<-done
	if !dcAllow1(t, c, a).hit {
		t.Error("Forget of a key of another shard kept a denial in flight from being cached")
	}
}

// TestDenyCacheExactWithUnits floods one client from two instances, each a
// deny cache on its own RedisStore, with costs, waits and a max that changes
// from call to call, and checks each answer from a cache against Redis: a
// peek made before the cache's denial ends must be a denial too.
func TestDenyCacheExactWithUnits(t *testing.T) {
	const window = 400 * time.Millisecond
	key := testKey(t)
	stores := instances(t, 2)
	caches := []*DenyCache{NewDenyCache(stores[0], 100), NewDenyCache(stores[1], 100)}
	rng := rand.New(rand.NewPCG(1, 2))
	var hits, checked int
	for stop := time.Now().Add(1500 * time.Millisecond); time.Now().Before(stop); {
		i := rng.IntN(2)
		ch := Check{Zone: "z", Key: key, Limit: Limit{Window: window, Max: 20 + rng.Int64N(20)}, Cost: 1 + rng.Int64N(15)}
		if rng.IntN(3) == 0 {
			ch.Wait = time.Duration(rng.Int64N(int64(window / 2)))
		}
		r := dcAllow1(t, caches[i], ch)
		if !r.hit {
			continue
		}
		hits++
		// The entry's end, on the cache's clock: the peek must be denied
		// if it ended before it.
		s := caches[i].shard(ch.Zone, ch.Key)
		s.mu.RLock()
		until := s.slots[s.index[denyKey{ch.Zone, ch.Key}]].until
		s.mu.RUnlock()
		ds := make([]Decision, 1)
		if err := stores[i].Peek(context.Background(), []Check{ch}, ds); err != nil {
			t.Fatal(err)
		}
		if caches[i].now() < until-int64(ch.Wait) {
			checked++
			if ds[0].Allowed {
				t.Fatalf("the cache denied %+v, Redis admits it at once: %+v", ch, ds[0])
			}
		}
	}
	t.Logf("%d answers from the caches, %d checked against Redis", hits, checked)
	if checked == 0 {
		t.Error("no answer from a cache was checked")
	}
}
