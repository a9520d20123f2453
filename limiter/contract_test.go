package limiter

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/redistest"
)

// clockedStore is a store whose clock the test moves (microseconds).
type clockedStore struct {
	Store
	now *int64
}

// at sets the store's clock to t0 plus d.
func (s clockedStore) at(d time.Duration) { *s.now = contractT0 + d.Microseconds() }

const contractT0 = int64(1_700_000_000_000_000)

// TestContract checks the semantics of units, settling, waits, leases and a
// changing Max on every store, at times the test sets, so that every figure
// is exact.
func TestContract(t *testing.T) {
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
	if !testing.Short() {
		cluster := redistest.StartCluster(t, 3)
		stores["redis-cluster"] = func(t *testing.T) clockedStore {
			s, now := newRedisStore(t, cluster.Client(t), testPrefix(t)), new(int64)
			s.batch.now = func() int64 { return *now }
			return clockedStore{s, now}
		}
	}
	cases := []struct {
		name string
		run  func(t *testing.T, s clockedStore)
	}{
		{"Units", testUnits},
		{"SettleDownUpAndTwice", testSettle},
		{"SettleCountsFromTheEnd", testSettleFromEnd},
		{"SettlesOutOfOrder", testSettleOutOfOrder},
		{"SettleThatDoesNotFitWaitsForRoom", testSettleWhenFull},
		{"SettleBeforeItsSlot", testSettleBeforeSlot},
		{"WaitsPromiseTheirSlot", testWaits},
		{"WaitsLongerThanTheWindow", testLongWaits},
		{"SeveralZonesGoOnTogether", testSeveralZonesWait},
		{"Leases", testLeases},
		{"ExtendHoldsReservations", testExtendHoldsReservations},
		{"ExtendLeaseAndReservations", testExtendLeaseAndReservations},
		{"ExtendRings", testExtendRings},
		{"ChangingMax", testChangingMax},
		{"PeekKnowsTheLastMax", testLastMax},
		{"CounterUnits", testCounterUnits},
	}
	for name, newStore := range stores {
		t.Run(name, func(t *testing.T) {
			for _, c := range cases {
				t.Run(c.name, func(t *testing.T) { c.run(t, newStore(t)) })
			}
		})
	}
}

// decide runs o (Allow or Peek) for checks at the store's clock and fails the
// test on an error.
func decide(t *testing.T, s clockedStore, peek bool, checks ...Check) []Decision {
	t.Helper()
	ds := make([]Decision, len(checks))
	var err error
	if peek {
		err = s.Peek(context.Background(), checks, ds)
	} else {
		err = s.Allow(context.Background(), checks, ds)
	}
	if err != nil {
		t.Fatalf("deciding %+v: %v", checks, err)
	}
	return ds
}

// want fails the test unless d's exported figures are w's; LastMax only when
// w sets it (testLastMax checks it).
func want(t *testing.T, what string, d, w Decision) {
	t.Helper()
	if w.LastMax == 0 {
		d.LastMax = 0
	}
	if exported(d) != w {
		t.Errorf("%s:\n got  %+v\n want %+v", what, exported(d), w)
	}
}

const sec = time.Second

