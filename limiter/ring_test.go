package limiter

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// scriptReq is one request of a limit.lua call made by hand.
type scriptReq struct {
	op        op
	keys      []string
	checks    []Check
	decisions []Decision
}

// runScript runs limit.lua once for reqs at the time now (microseconds; 0
// for Redis's clock) and fills their decisions.
func runScript(tb testing.TB, client redis.Scripter, now int64, reqs ...*scriptReq) {
	tb.Helper()
	var keys []string
	var args []byte
	zones := 0
	for _, r := range reqs {
		keys = append(keys, r.keys...)
		if r.decisions == nil {
			r.decisions = make([]Decision, len(r.checks))
		}
		args = appendRequest(args, r.op, r.checks, r.decisions)
		zones += len(r.checks)
	}
	argv := []any{args}
	if now != 0 {
		argv = append(argv, now)
	}
	reply, err := limitScript.Run(context.Background(), client, keys, argv...).Result()
	if err != nil {
		tb.Fatalf("limit.lua: %v", err)
	}
	s, err := checkReply(reply, zones)
	if err != nil {
		tb.Fatal(err)
	}
	for _, r := range reqs {
		n := len(r.checks) * zoneReplyLen
		decodeReply(s[:n], r.op, r.decisions)
		s = s[n:]
	}
}

// logModel is the sliding log as plainly as it can be written: every
// admission time, and a count of those in the window.
type logModel struct{ times []int64 }

func (m *logModel) decide(now, window, max int64, record bool) Decision {
	var in []int64
	for _, at := range m.times {
		if at > now-window {
			in = append(in, at)
		}
	}
	n := int64(len(in))
	if n >= max {
		wait := time.Duration(in[n-max]+window-now) * time.Microsecond
		return Decision{Reset: wait, RetryAfter: wait, token: -1}
	}
	d := Decision{Allowed: true, Remaining: max - n, token: -1}
	if n > 0 {
		d.Reset = time.Duration(in[0]+window-now) * time.Microsecond
	}
	if !record {
		return d
	}
	at := now
	if k := len(m.times); k > 0 && m.times[k-1] >= at {
		at = m.times[k-1] + 1
	}
	m.times = append(m.times, at)
	d.Remaining--
	if n == 0 {
		d.Reset = time.Duration(window) * time.Microsecond
	}
	d.token = at
	return d
}

func (m *logModel) refund(token int64) {
	for i, at := range m.times {
		if at == token {
			m.times = append(m.times[:i], m.times[i+1:]...)
			return
		}
	}
}

