package limiter

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/redistest"
)

// TestConformance runs the same contract tests against every store:
// TestConformance/redis/... on the package's redis-server,
// TestConformance/memory/... on a MemoryStore, and
// TestConformance/redis-cluster/... on a 3-master Redis Cluster of its own,
// batched.
// Cases run with the sliding log (the default algorithm) and, under
// .../counter/..., those that hold for the approximate sliding counter too.
// Every case gets a fresh store (a fresh key prefix for Redis). The three
// targets run in parallel: every timing assertion is made against the real
// time measured around the calls, so a slow machine widens the bounds
// rather than failing them.
func TestConformance(t *testing.T) {
	// Every RedisStore batches: concurrent calls share script calls and
	// must decide exactly as lone calls do.
	t.Run("redis", func(t *testing.T) {
		t.Parallel()
		runConformance(t, func(t *testing.T) Store { return newRedisStore(t, testClient, testPrefix(t)) })
	})
	t.Run("memory", func(t *testing.T) {
		t.Parallel()
		runConformance(t, func(t *testing.T) Store {
			s := NewMemoryStore()
			t.Cleanup(func() { s.Close() })
			return s
		})
	})
	t.Run("redis-cluster", func(t *testing.T) {
		t.Parallel()
		if testing.Short() {
			t.Skip("starts a Redis Cluster; skipped in -short mode")
		}
		// One script call per slot of a batch, and the refund across slots.
		client := redistest.StartCluster(t, 3).Client(t)
		runConformance(t, func(t *testing.T) Store { return newRedisStore(t, client, testPrefix(t)) })
	})
}

// conformanceCases are the contract tests. Those with counter set hold for
// SlidingCounter as well as SlidingLog; they check the log's exact figures
// only when algo is SlidingLog.
var conformanceCases = []struct {
	name    string
	run     func(t *testing.T, s Store, algo Algorithm)
	counter bool
}{
	{"ExactlyMaxPerWindow", testExactlyMax, true},
	{"OldestAgingOutFreesOneSlot", testOldestAgesOut, false},
	{"DeniedDoNotExtendBlock", testDeniedDoNotExtend, true},
	{"RetryAfterMatchesReadmission", testRetryAfterMatchesReadmission, true},
	{"RetryAfterCountsDownToPivot", testRetryAfterPivot, false},
	{"RemainingResetAfterPartialUse", testPartialUse, true},
	{"RemainingResetAfterAgeingOut", testAfterAgeingOut, false},
	{"Concurrent", testConcurrent, true},
	{"AllOrNothing", testAllOrNothing, true},
	{"ZonesCountedApart", testZonesApart, true},
	{"HostileKeys", testHostileKeys, true},
	{"PeekAndReset", testPeekAndReset, true},
	{"AlgorithmChange", testAlgorithmChange, false},
}

func runConformance(t *testing.T, newStore func(t *testing.T) Store) {
	for _, c := range conformanceCases {
		t.Run(c.name, func(t *testing.T) { c.run(t, newStore(t), SlidingLog) })
	}
	t.Run("counter", func(t *testing.T) {
		for _, c := range conformanceCases {
			if c.counter {
				t.Run(c.name, func(t *testing.T) { c.run(t, newStore(t), SlidingCounter) })
			}
		}
	})
}

// stall is the longest pause between two consecutive calls that the timing
// scenarios take as "at once".
const stall = 50 * time.Millisecond

// maxRetry bounds RetryAfter: one window for the log; for the counter, the
// current fixed window's end plus most of the next.
func maxRetry(w time.Duration, algo Algorithm) time.Duration {
	if algo == SlidingCounter {
		return 2 * w
	}
	return w
}

// checkRetry checks a denial's RetryAfter: for the log, that it counts down
// to the ageing out of the admission made by call from; for the counter,
// only that it is in (0, maxRetry].
func checkRetry(t *testing.T, what string, algo Algorithm, d Decision, from call, cStart, cEnd time.Time, w time.Duration) {
	t.Helper()
	if algo == SlidingLog {
		lo, hi := untilAged(from, cStart, cEnd, w)
		checkWithin(t, what, d.RetryAfter, lo, hi)
		return
	}
	if d.RetryAfter <= 0 || d.RetryAfter > maxRetry(w, algo) {
		t.Errorf("%s = %v, want in (0, %v]", what, d.RetryAfter, maxRetry(w, algo))
	}
}