// testUnits: a request admits when its units fit; Remaining counts units;
// a denial waits for the admissions that must age out for this cost; a
// cost above Max is never admitted and says so.
func testUnits(t *testing.T, s clockedStore) {
	c := Check{Zone: "tokens", Key: testKey(t), Limit: Limit{Window: 10 * sec, Max: 100}}
	s.at(0)
	c.Cost = 30
	want(t, "30 of 100", decide(t, s, false, c)[0], Decision{Allowed: true, Remaining: 70, Reset: 10 * sec})
	s.at(1 * sec)
	c.Cost = 50
	want(t, "50 more", decide(t, s, false, c)[0], Decision{Allowed: true, Remaining: 20, Reset: 9 * sec})
	s.at(2 * sec)
	c.Cost = 30
	// The first admission (30) must age out for 30 more to fit: at 10s.
	want(t, "30 more, with 20 left", decide(t, s, false, c)[0], Decision{Remaining: 20, Reset: 8 * sec, RetryAfter: 8 * sec})
	c.Cost = 20
	want(t, "20 more fits", decide(t, s, false, c)[0], Decision{Allowed: true, Remaining: 0, Reset: 8 * sec})
	c.Cost = 101
	want(t, "a cost above max", decide(t, s, false, c)[0], Decision{Never: true})
	s.at(10*sec + 500*time.Millisecond)
	c.Cost = 30
	// The 30 aged out; 70 are held, the oldest for another half second.
	want(t, "after the first aged out", decide(t, s, true, c)[0], Decision{Allowed: true, Remaining: 30, Reset: 500 * time.Millisecond})
	s.at(11*sec + 500*time.Millisecond)
	want(t, "after the second aged out", decide(t, s, false, c)[0], Decision{Allowed: true, Remaining: 50, Reset: 500 * time.Millisecond})
	if r, ok := s.Store.(*RedisStore); ok && r.client == testClient {
		// The log keeps admissions, not units: the two in the window.
		ring := readRing(t, testClient, r.Key(c.Zone, c.Key), *s.now)
		if len(ring.units) != 2 || ring.units[0] != 20 || ring.units[1] != 30 {
			t.Errorf("ring holds units %v, want [20 30]", ring.units)
		}
	}
}

// testSettle: settling down frees units at once, to zero takes the
// admission back, up records the whole charge even past Max; settling twice
// does nothing, nor does settling what aged out or was denied.
func testSettle(t *testing.T, s clockedStore) {
	ctx := context.Background()
	c := Check{Zone: "tokens", Key: testKey(t), Limit: Limit{Window: 10 * sec, Max: 100}, Cost: 60}
	s.at(0)
	a := decide(t, s, false, c)
	s.at(1 * sec)
	b := decide(t, s, false, c)
	if b[0].Allowed {
		t.Fatalf("60 more of 100 with 40 left admitted: %+v", b[0])
	}
	// The response cost 10: 90 left.
	c.Cost = 10
	if err := s.Settle(ctx, []Check{c}, a); err != nil {
		t.Fatal(err)
	}
	c.Cost = 60
	// The 10 count from the settle: they leave the window at 11s.
	want(t, "peek after settling 60 to 10", decide(t, s, true, c)[0], Decision{Allowed: true, Remaining: 90, Reset: 10 * sec})
	// Settling again, to anything, does nothing.
	c.Cost = 0
	if err := s.Settle(ctx, []Check{c}, a); err != nil {
		t.Fatal(err)
	}
	c.Cost = 60
	want(t, "peek after a second settle", decide(t, s, true, c)[0], Decision{Allowed: true, Remaining: 90, Reset: 10 * sec})
	// A denial recorded nothing: settling it does nothing.
	if err := s.Settle(ctx, []Check{c}, b); err != nil {
		t.Fatal(err)
	}
	// Up past Max: 60 reserved, 500 charged. Nothing fits until it ages out.
	s.at(2 * sec)
	d := decide(t, s, false, c)
	c.Cost = 500
	if err := s.Settle(ctx, []Check{c}, d); err != nil {
		t.Fatal(err)
	}
	c.Cost = 1
	want(t, "after a charge past max", decide(t, s, false, c)[0], Decision{Reset: 10 * sec, RetryAfter: 10 * sec})
	s.at(12 * sec)
	want(t, "once it aged out", decide(t, s, false, c)[0], Decision{Allowed: true, Remaining: 99, Reset: 10 * sec})
	// To zero: the admission is taken back, wherever it lies.
	e := decide(t, s, false, c)
	decide(t, s, false, c)
	c.Cost = 0
	if err := s.Settle(ctx, []Check{c}, e); err != nil {
		t.Fatal(err)
	}
	c.Cost = 1
	want(t, "after a refund in the middle", decide(t, s, true, c)[0], Decision{Allowed: true, Remaining: 98, Reset: 10 * sec})
	// An admission that aged out is left alone.
	s.at(30 * sec)
	c.Cost = 7
	if err := s.Settle(ctx, []Check{c}, d); err != nil {
		t.Fatal(err)
	}
	want(t, "after settling what aged out", decide(t, s, true, c)[0], Decision{Allowed: true, Remaining: 100})
}

