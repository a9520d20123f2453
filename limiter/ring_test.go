package limiter

import (
	"testing"
	"time"
)

// TestRingStrictlyIncreasing: two admissions in one microsecond, and a Redis
// clock that steps back, still store strictly increasing times; so does a
// ring whose newest time is ahead of Redis's clock.
func TestRingStrictlyIncreasing(t *testing.T) {
	c := Check{Zone: "z", Key: testKey(t), Limit: Limit{Window: time.Minute, Max: 10}}
	key := testPrefix(t) + "{" + c.Key + "}:z"
	allow := func(now int64) Decision {
		r := &scriptReq{op: opAllow, keys: []string{key}, checks: []Check{c}}
		runScript(t, testClient, now, r)
		return r.decisions[0]
	}
	const t0 = 1_700_000_000_000_000
	for i, step := range []struct{ now, want int64 }{
		{t0, t0},
		{t0, t0 + 1},         // the same microsecond
		{t0 - 5000, t0 + 2},  // the clock stepped back
		{t0 + 10, t0 + 10},   // ahead again
		{t0 + 10, t0 + 11},   // the same microsecond again
		{t0 + 500, t0 + 500}, // and on
	} {
		d := allow(step.now)
		if !d.Allowed || d.held.at != step.want {
			t.Fatalf("admission %d at %d: %+v, want recorded at %d", i+1, step.now, d, step.want)
		}
	}
	if got := readRing(t, testClient, key, t0).times; len(got) != 6 || got[5] != t0+500 {
		t.Errorf("ring times %v, want 6 ending at %d", got, int64(t0+500))
	}

	// A ring written by a clock ten seconds ahead of Redis's: the next
	// admission on Redis's clock is stored after its newest time.
	s := newRedisStore(t, testClient, testPrefix(t))
	c.Key = testKey(t)
	key = s.Key(c.Zone, c.Key)
	future := time.Now().Add(10 * time.Second).UnixMicro()
	allow(future)
	r := allow1(t, s, c)
	if !r.d.Allowed || r.d.held.at != future+1 {
		t.Errorf("admission on Redis's clock after one at %d: %+v, want recorded at %d", future, r.d, future+1)
	}
	if got := readRing(t, testClient, key, future).times; len(got) != 2 || got[1] != future+1 {
		t.Errorf("ring times %v, want [%d %d]", got, future, future+1)
	}
}

// TestRingMaxOne: a limit of one is one admission per window, with the
// exact wait.
func TestRingMaxOne(t *testing.T) {
	c := Check{Zone: "z", Key: testKey(t), Limit: Limit{Window: time.Second, Max: 1}}
	key := testPrefix(t) + "{" + c.Key + "}:z"
	const t0 = 1_700_000_000_000_000
	for _, step := range []struct {
		now     int64
		allowed bool
		wait    time.Duration
	}{
		{t0, true, 0},
		{t0 + 1, false, time.Second - time.Microsecond},
		{t0 + 999_999, false, time.Microsecond},
		{t0 + 1_000_000, true, 0},
		{t0 + 1_000_001, false, time.Second - time.Microsecond},
	} {
		r := &scriptReq{op: opAllow, keys: []string{key}, checks: []Check{c}}
		runScript(t, testClient, step.now, r)
		if d := r.decisions[0]; d.Allowed != step.allowed || d.RetryAfter != step.wait {
			t.Fatalf("at t0+%dµs: %+v, want Allowed %v, RetryAfter %v", step.now-t0, d, step.allowed, step.wait)
		}
	}
	if ring := readRing(t, testClient, key, t0); ring.cap != 1 || len(ring.times) != 1 {
		t.Errorf("ring of max 1: cap %d, %d times; want 1, 1", ring.cap, len(ring.times))
	}
}