// testExactlyMax: max requests are admitted, counting Remaining down to 0,
// and the next ones are denied until the first admission ages out.
func testExactlyMax(t *testing.T, s Store, algo Algorithm) {
	const w = time.Minute
	for _, max := range []int64{1, 5, 50} {
		t.Run(fmt.Sprintf("max=%d", max), func(t *testing.T) {
			c := Check{Zone: "z", Key: testKey(t), Limit: Limit{Window: w, Max: max, Algorithm: algo}}
			var first call
			for i := int64(1); i <= max; i++ {
				r := allow1(t, s, c)
				if !r.d.Allowed {
					t.Fatalf("request %d of %d denied: %+v", i, max, r.d)
				}
				if got, want := r.d.Remaining, max-i; got != want {
					t.Errorf("request %d: Remaining = %d, want %d", i, got, want)
				}
				if got := r.d.RetryAfter; got != 0 {
					t.Errorf("request %d: admitted with RetryAfter %v, want 0", i, got)
				}
				if i == 1 {
					first = r
				}
				if algo != SlidingLog {
					continue
				}
				if i == 1 {
					// The window was empty: the new admission is the oldest.
					if got, want := r.d.Reset, w; got != want {
						t.Errorf("request 1: Reset = %v, want %v", got, want)
					}
					continue
				}
				lo, hi := untilAged(first, r.start, r.end, w)
				checkWithin(t, fmt.Sprintf("request %d: Reset", i), r.d.Reset, lo, hi)
			}
			for i := max + 1; i <= max+3; i++ {
				r := allow1(t, s, c)
				if r.d.Allowed {
					t.Fatalf("request %d with max %d admitted: %+v", i, max, r.d)
				}
				if got := r.d.Remaining; got != 0 {
					t.Errorf("request %d: denied with Remaining %d, want 0", i, got)
				}
				if got, want := r.d.Reset, r.d.RetryAfter; got != want {
					t.Errorf("request %d: denied with Reset %v != RetryAfter %v", i, got, want)
				}
				checkRetry(t, fmt.Sprintf("request %d: RetryAfter", i), algo, r.d, first, r.start, r.end, w)
			}
		})
	}
}

// testOldestAgesOut: admit A, later B and C (max 3). When A ages out exactly
// one more request is admitted; the next is denied until B ages out.
func testOldestAgesOut(t *testing.T, s Store, algo Algorithm) {
	const (
		w   = 600 * time.Millisecond
		gap = 250 * time.Millisecond
	)
	timed(t, func(t *testing.T, key string) string {
		c := Check{Zone: "z", Key: key, Limit: Limit{Window: w, Max: 3, Algorithm: algo}}
		a := allow1(t, s, c)
		if !a.d.Allowed {
			t.Fatalf("A denied on a fresh key: %+v", a.d)
		}
		time.Sleep(gap)
		b := allow1(t, s, c)
		c3 := allow1(t, s, c)
		d := allow1(t, s, c)
		if d.end.Sub(a.start) >= w {
			return "A could have aged out before the 4th request"
		}
		if !b.d.Allowed || !c3.d.Allowed {
			t.Fatalf("B or C denied with max 3: %+v, %+v", b.d, c3.d)
		}
		if got, want := c3.d.Remaining, int64(0); got != want {
			t.Errorf("C: Remaining = %d, want %d", got, want)
		}
		if d.d.Allowed {
			t.Fatalf("4th request admitted while A, B and C are in the window: %+v", d.d)
		}
		lo, hi := untilAged(a, d.start, d.end, w)
		checkWithin(t, "4th request: RetryAfter (until A ages out)", d.d.RetryAfter, lo, hi)

		sleepUntil(a.end.Add(w + 20*time.Millisecond))
		e := allow1(t, s, c)
		f := allow1(t, s, c)
		if f.end.Sub(b.start) >= w {
			return "B could have aged out before the 6th request"
		}
		if !e.d.Allowed {
			t.Fatalf("5th request denied after A aged out: %+v", e.d)
		}
		if got, want := e.d.Remaining, int64(0); got != want {
			t.Errorf("5th request: Remaining = %d, want %d", got, want)
		}
		lo, hi = untilAged(b, e.start, e.end, w)
		checkWithin(t, "5th request: Reset (until B ages out)", e.d.Reset, lo, hi)
		if f.d.Allowed {
			t.Fatalf("6th request admitted: only A aged out, B, C and the 5th are in the window: %+v", f.d)
		}
		lo, hi = untilAged(b, f.start, f.end, w)
		checkWithin(t, "6th request: RetryAfter (until B ages out)", f.d.RetryAfter, lo, hi)
		return ""
	})
}