// testSettleFromEnd: a settled cost counts from the settle (when the
// response ended), in a log and in a counter, so a call longer than the
// window is charged like any other and its client waits a full window after
// it; a short one blocks a window from its end, not from its start.
func testSettleFromEnd(t *testing.T, s clockedStore) {
	ctx := context.Background()
	for _, algo := range []Algorithm{SlidingLog, SlidingCounter} {
		c := Check{Zone: "bytes-" + algo.String(), Key: testKey(t), Limit: Limit{Window: 10 * sec, Max: 100, Algorithm: algo}}
		s.at(100 * sec) // the start of a counter's fixed window
		long := decide(t, s, false, c)
		// A stream of 12s reports the whole budget.
		s.at(112 * sec)
		c.Cost = 100
		if err := s.Settle(ctx, []Check{c}, long); err != nil {
			t.Fatal(err)
		}
		c.Cost = 1
		d := decide(t, s, false, c)[0]
		if d.Allowed || d.RetryAfter < 8*sec {
			t.Errorf("%s: a call right after a 12s stream that spent the budget: %+v, want denied for most of a window", algo, d)
		}
		if algo == SlidingLog {
			want(t, "log: after a 12s stream that spent the budget", d, Decision{Reset: 10 * sec, RetryAfter: 10 * sec})
			s.at(121*sec + 999*time.Millisecond)
			want(t, "log: just before it ages out", decide(t, s, true, c)[0], Decision{Reset: time.Millisecond, RetryAfter: time.Millisecond})
			s.at(122 * sec)
			want(t, "log: a window after the stream ended", decide(t, s, false, c)[0], Decision{Allowed: true, Remaining: 99, Reset: 10 * sec})
		}
	}
	// A 5s call in a 10s window, reserving and spending the whole budget,
	// blocks until a window after its end.
	c := Check{Zone: "short", Key: testKey(t), Limit: Limit{Window: 10 * sec, Max: 100}, Cost: 100}
	s.at(200 * sec)
	short := decide(t, s, false, c)
	s.at(205 * sec)
	if err := s.Settle(ctx, []Check{c}, short); err != nil {
		t.Fatal(err)
	}
	s.at(212 * sec)
	want(t, "7s after a 5s call ended", decide(t, s, false, c)[0], Decision{Reset: 3 * sec, RetryAfter: 3 * sec})
	s.at(215 * sec)
	want(t, "10s after it ended", decide(t, s, false, c)[0], Decision{Allowed: true, Remaining: 0, Reset: 10 * sec})
}

// testSettleWhenFull: a settle whose cost does not fit in the window now is
// charged at its room, when older units leave, as a wait would be; not at
// the settle's time, which would let more than Max into a later window.
func testSettleWhenFull(t *testing.T, s clockedStore) {
	ctx := context.Background()
	c := Check{Zone: "tokens", Key: testKey(t), Limit: Limit{Window: 10 * sec, Max: 100}, Cost: 70}
	s.at(0)
	decide(t, s, false, c)
	s.at(1 * sec)
	c.Cost = 20
	reserved := decide(t, s, false, c)
	// It cost 50: with the 70 from 0s that is 120, so the 50 count from 10s.
	s.at(2 * sec)
	c.Cost = 50
	if err := s.Settle(ctx, []Check{c}, reserved); err != nil {
		t.Fatal(err)
	}
	c.Cost = 1
	s.at(12500 * time.Millisecond)
	want(t, "2.5s after the 50 count", decide(t, s, true, c)[0], Decision{Allowed: true, Remaining: 50, Reset: 7500 * time.Millisecond})
	s.at(20 * sec)
	want(t, "a window after they count", decide(t, s, true, c)[0], Decision{Allowed: true, Remaining: 100})
}

