package limiter

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"
)

// extendVia runs run on s itself and on a DenyCache in front of it (cache
// set), which must pass Extend on and forget nothing for it.
func extendVia(t *testing.T, s clockedStore, run func(t *testing.T, s clockedStore, cache *DenyCache)) {
	t.Run("store", func(t *testing.T) { run(t, s, nil) })
	t.Run("denycache", func(t *testing.T) {
		cache := NewDenyCache(s.Store, 0)
		run(t, clockedStore{cache, s.now}, cache)
	})
}

// extendAt sets the clock to at and extends ds, which must change none of
// their exported figures.
func extendAt(t *testing.T, s clockedStore, at time.Duration, checks []Check, ds []Decision) error {
	t.Helper()
	s.at(at)
	before := make([]Decision, len(ds))
	for i, d := range ds {
		before[i] = exported(d)
	}
	err := s.Extend(context.Background(), checks, ds)
	for i, d := range ds {
		if exported(d) != before[i] {
			t.Errorf("extend at %v changed decision %d:\n got  %+v\n want %+v", at, i, exported(d), before[i])
		}
	}
	return err
}

// settleAt sets the clock to at and settles ds to the checks' costs.
func settleAt(t *testing.T, s clockedStore, at time.Duration, checks []Check, ds []Decision) {
	t.Helper()
	s.at(at)
	if err := s.Settle(context.Background(), checks, ds); err != nil {
		t.Fatalf("settle at %v: %v", at, err)
	}
}