// fullAfterGap makes c's key (max 2) full: two admissions gap apart, then a
// third request, which must be denied. It returns the three calls, or why
// this run's timing cannot be judged: the first admission may already have
// aged out, or a stall before the denial let the counter's estimate decay.
func fullAfterGap(t *testing.T, s Store, c Check, gap time.Duration) (x, y, denied call, slow string) {
	t.Helper()
	x = allow1(t, s, c)
	time.Sleep(gap)
	y = allow1(t, s, c)
	denied = allow1(t, s, c)
	if denied.end.Sub(x.start) >= c.Limit.Window {
		return x, y, denied, "the first admission could have aged out before the denial"
	}
	if denied.start.Sub(y.end) > stall {
		return x, y, denied, "a stall between the second admission and the denial"
	}
	if !x.d.Allowed || !y.d.Allowed {
		t.Fatalf("admissions 1 and 2 of max 2: %+v, %+v", x.d, y.d)
	}
	if denied.d.Allowed {
		t.Fatalf("3rd request with max 2 admitted: %+v", denied.d)
	}
	return x, y, denied, ""
}

// testDeniedDoNotExtend hammers a full key: every denial must promise the same
// readmission time as the first, and the key must be admitted at that time.
// The second admission comes later than the first, so that it is the ageing
// out of the first, not the expiry of the whole key, that readmits.
func testDeniedDoNotExtend(t *testing.T, s Store, algo Algorithm) {
	const (
		w   = 400 * time.Millisecond
		gap = 100 * time.Millisecond
	)
	timed(t, func(t *testing.T, key string) string {
		c := Check{Zone: "z", Key: key, Limit: Limit{Window: w, Max: 2, Algorithm: algo}}
		x, y, first, slow := fullAfterGap(t, s, c, gap)
		if slow != "" {
			return slow
		}
		checkRetry(t, "first denial: RetryAfter", algo, first.d, x, first.start, first.end, w)

		// The store's clock read for the first denial is in [first.start,
		// first.end], so it promised readmission within these bounds.
		promisedLo := first.start.Add(first.d.RetryAfter)
		promisedHi := first.end.Add(first.d.RetryAfter)
		since := func(at time.Time) time.Duration { return at.Sub(first.start) }
		// The loop ends: on the readmission, or on a denial after the
		// promised time, which fails the test.
		denials := 1
		var readmitted call
		for {
			r := allow1(t, s, c)
			if r.d.Allowed {
				readmitted = r
				break
			}
			denials++
			if r.start.After(promisedHi.Add(tol)) {
				t.Fatalf("denial %d at +%v, after the first denial promised readmission at +%v: denials extended the block",
					denials, since(r.start), first.d.RetryAfter)
			}
			if r.start.Add(r.d.RetryAfter).After(promisedHi.Add(tol)) || r.end.Add(r.d.RetryAfter).Before(promisedLo.Add(-tol)) {
				t.Fatalf("denial %d at +%v promises readmission at +%v, the first denial promised +%v (±%v)",
					denials, since(r.start), since(r.start.Add(r.d.RetryAfter)), first.d.RetryAfter, tol)
			}
			time.Sleep(time.Millisecond)
		}
		if readmitted.end.Before(promisedLo.Add(-tol)) {
			t.Fatalf("readmitted at +%v, before the promised +%v", since(readmitted.end), first.d.RetryAfter)
		}
		// Only the first admission aged out: one slot, taken by readmitted.
		if next := allow1(t, s, c); algo == SlidingLog && next.end.Sub(y.start) < w && next.d.Allowed {
			t.Errorf("admitted again right after the readmission, with the second admission still in the window: %+v", next.d)
		}
		t.Logf("%d denials; first one promised readmission at +%v, readmitted at +%v",
			denials, first.d.RetryAfter, since(readmitted.start))
		return ""
	})
}

// testRetryAfterMatchesReadmission compares a denial's RetryAfter with the
// real time at which the key is admitted again, polling every millisecond
// around that time. As in testDeniedDoNotExtend, a later second admission
// keeps the key alive past the first one's ageing out.
func testRetryAfterMatchesReadmission(t *testing.T, s Store, algo Algorithm) {
	const (
		w   = 500 * time.Millisecond
		gap = 100 * time.Millisecond
	)
	timed(t, func(t *testing.T, key string) string {
		c := Check{Zone: "z", Key: key, Limit: Limit{Window: w, Max: 2, Algorithm: algo}}
		x, _, d, slow := fullAfterGap(t, s, c, gap)
		if slow != "" {
			return slow
		}
		checkRetry(t, "RetryAfter", algo, d.d, x, d.start, d.end, w)
		promisedLo := d.start.Add(d.d.RetryAfter)
		promisedHi := d.end.Add(d.d.RetryAfter)
		since := func(at time.Time) time.Duration { return at.Sub(d.start) }

		sleepUntil(promisedLo.Add(-50 * time.Millisecond))
		// The loop ends: on the readmission, or on a denial after the
		// promised time, which fails the test.
		var lastDenied *call
		var readmitted call
		for {
			r := allow1(t, s, c)
			if r.d.Allowed {
				readmitted = r
				break
			}
			if r.start.After(promisedHi.Add(tol)) {
				t.Fatalf("RetryAfter was %v, but still denied at +%v", d.d.RetryAfter, since(r.start))
			}
			lastDenied = &r
			time.Sleep(time.Millisecond)
		}
		if readmitted.end.Before(promisedLo.Add(-tol)) {
			t.Fatalf("RetryAfter was %v, but admitted again at +%v", d.d.RetryAfter, since(readmitted.end))
		}
		if lastDenied == nil {
			// Not wrong, but the early side went untested.
			return "no denial seen: the poll began too late"
		}
		t.Logf("RetryAfter %v; last denial at +%v, admitted again at +%v",
			d.d.RetryAfter, since(lastDenied.start), since(readmitted.start))
		return ""
	})
}