// testSettleBeforeItsSlot: a promised admission settled before its slot,
// behind another promise given back meanwhile, counts from the settle and
// leaves the window then: an admission is never moved before an older one.
func testSettleBeforeSlot(t *testing.T, s clockedStore) {
	ctx := context.Background()
	c := Check{Zone: "tokens", Key: testKey(t), Limit: Limit{Window: 10 * sec, Max: 100}, Cost: 80}
	s.at(0)
	decide(t, s, false, c)
	s.at(1 * sec)
	c.Cost, c.Wait = 30, 20*sec
	first := decide(t, s, false, c)
	s.at(2 * sec)
	c.Cost = 10
	second := decide(t, s, false, c)
	if !second[0].Allowed || second[0].held.at != contractT0+(10*sec).Microseconds()+1 {
		t.Fatalf("10 more behind a promise, waiting up to 20s: %+v, want recorded just after 10s", second[0])
	}
	s.at(3 * sec)
	c.Cost = 0
	if err := s.Settle(ctx, []Check{c}, first); err != nil {
		t.Fatal(err)
	}
	c.Cost = 5
	if err := s.Settle(ctx, []Check{c}, second); err != nil {
		t.Fatal(err)
	}
	c.Cost, c.Wait = 1, 0
	want(t, "the 80 from 0s and the 5 from 3s", decide(t, s, true, c)[0], Decision{Allowed: true, Remaining: 15, Reset: 7 * sec})
	s.at(10500 * time.Millisecond)
	want(t, "the 5 from 3s", decide(t, s, true, c)[0], Decision{Allowed: true, Remaining: 95, Reset: 2500 * time.Millisecond})
	s.at(13500 * time.Millisecond)
	want(t, "all aged out", decide(t, s, true, c)[0], Decision{Allowed: true, Remaining: 100})
}

// testSettleOutOfOrder: settles that arrive in another order than their
// admissions take back each its own reservation and charge at their own
// times; a settle while requests wait for later slots charges just after
// the newest of them.
func testSettleOutOfOrder(t *testing.T, s clockedStore) {
	ctx := context.Background()
	c := Check{Zone: "tokens", Key: testKey(t), Limit: Limit{Window: 10 * sec, Max: 100}, Cost: 40}
	s.at(0)
	a := decide(t, s, false, c)
	s.at(1 * sec)
	b := decide(t, s, false, c)
	s.at(2 * sec)
	c.Cost = 15
	if err := s.Settle(ctx, []Check{c}, b); err != nil {
		t.Fatal(err)
	}
	s.at(3 * sec)
	c.Cost = 25
	if err := s.Settle(ctx, []Check{c}, a); err != nil {
		t.Fatal(err)
	}
	c.Cost = 61
	want(t, "after two settles out of order", decide(t, s, true, c)[0], Decision{Remaining: 60, Reset: 9 * sec, RetryAfter: 9 * sec})
	s.at(12 * sec)
	want(t, "once the first settled aged out", decide(t, s, true, c)[0], Decision{Allowed: true, Remaining: 75, Reset: sec})
	s.at(13 * sec)
	want(t, "once both aged out", decide(t, s, true, c)[0], Decision{Allowed: true, Remaining: 100})

	// A count zone of 2: a request waits for the slot at 30s; a settle at
	// 22s charges just after it, never before a promised admission.
	n := Check{Zone: "api", Key: testKey(t), Limit: Limit{Window: 10 * sec, Max: 2}}
	s.at(20 * sec)
	first := decide(t, s, false, n)
	s.at(21 * sec)
	decide(t, s, false, n)
	n.Wait = 9 * sec
	want(t, "a wait for the slot at 30s", decide(t, s, false, n)[0], Decision{Allowed: true, Delay: 9 * sec, Reset: 9 * sec})
	s.at(22 * sec)
	n.Cost, n.Wait = 1, 0
	if err := s.Settle(ctx, []Check{n}, first); err != nil {
		t.Fatal(err)
	}
	s.at(31 * sec)
	// 21s aged out; held: 30s and the settle's charge just after it.
	want(t, "after the promised slot", decide(t, s, true, n)[0], Decision{Reset: 9 * sec, RetryAfter: 9 * sec})
}

