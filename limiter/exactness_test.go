package limiter

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// instances returns n RedisStores on the package's Redis, each with a client
// of its own, as n Caddy instances would be, sharing one key prefix.
func instances(t *testing.T, n int) []*RedisStore {
	t.Helper()
	prefix := testPrefix(t)
	stores := make([]*RedisStore, n)
	for i := range stores {
		client := redis.NewClient(&redis.Options{Addr: testRedis.Addr(), ContextTimeoutEnabled: true})
		t.Cleanup(func() { client.Close() })
		stores[i] = NewRedisStore(client, RedisOptions{KeyPrefix: prefix, Timeout: 5 * time.Second})
		t.Cleanup(func() { stores[i].Close() })
	}
	return stores
}

// TestExactUnderConcurrency: three instances admit requests of one client
// with costs of 1 to 9 units, some waiting for their slot, some settled to
// less or to nothing at once (a call shorter than the window, charged from
// its end); in any window, the units whose times (waits included, at the
// time they were recorded for; a settled cost at the time the settle
// recorded it) lie in it never exceed Max, however the calls interleave.
func TestExactUnderConcurrency(t *testing.T) {
	const (
		limit   = 40
		window  = 300 * time.Millisecond
		callers = 6 // per instance
	)
	stores := instances(t, 3)
	key := testKey(t)
	type admission struct{ at, units int64 }
	var mu sync.Mutex
	var admitted []admission
	var denied, delayed atomic.Int64
	stop := time.Now().Add(2 * time.Second)
	var wg sync.WaitGroup
	for i, s := range stores {
		for g := range callers {
			wg.Go(func() {
				rng := rand.New(rand.NewPCG(uint64(i), uint64(g)))
				ctx := context.Background()
				for time.Now().Before(stop) {
					c := Check{Zone: "z", Key: key, Limit: Limit{Window: window, Max: limit}, Cost: 1 + rng.Int64N(9)}
					if rng.IntN(4) == 0 {
						c.Wait = time.Duration(rng.Int64N(int64(window)))
					}
					ds := make([]Decision, 1)
					if err := s.Allow(ctx, []Check{c}, ds); err != nil {
						t.Error(err)
						return
					}
					if !ds[0].Allowed {
						denied.Add(1)
						time.Sleep(time.Millisecond)
						continue
					}
					if ds[0].Delay > 0 {
						delayed.Add(1)
					}
					a := admission{ds[0].held.at, c.Cost}
					if rng.IntN(3) == 0 {
						// Settled to less, or to nothing: never more.
						c.Cost = rng.Int64N(c.Cost)
						if err := s.Settle(ctx, []Check{c}, ds); err != nil {
							t.Error(err)
							return
						}
						a = admission{ds[0].charged, c.Cost}
					}
					mu.Lock()
					admitted = append(admitted, a)
					mu.Unlock()
				}
			})
		}
	}
	wg.Wait()
	slices.SortFunc(admitted, func(a, b admission) int { return int(a.at - b.at) })
	// Every window that holds the most ends at an admission.
	w, worst, units := window.Microseconds(), int64(0), int64(0)
	for lo, hi := 0, 0; hi < len(admitted); hi++ {
		units += admitted[hi].units
		for admitted[lo].at <= admitted[hi].at-w {
			units -= admitted[lo].units
			lo++
		}
		worst = max(worst, units)
	}
	t.Logf("%d admissions, %d denials, %d delayed; at most %d units in a window of %v (max %d)", len(admitted), denied.Load(), delayed.Load(), worst, window, limit)
	if worst > limit {
		t.Errorf("%d units admitted within one window, want at most %d", worst, limit)
	}
	if denied.Load() == 0 || delayed.Load() == 0 || worst < limit-9 {
		t.Errorf("the load did not reach the limit: %d denials, %d delayed, at most %d units in a window", denied.Load(), delayed.Load(), worst)
	}
}

// TestLeasesUnderConcurrency: however instances interleave, no more than
// Max requests of a client hold a lease at once.
func TestLeasesUnderConcurrency(t *testing.T) {
	const limit = 3
	stores := instances(t, 3)
	c := Check{Zone: "inflight", Key: testKey(t), Limit: Limit{Window: 10 * time.Second, Max: limit, Algorithm: Concurrency}}
	var running, most, admitted, denied atomic.Int64
	stop := time.Now().Add(time.Second)
	var wg sync.WaitGroup
	for i, s := range stores {
		for g := range 5 {
			wg.Go(func() {
				rng := rand.New(rand.NewPCG(uint64(i), uint64(g)))
				ctx := context.Background()
				for time.Now().Before(stop) {
					ds := make([]Decision, 1)
					if err := s.Allow(ctx, []Check{c}, ds); err != nil {
						t.Error(err)
						return
					}
					if !ds[0].Allowed {
						denied.Add(1)
						continue
					}
					// Counted from when Allow returned to before Settle is
					// called: within the store's own count, which is what
					// may never exceed max.
					admitted.Add(1)
					n := running.Add(1)
					for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
					}
					time.Sleep(time.Duration(rng.Int64N(int64(3 * time.Millisecond))))
					running.Add(-1)
					if err := s.Settle(ctx, []Check{c}, ds); err != nil {
						t.Error(err)
						return
					}
				}
			})
		}
	}
	wg.Wait()
	t.Logf("%d leases taken, %d denied, at most %d at once (max %d)", admitted.Load(), denied.Load(), most.Load(), limit)
	if most.Load() > limit {
		t.Errorf("%d requests ran at once, want at most %d", most.Load(), limit)
	}
	if most.Load() < limit || denied.Load() == 0 {
		t.Errorf("the load did not reach the limit: at most %d at once, %d denied", most.Load(), denied.Load())
	}
}

// TestLeasesOfAClosedStore: an instance that stops without releasing its
// leases (a killed Caddy) locks its clients out for no longer than the lease
// time: another instance admits again once the leases expire, not before.
func TestLeasesOfAClosedStore(t *testing.T) {
	const lease = 500 * time.Millisecond
	stores := instances(t, 2)
	c := Check{Zone: "inflight", Key: testKey(t), Limit: Limit{Window: lease, Max: 2, Algorithm: Concurrency}}
	ctx := context.Background()
	taken := time.Now()
	for range 2 {
		if ds, _, _ := allowN(t, stores[0], c); !ds[0].Allowed {
			t.Fatalf("lease refused: %+v", ds[0])
		}
	}
	stores[0].Close()
	if err := stores[0].Allow(ctx, []Check{c}, make([]Decision, 1)); !errors.Is(err, errClosed) {
		t.Fatalf("a closed store: %v, want errClosed", err)
	}
	ds, start, _ := allowN(t, stores[1], c)
	if ds[0].Allowed || ds[0].RetryAfter <= 0 || ds[0].RetryAfter > lease {
		t.Fatalf("while the dead instance's leases run: %+v, want denied for at most %v", ds[0], lease)
	}
	if start.Sub(taken) < lease {
		for {
			ds, start, _ = allowN(t, stores[1], c)
			if ds[0].Allowed {
				break
			}
			if time.Since(taken) > 10*lease {
				t.Fatalf("still denied %v after the leases were taken (lease time %v)", time.Since(taken), lease)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	// Admitted: it can only be after the leases expired.
	if got := start.Sub(taken); got < lease-tol {
		t.Errorf("admitted %v after the dead instance took its leases, before the lease time %v", got, lease)
	}
}
