package limiter

import (
	"context"
	"math/rand/v2"
	"sort"
	"testing"
	"time"
)

// recordedTraffic is a fixed, seeded pattern of request times over 20
// windows: 200 clients, client c at rate(c) times the limit per window, each
// a Poisson stream with occasional bursts of 5.
func recordedTraffic(window time.Duration, max int64, rate func(c int) float64) []struct {
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
		mean := float64(window) / (float64(max) * rate(c))
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

// TestCounterAccuracy replays one recorded traffic pattern through the
// counter and measures it two ways; the README quotes both figures.
//
// Wrong decisions (Cloudflare's measure): on the counter's own history, a
// decision is wrong when the exact count of its admissions in the sliding
// window says otherwise (admitted at or over the limit, or denied under it).
//
// Agreement with the log: the exact log run on the same requests. The two
// histories diverge as soon as they decide one request differently, so for
// clients near or over the limit many later decisions differ too, while
// both admit about the limit per window; the totals show that.
func TestCounterAccuracy(t *testing.T) {
	for _, c := range []struct {
		name string
		rate func(c int) float64
		// maxWrong bounds the share of wrong decisions.
		maxWrong float64
	}{
		// Most clients well under the limit, one in twenty over it.
		{"typical", func(c int) float64 {
			if c%20 == 0 {
				return 1 + 2*float64(c)/199
			}
			return 0.05 + 0.75*float64(c)/199
		}, 0.2},
		// Every client from 0.2x to 3x the limit: the counter's worst case.
		{"adversarial", func(c int) float64 { return 0.2 + 2.8*float64(c)/199 }, 0.5},
	} {
		t.Run(c.name, func(t *testing.T) { counterAccuracy(t, c.rate, c.maxWrong) })
	}
}

func counterAccuracy(t *testing.T, rate func(int) float64, maxWrong float64) {
	const max = 60
	window := time.Minute
	events := recordedTraffic(window, max, rate)

	var now time.Duration
	clock := func() int64 { return now.Microseconds() }
	logStore, counterStore := newMemoryStoreAt(clock), newMemoryStoreAt(clock)

	var wrong, overAdmitted, differ, logAdmitted, counterAdmitted int
	history := make(map[string][]time.Duration) // the counter's admissions
	worst := 0                                  // most counter admissions in any window
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
		if exact {
			logAdmitted++
		}
		if d[0].Allowed != exact {
			differ++
		}

		h := history[e.client]
		for len(h) > 0 && h[0] <= now-window {
			h = h[1:]
		}
		if truth := len(h) < max; d[0].Allowed != truth {
			wrong++
			if d[0].Allowed {
				overAdmitted++
			}
		}
		if d[0].Allowed {
			counterAdmitted++
			h = append(h, now)
			worst = maxInt(worst, len(h))
		}
		history[e.client] = h
	}
	n := float64(len(events))
	t.Logf("counter on %d requests from 200 clients, limit %d per %s:", len(events), max, window)
	t.Logf("  wrong decisions on its own history: %d (%.3f%%), of which %d admitted at or over the limit; at most %d admissions in any window",
		wrong, 100*float64(wrong)/n, overAdmitted, worst)
	t.Logf("  admitted %d vs the exact log's %d (%+.2f%%); decided %.1f%% of requests differently from the log",
		counterAdmitted, logAdmitted, 100*(float64(counterAdmitted)/float64(logAdmitted)-1), 100*float64(differ)/n)
	if logAdmitted == 0 || logAdmitted == len(events) {
		t.Fatalf("the pattern must mix admissions and denials, got %d of %d admitted", logAdmitted, len(events))
	}
	if share := float64(wrong) / n; share > maxWrong {
		t.Errorf("counter decides %.2f%% of requests wrongly, want under %.0f%%", 100*share, 100*maxWrong)
	}
	if worst > max*3/2 {
		t.Errorf("counter admitted %d in one window, want at most 1.5x the limit", worst)
	}
	if ratio := float64(counterAdmitted) / float64(logAdmitted); ratio < 0.95 || ratio > 1.05 {
		t.Errorf("counter admitted %.1f%% of what the exact log admitted, want within 5%%", 100*ratio)
	}
}

func maxInt(a, b int) int {
	if a > b {
		return a
	}
	return b
}

// TestCounterRedisMatchesMemory runs the same admissions through the Redis
// counter script and the in-process counter: both admit exactly max in a
// fresh window and agree on the denial.
func TestCounterRedisMatchesMemory(t *testing.T) {
	mem := NewMemoryStore()
	defer mem.Close()
	stores := map[string]Store{"redis": newRedisStore(t, testClient, testPrefix(t)), "memory": mem}
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
