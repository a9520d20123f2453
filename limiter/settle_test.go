package limiter

import (
	"testing"
	"time"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/redistest"
)

// TestSettleToZero: on every store, settling to zero takes back exactly the
// admission an earlier Allow recorded, even after later ones, on small and
// large rings and on counters, in zones of two clients (two Redis Cluster
// slots); a second Settle does nothing.
func TestSettleToZero(t *testing.T) {
	stores := map[string]func(t *testing.T) Store{
		"memory": func(t *testing.T) Store {
			s := NewMemoryStore()
			t.Cleanup(func() { s.Close() })
			return s
		},
		"redis": func(t *testing.T) Store { return newRedisStore(t, testClient, testPrefix(t)) },
	}
	if !testing.Short() {
		cluster := redistest.StartCluster(t, 3)
		stores["redis-cluster"] = func(t *testing.T) Store { return newRedisStore(t, cluster.Client(t), testPrefix(t)) }
	}
	for name, newStore := range stores {
		t.Run(name, func(t *testing.T) {
			for _, c := range []struct {
				name  string
				limit Limit
				fill  int
			}{
				{"log", Limit{Window: time.Minute, Max: 5}, 2},
				{"large-log", Limit{Window: time.Minute, Max: 2000}, 900},
				{"counter", Limit{Window: time.Minute, Max: 5, Algorithm: SlidingCounter}, 2},
			} {
				t.Run(c.name, func(t *testing.T) { testSettleToZero(t, newStore(t), c.limit, c.fill) })
			}
		})
	}
}

func testSettleToZero(t *testing.T, s Store, lim Limit, fill int) {
	// Two zones of two clients: on a cluster, two slots.
	checks := []Check{{Zone: "a", Key: testKey(t), Limit: lim}, {Zone: "b", Key: testKey(t), Limit: lim}}
	remaining := func() [2]int64 {
		ds := make([]Decision, 2)
		if err := s.Peek(testContext(t), checks, ds); err != nil {
			t.Fatal(err)
		}
		return [2]int64{ds[0].Remaining, ds[1].Remaining}
	}
	first, _, _ := allowN(t, s, checks...)
	for range fill {
		allowN(t, s, checks...)
	}
	before := remaining()
	zero := []Check{checks[0], checks[1]}
	zero[0].Cost, zero[1].Cost = 0, 0
	if err := s.Settle(testContext(t), zero, first); err != nil {
		t.Fatal(err)
	}
	after := remaining()
	if after[0] != before[0]+1 || after[1] != before[1]+1 {
		t.Errorf("remaining %v before settling to zero, %v after; want one more in each zone", before, after)
	}
	if err := s.Settle(testContext(t), zero, first); err != nil {
		t.Fatal(err)
	}
	if again := remaining(); again != after {
		t.Errorf("a second settle of the same admission: remaining %v, want %v", again, after)
	}
	// A denial records nothing, so settling it takes back nothing.
	denied := make([]Decision, 2)
	for range lim.Max {
		denied, _, _ = allowN(t, s, checks...)
	}
	if Admitted(denied) {
		t.Fatalf("still admitted after max requests: %+v", denied)
	}
	full := remaining()
	if err := s.Settle(testContext(t), zero, denied); err != nil {
		t.Fatal(err)
	}
	if got := remaining(); got != full {
		t.Errorf("settle of a denial: remaining %v, want %v", got, full)
	}
}