// testRetryAfterPivot: with A, B, C admitted 100ms apart, a denial's
// RetryAfter counts down to the (count-max+1)-th oldest admission, also when
// max is lowered below the count (a config change).
func testRetryAfterPivot(t *testing.T, s Store, algo Algorithm) {
	const (
		w   = time.Second
		gap = 100 * time.Millisecond
	)
	timed(t, func(t *testing.T, key string) string {
		check := func(max int64) Check {
			return Check{Zone: "z", Key: key, Limit: Limit{Window: w, Max: max, Algorithm: algo}}
		}
		var adm []call // admissions, oldest first
		for i := range 3 {
			if i > 0 {
				time.Sleep(gap)
			}
			r := allow1(t, s, check(3))
			if !r.d.Allowed {
				t.Fatalf("admission %d of max 3 denied: %+v", i+1, r.d)
			}
			adm = append(adm, r)
		}
		steps := []struct {
			max     int64
			allowed bool
			// from is the index of the admission whose ageing out the
			// reply's RetryAfter (denied) or Reset (admitted) counts down to.
			from int
		}{
			{max: 3, allowed: false, from: 0},
			{max: 2, allowed: false, from: 1},
			{max: 1, allowed: false, from: 2},
			{max: 4, allowed: true, from: 0},
			{max: 4, allowed: false, from: 0},
			{max: 3, allowed: false, from: 1},
			{max: 2, allowed: false, from: 2},
			{max: 1, allowed: false, from: 3},
		}
		for i, st := range steps {
			r := allow1(t, s, check(st.max))
			if r.end.Sub(adm[0].start) >= w {
				return fmt.Sprintf("step %d: the oldest admission could have aged out", i)
			}
			if got, want := r.d.Allowed, st.allowed; got != want {
				t.Fatalf("step %d, max %d with %d admissions: Allowed = %v, want %v", i, st.max, len(adm), got, want)
			}
			lo, hi := untilAged(adm[st.from], r.start, r.end, w)
			if st.allowed {
				if got, want := r.d.Remaining, st.max-int64(len(adm))-1; got != want {
					t.Errorf("step %d: Remaining = %d, want %d", i, got, want)
				}
				checkWithin(t, fmt.Sprintf("step %d: Reset", i), r.d.Reset, lo, hi)
				adm = append(adm, r)
				continue
			}
			checkWithin(t, fmt.Sprintf("step %d, max %d with %d admissions: RetryAfter (until admission %d ages out)",
				i, st.max, len(adm), st.from), r.d.RetryAfter, lo, hi)
		}
		return ""
	})
}

