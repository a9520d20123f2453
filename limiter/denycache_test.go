package limiter

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// dcCounting is a Store that counts the calls that reach the store it wraps.
type dcCounting struct {
	next  Store
	calls atomic.Int64
}

func (s *dcCounting) Allow(ctx context.Context, checks []Check, decisions []Decision) error {
	s.calls.Add(1)
	return s.next.Allow(ctx, checks, decisions)
}

func (s *dcCounting) Peek(ctx context.Context, checks []Check, decisions []Decision) error {
	return s.next.Peek(ctx, checks, decisions)
}

func (s *dcCounting) Settle(ctx context.Context, checks []Check, decisions []Decision) error {
	return s.next.Settle(ctx, checks, decisions)
}

func (s *dcCounting) Extend(ctx context.Context, checks []Check, decisions []Decision) error {
	return s.next.Extend(ctx, checks, decisions)
}

func (s *dcCounting) Reset(ctx context.Context, zone, key string) error {
	return s.next.Reset(ctx, zone, key)
}

// dcFunc is a Store made of a function.
type dcFunc func(ctx context.Context, checks []Check, decisions []Decision) error

func (f dcFunc) Allow(ctx context.Context, checks []Check, decisions []Decision) error {
	return f(ctx, checks, decisions)
}

func (dcFunc) Peek(context.Context, []Check, []Decision) error   { return nil }
func (dcFunc) Settle(context.Context, []Check, []Decision) error { return nil }
func (dcFunc) Extend(context.Context, []Check, []Decision) error { return nil }
func (dcFunc) Reset(context.Context, string, string) error       { return nil }

// dcDenyAll returns a store that denies every check with RetryAfter retry and
// counts its calls.
func dcDenyAll(retry time.Duration) *dcCounting {
	return &dcCounting{next: dcFunc(func(_ context.Context, checks []Check, ds []Decision) error {
		for i := range checks {
			ds[i] = Decision{RetryAfter: retry, Reset: retry}
		}
		return nil
	})}
}

// dcCall is one decision made through a DenyCache, and the time around it.
type dcCall struct {
	start, end time.Time
	d          Decision
	hit        bool
}

// dcAllow1 decides one check through c and fails the test on an error.
func dcAllow1(tb testing.TB, c *DenyCache, ch Check) dcCall {
	tb.Helper()
	r, err := dcTryAllow1(c, ch)
	if err != nil {
		tb.Fatal(err)
	}
	return r
}