// TestRingMatchesModel runs random schedules of admissions, peeks and
// refunds, with the clock standing still, creeping, jumping and stepping
// back, in random batches over keys of several sizes (small rings read
// whole, large ones with samples, both growing and wrapping), and compares
// every answer with the plain model's.
func TestRingMatchesModel(t *testing.T) {
	// Keys expire on Redis's real clock: the window outlasts the test.
	const window = 20_000_000 // µs
	maxes := []int64{1, 2, 5, 60, 700, 1500}
	for _, seed := range []uint64{1, 2, 3} {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 0))
			prefix := testPrefix(t)
			models := make([]logModel, len(maxes))
			var tokens [][]int64 // admissions of each key not yet refunded
			tokens = make([][]int64, len(maxes))
			key := func(i int) string { return prefix + "{c" + strconv.Itoa(i) + "}:z" }
			check := func(i int) Check {
				return Check{Zone: "z", Key: "c" + strconv.Itoa(i), Limit: Limit{Window: window * time.Microsecond, Max: maxes[i]}}
			}
			now := int64(1_700_000_000_000_000)
			denials := make([]int, len(maxes))
			for step := range 8000 {
				switch r := rng.IntN(1000); {
				case r < 3:
					now -= rng.Int64N(3000) // Redis's clock stepping back
				case r < 5:
					now += rng.Int64N(window / 2)
				case r < 600:
					now += rng.Int64N(10_000)
				}
				var reqs []*scriptReq
				var want [][]Decision
				for range 1 + rng.IntN(6) {
					// Half the requests go to the large rings, to fill them.
					i := rng.IntN(len(maxes))
					if rng.IntN(2) == 0 {
						i = len(maxes) - 1 - rng.IntN(2)
					}
					c := check(i)
					switch r := rng.IntN(10); {
					case r == 0 && len(tokens[i]) > 0:
						j := rng.IntN(len(tokens[i]))
						tok := tokens[i][j]
						tokens[i] = append(tokens[i][:j], tokens[i][j+1:]...)
						models[i].refund(tok)
						reqs = append(reqs, &scriptReq{op: opRefund, keys: []string{key(i)}, checks: []Check{c}, decisions: []Decision{{token: tok}}})
						want = append(want, nil)
					case r == 1:
						reqs = append(reqs, &scriptReq{op: opPeek, keys: []string{key(i)}, checks: []Check{c}})
						want = append(want, []Decision{models[i].decide(now, window, maxes[i], false)})
					default:
						reqs = append(reqs, &scriptReq{op: opAllow, keys: []string{key(i)}, checks: []Check{c}})
						d := models[i].decide(now, window, maxes[i], true)
						if d.token >= 0 {
							tokens[i] = append(tokens[i], d.token)
						}
						want = append(want, []Decision{d})
					}
				}
				runScript(t, testClient, now, reqs...)
				for k, r := range reqs {
					if want[k] == nil {
						continue
					}
					if !want[k][0].Allowed {
						denials[slices.Index(maxes, r.checks[0].Limit.Max)]++
					}
					if got := r.decisions[0]; got != want[k][0] {
						t.Fatalf("step %d, %s of key %s (max %d) at %d: got %+v, want %+v",
							step, []string{"peek", "allow"}[r.op], r.keys[0], r.checks[0].Limit.Max, now, got, want[k][0])
					}
				}
			}
			for i := range maxes {
				if models[i].times == nil {
					continue
				}
				ring := readRing(t, testClient, key(i))
				if int64(ring.cap) > maxes[i] {
					t.Errorf("key of max %d: ring of cap %d", maxes[i], ring.cap)
				}
				// The schedule must reach every limit, or it tests little.
				if denials[i] == 0 {
					t.Errorf("key of max %d: never denied", maxes[i])
				}
				t.Logf("key of max %d: %d denials, ring of cap %d with head %d", maxes[i], denials[i], ring.cap, ring.head)
			}
		})
	}
}

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
		if !d.Allowed || d.token != step.want {
			t.Fatalf("admission %d at %d: %+v, want recorded at %d", i+1, step.now, d, step.want)
		}
	}
	if got := readRing(t, testClient, key).times; len(got) != 6 || got[5] != t0+500 {
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
	if !r.d.Allowed || r.d.token != future+1 {
		t.Errorf("admission on Redis's clock after one at %d: %+v, want recorded at %d", future, r.d, future+1)
	}
	if got := readRing(t, testClient, key).times; len(got) != 2 || got[1] != future+1 {
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
	if ring := readRing(t, testClient, key); ring.cap != 1 || len(ring.times) != 1 {
		t.Errorf("ring of max 1: cap %d, %d times; want 1, 1", ring.cap, len(ring.times))
	}
}

// TestRingMax100000: a hundred thousand admissions fill the ring, the next
// one is denied until the oldest ages out, remaining and reset are exact
// throughout, and a refund in the middle frees exactly one slot.
func TestRingMax100000(t *testing.T) {
	const (
		max    = 100_000
		window = 10 * time.Second
		t0     = 1_700_000_000_000_000
		batch  = 250
	)
	c := Check{Zone: "z", Key: testKey(t), Limit: Limit{Window: window, Max: max}}
	key := testPrefix(t) + "{" + c.Key + "}:z"
	var tokens []int64
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
			tokens = append(tokens, d.token)
		}
	}
	ring := readRing(t, testClient, key)
	if ring.cap != max || len(ring.times) != max || ring.times[0] != t0 {
		t.Fatalf("ring: cap %d, %d times from %d; want %d from %d", ring.cap, len(ring.times), ring.times[0], max, int64(t0))
	}
	last := int64(t0 + (max/batch-1)*10)
	deny := &scriptReq{op: opAllow, keys: []string{key}, checks: []Check{c}}
	runScript(t, testClient, last+1, deny)
	if d := deny.decisions[0]; d.Allowed || d.RetryAfter != window-time.Duration(last+1-t0)*time.Microsecond {
		t.Fatalf("admission %d: %+v, want denied until the oldest ages out", max+1, d)
	}
	// Refund one from the middle: one slot frees at once.
	refund := &scriptReq{op: opRefund, keys: []string{key}, checks: []Check{c}, decisions: []Decision{{token: tokens[max/2]}}}
	runScript(t, testClient, last+2, refund)
	peek := &scriptReq{op: opPeek, keys: []string{key}, checks: []Check{c}}
	runScript(t, testClient, last+3, peek)
	if d := peek.decisions[0]; !d.Allowed || d.Remaining != 1 {
		t.Fatalf("after a refund in a full ring of %d: %+v, want Allowed with Remaining 1", max, d)
	}
	ring = readRing(t, testClient, key)
	if len(ring.times) != max-1 || ring.times[max/2] != tokens[max/2+1] {
		t.Fatalf("after the refund: %d times, time %d = %d; want %d, %d", len(ring.times), max/2, ring.times[max/2], max-1, tokens[max/2+1])
	}
	// Once the oldest ages out, each admission overwrites the oldest slot.
	for i := range 3 {
		now := t0 + window.Microseconds() + int64(i)*10
		r := &scriptReq{op: opAllow, keys: []string{key}, checks: []Check{c}}
		runScript(t, testClient, now, r)
		if d := r.decisions[0]; !d.Allowed {
			t.Fatalf("admission after the oldest aged out, %d: %+v", i, d)
		}
	}
	if ring := readRing(t, testClient, key); len(ring.times) != max || ring.cap != max {
		t.Errorf("ring after wrapping: cap %d, %d times; want %d", ring.cap, len(ring.times), max)
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
	if ring := readRing(t, testClient, s.Key(c.Zone, c.Key)); ring.cap != 8 || len(ring.times) != 5 {
		t.Errorf("ring after 5 admissions under max 1e9: cap %d, %d times; want 8, 5", ring.cap, len(ring.times))
	}
}