// TestRingMax100000: a hundred thousand admissions in a tenth of a second
// are decided exactly (remaining and reset throughout), while the ring stays
// bounded: a count ring of 4*mergeEntries becomes a units ring whose later
// admissions merge by span. The next one is denied until the oldest ages
// out, exactly (the oldest were kept one by one); a refund of an admission
// that merged frees exactly one unit; once everything aged out the client
// starts over.
func TestRingMax100000(t *testing.T) {
	const (
		max    = 100_000
		window = 10 * time.Second
		t0     = 1_700_000_000_000_000
		batch  = 250
	)
	c := Check{Zone: "z", Key: testKey(t), Limit: Limit{Window: window, Max: max}}
	key := testPrefix(t) + "{" + c.Key + "}:z"
	var tokens []Decision
	for b := range max / batch {
		now := int64(t0 + b*10) // 250 admissions in each 10 µs
		reqs := make([]*scriptReq, batch)
		for i := range reqs {
			reqs[i] = &scriptReq{op: opAllow, keys: []string{key}, checks: []Check{c}}
		}
		runScript(t, testClient, now, reqs...)
		for i, r := range reqs {
			n := int64(b*batch + i)
			d := r.decisions[0]
			wantReset := window
			if n > 0 {
				wantReset = time.Duration(t0+window.Microseconds()-now) * time.Microsecond
			}
			if !d.Allowed || d.Remaining != max-n-1 || d.Reset != wantReset {
				t.Fatalf("admission %d: %+v, want Remaining %d, Reset %v", n+1, d, max-n-1, wantReset)
			}
			tokens = append(tokens, d)
		}
	}
	ring := readRing(t, testClient, key, t0)
	var sum int64
	for _, u := range ring.units {
		sum += u
	}
	t.Logf("ring of %d admissions: version %d, cap %d, %d entries, %d bytes", max, ring.version, ring.cap, len(ring.times), ring.bytes)
	if ring.version != ringUnits || len(ring.times) > maxEntries || ring.bytes > 16<<10 || sum != max || ring.times[0] != t0 {
		t.Fatalf("ring: version %d, %d entries of %d units, %d bytes, from %d; want a units ring of at most %d entries and 16 KB holding %d from %d",
			ring.version, len(ring.times), sum, ring.bytes, ring.times[0], maxEntries, max, int64(t0))
	}
	last := tokens[max-1].held.at
	deny := &scriptReq{op: opAllow, keys: []string{key}, checks: []Check{c}}
	runScript(t, testClient, last+1, deny)
	if d := deny.decisions[0]; d.Allowed || d.RetryAfter != window-time.Duration(last+1-t0)*time.Microsecond {
		t.Fatalf("admission %d: %+v, want denied until the oldest ages out", max+1, d)
	}
	// Refund one that merged: one unit frees at once.
	refund := &scriptReq{op: opSettle, keys: []string{key}, checks: []Check{c}, decisions: []Decision{tokens[max-10]}}
	runScript(t, testClient, last+2, refund)
	peek := &scriptReq{op: opPeek, keys: []string{key}, checks: []Check{c}}
	runScript(t, testClient, last+3, peek)
	if d := peek.decisions[0]; !d.Allowed || d.Remaining != 1 {
		t.Fatalf("after a refund in a full ring of %d: %+v, want Allowed with Remaining 1", max, d)
	}
	// A span after the newest aged out, nothing is held.
	now := last + window.Microseconds() + mergeSpan(window.Microseconds())
	r := &scriptReq{op: opAllow, keys: []string{key}, checks: []Check{c}}
	runScript(t, testClient, now, r)
	if d := r.decisions[0]; !d.Allowed || d.Remaining != max-1 {
		t.Fatalf("after everything aged out: %+v, want Remaining %d", d, max-1)
	}
}

// TestRingGrowsWithUse: a client's ring is the size of its use, not of max,
// so a limit of a billion costs an occasional client a few bytes.
func TestRingGrowsWithUse(t *testing.T) {
	s := newRedisStore(t, testClient, testPrefix(t))
	c := Check{Zone: "z", Key: testKey(t), Limit: Limit{Window: time.Minute, Max: 1_000_000_000}}
	for range 5 {
		allow1(t, s, c)
	}
	if ring := readRing(t, testClient, s.Key(c.Zone, c.Key), redisNow(t, testClient)); ring.cap != 8 || len(ring.times) != 5 {
		t.Errorf("ring after 5 admissions under max 1e9: cap %d, %d times; want 8, 5", ring.cap, len(ring.times))
	}
}