// dcTryAllow1 decides one check through c.
func dcTryAllow1(c *DenyCache, ch Check) (dcCall, error) {
	ds := make([]Decision, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	start := time.Now()
	hit, err := c.AllowCached(ctx, []Check{ch}, ds)
	end := time.Now()
	if err != nil {
		return dcCall{}, fmt.Errorf("AllowCached(%+v): %w", ch, err)
	}
	return dcCall{start: start, end: end, d: ds[0], hit: hit}, nil
}

// dcCheckConsistent fails unless every shard's index and slots agree and the
// entry count is their total.
func dcCheckConsistent(tb testing.TB, c *DenyCache) {
	tb.Helper()
	total := 0
	for si := range c.shards {
		s := &c.shards[si]
		s.mu.Lock()
		if len(s.index) != len(s.slots) {
			tb.Errorf("shard %d: %d index entries, %d slots", si, len(s.index), len(s.slots))
		}
		if len(s.slots) > s.max {
			tb.Errorf("shard %d: %d slots, max %d", si, len(s.slots), s.max)
		}
		for i, sl := range s.slots {
			if j, ok := s.index[sl.k]; !ok || int(j) != i {
				tb.Errorf("shard %d: slot %d (%v) indexed at %d, %v", si, i, sl.k, j, ok)
			}
			if sl.until < s.minUntil {
				tb.Errorf("shard %d: slot %d until %d < minUntil %d", si, i, sl.until, s.minUntil)
			}
		}
		total += len(s.slots)
		s.mu.Unlock()
	}
	if got := c.stats().Entries; got != total {
		tb.Errorf("Stats().Entries = %d, shards hold %d", got, total)
	}
}

// TestDenyCacheExactAgainstRedis floods one key from two "Caddy instances",
// each a DenyCache on its own RedisStore and client, and checks that the
// admissions are Redis's: at most Max in any window, and no request denied
// (by the cache or Redis) at a time when Redis would have admitted it.
func TestDenyCacheExactAgainstRedis(t *testing.T) {
	const (
		limit        = 20
		window       = time.Second
		instances    = 2
		perInstance  = 4 // goroutines
		perGoroutine = 250
		spacing      = 6 * time.Millisecond // 250 requests over 1.5 s per goroutine
		goroutines   = instances * perInstance
		requests     = goroutines * perGoroutine
	)
	prefix := testPrefix(t)
	timed(t, func(t *testing.T, key string) string {
		caches := make([]*DenyCache, instances)
		inner := make([]*dcCounting, instances)
		for i := range caches {
			client := redis.NewClient(&redis.Options{Addr: testRedis.Addr(), PoolSize: perInstance})
			defer client.Close()
			inner[i] = &dcCounting{next: newRedisStore(t, client, prefix)}
			caches[i] = NewDenyCache(inner[i], 1000)
		}
		check := Check{Zone: "flood", Key: key, Limit: Limit{Window: window, Max: limit}}

		calls := make([][]dcCall, goroutines)
		var wg sync.WaitGroup
		begin := time.Now().Add(20 * time.Millisecond)
		for g := range goroutines {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c := caches[g%instances]
				offset := time.Duration(g) * spacing / goroutines
				for j := range perGoroutine {
					sleepUntil(begin.Add(offset + time.Duration(j)*spacing))
					r, err := dcTryAllow1(c, check)
					if err != nil {
						t.Error(err)
						return
					}
					calls[g] = append(calls[g], r)
				}
			}()
		}
		wg.Wait()
		if t.Failed() {
			return ""
		}
		all := slices.Concat(calls...)
		slices.SortFunc(all, func(a, b dcCall) int { return a.start.Compare(b.start) })
		var admitted []dcCall
		var hits int
		for _, c := range all {
			if c.d.Allowed {
				if c.hit {
					t.Fatalf("cache hit answered allowed: %+v", c)
				}
				admitted = append(admitted, c)
			}
			if c.hit {
				hits++
			}
		}
		floodEnd := all[len(all)-1].start
		if len(admitted) < limit {
			return fmt.Sprintf("only %d admissions", len(admitted))
		}
		if got := admitted[limit-1].end.Sub(admitted[0].start); got > window/2 {
			return fmt.Sprintf("the first %d admissions took %v", limit, got)
		}
		if admitted[limit-1].end.Add(window + 100*time.Millisecond).After(floodEnd) {
			return "the flood ended before the second window was well under way"
		}

		// Safety: any Max+1 admissions span at least a window of Redis time,
		// which lies within [start, end] of each call.
		for k := 0; k+limit < len(admitted); k++ {
			var last time.Time
			for _, a := range admitted[k : k+limit+1] {
				if a.end.After(last) {
					last = a.end
				}
			}
			if span := last.Sub(admitted[k].start); span < window-tol {
				t.Errorf("admissions %d..%d within %v < window %v", k, k+limit, span, window)
			}
		}
		// Exactness: Redis denies a call only when Max admissions lie in the
		// window ending at its clock read. Every admission that may be in
		// that window started before the call ended and ended after the
		// call's start minus the window. Cache hits must pass the same test.
		for _, c := range all {
			if c.d.Allowed {
				continue
			}
			n := 0
			for _, a := range admitted {
				if !a.start.After(c.end) && a.end.After(c.start.Add(-window-tol)) {
					n++
				}
			}
			if n < limit {
				t.Errorf("denied (hit %v) at %v after the first admission with at most %d admissions in the window: %+v",
					c.hit, c.start.Sub(admitted[0].start), n, c.d)
			}
		}
		// The first denial's retry time: the first call after it is admitted,
		// or someone took the slot before that call ended.
		for _, c := range all {
			if c.d.Allowed || c.hit {
				continue
			}
			deadline := c.end.Add(c.d.RetryAfter)
			i, _ := slices.BinarySearchFunc(all, deadline, func(a dcCall, t time.Time) int { return a.start.Compare(t) })
			if i == len(all) {
				t.Fatalf("no call after the first retry deadline")
			}
			next := all[i]
			if late := next.start.Sub(deadline); late > tol {
				return fmt.Sprintf("no call within %v of the retry deadline (first %v later)", tol, late)
			}
			j := slices.IndexFunc(admitted, func(a dcCall) bool { return !a.start.Before(c.end) })
			if j < 0 || admitted[j].start.After(next.end) {
				t.Errorf("first denial at %v, retry %v: not admitted again by the first call %v after the deadline",
					c.start.Sub(admitted[0].start), c.d.RetryAfter, next.start.Sub(deadline))
			}
			break
		}
		if floodEnd.Before(admitted[0].start.Add(2*window - tol)) {
			if len(admitted) != 2*limit {
				t.Errorf("%d admissions in a flood of %v, want %d (Max in each of two windows)",
					len(admitted), floodEnd.Sub(admitted[0].start), 2*limit)
			}
		}
		var storeCalls int64
		for _, s := range inner {
			storeCalls += s.calls.Load()
		}
		if storeCalls > requests/4 {
			t.Errorf("the stores were called %d times for %d requests", storeCalls, requests)
		}
		var cacheHits uint64
		for _, c := range caches {
			cacheHits += c.stats().Hits
		}
		if cacheHits != uint64(hits) || int64(hits)+storeCalls != requests {
			t.Errorf("hits %d (Stats %d) + store calls %d != %d requests", hits, cacheHits, storeCalls, requests)
		}
		t.Logf("%d requests, %d admitted, %d cache hits, %d store calls", requests, len(admitted), hits, storeCalls)
		return ""
	})
}