// testWaits: a request that may wait is admitted at the earliest time it
// can be, recorded then, and told to wait that long; a later request does
// not take the promised slot; a promise given back frees it.
func testWaits(t *testing.T, s clockedStore) {
	ctx := context.Background()
	c := Check{Zone: "api", Key: testKey(t), Limit: Limit{Window: 10 * sec, Max: 2}}
	s.at(0)
	decide(t, s, false, c)
	s.at(1 * sec)
	decide(t, s, false, c)
	s.at(5 * sec)
	c.Wait = 4 * sec
	want(t, "full, and the room 5s away", decide(t, s, false, c)[0], Decision{Reset: 5 * sec, RetryAfter: 1 * sec})
	c.Wait = 6 * sec
	promised := decide(t, s, false, c)
	want(t, "full, waiting 6s", promised[0], Decision{Allowed: true, Delay: 5 * sec, Reset: 5 * sec})
	if at := promised[0].held.at; at != contractT0+(10*sec).Microseconds() {
		t.Errorf("the promise is recorded at %d, want at t0+10s", at-contractT0)
	}
	// The slot freed at 10s is promised: the next frees at 11s.
	s.at(9 * sec)
	c.Wait = 0
	want(t, "after the promise", decide(t, s, false, c)[0], Decision{Reset: 2 * sec, RetryAfter: 2 * sec})
	// The client went away: the promise given back frees its slot.
	c.Cost = 0
	if err := s.Settle(ctx, []Check{c}, promised); err != nil {
		t.Fatal(err)
	}
	c.Cost, c.Wait = 0, 2*sec
	want(t, "after the promise was given back", decide(t, s, false, c)[0], Decision{Allowed: true, Delay: 1 * sec, Reset: 1 * sec})
	// A wait of more than MaxWaitWindows windows is refused.
	c.Wait = MaxWaitWindows*c.Limit.Window + time.Microsecond
	if err := s.Allow(ctx, []Check{c}, make([]Decision, 1)); err == nil {
		t.Errorf("a wait of %v in a window of %v: no error", c.Wait, c.Limit.Window)
	}
}

// testLongWaits: a wait longer than the window holds as long as it says: ten
// requests at once against 2 per 10s with a wait of 35s go on two by two at
// 0, 10, 20 and 30s, each recorded at its slot; the ninth would need 40s
// and is denied at once, told to come back when 40s is within its wait.
func testLongWaits(t *testing.T, s clockedStore) {
	c := Check{Zone: "line", Key: testKey(t), Limit: Limit{Window: 10 * sec, Max: 2}, Wait: 35 * sec}
	s.at(0)
	for i := range 10 {
		d := decide(t, s, false, c)[0]
		if i >= 8 {
			want(t, "beyond the wait", d, Decision{Reset: 40 * sec, RetryAfter: 5 * sec})
			continue
		}
		slot := time.Duration(i/2) * 10 * sec
		if !d.Allowed || d.Delay < slot || d.Delay > slot+10*time.Microsecond {
			t.Errorf("request %d: %+v, want admitted with a delay of %v", i+1, exported(d), slot)
		}
	}
	// The line holds: at 25s the next slot is at 40s.
	s.at(25 * sec)
	c.Wait = 0
	want(t, "while the line is served", decide(t, s, true, c)[0], Decision{Reset: 15 * sec, RetryAfter: 15 * sec})
	s.at(40 * sec)
	want(t, "once the line is served", decide(t, s, false, c)[0], Decision{Allowed: true, Remaining: 0, Reset: time.Microsecond})
}

