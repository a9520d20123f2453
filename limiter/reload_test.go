package limiter

import (
	"context"
	"testing"
	"time"
)

// TestReloadKeepsState: a zone's state outlives a change of the numbers each
// call brings (a reload that lowers max_requests, lengthens or shortens a
// log zone's window, or lowers a concurrency zone's limit), on every store:
// what the state holds counts against each call's own Limit.
func TestReloadKeepsState(t *testing.T) {
	stores := map[string]func(t *testing.T) clockedStore{
		"memory": func(t *testing.T) clockedStore {
			now := new(int64)
			s := newMemoryStoreAt(func() int64 { return *now })
			return clockedStore{s, now}
		},
		"redis": func(t *testing.T) clockedStore {
			s, now := newRedisStore(t, testClient, testPrefix(t)), new(int64)
			s.batch.now = func() int64 { return *now }
			return clockedStore{s, now}
		},
	}
	cases := []struct {
		name string
		run  func(t *testing.T, s clockedStore)
	}{
		{"LeasesAgainstALoweredMax", testLeasesLoweredMax},
		{"LogWindowChanged", testLogWindowChanged},
		{"LongerWindowSeesWhatTheKeyKept", testLongerWindowSeesWhatWasKept},
		{"CounterAgainstALoweredMax", testCounterLoweredMax},
	}
	for name, newStore := range stores {
		t.Run(name, func(t *testing.T) {
			for _, c := range cases {
				t.Run(c.name, func(t *testing.T) { c.run(t, newStore(t)) })
			}
		})
	}
}

// testLeasesLoweredMax: leases taken under a Max of 3 all count against a
// Max lowered to 2: no slot until two are given back, and a raised Max
// admits at once.
func testLeasesLoweredMax(t *testing.T, s clockedStore) {
	ctx := context.Background()
	c := Check{Zone: "inflight", Key: testKey(t), Limit: Limit{Window: time.Minute, Max: 3, Algorithm: Concurrency}}
	s.at(0)
	var held [][]Decision
	for range 3 {
		held = append(held, decide(t, s, false, c))
	}
	c.Limit.Max = 2
	s.at(sec)
	if d := decide(t, s, false, c)[0]; d.Allowed {
		t.Fatalf("three held, max lowered to 2: %+v, want a denial", d)
	}
	if err := s.Settle(ctx, []Check{c}, held[0]); err != nil {
		t.Fatal(err)
	}
	if d := decide(t, s, false, c)[0]; d.Allowed {
		t.Errorf("two held, max 2: %+v, want a denial", d)
	}
	if err := s.Settle(ctx, []Check{c}, held[1]); err != nil {
		t.Fatal(err)
	}
	if d := decide(t, s, false, c)[0]; !d.Allowed || d.Remaining != 0 {
		t.Errorf("one held, max 2: %+v, want the last slot", d)
	}
	c.Limit.Max = 5
	if d := decide(t, s, false, c)[0]; !d.Allowed || d.Remaining != 2 {
		t.Errorf("two held, max raised to 5: %+v, want a slot and 2 more", d)
	}
}

// testLogWindowChanged: admissions a log zone recorded under one window
// count under another for as long as they lie in it: a shorter window
// stops counting the older ones, a longer one counts every admission the
// key still holds.
func testLogWindowChanged(t *testing.T, s clockedStore) {
	c := Check{Zone: "log", Key: testKey(t), Limit: Limit{Window: 10 * sec, Max: 5}}
	for i := range 5 {
		s.at(time.Duration(i) * sec)
		decide(t, s, false, c)
	}
	s.at(5 * sec)
	want(t, "five in 10s, max 5", decide(t, s, true, c)[0], Decision{Remaining: 0, Reset: 5 * sec, RetryAfter: 5 * sec})
	// Lengthened to 20s: the five still count, and the first frees a slot
	// at 20s.
	c.Limit.Window = 20 * sec
	want(t, "window lengthened to 20s", decide(t, s, false, c)[0], Decision{Reset: 15 * sec, RetryAfter: 15 * sec})
	// Shortened to 3s: only those at 3s and 4s lie in (2s, 5s].
	c.Limit.Window = 3 * sec
	want(t, "window shortened to 3s", decide(t, s, false, c)[0], Decision{Allowed: true, Remaining: 2, Reset: sec})
}

// testLongerWindowSeesWhatWasKept: a write drops the admissions that left
// the window it was made with, so a longer window later counts what lay in
// the old window at the key's last write, not all it would have held.
func testLongerWindowSeesWhatWasKept(t *testing.T, s clockedStore) {
	c := Check{Zone: "log", Key: testKey(t), Limit: Limit{Window: 10 * sec, Max: 5}}
	for i := range 5 {
		s.at(time.Duration(i) * sec)
		decide(t, s, false, c)
	}
	// At 12s, those at 0s, 1s and 2s have left the window: the write drops
	// them.
	s.at(12 * sec)
	want(t, "at 12s, three in the window", decide(t, s, false, c)[0], Decision{Allowed: true, Remaining: 2, Reset: sec})
	c.Limit.Window = 20 * sec
	s.at(12500 * time.Millisecond)
	// A 20s window would hold all six; the key holds 3s, 4s and 12s.
	want(t, "window lengthened to 20s", decide(t, s, true, c)[0], Decision{Allowed: true, Remaining: 2, Reset: 10500 * time.Millisecond})
}

// testCounterLoweredMax: the counter's sums count against each call's Max:
// lowered below them, it denies; raised, it admits the difference.
func testCounterLoweredMax(t *testing.T, s clockedStore) {
	c := Check{Zone: "ctr", Key: testKey(t), Limit: Limit{Window: 10 * sec, Max: 10, Algorithm: SlidingCounter}}
	s.at(0)
	for i := range 8 {
		if d := decide(t, s, false, c)[0]; !d.Allowed {
			t.Fatalf("request %d of 10: %+v", i+1, d)
		}
	}
	c.Limit.Max = 5
	if d := decide(t, s, false, c)[0]; d.Allowed || d.RetryAfter <= 0 {
		t.Errorf("8 counted, max lowered to 5: %+v, want a denial with a wait", d)
	}
	c.Limit.Max = 12
	for i := range 4 {
		if d := decide(t, s, false, c)[0]; !d.Allowed || d.Remaining != int64(3-i) {
			t.Errorf("8 counted, max raised to 12, request %d: %+v, want admitted with %d left", i+1, d, 3-i)
		}
	}
	if d := decide(t, s, false, c)[0]; d.Allowed {
		t.Errorf("12 counted, max 12: %+v, want a denial", d)
	}
}
