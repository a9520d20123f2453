package limiter

import (
	"context"
	"math/rand/v2"
	"sort"
	"testing"
	"time"
)

// recordedTraffic is a fixed, seeded pattern of request times over 20
// windows: 200 clients, most well under the limit, some near it, some over
// it, each at a steady Poisson rate with bursts.
func recordedTraffic(window time.Duration, max int64) []struct {
	at     time.Duration
	client string
} {
	rng := rand.New(rand.NewPCG(1, 2))
	type event = struct {
		at     time.Duration
		client string
	}
	var events []event
	span := 20 * window
	for c := 0; c < 200; c++ {
		client := "c" + string(rune('A'+c%26)) + string(rune('a'+c/26))
		// Rate per window from 0.2x to 3x the limit.
		rate := float64(max) * (0.2 + 2.8*float64(c)/199)
		mean := float64(window) / rate
		for t := time.Duration(rng.ExpFloat64() * mean); t < span; t += time.Duration(rng.ExpFloat64() * mean) {
			events = append(events, event{t, client})
			if rng.IntN(20) == 0 { // a burst of 5 at once
				for i := 1; i <= 5; i++ {
					events = append(events, event{t + time.Duration(i)*time.Microsecond, client})
				}
			}
		}
	}
	sort.Slice(events, func(i, j int) bool { return events[i].at < events[j].at })
	return events
}

// TestCounterAccuracy replays one recorded traffic pattern through the exact
// log and through the counter, and counts the requests they decide
// differently. The README quotes this figure.
func TestCounterAccuracy(t *testing.T) {
	const max = 60
	window := time.Minute
	events := recordedTraffic(window, max)

	var now time.Duration
	logStore, counterStore := NewMemoryStore(), NewMemoryStore()
	defer logStore.Close()
	defer counterStore.Close()
	logStore.clock = func() time.Duration { return now }
	counterStore.clock = func() time.Duration { return now }

	var wrong, falseAllow, falseDeny, denied int
	d := make([]Decision, 1)
	for _, e := range events {
		now = e.at
		check := []Check{{Zone: "z", Key: e.client, Limit: Limit{Window: window, Max: max}}}
		if err := logStore.Allow(context.Background(), check, d); err != nil {
			t.Fatal(err)
		}
		exact := d[0].Allowed
		check[0].Limit.Algorithm = SlidingCounter
		if err := counterStore.Allow(context.Background(), check, d); err != nil {
			t.Fatal(err)
		}
		if !exact {
			denied++
		}
		if d[0].Allowed != exact {
			wrong++
			if d[0].Allowed {
				falseAllow++
			} else {
				falseDeny++
			}
		}
	}
	rate := float64(wrong) / float64(len(events))
	t.Logf("counter vs log on %d requests (%d denied by the log): %d decided differently (%.3f%%): %d admitted that the log denied, %d denied that the log admitted",
		len(events), denied, wrong, 100*rate, falseAllow, falseDeny)
	if denied == 0 || denied == len(events) {
		t.Fatalf("the pattern must mix admissions and denials, got %d of %d denied", denied, len(events))
	}
	if rate > 0.05 {
		t.Errorf("counter disagrees with the exact log on %.2f%% of requests, want under 5%%", 100*rate)
	}
}

// TestCounterRedisMatchesMemory runs the same admissions through the Redis
// counter script and the in-process counter: both admit exactly max in a
// fresh window and agree on the denial.
func TestCounterRedisMatchesMemory(t *testing.T) {
	mem := NewMemoryStore()
	defer mem.Close()
	stores := map[string]Store{"redis": NewRedisStore(testClient, testPrefix(t)), "memory": mem}
	for name, store := range stores {
		t.Run(name, func(t *testing.T) {
			// A burst of 20 takes milliseconds; with a 10-minute window it
			// almost never straddles a fixed-window boundary, and if it does
			// the previous window weighs almost fully, so 7 still holds.
			check := []Check{{Zone: "z", Key: testKey(t), Limit: Limit{Window: 10 * time.Minute, Max: 7, Algorithm: SlidingCounter}}}
			d := make([]Decision, 1)
			admitted := 0
			for i := 0; i < 20; i++ {
				if err := store.Allow(context.Background(), check, d); err != nil {
					t.Fatal(err)
				}
				if d[0].Allowed {
					admitted++
					if got, want := d[0].Remaining, int64(7-admitted); got > want {
						t.Errorf("admission %d: remaining %d, want at most %d", admitted, got, want)
					}
				} else if d[0].RetryAfter <= 0 || d[0].RetryAfter > 20*time.Minute {
					t.Errorf("denied with retry_after %s, want within two windows", d[0].RetryAfter)
				}
			}
			if admitted != 7 {
				t.Errorf("admitted %d of 20, want 7", admitted)
			}
		})
	}
}