// testSeveralZonesWait: the zones of one request go on together at the
// latest of their times, each recording it then; when one cannot within
// the wait, none records anything.
func testSeveralZonesWait(t *testing.T, s clockedStore) {
	key := testKey(t) // one client: one Redis Cluster slot
	slow := Check{Zone: "slow", Key: key, Limit: Limit{Window: 10 * sec, Max: 1}}
	fast := Check{Zone: "fast", Key: key, Limit: Limit{Window: 10 * sec, Max: 100}, Cost: 3}
	s.at(0)
	decide(t, s, false, slow)
	s.at(7 * sec)
	slow.Wait, fast.Wait = 5*sec, 5*sec
	ds := decide(t, s, false, slow, fast)
	if !Admitted(ds) || ds[0].Delay != 3*sec || ds[1].Delay != 3*sec {
		t.Fatalf("two zones, one free in 3s: %+v, want both admitted after 3s", ds)
	}
	if ds[0].held.at != ds[1].held.at {
		t.Errorf("recorded at %d and %d, want one time", ds[0].held.at, ds[1].held.at)
	}
	s.at(8 * sec)
	slow.Wait, fast.Wait = sec, sec
	ds = decide(t, s, false, slow, fast)
	if Admitted(ds) || !ds[1].Allowed {
		t.Fatalf("slow zone full for 12s more: %+v, want denied by it alone", ds)
	}
	want(t, "the fast zone after the denial", decide(t, s, true, fast)[0], Decision{Allowed: true, Remaining: 97, Reset: 12 * sec})
}

// testLeases: at most Max leases at once; a release frees one at once; a
// lease expires a Window after it was taken or extended; extending one that
// expired reports it lost.
func testLeases(t *testing.T, s clockedStore) {
	ctx := context.Background()
	c := Check{Zone: "inflight", Key: testKey(t), Limit: Limit{Window: sec, Max: 2, Algorithm: Concurrency}}
	s.at(0)
	a := decide(t, s, false, c)
	s.at(100 * time.Millisecond)
	b := decide(t, s, false, c)
	// The first lease expires at 1s.
	want(t, "second lease", b[0], Decision{Allowed: true, Remaining: 0, Reset: 900 * time.Millisecond})
	s.at(200 * time.Millisecond)
	want(t, "third lease", decide(t, s, false, c)[0], Decision{Reset: 800 * time.Millisecond, RetryAfter: 800 * time.Millisecond})
	if err := s.Settle(ctx, []Check{c}, a); err != nil {
		t.Fatal(err)
	}
	d := decide(t, s, false, c)
	want(t, "after a release", d[0], Decision{Allowed: true, Remaining: 0, Reset: 900 * time.Millisecond})
	// b is extended at 0.9s, to 1.9s; d expires at 1.2s.
	s.at(900 * time.Millisecond)
	if err := s.Extend(ctx, []Check{c}, b); err != nil {
		t.Fatalf("extending a live lease: %v", err)
	}
	s.at(1500 * time.Millisecond)
	want(t, "after d expired", decide(t, s, true, c)[0], Decision{Allowed: true, Remaining: 1, Reset: 400 * time.Millisecond})
	if err := s.Extend(ctx, []Check{c}, d); !errors.Is(err, ErrLeaseLost) {
		t.Errorf("extending an expired lease: %v, want ErrLeaseLost", err)
	}
	if err := s.Extend(ctx, []Check{c}, d); err != nil {
		t.Errorf("extending a lost lease again: %v, want nothing", err)
	}
	c.Limit.Max = 0
	want(t, "max 0", decide(t, s, false, c)[0], Decision{Never: true})
}