// testPartialUse: after n of max admissions, a decision that records nothing
// (another zone denies) reports max-n remaining, and the next admission
// max-n-1; Reset counts down to the oldest admission.
func testPartialUse(t *testing.T, s Store, algo Algorithm) {
	const (
		w   = time.Minute
		max = 10
	)
	for _, used := range []int64{0, 1, 3, 9, 10} {
		t.Run(fmt.Sprintf("used=%d", used), func(t *testing.T) {
			key := testKey(t)
			open := Check{Zone: "open", Key: key, Limit: Limit{Window: w, Max: max, Algorithm: algo}}
			full := Check{Zone: "full", Key: key, Limit: Limit{Window: w, Max: 1, Algorithm: algo}}
			if r := allow1(t, s, full); !r.d.Allowed {
				t.Fatalf("filling zone full: %+v", r.d)
			}
			var first call
			for i := range used {
				r := allow1(t, s, open)
				if !r.d.Allowed {
					t.Fatalf("admission %d of %d denied: %+v", i+1, max, r.d)
				}
				if i == 0 {
					first = r
				}
			}

			// Reset is the log's: the time until its oldest admission ages out.
			exactReset := algo == SlidingLog

			ds, start, end := allowN(t, s, open, full)
			probe := ds[0]
			lo, hi := untilAged(first, start, end, w)
			switch {
			case used == max:
				if probe.Allowed || probe.Remaining != 0 {
					t.Errorf("probe of a full zone: %+v, want denied with Remaining 0", probe)
				}
				checkRetry(t, "probe: RetryAfter", algo, probe, first, start, end, w)
			default:
				if !probe.Allowed || probe.RetryAfter != 0 {
					t.Errorf("probe: %+v, want Allowed and RetryAfter 0", probe)
				}
				if got, want := probe.Remaining, max-used; got != want {
					t.Errorf("probe: Remaining = %d, want %d", got, want)
				}
				if used == 0 {
					if got := probe.Reset; got != 0 {
						t.Errorf("probe of an empty window: Reset = %v, want 0", got)
					}
				} else if exactReset {
					checkWithin(t, "probe: Reset", probe.Reset, lo, hi)
				}
			}

			r := allow1(t, s, open)
			lo, hi = untilAged(first, r.start, r.end, w)
			switch {
			case used == max:
				if r.d.Allowed {
					t.Fatalf("request %d of max %d admitted: %+v", used+1, max, r.d)
				}
				checkRetry(t, "RetryAfter", algo, r.d, first, r.start, r.end, w)
			default:
				if !r.d.Allowed {
					t.Fatalf("request %d of max %d denied: %+v", used+1, max, r.d)
				}
				if got, want := r.d.Remaining, max-used-1; got != want {
					t.Errorf("Remaining = %d, want %d", got, want)
				}
				switch {
				case !exactReset:
				case used == 0:
					if got, want := r.d.Reset, w; got != want {
						t.Errorf("first admission: Reset = %v, want %v", got, want)
					}
				default:
					checkWithin(t, "Reset", r.d.Reset, lo, hi)
				}
			}
		})
	}
}

// testAfterAgeingOut: once every admission has aged out, the key is as new.
func testAfterAgeingOut(t *testing.T, s Store, algo Algorithm) {
	const w = 300 * time.Millisecond
	key := testKey(t)
	open := Check{Zone: "open", Key: key, Limit: Limit{Window: w, Max: 5, Algorithm: algo}}
	full := Check{Zone: "full", Key: key, Limit: Limit{Window: time.Minute, Max: 1, Algorithm: algo}}
	allow1(t, s, full)
	var last call
	for i := range 5 {
		last = allow1(t, s, open)
		if !last.d.Allowed {
			t.Fatalf("admission %d of 5 denied: %+v", i+1, last.d)
		}
	}
	sleepUntil(last.end.Add(w + 20*time.Millisecond))

	ds, _, _ := allowN(t, s, open, full)
	if got, want := exported(ds[0]), (Decision{Allowed: true, Remaining: 5}); got != want {
		t.Errorf("probe after every admission aged out: %+v, want %+v", got, want)
	}
	r := allow1(t, s, open)
	if got, want := exported(r.d), (Decision{Allowed: true, Remaining: 4, Reset: w}); got != want {
		t.Errorf("admission after every admission aged out: %+v, want %+v", got, want)
	}
}