// TestDenyCacheNeverDeniesWhatRedisAdmits checks that a key denied with retry
// d reaches Redis, and is admitted, 1 ms after d.
func TestDenyCacheNeverDeniesWhatRedisAdmits(t *testing.T) {
	const window = 300 * time.Millisecond
	timed(t, func(t *testing.T, key string) string {
		inner := &dcCounting{next: newRedisStore(t, testClient, testPrefix(t))}
		c := NewDenyCache(inner, 100)
		check := Check{Zone: "z", Key: key, Limit: Limit{Window: window, Max: 2}}
		first := dcAllow1(t, c, check)
		dcAllow1(t, c, check)
		denied := dcAllow1(t, c, check)
		if denied.d.Allowed {
			return "third request admitted: the first aged out already"
		}
		if denied.hit || inner.calls.Load() != 3 {
			t.Fatalf("first denial: hit %v, %d store calls", denied.hit, inner.calls.Load())
		}
		lo, hi := untilAged(call{start: first.start, end: first.end}, denied.start, denied.end, window)
		checkWithin(t, "RetryAfter", denied.d.RetryAfter, lo, hi)

		again := dcAllow1(t, c, check)
		if !again.hit || again.d.Allowed || inner.calls.Load() != 3 {
			t.Fatalf("second denial: hit %v, %+v, %d store calls", again.hit, again.d, inner.calls.Load())
		}
		least, most := denied.start.Add(denied.d.RetryAfter).Sub(again.end), denied.end.Add(denied.d.RetryAfter).Sub(again.start)
		if again.d.RetryAfter < least || again.d.RetryAfter > most {
			t.Errorf("hit RetryAfter %v, want the store's retry counted from its answer, in [%v, %v]", again.d.RetryAfter, least, most)
		}
		if again.d.Reset != again.d.RetryAfter || again.d.Remaining != 0 {
			t.Errorf("hit decision %+v: want Reset = RetryAfter, Remaining 0", again.d)
		}

		sleepUntil(denied.end.Add(denied.d.RetryAfter + time.Millisecond))
		after := dcAllow1(t, c, check)
		if after.hit || !after.d.Allowed || inner.calls.Load() != 4 {
			t.Errorf("1 ms after the retry deadline: hit %v, %+v, %d store calls", after.hit, after.d, inner.calls.Load())
		}
		return ""
	})
}

// TestDenyCacheTellsTheUntrimmedWait: the drift margin shortens the entry's
// own life (a day's wait by 86 s), never the wait a client is told.
func TestDenyCacheTellsTheUntrimmedWait(t *testing.T) {
	const retry = 24 * time.Hour
	c := NewDenyCache(dcFunc(func(_ context.Context, checks []Check, ds []Decision) error {
		for i := range checks {
			ds[i] = Decision{RetryAfter: retry, Reset: retry}
		}
		return nil
	}), 10)
	check := Check{Zone: "z", Key: "k", Limit: Limit{Window: retry, Max: 1}}
	first := dcAllow1(t, c, check)
	hit := dcAllow1(t, c, check)
	if !hit.hit {
		t.Fatal("second call missed the cache")
	}
	if least := first.start.Add(retry).Sub(hit.end); hit.d.RetryAfter < least {
		t.Errorf("hit RetryAfter %v, want at least %v: the trim leaked into the answer", hit.d.RetryAfter, least)
	}
}

// TestDenyCacheExpiryFromCallStart checks that the cached expiry counts the
// retry from before the store call, not from its return.
func TestDenyCacheExpiryFromCallStart(t *testing.T) {
	const (
		latency = 50 * time.Millisecond
		retry   = 300 * time.Millisecond
	)
	inner := &dcCounting{next: dcFunc(func(_ context.Context, checks []Check, ds []Decision) error {
		time.Sleep(latency)
		for i := range checks {
			ds[i] = Decision{RetryAfter: retry, Reset: retry}
		}
		return nil
	})}
	c := NewDenyCache(inner, 10)
	check := Check{Zone: "z", Key: "k", Limit: Limit{Window: time.Second, Max: 1}}
	first := dcAllow1(t, c, check)
	if first.hit || first.d.Allowed {
		t.Fatalf("first call: %+v", first)
	}
	hit := dcAllow1(t, c, check)
	if !hit.hit {
		t.Fatalf("second call missed the cache")
	}
	// What the client is told is the store's wait counted from its answer:
	// never early, and not trimmed like the entry's own expiry.
	if least, most := first.start.Add(retry).Sub(hit.end), first.end.Add(retry).Sub(hit.start); hit.d.RetryAfter < least || hit.d.RetryAfter > most {
		t.Errorf("hit RetryAfter %v, want the retry counted from the answer, in [%v, %v]", hit.d.RetryAfter, least, most)
	}
	// Before first.end+retry but after first.start+retry: only the safe side
	// lets it through.
	sleepUntil(first.start.Add(retry + time.Millisecond))
	if late := dcAllow1(t, c, check); late.hit {
		t.Errorf("%v after the call began, %v before it ended + retry: still cached",
			late.start.Sub(first.start), first.end.Add(retry).Sub(late.start))
	}
	if n := inner.calls.Load(); n != 2 {
		t.Errorf("%d store calls, want 2", n)
	}
}