// testExtendHoldsReservations: a log zone's reservation extended every third
// of a window counts past its admission's window, until its call is settled;
// the settle then takes the moved record back and charges the real cost from
// its own time; an extend after the settle does nothing. In a units zone and
// a count zone, on the store and through a DenyCache, which keeps its
// denials across an extend. A counter zone's reservation is left as it is.
func testExtendHoldsReservations(t *testing.T, s clockedStore) {
	const w = 9 * sec
	extendVia(t, s, func(t *testing.T, s clockedStore, cache *DenyCache) {
		t.Run("units", func(t *testing.T) {
			c := Check{Zone: "tokens", Key: testKey(t), Limit: Limit{Window: w, Max: 100}, Cost: 60}
			s.at(0)
			a := decide(t, s, false, c)
			want(t, "a call reserving 60 of 100", a[0], Decision{Allowed: true, Remaining: 40, Reset: w})
			for _, at := range []time.Duration{3 * sec, 6 * sec, 9 * sec} {
				if err := extendAt(t, s, at, []Check{c}, a); err != nil {
					t.Fatalf("extend at %v: %v", at, err)
				}
			}
			// Past its admission's window, the reservation counts from the
			// extend at 9s: 50 would fit only without it.
			s.at(11 * sec)
			c.Cost = 50
			want(t, "50 more at 11s, 2s after the admission's window", decide(t, s, false, c)[0],
				Decision{Remaining: 40, Reset: 7 * sec, RetryAfter: 7 * sec})
			c.Cost = 40
			want(t, "peek of 40 at 11s", decide(t, s, true, c)[0], Decision{Allowed: true, Remaining: 40, Reset: 7 * sec})
			if cache != nil && cache.stats().Entries != 1 {
				t.Fatalf("the cache holds %d denials after one, want 1", cache.stats().Entries)
			}
			c.Cost = 60
			if err := extendAt(t, s, 12*sec, []Check{c}, a); err != nil {
				t.Fatalf("extend at 12s: %v", err)
			}
			c.Cost = 50
			want(t, "peek of 50 after the extend at 12s", decide(t, s, true, c)[0], Decision{Remaining: 40, Reset: w, RetryAfter: w})
			if cache != nil {
				// The cached denial still holds: the store denies as long.
				if cache.stats().Entries != 1 {
					t.Errorf("the cache holds %d denials after an extend, want the 1 it held", cache.stats().Entries)
				}
				ds := make([]Decision, 1)
				if hit, err := cache.AllowCached(context.Background(), []Check{c}, ds); err != nil || !hit || ds[0].Allowed {
					t.Errorf("50 more through the cache after the extend: hit %v, %+v, %v; want a cached denial", hit, exported(ds[0]), err)
				}
			}
			// The call ends at 13s, having cost 20.
			c.Cost = 20
			settleAt(t, s, 13*sec, []Check{c}, a)
			if !a[0].Lifts || a[0].held.recorded {
				t.Errorf("the settle: Lifts %v, holds %+v; want Lifts (40 left for 60) and nothing held", a[0].Lifts, a[0].held)
			}
			if cache != nil && cache.stats().Entries != 0 {
				t.Errorf("the cache holds %d denials after a settle to less, want 0", cache.stats().Entries)
			}
			c.Cost = 80
			want(t, "80 after the settle", decide(t, s, true, c)[0], Decision{Allowed: true, Remaining: 80, Reset: w})
			c.Cost = 81
			want(t, "81 after the settle", decide(t, s, true, c)[0], Decision{Remaining: 80, Reset: w, RetryAfter: w})
			// An extend after the settle does nothing.
			c.Cost = 60
			if err := extendAt(t, s, 14*sec, []Check{c}, a); err != nil {
				t.Fatalf("extend after the settle: %v", err)
			}
			c.Cost = 80
			want(t, "80 after an extend of the settled call", decide(t, s, true, c)[0], Decision{Allowed: true, Remaining: 80, Reset: 8 * sec})
			s.at(21*sec + 999*time.Millisecond)
			want(t, "just before the 20 age out", decide(t, s, true, c)[0], Decision{Allowed: true, Remaining: 80, Reset: time.Millisecond})
			s.at(22 * sec)
			want(t, "a window after the settle", decide(t, s, true, c)[0], Decision{Allowed: true, Remaining: 100})
		})

		t.Run("count", func(t *testing.T) {
			c := Check{Zone: "api", Key: testKey(t), Limit: Limit{Window: w, Max: 3}}
			// count reads what the zone holds: a peek under a max of 10.
			count := func(what string, at time.Duration, held int64, reset time.Duration) {
				t.Helper()
				s.at(at)
				wide := c
				wide.Limit.Max = 10
				want(t, what, decide(t, s, true, wide)[0], Decision{Allowed: true, Remaining: 10 - held, Reset: reset})
			}
			s.at(0)
			a := decide(t, s, false, c)
			for _, at := range []time.Duration{3 * sec, 6 * sec, 9 * sec} {
				if err := extendAt(t, s, at, []Check{c}, a); err != nil {
					t.Fatalf("extend at %v: %v", at, err)
				}
			}
			s.at(10 * sec)
			want(t, "second at 10s", decide(t, s, false, c)[0], Decision{Allowed: true, Remaining: 1, Reset: 8 * sec})
			want(t, "third at 10s", decide(t, s, false, c)[0], Decision{Allowed: true, Remaining: 0, Reset: 8 * sec})
			s.at(11 * sec)
			want(t, "fourth at 11s", decide(t, s, false, c)[0], Decision{Reset: 7 * sec, RetryAfter: 7 * sec})
			if err := extendAt(t, s, 12*sec, []Check{c}, a); err != nil {
				t.Fatalf("extend at 12s: %v", err)
			}
			// Held: the two of 10s and the reservation, moved to 12s.
			count("after the extend at 12s", 12*sec, 3, 7*sec)
			want(t, "a peek under max 3 after it", decide(t, s, true, c)[0], Decision{Reset: 7 * sec, RetryAfter: 7 * sec})
			if cache != nil && cache.stats().Entries != 1 {
				t.Errorf("the cache holds %d denials after an extend, want the 1 it held", cache.stats().Entries)
			}
			c.Cost = 1
			settleAt(t, s, 13*sec, []Check{c}, a)
			count("after the settle at 13s", 13*sec, 3, 6*sec)
			if err := extendAt(t, s, 14*sec, []Check{c}, a); err != nil {
				t.Fatalf("extend after the settle: %v", err)
			}
			count("after an extend of the settled call", 14*sec, 3, 5*sec)
			// The two of 10s aged out: the request's 1, from 13s.
			count("once the two of 10s aged out", 20*sec, 1, 2*sec)
			count("a window after the settle", 22*sec, 0, 0)
		})

		t.Run("counter", func(t *testing.T) {
			c := Check{Zone: "ctr", Key: testKey(t), Limit: Limit{Window: w, Max: 100, Algorithm: SlidingCounter}, Cost: 60}
			start := time.Duration((microseconds(w)-contractT0%microseconds(w))%microseconds(w)) * time.Microsecond
			s.at(start + sec)
			a := decide(t, s, false, c)
			held := a[0].held
			c.Cost = 1
			before := decide(t, s, true, c)[0]
			if err := extendAt(t, s, start+sec, []Check{c}, a); err != nil {
				t.Fatalf("extend: %v", err)
			}
			if a[0].held != held {
				t.Errorf("a counter's decision after an extend holds %+v, want %+v", a[0].held, held)
			}
			want(t, "a counter after an extend", decide(t, s, true, c)[0], exported(before))
			// Its reservation counts in its fixed window and, weighted, the
			// next, as it did: settled there to 10.
			s.at(start + w + 3*sec)
			before = decide(t, s, true, c)[0]
			c.Cost = 10
			settleAt(t, s, start+w+3*sec, []Check{c}, a)
			c.Cost = 1
			if d := decide(t, s, true, c)[0]; d.Remaining <= before.Remaining {
				t.Errorf("a counter settled from 60 to 10: Remaining %d, before %d; want more", d.Remaining, before.Remaining)
			}
		})
	})
}