// testConcurrent starts many decisions on one key at once: exactly the
// limit's worth are admitted, each seeing a distinct Remaining.
func testConcurrent(t *testing.T, s Store, algo Algorithm) {
	const w = time.Minute
	cases := []struct {
		name   string
		n      int
		limits []int64 // one zone each, all on one client key
	}{
		{"500 on max 50", 500, []int64{50}},
		{"100 on max 1", 100, []int64{1}},
		{"64 on max 64", 64, []int64{64}},
		{"500 on zones of max 50 and 30", 500, []int64{50, 30}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			key := testKey(t)
			checks := make([]Check, len(tc.limits))
			for j, max := range tc.limits {
				checks[j] = Check{Zone: fmt.Sprintf("z%d", j), Key: key, Limit: Limit{Window: w, Max: max, Algorithm: algo}}
			}
			results := make([][]Decision, tc.n)
			errs := make([]error, tc.n)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			startGate := make(chan struct{})
			var wg sync.WaitGroup
			for i := range tc.n {
				wg.Go(func() {
					ds := make([]Decision, len(checks))
					<-startGate
					errs[i] = s.Allow(ctx, checks, ds)
					results[i] = ds
				})
			}
			close(startGate)
			wg.Wait()

			want := int64(tc.n)
			for _, max := range tc.limits {
				want = min(want, max)
			}
			var admitted int64
			remaining := make([][]int64, len(checks))
			for i, ds := range results {
				if errs[i] != nil {
					t.Fatalf("decision %d: %v", i, errs[i])
				}
				if Admitted(ds) {
					admitted++
					for j, d := range ds {
						remaining[j] = append(remaining[j], d.Remaining)
					}
					continue
				}
				for j, d := range ds {
					if !d.Allowed && (d.RetryAfter <= 0 || d.RetryAfter > maxRetry(w, algo)) {
						t.Errorf("decision %d, zone %d: denied with RetryAfter %v, want in (0, %v]", i, j, d.RetryAfter, maxRetry(w, algo))
					}
				}
			}
			if got := admitted; got != want {
				t.Fatalf("%d concurrent decisions with limits %v: %d admitted, want %d", tc.n, tc.limits, got, want)
			}
			for j, max := range tc.limits {
				// The k-th admission (from 0) leaves max-k-1.
				var wantRemaining []int64
				for k := range want {
					wantRemaining = append(wantRemaining, max-k-1)
				}
				slices.Sort(wantRemaining)
				slices.Sort(remaining[j])
				if got := remaining[j]; !slices.Equal(got, wantRemaining) {
					t.Errorf("zone %d: Remaining of the admitted decisions = %v, want %v", j, got, wantRemaining)
				}
				// What was recorded: one more request in the zone alone.
				r := allow1(t, s, checks[j])
				if left := max - want; left == 0 {
					if r.d.Allowed {
						t.Errorf("zone %d: admitted after %d concurrent admissions of max %d", j, want, max)
					}
				} else if got, want := r.d.Remaining, left-1; !r.d.Allowed || got != want {
					t.Errorf("zone %d alone afterwards: %+v, want Allowed with Remaining %d", j, r.d, want)
				}
			}
		})
	}
}

// testAllOrNothing: when one zone denies, nothing is recorded in any zone.
func testAllOrNothing(t *testing.T, s Store, algo Algorithm) {
	const w = time.Minute
	cases := []struct {
		name      string
		fullFirst bool
		sameKey   bool
	}{
		{"denying zone last", false, true},
		{"denying zone first", true, true},
		{"zones on different client keys", false, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			openKey, fullKey := testKey(t), testKey(t)
			if tc.sameKey {
				fullKey = openKey
			}
			open := Check{Zone: "open", Key: openKey, Limit: Limit{Window: w, Max: 5, Algorithm: algo}}
			full := Check{Zone: "full", Key: fullKey, Limit: Limit{Window: w, Max: 2, Algorithm: algo}}
			openFirst := allow1(t, s, open)
			if got, want := openFirst.d.Remaining, int64(4); !openFirst.d.Allowed || got != want {
				t.Fatalf("open zone, first request: %+v, want Allowed with Remaining %d", openFirst.d, want)
			}
			fullFirst := allow1(t, s, full)
			if r := allow1(t, s, full); !r.d.Allowed || r.d.Remaining != 0 {
				t.Fatalf("full zone, second request: %+v, want Allowed with Remaining 0", r.d)
			}
			checks, iOpen, iFull := []Check{open, full}, 0, 1
			if tc.fullFirst {
				checks, iOpen, iFull = []Check{full, open}, 1, 0
			}
			for rep := range 3 {
				ds, start, end := allowN(t, s, checks...)
				if Admitted(ds) {
					t.Fatalf("call %d admitted with a full zone: %+v", rep, ds)
				}
				o, f := ds[iOpen], ds[iFull]
				if !o.Allowed || o.RetryAfter != 0 {
					t.Errorf("call %d, open zone: %+v, want Allowed with RetryAfter 0", rep, o)
				}
				if got, want := o.Remaining, int64(4); got != want {
					t.Errorf("call %d, open zone: Remaining = %d, want %d (unchanged)", rep, got, want)
				}
				if algo == SlidingLog {
					lo, hi := untilAged(openFirst, start, end, w)
					checkWithin(t, fmt.Sprintf("call %d, open zone: Reset", rep), o.Reset, lo, hi)
				}
				if f.Allowed || f.Remaining != 0 || f.Reset != f.RetryAfter {
					t.Errorf("call %d, full zone: %+v, want denied with Remaining 0 and Reset = RetryAfter", rep, f)
				}
				checkRetry(t, fmt.Sprintf("call %d, full zone: RetryAfter", rep), algo, f, fullFirst, start, end, w)
			}
			if r := allow1(t, s, open); !r.d.Allowed || r.d.Remaining != 3 {
				t.Errorf("open zone alone afterwards: %+v, want Allowed with Remaining 3 (one admission before)", r.d)
			}
			if r := allow1(t, s, full); r.d.Allowed {
				t.Errorf("full zone alone afterwards admitted: %+v", r.d)
			}
		})
	}

	// Several zones of one client in one call, also for client keys that
	// BoundKey hashed or that are empty (all zones of one client share a
	// Redis Cluster slot only if its hash tag is not empty).
	for _, tc := range []struct{ name, key string }{
		{"three zones", testKey(t)},
		{"three zones, hashed key", BoundKey(strings.Repeat("k", 10<<10) + testKey(t))},
		{"three zones, empty key", BoundKey("")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var checks []Check
			for _, max := range []int64{2, 4, 5} {
				checks = append(checks, Check{Zone: fmt.Sprintf("max%d", max), Key: tc.key, Limit: Limit{Window: w, Max: max, Algorithm: algo}})
			}
			steps := []struct {
				allowed   []bool
				remaining []int64
			}{
				{[]bool{true, true, true}, []int64{1, 3, 4}},
				{[]bool{true, true, true}, []int64{0, 2, 3}},
				{[]bool{false, true, true}, []int64{0, 2, 3}},
				{[]bool{false, true, true}, []int64{0, 2, 3}},
			}
			for i, st := range steps {
				ds, _, _ := allowN(t, s, checks...)
				for j, d := range ds {
					if d.Allowed != st.allowed[j] || d.Remaining != st.remaining[j] {
						t.Errorf("call %d, zone %s: Allowed %v, Remaining %d; want %v, %d",
							i, checks[j].Zone, d.Allowed, d.Remaining, st.allowed[j], st.remaining[j])
					}
				}
			}
			if r := allow1(t, s, checks[1]); !r.d.Allowed || r.d.Remaining != 1 {
				t.Errorf("zone max4 alone after 2 admissions: %+v, want Allowed with Remaining 1", r.d)
			}
		})
	}
}