// writeSortedSet writes key in the layout of the previous version: member =
// sequence number, score = admission time in microseconds.
func writeSortedSet(t *testing.T, key string, times []int64, ttl time.Duration) {
	t.Helper()
	ctx := context.Background()
	members := make([]redis.Z, len(times))
	for i, at := range times {
		members[i] = redis.Z{Score: float64(at), Member: strconv.Itoa(i)}
	}
	if err := testClient.ZAdd(ctx, key, members...).Err(); err != nil {
		t.Fatal(err)
	}
	if err := testClient.PExpire(ctx, key, ttl).Err(); err != nil {
		t.Fatal(err)
	}
}

// redisNow returns Redis's clock in microseconds.
func redisNow(t *testing.T) int64 {
	t.Helper()
	now, err := testClient.Time(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	return now.UnixMicro()
}

// TestRingConvertsSortedSet: a key in the previous version's sorted-set
// layout becomes a ring of its admissions still in the window, with the
// same answers, on its first touch; so does a peek, and a denied request
// leaves the converted state in place.
func TestRingConvertsSortedSet(t *testing.T) {
	s := newRedisStore(t, testClient, testPrefix(t))
	const window = time.Minute
	c := Check{Zone: "z", Key: testKey(t), Limit: Limit{Window: window, Max: 10}}
	key := s.Key(c.Zone, c.Key)
	now := redisNow(t)
	old := now - 2*window.Microseconds()
	in := []int64{now - 30_000_000, now - 20_000_000, now - 10_000_000, now - 5_000_000}
	writeSortedSet(t, key, append([]int64{old, old + 1}, in...), window)

	r := allow1(t, s, c)
	if !r.d.Allowed || r.d.Remaining != 10-4-1 {
		t.Fatalf("first decision after the change: %+v, want Allowed with Remaining 5", r.d)
	}
	checkWithin(t, "Reset", r.d.Reset, time.Duration(in[0]+window.Microseconds()-now)*time.Microsecond-time.Since(r.start), time.Duration(in[0]+window.Microseconds()-now)*time.Microsecond)
	ring := readRing(t, testClient, key)
	if len(ring.times) != 5 || ring.times[0] != in[0] || ring.times[3] != in[3] {
		t.Fatalf("converted ring holds %v, want %v and the new admission", ring.times, in)
	}

	// A full sorted set: the first touch is denied and converts it anyway.
	c.Key = testKey(t)
	key = s.Key(c.Zone, c.Key)
	full := make([]int64, 10)
	for i := range full {
		full[i] = now - 1_000_000*int64(10-i)
	}
	writeSortedSet(t, key, full, window)
	if r := allow1(t, s, c); r.d.Allowed {
		t.Fatalf("full sorted set: %+v, want denied", r.d)
	}
	if got := readRing(t, testClient, key).times; len(got) != 10 || got[0] != full[0] {
		t.Fatalf("converted full ring holds %v, want %v", got, full)
	}
}

// TestRingConversionUnderLoad: clients whose keys are in the sorted-set
// layout, hammered concurrently across the change, get no more than max
// admissions in the window.
func TestRingConversionUnderLoad(t *testing.T) {
	const (
		clients  = 20
		max      = 10
		prefill  = 7
		requests = 60 // per client, from 4 goroutines each
	)
	s := newRedisStore(t, testClient, testPrefix(t))
	lim := Limit{Window: time.Minute, Max: max}
	now := redisNow(t)
	for i := range clients {
		times := make([]int64, prefill)
		for j := range times {
			times[j] = now - 1_000_000*int64(prefill-j)
		}
		writeSortedSet(t, s.Key("z", "c"+strconv.Itoa(i)), times, time.Minute)
	}
	admitted := make([]atomic.Int64, clients)
	var wg sync.WaitGroup
	for i := range clients {
		for range 4 {
			wg.Go(func() {
				checks := []Check{{Zone: "z", Key: "c" + strconv.Itoa(i), Limit: lim}}
				ds := make([]Decision, 1)
				for range requests / 4 {
					if err := s.Allow(context.Background(), checks, ds); err != nil {
						t.Error(err)
						return
					}
					if ds[0].Allowed {
						admitted[i].Add(1)
					}
				}
			})
		}
	}
	wg.Wait()
	for i := range clients {
		if got := admitted[i].Load(); got != max-prefill {
			t.Errorf("client %d: %d admitted across the change, want %d", i, got, max-prefill)
		}
	}
}