// testExtendLeaseAndReservations: one request holding a lease and log
// reservations in two client keys (two slots on a cluster): Extend keeps
// them all; Settle gives them all back; an extend after the settle does
// nothing. A lease lost does not keep the reservations from being moved.
func testExtendLeaseAndReservations(t *testing.T, s clockedStore) {
	const w = 9 * sec
	extendVia(t, s, func(t *testing.T, s clockedStore, _ *DenyCache) {
		key, other := testKey(t), testKey(t)
		tokens := Check{Zone: "tokens", Key: key, Limit: Limit{Window: w, Max: 100}, Cost: 60}
		inflight := Check{Zone: "inflight", Key: key, Limit: Limit{Window: w, Max: 1, Algorithm: Concurrency}}
		calls := Check{Zone: "calls", Key: other, Limit: Limit{Window: w, Max: 1}}
		checks := []Check{tokens, inflight, calls}
		s.at(0)
		a := decide(t, s, false, checks...)
		if !Admitted(a) {
			t.Fatalf("a request of three zones: %+v", a)
		}
		for _, at := range []time.Duration{3 * sec, 6 * sec, 9 * sec} {
			if err := extendAt(t, s, at, checks, a); err != nil {
				t.Fatalf("extend at %v: %v", at, err)
			}
		}
		s.at(11 * sec)
		want(t, "another lease at 11s", decide(t, s, false, inflight)[0], Decision{Reset: 7 * sec, RetryAfter: 7 * sec})
		more := tokens
		more.Cost = 50
		want(t, "50 more tokens at 11s", decide(t, s, false, more)[0], Decision{Remaining: 40, Reset: 7 * sec, RetryAfter: 7 * sec})
		want(t, "another call at 11s", decide(t, s, false, calls)[0], Decision{Reset: 7 * sec, RetryAfter: 7 * sec})
		if err := extendAt(t, s, 12*sec, checks, a); err != nil {
			t.Fatalf("extend at 12s: %v", err)
		}
		tokens.Cost, inflight.Cost, calls.Cost = 30, 0, 1
		settleAt(t, s, 13*sec, []Check{tokens, inflight, calls}, a)
		if holds(a) {
			t.Errorf("after the settle: %+v, want nothing held", a)
		}
		if err := extendAt(t, s, 14*sec, checks, a); err != nil {
			t.Fatalf("extend after the settle: %v", err)
		}
		more.Cost = 70
		want(t, "70 tokens after the settle to 30", decide(t, s, true, more)[0], Decision{Allowed: true, Remaining: 70, Reset: 8 * sec})
		want(t, "a call after the settle", decide(t, s, true, calls)[0], Decision{Reset: 8 * sec, RetryAfter: 8 * sec})
		want(t, "a lease after the release", decide(t, s, false, inflight)[0], Decision{Allowed: true, Remaining: 0, Reset: w})

		// A lease of 1s, not extended in time, is lost; the reservation of
		// the same request is moved all the same.
		short := Check{Zone: "short", Key: key, Limit: Limit{Window: sec, Max: 5, Algorithm: Concurrency}}
		tokens.Cost = 60
		s.at(30 * sec)
		b := decide(t, s, false, tokens, short)
		if err := extendAt(t, s, 32*sec, []Check{tokens, short}, b); !errors.Is(err, ErrLeaseLost) {
			t.Fatalf("extend of a lease expired: %v, want ErrLeaseLost", err)
		}
		if !b[0].held.recorded || b[1].held.recorded {
			t.Errorf("after a lease lost: holds %+v and %+v, want the reservation alone", b[0].held, b[1].held)
		}
		s.at(40 * sec)
		more.Cost = 40
		want(t, "40 tokens past the window of 30s", decide(t, s, true, more)[0], Decision{Allowed: true, Remaining: 40, Reset: sec})
		if err := extendAt(t, s, 41*sec, []Check{tokens, short}, b); err != nil {
			t.Errorf("extend with the lost lease marked: %v", err)
		}
		tokens.Cost = 0
		settleAt(t, s, 42*sec, []Check{tokens, short}, b)
		want(t, "after a refund", decide(t, s, true, more)[0], Decision{Allowed: true, Remaining: 100})
	})
}