// testZonesApart: a client is counted apart in each zone, and no zone and
// client pair shares a count with another, however their names concatenate.
func testZonesApart(t *testing.T, s Store, algo Algorithm) {
	k := testKey(t)
	pairs := []struct{ zone, key string }{
		{"a", k},
		{"b", k},
		{"a", k + "x"},
		{"a:b", k},
		{"a", "b:" + k},
		{"b", k + ":a"},
		{"a:" + k, "b"},
		{"x", BoundKey(k + "}:y")},
		{"y}:x", k},
		{"", k},
		{"a", ""},
	}
	lim := Limit{Window: time.Minute, Max: 1, Algorithm: algo}
	for _, p := range pairs {
		c := Check{Zone: p.zone, Key: p.key, Limit: lim}
		if r := allow1(t, s, c); !r.d.Allowed {
			t.Errorf("zone %q, key %q: first request denied (counted with another pair): %+v", p.zone, p.key, r.d)
		}
	}
	for _, p := range pairs {
		c := Check{Zone: p.zone, Key: p.key, Limit: lim}
		if r := allow1(t, s, c); r.d.Allowed {
			t.Errorf("zone %q, key %q: second request with max 1 admitted", p.zone, p.key)
		}
	}
}

// hostileKeys are client keys as a client might send them, before BoundKey.
// No two are equal.
func hostileKeys() []struct{ name, key string } {
	long := strings.Repeat("k", 10<<10)
	return []struct{ name, key string }{
		{"empty", ""},
		{"ip", "203.0.113.7"},
		{"10 KB", long},
		{"10 KB, last byte differs", long[:len(long)-1] + "j"},
		{"64 bytes", strings.Repeat("a", maxKeyLen)},
		{"65 bytes", strings.Repeat("a", maxKeyLen+1)},
		{"CRLF injection", "1.2.3.4\r\nFLUSHALL\r\n"},
		{"LF injection", "1.2.3.4\nFLUSHALL\n"},
		{"NUL then b", "a\x00b"},
		{"NUL then c", "a\x00c"},
		{"NUL alone", "\x00"},
		{"glob star", "*"},
		{"glob question", "?"},
		{"glob class", "[a-z]*"},
		{"glob escaped", `\*`},
		{"braces", "{}"},
		{"open brace", "{"},
		{"close brace", "}"},
		{"hash tag", "{user}:zone"},
		{"hash tag breakout", "k}:z{"},
		{"hash prefix", "#"},
		{"looks hashed", BoundKey(long)},
		{"cyrillic", "ключ"},
		{"emoji", "🔑"},
		{"combining accent", "e\u0301"},
		{"precomposed accent", "\u00e9"},
		{"68 bytes of emoji", strings.Repeat("🔑", 17)},
		{"invalid UTF-8", "\xff\xfe\xfd"},
		{"space", " "},
		{"percent", "%s%n%x"},
	}
}