func TestDenyCacheBounded(t *testing.T) {
	const (
		keys       = 100_000
		maxEntries = 10_000
	)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)

	inner := dcDenyAll(time.Minute)
	c := NewDenyCache(inner, maxEntries)
	ctx := context.Background()
	checks := []Check{{Zone: "z", Limit: Limit{Window: time.Minute, Max: 1}}}
	ds := make([]Decision, 1)
	for i := range keys {
		checks[0].Key = "198.51." + strconv.Itoa(i>>8) + "." + strconv.Itoa(i&0xff) + "-" + strconv.Itoa(i)
		if err := c.Allow(ctx, checks, ds); err != nil {
			t.Fatal(err)
		}
		if ds[0].Allowed {
			t.Fatalf("allowed: %+v", ds[0])
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	st := c.stats()
	if st.Entries > maxEntries || st.Evictions < keys-maxEntries || st.Entries+int(st.Evictions) != keys || st.Hits != 0 {
		t.Errorf("Stats = %+v after %d distinct denied keys, max %d", st, keys, maxEntries)
	}
	if n := inner.calls.Load(); n != keys {
		t.Errorf("%d store calls, want %d", n, keys)
	}
	dcCheckConsistent(t, c)
	delta := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("Stats %+v, heap grew %d KB (%d B an entry)", st, delta/1024, delta/int64(max(st.Entries, 1)))
	if delta > 16<<20 {
		t.Errorf("heap grew %d MB for %d entries", delta>>20, st.Entries)
	}
	runtime.KeepAlive(c)
}

func TestDenyCacheEvictsExpiredFirst(t *testing.T) {
	retry := 20 * time.Millisecond
	var mu sync.Mutex
	inner := &dcCounting{next: dcFunc(func(_ context.Context, checks []Check, ds []Decision) error {
		mu.Lock()
		defer mu.Unlock()
		for i := range checks {
			ds[i] = Decision{RetryAfter: retry, Reset: retry}
		}
		return nil
	})}
	c := NewDenyCache(inner, denyCacheShards*8)
	for i := range 2000 {
		dcAllow1(t, c, Check{Zone: "z", Key: "short-" + strconv.Itoa(i)})
	}
	evicted := c.stats().Evictions
	time.Sleep(2 * retry)
	mu.Lock()
	retry = time.Minute
	mu.Unlock()
	// 32 new keys over 32 shards of 8: a shard gets more than 8 with
	// probability about 1e-6.
	for i := range denyCacheShards {
		dcAllow1(t, c, Check{Zone: "z", Key: "long-" + strconv.Itoa(i)})
	}
	if got := c.stats().Evictions; got != evicted {
		t.Errorf("%d live entries evicted while expired ones were there", got-evicted)
	}
	for i := range denyCacheShards {
		if !dcAllow1(t, c, Check{Zone: "z", Key: "long-" + strconv.Itoa(i)}).hit {
			t.Errorf("long-%d not cached", i)
		}
	}
	dcCheckConsistent(t, c)
}

func TestDenyCacheSmallBounds(t *testing.T) {
	for _, maxEntries := range []int{1, 2, 3, 31, 32, 33, 1000} {
		inner := dcDenyAll(time.Minute)
		c := NewDenyCache(inner, maxEntries)
		total := 0
		for i := range c.shards {
			total += c.shards[i].max
			if c.shards[i].max < 1 {
				t.Errorf("max %d: shard %d holds %d", maxEntries, i, c.shards[i].max)
			}
		}
		if total != maxEntries {
			t.Errorf("max %d: shards hold %d", maxEntries, total)
		}
		for i := range 3 * maxEntries {
			dcAllow1(t, c, Check{Zone: "z", Key: strconv.Itoa(i)})
		}
		if st := c.stats(); st.Entries > maxEntries || st.Entries < 1 {
			t.Errorf("max %d: Stats %+v", maxEntries, st)
		}
		// The key just denied is always cached.
		if !dcAllow1(t, c, Check{Zone: "z", Key: strconv.Itoa(3*maxEntries - 1)}).hit {
			t.Errorf("max %d: last key not cached", maxEntries)
		}
		dcCheckConsistent(t, c)
	}
	if c := NewDenyCache(dcDenyAll(time.Minute), 0); len(c.shards)*c.shards[0].max != defaultDenyCacheEntries {
		t.Errorf("maxEntries 0: %d shards of %d", len(c.shards), c.shards[0].max)
	}
}

func TestDenyCacheClearForget(t *testing.T) {
	inner := dcDenyAll(time.Minute)
	c := NewDenyCache(inner, 100)
	a := Check{Zone: "z", Key: "a"}
	b := Check{Zone: "z", Key: "b"}
	aOther := Check{Zone: "other", Key: "a"}
	wantCalls := func(n int64) {
		t.Helper()
		if got := inner.calls.Load(); got != n {
			t.Fatalf("%d store calls, want %d", got, n)
		}
	}
	dcAllow1(t, c, a)
	dcAllow1(t, c, b)
	wantCalls(2)
	if !dcAllow1(t, c, a).hit || !dcAllow1(t, c, b).hit {
		t.Fatal("not cached")
	}
	wantCalls(2)
	if dcAllow1(t, c, aOther).hit {
		t.Fatal("zone other hit the entry of zone z")
	}
	wantCalls(3)

	c.Forget("z", "a")
	c.Forget("z", "nobody")
	if dcAllow1(t, c, a).hit {
		t.Error("a still cached after Forget")
	}
	wantCalls(4)
	if !dcAllow1(t, c, b).hit || !dcAllow1(t, c, aOther).hit {
		t.Error("Forget(z, a) dropped other entries")
	}
	wantCalls(4)
	if !dcAllow1(t, c, a).hit {
		t.Error("a not cached again")
	}

	c.Clear()
	if st := c.stats(); st.Entries != 0 {
		t.Errorf("after Clear: %+v", st)
	}
	for _, ch := range []Check{a, b, aOther} {
		if dcAllow1(t, c, ch).hit {
			t.Errorf("%+v cached after Clear", ch)
		}
	}
	wantCalls(7)
	if !dcAllow1(t, c, b).hit {
		t.Error("b not cached after Clear and a new denial")
	}
	dcCheckConsistent(t, c)
}

// heldDenials returns a store that denies every check for a minute, and
// whose first call closes entered and then waits until release is closed.
func heldDenials() (inner dcFunc, entered, release chan struct{}) {
	entered, release = make(chan struct{}), make(chan struct{})
	var calls atomic.Int64
	inner = func(_ context.Context, checks []Check, ds []Decision) error {
		if calls.Add(1) == 1 {
			close(entered)
			<-release
		}
		for i := range checks {
			ds[i] = Decision{Reset: time.Minute, RetryAfter: time.Minute}
		}
		return nil
	}
	return inner, entered, release
}

// TestDenyCacheForgetDuringCall checks that a denial read from the store
// before an operator reset, and returned after Forget, is not cached.
func TestDenyCacheForgetDuringCall(t *testing.T) {
	for _, name := range []string{"Forget", "Clear"} {
		t.Run(name, func(t *testing.T) {
			inner, entered, release := heldDenials()
			c := NewDenyCache(inner, 100)
			check := Check{Zone: "z", Key: "k"}
			done := make(chan struct{})
			go func() {
				defer close(done)
				dcAllow1(t, c, check)
			}()
			<-entered
			if name == "Forget" {
				c.Forget("z", "k")
			} else {
				c.Clear()
			}
			close(release)
			<-done
			if dcAllow1(t, c, check).hit {
				t.Errorf("a denial from before %s was cached", name)
			}
			if !dcAllow1(t, c, check).hit {
				t.Error("a denial from after it was not cached")
			}
		})
	}
}

func TestDenyCacheSeveralChecks(t *testing.T) {
	inner := &dcCounting{next: dcFunc(func(_ context.Context, checks []Check, ds []Decision) error {
		for i, ch := range checks {
			ds[i] = Decision{Allowed: true, Remaining: 5, Reset: time.Second}
			if ch.Zone == "strict" {
				ds[i] = Decision{RetryAfter: time.Minute, Reset: time.Minute}
			}
		}
		return nil
	})}
	c := NewDenyCache(inner, 100)
	checks := []Check{{Zone: "loose", Key: "k"}, {Zone: "strict", Key: "k"}}
	ds := make([]Decision, 2)
	ctx := context.Background()
	if hit, err := c.AllowCached(ctx, checks, ds); hit || err != nil || Admitted(ds) {
		t.Fatalf("first: hit %v, err %v, %+v", hit, err, ds)
	}
	if hit, err := c.AllowCached(ctx, checks, ds); !hit || err != nil {
		t.Fatalf("second: hit %v, err %v", hit, err)
	}
	if ds[0] != (Decision{Allowed: true}) {
		t.Errorf("uncached check on a hit: %+v", ds[0])
	}
	if d := ds[1]; d.Allowed || d.RetryAfter <= 0 || d.RetryAfter > time.Minute || d.Reset != d.RetryAfter || d.Remaining != 0 {
		t.Errorf("cached check on a hit: %+v", d)
	}
	if n := inner.calls.Load(); n != 1 {
		t.Errorf("%d store calls, want 1", n)
	}
	// The loose zone alone was never denied: it reaches the store.
	if hit, err := c.AllowCached(ctx, checks[:1], ds[:1]); hit || err != nil || !ds[0].Allowed || ds[0].Remaining != 5 {
		t.Errorf("loose alone: hit %v, err %v, %+v", hit, err, ds[0])
	}
	if st := c.stats(); st.Hits != 1 || st.Entries != 1 {
		t.Errorf("Stats %+v", st)
	}
}

func TestDenyCacheStoreError(t *testing.T) {
	boom := errors.New("boom")
	c := NewDenyCache(dcFunc(func(_ context.Context, checks []Check, ds []Decision) error {
		for i := range checks {
			ds[i] = Decision{RetryAfter: time.Minute}
		}
		return boom
	}), 100)
	ds := make([]Decision, 1)
	for range 2 {
		if hit, err := c.AllowCached(context.Background(), []Check{{Zone: "z", Key: "k"}}, ds); hit || !errors.Is(err, boom) {
			t.Errorf("hit %v, err %v", hit, err)
		}
	}
	if st := c.stats(); st.Entries != 0 {
		t.Errorf("a failed call was cached: %+v", st)
	}
}

// TestDenyCacheConcurrent runs decisions, Forget, Clear and Stats at once;
// run it with -race.
func TestDenyCacheConcurrent(t *testing.T) {
	const maxEntries = 50
	inner := dcFunc(func(_ context.Context, checks []Check, ds []Decision) error {
		for i := range checks {
			if rand.IntN(3) == 0 {
				ds[i] = Decision{Allowed: true, Remaining: 1}
				continue
			}
			r := time.Duration(rand.IntN(3000)) * time.Microsecond
			ds[i] = Decision{RetryAfter: r, Reset: r}
		}
		return nil
	})
	c := NewDenyCache(inner, maxEntries)
	stop := make(chan struct{})
	var admin sync.WaitGroup
	admin.Add(1)
	go func() {
		defer admin.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			switch i % 3 {
			case 0:
				c.Forget("z0", strconv.Itoa(rand.IntN(200)))
			case 1:
				if st := c.stats(); st.Entries > maxEntries {
					t.Errorf("Stats %+v", st)
				}
				denied, total := c.Denied(nil, 10)
				if len(denied) > 10 || len(denied) > total || total > maxEntries {
					t.Errorf("Denied: %d listed of %d", len(denied), total)
				}
				for j, d := range denied {
					if d.RetryAfter <= 0 || j > 0 && d.RetryAfter > denied[j-1].RetryAfter {
						t.Errorf("Denied: entry %d waits %v after %v", j, d.RetryAfter, denied[j-1].RetryAfter)
					}
				}
			case 2:
				if i%300 == 2 {
					c.Clear()
				}
			}
			time.Sleep(50 * time.Microsecond)
		}
	}()
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := context.Background()
			checks := []Check{{Zone: "z0"}, {Zone: "z1"}}
			ds := make([]Decision, 2)
			for range 5000 {
				checks[0].Key = strconv.Itoa(rand.IntN(200))
				checks[1].Key = checks[0].Key
				n := 1 + g%2
				hit, err := c.AllowCached(ctx, checks[:n], ds[:n])
				if err != nil {
					t.Error(err)
					return
				}
				if hit && Admitted(ds[:n]) {
					t.Errorf("a hit admitted: %+v", ds[:n])
					return
				}
				for _, d := range ds[:n] {
					if hit && !d.Allowed && d.RetryAfter <= 0 {
						t.Errorf("a hit denied with RetryAfter %v", d.RetryAfter)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	admin.Wait()
	dcCheckConsistent(t, c)
	t.Logf("Stats %+v", c.stats())
}

func TestDenyCacheHitAllocs(t *testing.T) {
	c := NewDenyCache(dcDenyAll(time.Hour), 100)
	ctx := context.Background()
	checks := []Check{{Zone: "z", Key: "k"}, {Zone: "y", Key: "k"}}
	ds := make([]Decision, 2)
	if err := c.Allow(ctx, checks, ds); err != nil {
		t.Fatal(err)
	}
	if n := testing.AllocsPerRun(1000, func() {
		if hit, err := c.AllowCached(ctx, checks, ds); !hit || err != nil {
			t.Fatalf("hit %v, err %v", hit, err)
		}
	}); n != 0 {
		t.Errorf("%v allocations a hit", n)
	}
}

// BenchmarkDenyCacheHit decides one denied key from parallel goroutines, all
// answered by the cache.
func BenchmarkDenyCacheHit(b *testing.B) {
	inner := dcDenyAll(time.Hour)
	c := NewDenyCache(inner, defaultDenyCacheEntries)
	check := Check{Zone: "bench", Key: "198.51.100.7", Limit: Limit{Window: time.Minute, Max: 10}}
	if err := c.Allow(context.Background(), []Check{check}, make([]Decision, 1)); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		ctx := context.Background()
		checks := []Check{check}
		ds := make([]Decision, 1)
		for pb.Next() {
			if hit, err := c.AllowCached(ctx, checks, ds); !hit || err != nil {
				b.Errorf("hit %v, err %v", hit, err)
				return
			}
		}
	})
	b.StopTimer()
	if n := inner.calls.Load(); n != 1 {
		b.Errorf("%d store calls, want 1", n)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
}

// dcInspectable is a store that denies every check with a one-minute retry
// until its key is reset, and counts calls.
type dcInspectable struct {
	mu      sync.Mutex
	resets  map[string]bool
	calls   atomic.Int64
	peeks   atomic.Int64
	extends atomic.Int64
}

func (s *dcInspectable) Allow(_ context.Context, checks []Check, ds []Decision) error {
	s.calls.Add(1)
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, ch := range checks {
		ds[i] = Decision{RetryAfter: time.Minute, Reset: time.Minute}
		if s.resets[ch.Zone+"/"+ch.Key] {
			ds[i] = Decision{Allowed: true, Remaining: 1}
		}
	}
	return nil
}

func (s *dcInspectable) Peek(_ context.Context, checks []Check, ds []Decision) error {
	s.peeks.Add(1)
	for i := range checks {
		ds[i] = Decision{Allowed: true, Remaining: 7}
	}
	return nil
}

func (s *dcInspectable) Settle(context.Context, []Check, []Decision) error { return nil }

func (s *dcInspectable) Extend(context.Context, []Check, []Decision) error {
	s.extends.Add(1)
	return nil
}

func (s *dcInspectable) Reset(_ context.Context, zone, key string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.resets == nil {
		s.resets = make(map[string]bool)
	}
	s.resets[zone+"/"+key] = true
	return nil
}

// TestDenyCachePassesThrough: Peek and Extend go to the store without
// touching the cache; Reset resets the store and forgets the key.
func TestDenyCachePassesThrough(t *testing.T) {
	inner := &dcInspectable{}
	c := NewDenyCache(inner, 10)
	check := Check{Zone: "z", Key: "k"}
	dcAllow1(t, c, check)
	if !dcAllow1(t, c, check).hit {
		t.Fatal("not cached")
	}
	ds := make([]Decision, 1)
	if err := c.Peek(context.Background(), []Check{check}, ds); err != nil || ds[0].Remaining != 7 || inner.peeks.Load() != 1 {
		t.Errorf("Peek: err %v, %+v, %d peeks", err, ds[0], inner.peeks.Load())
	}
	if err := c.Extend(context.Background(), []Check{check}, ds); err != nil || inner.extends.Load() != 1 {
		t.Errorf("Extend: err %v, %d extends", err, inner.extends.Load())
	}
	if !dcAllow1(t, c, check).hit {
		t.Fatal("Peek or Extend dropped the entry")
	}
	if err := c.Reset(context.Background(), "z", "k"); err != nil {
		t.Fatal(err)
	}
	if r := dcAllow1(t, c, check); r.hit || !r.d.Allowed {
		t.Errorf("after Reset: %+v", r)
	}
	if n := inner.calls.Load(); n != 2 {
		t.Errorf("%d store calls, want 2", n)
	}
}

// dcDenyByKey returns a store that denies every check for as many minutes as
// its key says ("7" waits 7 minutes) and admits keys that are no number.
func dcDenyByKey() Store {
	return dcFunc(func(_ context.Context, checks []Check, ds []Decision) error {
		for i, ch := range checks {
			minutes, err := strconv.Atoi(ch.Key)
			if err != nil {
				ds[i] = Decision{Allowed: true, Remaining: 1}
				continue
			}
			r := time.Duration(minutes) * time.Minute
			ds[i] = Decision{RetryAfter: r, Reset: r}
		}
		return nil
	})
}

func TestDenyCacheDenied(t *testing.T) {
	c := NewDenyCache(dcDenyByKey(), 1000)
	// 60 denied keys in two zones, waits 1 to 30 minutes, and admitted ones.
	start := time.Now()
	for m := 1; m <= 30; m++ {
		for _, zone := range []string{"b", "a"} {
			dcAllow1(t, c, Check{Zone: zone, Key: strconv.Itoa(m)})
		}
		dcAllow1(t, c, Check{Zone: "a", Key: "admitted" + strconv.Itoa(m)})
	}

	denied, total := c.Denied(nil, 5)
	if total != 60 {
		t.Errorf("total %d, want 60", total)
	}
	want := []struct{ zone, key string }{{"a", "30"}, {"b", "30"}, {"a", "29"}, {"b", "29"}, {"a", "28"}}
	if len(denied) != len(want) {
		t.Fatalf("%d listed, want %d: %+v", len(denied), len(want), denied)
	}
	for i, w := range want {
		d := denied[i]
		minutes, _ := strconv.Atoi(w.key)
		full := time.Duration(minutes) * time.Minute
		if d.Zone != w.zone || d.Key != w.key || d.RetryAfter > full || d.RetryAfter < full-time.Since(start) {
			t.Errorf("entry %d: %+v, want %s/%s waiting at most %v and about that", i, d, w.zone, w.key, full)
		}
	}

	all, total := c.Denied(make([]DeniedKey, 3), 1000)
	if len(all) != 60 || total != 60 {
		t.Fatalf("n 1000: %d listed of %d, want 60 of 60", len(all), total)
	}
	for i := 1; i < len(all); i++ {
		if all[i].RetryAfter > all[i-1].RetryAfter {
			t.Errorf("entry %d waits %v, longer than entry %d's %v", i, all[i].RetryAfter, i-1, all[i-1].RetryAfter)
		}
	}
	for _, d := range all {
		if strings.HasPrefix(d.Key, "admitted") {
			t.Errorf("admitted key listed: %+v", d)
		}
	}

	if none, total := c.Denied(nil, 0); len(none) != 0 || total != 60 {
		t.Errorf("n 0: %d listed of %d, want 0 of 60", len(none), total)
	}
	c.Forget("a", "30")
	if top, total := c.Denied(nil, 1); total != 59 || len(top) != 1 || top[0].Zone != "b" || top[0].Key != "30" {
		t.Errorf("after Forget(a, 30): %+v of %d, want b/30 of 59", top, total)
	}
	c.Clear()
	if none, total := c.Denied(nil, 10); len(none) != 0 || total != 0 {
		t.Errorf("after Clear: %+v of %d", none, total)
	}
}

// TestDenyCacheDeniedUntilIsTheEnd: an entry whose own, trimmed expiry has
// passed is not listed, though the wait it would tell has not.
func TestDenyCacheDeniedUntilIsTheEnd(t *testing.T) {
	// Room for both entries whatever shard their keys hash to: with 10,
	// the two keys shared a slot in some runs.
	c := NewDenyCache(dcDenyAll(time.Minute), 1000)
	now := c.now()
	// Long enough that a loaded machine lists it before it ends.
	const short = 100 * time.Millisecond
	c.remember(denySlot{k: denyKey{"z", "short"}, until: now + int64(short), retryAt: now + int64(time.Hour), cost: 1, waits: true}, c.shard("z", "short").gen)
	c.remember(denySlot{k: denyKey{"z", "long"}, until: now + int64(time.Hour), retryAt: now + int64(2*time.Hour), cost: 1, waits: true}, c.shard("z", "long").gen)
	if denied, total := c.Denied(nil, 10); total != 2 || len(denied) != 2 || denied[0].Key != "long" {
		t.Fatalf("before the short entry ends: %+v of %d", denied, total)
	}
	for c.now() <= now+int64(short) {
		time.Sleep(time.Millisecond)
	}
	denied, total := c.Denied(nil, 10)
	if total != 1 || len(denied) != 1 || denied[0].Key != "long" {
		t.Fatalf("after the short entry ended: %+v of %d, want long alone", denied, total)
	}
	if d := denied[0].RetryAfter; d <= time.Hour || d > 2*time.Hour {
		t.Errorf("long waits %v, want the told wait (2h less the time passed), not the expiry", d)
	}
}

func TestDenyCacheDeniedAllocs(t *testing.T) {
	c := NewDenyCache(dcDenyByKey(), 1000)
	for m := 1; m <= 100; m++ {
		dcAllow1(t, c, Check{Zone: "z", Key: strconv.Itoa(m)})
	}
	dst := make([]DeniedKey, 0, 10)
	if n := testing.AllocsPerRun(100, func() {
		if denied, total := c.Denied(dst, 10); len(denied) != 10 || total != 100 {
			t.Fatalf("%d listed of %d", len(denied), total)
		}
	}); n != 0 {
		t.Errorf("%v allocations a listing", n)
	}
}

// BenchmarkDenyCacheDenied lists the 100 longest waits of a full cache of
// defaultDenyCacheEntries entries; the time a shard's lock is held is the
// time per op divided by the shards.
func BenchmarkDenyCacheDenied(b *testing.B) {
	c := NewDenyCache(dcDenyAll(time.Hour), defaultDenyCacheEntries)
	now := c.now()
	for i := range defaultDenyCacheEntries {
		wait := int64(time.Duration(rand.IntN(3600)) * time.Second)
		k := strconv.Itoa(i)
		c.remember(denySlot{k: denyKey{"zone", k}, until: now + int64(2*time.Hour) + wait, retryAt: now + int64(2*time.Hour) + wait, cost: 1, waits: true}, c.shard("zone", k).gen)
	}
	if got := c.stats().Entries; got < defaultDenyCacheEntries*9/10 {
		b.Fatalf("%d entries", got)
	}
	dst := make([]DeniedKey, 0, 100)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		dst, _ = c.Denied(dst, 100)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(len(c.shards)), "ns/shard")
}

// ExampleDenyCache_Denied lists who is blocked, as an operator would ask.
func ExampleDenyCache_Denied() {
	store := NewMemoryStore()
	defer store.Close()
	cache := NewDenyCache(store, 0)
	ctx := context.Background()
	for _, check := range []Check{
		{Zone: "api", Key: "198.51.100.2", Limit: Limit{Window: time.Minute, Max: 1}},
		{Zone: "login", Key: "203.0.113.7", Limit: Limit{Window: 10 * time.Minute, Max: 1}},
		{Zone: "login", Key: "192.0.2.1", Limit: Limit{Window: 10 * time.Minute, Max: 5}},
	} {
		// The second request of a client with Max 1 is denied, and the
		// denial remembered.
		for range 2 {
			_ = cache.Allow(ctx, []Check{check}, make([]Decision, 1))
		}
	}
	denied, total := cache.Denied(make([]DeniedKey, 0, 10), 10)
	fmt.Println(total, "blocked")
	for _, d := range denied {
		fmt.Printf("%s %s may retry in about %v\n", d.Zone, d.Key, d.RetryAfter.Round(time.Minute))
	}
	// Output:
	// 2 blocked
	// login 203.0.113.7 may retry in about 10m0s
	// api 198.51.100.2 may retry in about 1m0s
}
