package limiter

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/redistest"
)

// benchKeys is how many distinct client keys the benchmarks cycle through.
const benchKeys = 1 << 16

// benchmarkAllow decides single checks on many distinct keys, all under their
// limit, from parallel goroutines.
func benchmarkAllow(b *testing.B, s Store) {
	keys := make([]string, benchKeys)
	for i := range keys {
		keys[i] = "198.51." + strconv.Itoa(i>>8) + "." + strconv.Itoa(i&0xff)
	}
	lim := Limit{Window: time.Minute, Max: 1 << 40}
	var next atomic.Uint64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		ctx := context.Background()
		checks := []Check{{Zone: "bench", Limit: lim}}
		ds := make([]Decision, 1)
		for pb.Next() {
			checks[0].Key = keys[next.Add(1)%benchKeys]
			if err := s.Allow(ctx, checks, ds); err != nil {
				b.Error(err)
				return
			}
			if !ds[0].Allowed {
				b.Errorf("denied under the limit: %+v", ds[0])
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
}

func BenchmarkRedisStoreAllow(b *testing.B) {
	// Decisions wait on the network: keep more in flight than there are CPUs.
	b.SetParallelism(8)
	benchmarkAllow(b, newRedisStore(b, testClient, testPrefix(b)))
}

func BenchmarkMemoryStoreAllow(b *testing.B) {
	s := NewMemoryStore()
	defer s.Close()
	benchmarkAllow(b, s)
}

// TestRedisMemoryPerKey measures what Redis holds for a client at a steady
// 60 requests a minute: 1,000 keys of 60 admissions each (window 1m, max 60),
// on a redis-server of its own so the delta is this test's alone.
func TestRedisMemoryPerKey(t *testing.T) {
	if testing.Short() {
		t.Skip("120,000 decisions; skipped in -short mode")
	}
	// The log's bound is the project's target (1.2 KB per key at 60
	// admissions a minute); the counter keeps three small integers.
	for _, c := range []struct {
		algo  Algorithm
		limit int64
	}{{SlidingLog, 1200}, {SlidingCounter, 400}} {
		t.Run(c.algo.String(), func(t *testing.T) { redisMemoryPerKey(t, c.algo, c.limit) })
	}
}

func redisMemoryPerKey(t *testing.T, algo Algorithm, limit int64) {
	const (
		keys       = 1000
		admissions = 60
		workers    = 8
	)
	srv := redistest.Start(t)
	client := srv.Client(t)
	// 60,000 decisions take seconds, more under -race on a busy machine.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s := newRedisStore(t, client, testPrefix(t))
	lim := Limit{Window: time.Minute, Max: admissions, Algorithm: algo}
	key := func(i int) string { return "203.0." + strconv.Itoa(i>>8) + "." + strconv.Itoa(i&0xff) }

	// Load the script and settle the allocator before the first reading.
	allow1(t, s, Check{Zone: "warmup", Key: "warmup", Limit: lim})
	usedMemory := func() int64 {
		info, err := client.Info(ctx, "memory").Result()
		if err != nil {
			t.Fatal(err)
		}
		for line := range strings.Lines(info) {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "used_memory:"); ok {
				n, err := strconv.ParseInt(v, 10, 64)
				if err != nil {
					t.Fatal(err)
				}
				return n
			}
		}
		t.Fatalf("no used_memory in INFO memory:\n%s", info)
		return 0
	}
	before := usedMemory()

	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
			ds := make([]Decision, 1)
			for i := w; i < keys; i += workers {
				checks := []Check{{Zone: "default", Key: key(i), Limit: lim}}
				for n := range admissions {
					if err := s.Allow(ctx, checks, ds); err != nil {
						errs <- err
						return
					}
					if !ds[0].Allowed || ds[0].Remaining != int64(admissions-n-1) {
						errs <- fmt.Errorf("key %s, request %d of %d: %+v", key(i), n+1, admissions, ds[0])
						return
					}
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	after := usedMemory()

	var usage int64
	for i := range keys {
		k := s.Key("default", key(i))
		if algo == SlidingLog {
			if n := len(readRing(t, client, k, redisNow(t, client)).times); n != admissions {
				t.Fatalf("admissions kept in %s = %d; want %d", k, n, admissions)
			}
		}
		n, err := client.MemoryUsage(ctx, k, 0).Result()
		if err != nil {
			t.Fatal(err)
		}
		usage += n
	}
	delta := (after - before) / keys
	mean := usage / keys
	t.Logf("Redis memory per key, %s (%d admissions, window 1m): %d bytes (used_memory delta over %d keys), %d bytes (MEMORY USAGE mean)",
		algo, admissions, delta, keys, mean)
	if delta > limit || mean > limit {
		t.Errorf("Redis memory per key: %d bytes (used_memory delta), %d bytes (MEMORY USAGE); want both < %d", delta, mean, limit)
	}
}