// testHostileKeys: bounded hostile keys are decided without error, and each
// is counted apart from the others.
func testHostileKeys(t *testing.T, s Store, algo Algorithm) {
	lim := Limit{Window: time.Minute, Max: 1, Algorithm: algo}
	for _, h := range hostileKeys() {
		r := allow1(t, s, Check{Zone: "z", Key: BoundKey(h.key), Limit: lim})
		if !r.d.Allowed {
			t.Errorf("%s: first request denied (counted with another key): %+v", h.name, r.d)
		}
	}
	for _, h := range hostileKeys() {
		r := allow1(t, s, Check{Zone: "z", Key: BoundKey(h.key), Limit: lim})
		if r.d.Allowed {
			t.Errorf("%s: second request with max 1 admitted", h.name)
		}
	}
}

// testPeekAndReset: Peek decides without recording, and Reset forgets one
// client in one zone.
func testPeekAndReset(t *testing.T, s Store, algo Algorithm) {
	insp := s
	ctx := context.Background()
	const w = time.Minute
	key := testKey(t)
	c := Check{Zone: "z", Key: key, Limit: Limit{Window: w, Max: 3, Algorithm: algo}}
	other := Check{Zone: "other", Key: key, Limit: Limit{Window: w, Max: 3, Algorithm: algo}}
	peek := func(c Check) Decision {
		t.Helper()
		ds := make([]Decision, 1)
		if err := insp.Peek(ctx, []Check{c}, ds); err != nil {
			t.Fatalf("Peek: %v", err)
		}
		return ds[0]
	}

	first := allow1(t, s, c)
	allow1(t, s, c)
	for i := range 3 {
		if d := peek(c); !d.Allowed || d.Remaining != 1 || d.RetryAfter != 0 {
			t.Errorf("Peek %d after 2 of 3: %+v, want Allowed with Remaining 1", i, d)
		}
	}
	if r := allow1(t, s, c); !r.d.Allowed || r.d.Remaining != 0 {
		t.Fatalf("3rd of 3 after Peeks: %+v, want Allowed with Remaining 0 (Peek recorded something)", r.d)
	}
	start := time.Now()
	d := peek(c)
	end := time.Now()
	if d.Allowed || d.Remaining != 0 {
		t.Errorf("Peek of a full zone: %+v, want denied with Remaining 0", d)
	}
	checkRetry(t, "Peek of a full zone: RetryAfter", algo, d, first, start, end, w)
	if d := peek(other); !d.Allowed || d.Remaining != 3 || d.Reset != 0 {
		t.Errorf("Peek of an unused zone: %+v, want Allowed with Remaining 3 and Reset 0", d)
	}
	if r := allow1(t, s, other); !r.d.Allowed || r.d.Remaining != 2 {
		t.Fatalf("other zone, first request: %+v, want Allowed with Remaining 2", r.d)
	}

	if err := insp.Reset(ctx, c.Zone, c.Key); err != nil {
		t.Fatalf("Reset: %v", err)
	}
	if d := peek(c); !d.Allowed || d.Remaining != 3 {
		t.Errorf("Peek after Reset: %+v, want Allowed with Remaining 3", d)
	}
	if r := allow1(t, s, c); !r.d.Allowed || r.d.Remaining != 2 {
		t.Errorf("request after Reset: %+v, want Allowed with Remaining 2", r.d)
	}
	if r := allow1(t, s, other); !r.d.Allowed || r.d.Remaining != 1 {
		t.Errorf("other zone after Reset of z: %+v, want Allowed with Remaining 1 (untouched)", r.d)
	}
	if err := insp.Reset(ctx, "never-used", testKey(t)); err != nil {
		t.Errorf("Reset of an unknown client: %v", err)
	}
}

// testAlgorithmChange: a zone whose algorithm changes (a config reload) keeps
// deciding, without error, and starts over under the new algorithm.
func testAlgorithmChange(t *testing.T, s Store, _ Algorithm) {
	for _, tc := range []struct{ from, to Algorithm }{
		{SlidingLog, SlidingCounter},
		{SlidingCounter, SlidingLog},
	} {
		t.Run(tc.from.String()+" to "+tc.to.String(), func(t *testing.T) {
			key := testKey(t)
			check := func(a Algorithm) Check {
				return Check{Zone: "z", Key: key, Limit: Limit{Window: time.Minute, Max: 3, Algorithm: a}}
			}
			for range 3 {
				allow1(t, s, check(tc.from))
			}
			if r := allow1(t, s, check(tc.from)); r.d.Allowed {
				t.Fatalf("4th request of max 3 admitted: %+v", r.d)
			}
			for i, want := range []int64{2, 1} {
				if r := allow1(t, s, check(tc.to)); !r.d.Allowed || r.d.Remaining != want {
					t.Errorf("request %d after the change: %+v, want Allowed with Remaining %d", i+1, r.d, want)
				}
			}
		})
	}
}