// testChangingMax: each call is exact for its own Max; a lowered Max denies
// until enough ages out, a raised one admits at once.
func testChangingMax(t *testing.T, s clockedStore) {
	c := Check{Zone: "tenant", Key: testKey(t), Limit: Limit{Window: 10 * sec, Max: 5}}
	for i := range 5 {
		s.at(time.Duration(i) * sec)
		decide(t, s, false, c)
	}
	s.at(5 * sec)
	c.Limit.Max = 3
	// Three of five must age out: the third, at 2s, does at 12s.
	want(t, "max lowered to 3", decide(t, s, false, c)[0], Decision{Reset: 7 * sec, RetryAfter: 7 * sec})
	c.Limit.Max = 10
	want(t, "max raised to 10", decide(t, s, false, c)[0], Decision{Allowed: true, Remaining: 4, Reset: 5 * sec})
	c.Limit.Max = 6
	want(t, "max 6 with 6 held", decide(t, s, false, c)[0], Decision{Reset: 5 * sec, RetryAfter: 5 * sec})
}

// testCounterUnits: the counter weighs units as it weighs requests.
func testCounterUnits(t *testing.T, s clockedStore) {
	c := Check{Zone: "ctr", Key: testKey(t), Limit: Limit{Window: 10 * sec, Max: 100, Algorithm: SlidingCounter}, Cost: 60}
	s.at(0)
	if d := decide(t, s, false, c)[0]; !d.Allowed || d.Remaining != 40 {
		t.Errorf("60 of 100: %+v", d)
	}
	if d := decide(t, s, false, c)[0]; d.Allowed || d.RetryAfter <= 0 || d.Never {
		t.Errorf("60 more with 40 left: %+v, want a denial with a wait", d)
	}
	c.Cost = 40
	if d := decide(t, s, false, c)[0]; !d.Allowed || d.Remaining != 0 {
		t.Errorf("40 more: %+v", d)
	}
	c.Cost = 101
	want(t, "a cost above max", decide(t, s, false, c)[0], Decision{Never: true})
}

// testLastMax: Peek reports the Max of the newest admission recorded for the
// client in the zone (a tenant's own quota), whatever Max it is asked with;
// a denial records nothing, so it leaves it; 0 before any.
func testLastMax(t *testing.T, s clockedStore) {
	c := Check{Zone: "tenant", Key: testKey(t), Limit: Limit{Window: 10 * sec, Max: 1000}}
	s.at(0)
	if d := decide(t, s, true, c)[0]; d.LastMax != 0 {
		t.Errorf("peek before any admission: LastMax %d, want 0", d.LastMax)
	}
	c.Limit.Max = 3
	for range 3 {
		decide(t, s, false, c)
	}
	want(t, "the fourth under max 3", decide(t, s, false, c)[0], Decision{Reset: 10 * sec, RetryAfter: 10 * sec})
	c.Limit.Max = 1000
	want(t, "peek under the fallback 1000", decide(t, s, true, c)[0], Decision{Allowed: true, Remaining: 997, Reset: 10 * sec, LastMax: 3})
	s.at(1 * sec)
	c.Limit.Max = 2
	if d := decide(t, s, false, c)[0]; d.Allowed {
		t.Fatalf("under max 2 after 3: %+v, want denied", exported(d))
	}
	if d := decide(t, s, true, c)[0]; d.LastMax != 3 {
		t.Errorf("after a denial: LastMax %d, want 3 (a denial records nothing)", d.LastMax)
	}
	c.Limit.Max, c.Cost = 50, 10
	decide(t, s, false, c)
	c.Limit.Max, c.Cost = 1000, 0
	if d := decide(t, s, true, c)[0]; d.LastMax != 50 || d.Remaining != 1000-13 {
		t.Errorf("after an admission under max 50: %+v, want LastMax 50, Remaining %d", exported(d), 1000-13)
	}
}