// testExtendRings: a reservation among many admissions, extended every
// third of a window, settled, in rings of every layout: a small and a large
// count ring, a large units ring, and a units ring that merges admissions
// (the reservation merges into an entry that later admissions move, and is
// moved into another). Each answer of the store is held to the model's,
// and, past its admission's window, the reservation counts: the client
// holds it more than a client of the same admissions without it.
func testExtendRings(t *testing.T, s clockedStore) {
	const w = 9 * sec
	for _, tc := range []struct {
		name  string
		limit Limit
		// cost is what the background admissions cost, every gap; the
		// reservation reserves reserve after before of them and is settled
		// to charge.
		cost, reserve, charge int64
		before                int
		gap                   time.Duration
		// version is the ring's layout at the first extend (on Redis);
		// large, whether it is read by ranges; merged, whether it holds
		// fewer entries than admissions.
		version       int
		large, merged bool
	}{
		{"small count ring", Limit{Window: w, Max: 1000}, 1, 1, 1, 20, 600 * time.Millisecond, ringSmallCount, false, false},
		{"large count ring", Limit{Window: w, Max: 100_000}, 1, 1, 1, 150, 20 * time.Millisecond, ringCount, true, false},
		{"large units ring", Limit{Window: w, Max: 100_000}, 2, 500, 300, 100, 60 * time.Millisecond, ringUnits, true, false},
		{"merged units ring", Limit{Window: w, Max: 10_000_000}, 2, 1000, 500, 400, 5 * time.Millisecond, ringUnits, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			m := newModel(false)
			a := Check{Zone: "z", Key: testKey(t), Limit: tc.limit, Cost: tc.cost}
			b := a
			b.Key = testKey(t) // the same admissions, without the reservation
			res := a
			res.Cost = tc.reserve
			resAt := time.Duration(tc.before) * tc.gap
			type event struct {
				at   time.Duration
				kind int // background admissions, reservation, extend, settle, peek
			}
			const (
				background = iota
				reservation
				extend
				settle
				peek
			)
			var events []event
			for at := time.Duration(0); at <= resAt+15*sec; at += tc.gap {
				events = append(events, event{at, background})
			}
			events = append(events, event{resAt, reservation}, event{resAt + 12500*time.Millisecond, settle})
			for k := time.Duration(1); k <= 4; k++ {
				events = append(events, event{resAt + k*w/3, extend})
			}
			for at := resAt + 250*time.Millisecond; at <= resAt+15*sec; at += 250 * time.Millisecond {
				events = append(events, event{at, peek})
			}
			slices.SortStableFunc(events, func(x, y event) int { return int(x.at - y.at) })
			// inspect reads the ring on Redis (readRing checks it is well
			// formed); at the first extend, its layout.
			var admissions []time.Duration
			inspect := func(step string, first bool) {
				r, ok := s.Store.(*RedisStore)
				if !ok || r.client != testClient {
					return
				}
				ring := readRing(t, testClient, r.Key(a.Zone, a.Key), *s.now)
				if !first {
					return
				}
				now := time.Duration(*s.now-contractT0) * time.Microsecond
				inWindow := 0
				for _, at := range admissions {
					if at > now-w {
						inWindow++
					}
				}
				t.Logf("%s: ring version %d, cap %d, %d entries for %d admissions, %d bytes", step, ring.version, ring.cap, len(ring.times), inWindow, ring.bytes)
				if ring.version != tc.version || (ring.bytes > ringSmall) != tc.large || (len(ring.times) < inWindow) != tc.merged {
					t.Errorf("%s: ring version %d of %d bytes, %d entries for %d admissions; want version %d, large %v, merged %v",
						step, ring.version, ring.bytes, len(ring.times), inWindow, tc.version, tc.large, tc.merged)
				}
			}
			var got, mine []Decision
			var moved, checked int
			for _, e := range events {
				s.at(e.at)
				now := *s.now
				step := fmt.Sprintf("at %v (the reservation's %v)", e.at, e.at-resAt)
				switch e.kind {
				case background, reservation, peek:
					checks := []Check{a, b}
					if e.kind == reservation {
						checks = []Check{res}
					}
					meth := methodAllow
					if e.kind == peek {
						meth = methodPeek
						checks = []Check{{Zone: a.Zone, Key: a.Key, Limit: a.Limit}, {Zone: b.Zone, Key: b.Key, Limit: b.Limit}}
					}
					var ds []Decision
					for _, c := range checks {
						d := decide(t, s, meth == methodPeek, c)
						md := make([]Decision, 1)
						m.allow(now, meth, []Check{c}, md)
						if exported(d[0]) != exported(md[0]) {
							t.Fatalf("%s, %s of %+v:\n got  %+v\n want %+v", step, []string{"peek", "allow"}[meth], c, exported(d[0]), exported(md[0]))
						}
						if e.kind == reservation {
							got, mine = d, md
						}
						ds = append(ds, d[0])
					}
					if e.kind != peek {
						admissions = append(admissions, e.at)
					}
					if e.kind != peek {
						break
					}
					// Past the admission's window, until the settle, the
					// reservation counts; after it, the charge.
					since, extra := e.at-resAt, tc.reserve
					if since >= 12500*time.Millisecond {
						extra = tc.charge
					}
					if since >= w {
						checked++
					}
					if ds[0].Remaining > ds[1].Remaining-extra {
						t.Fatalf("%s: %d left, %d left to a client of the same admissions without the call's %d units; want at most %d",
							step, ds[0].Remaining, ds[1].Remaining, extra, ds[1].Remaining-extra)
					}
				case extend:
					if err := extendAt(t, s, e.at, []Check{res}, got); err != nil {
						t.Fatalf("%s: extend: %v", step, err)
					}
					if err := m.extend(now, []Check{res}, mine); err != nil {
						t.Fatal(err)
					}
					if got[0].held != mine[0].held {
						t.Fatalf("%s: extend: holds %+v, want %+v", step, got[0].held, mine[0].held)
					}
					inspect(step, moved == 0)
					moved++
				case settle:
					c := res
					c.Cost = tc.charge
					if err := s.Settle(ctx, []Check{c}, got); err != nil {
						t.Fatal(err)
					}
					m.settle(now, []Check{c}, mine)
					if got[0].Lifts != mine[0].Lifts {
						t.Errorf("%s: settle: Lifts %v, want %v", step, got[0].Lifts, mine[0].Lifts)
					}
					inspect(step, false)
				}
			}
			if moved != 4 || checked == 0 {
				t.Fatalf("%d extends, %d checks past the admission's window of what the reservation holds", moved, checked)
			}
		})
	}
}
