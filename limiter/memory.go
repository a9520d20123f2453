package limiter

import (
	"context"
	"fmt"
	"math"
	"sync"
	"time"
)

// MemoryStore keeps client state in this process with the same semantics and
// answers as RedisStore, for a single instance or as the fallback while Redis
// is away. Its clock is the process's monotonic clock, in microseconds as
// Redis's. Idle keys are dropped by a sweep once they no longer weigh. It is
// safe for concurrent use; Close stops the sweep.
type MemoryStore struct {
	mu    sync.Mutex
	state map[memoryKey]*memoryState
	// now returns the time in microseconds; tests replace it.
	now    func() int64
	leases uint64
	done   chan struct{}
	once   sync.Once
}

type memoryKey struct{ zone, client string }

// memoryState is one client's state in one zone. Times are microseconds.
type memoryState struct {
	kind Algorithm
	// log holds a log zone's admissions, oldest first, strictly increasing
	// in time. In a count log an admission settled to zero is dropped; in a
	// units log (units) it stays at zero until it is the newest, and
	// admissions close in time merge (see mergeEntries), as in Redis.
	log   []admission
	units bool
	// index, cur and prev are a counter zone's current fixed window and the
	// units in it and in the one before.
	index, cur, prev int64
	// leases are a concurrency zone's lease ids and their expiry.
	leases map[uint64]int64
	// expires is when the state stops weighing on any decision.
	expires int64
	// lastMax is the Max of a log's newest record.
	lastMax int64
}

type admission struct{ at, units int64 }

const (
	// mergeEntries is how many entries a units log keeps before admissions
	// within one span of Window/mergeEntries merge into one entry, which
	// carries their units and the latest of their times: it leaves the
	// window no earlier than any of them would, so the limit holds, and a
	// client may be denied up to a span early. A count log of
	// 4*mergeEntries (3*mergeEntries if Max is above 4*mergeEntries, which a
	// count log reaches only with waits) becomes a units log.
	mergeEntries = 256
	// maxEntries bounds a log: past it, every admission merges into the
	// newest entry. A units entry is 12 bytes in Redis: 14.3 KB with the
	// header, under 16 KB with Redis's own. A ring reaches it only with
	// waits beyond the window: then the merge span no longer bounds how
	// early a client may be denied.
	maxEntries = 1170
)

// countToUnits reports whether a count log of n admissions before a record
// under max becomes a units log, which merges.
func countToUnits(n int, max int64) bool {
	return n >= 4*mergeEntries || n >= 3*mergeEntries && max > 4*mergeEntries
}

// mergeSpan is the span, in microseconds, within which a units log of w
// merges admissions.
func mergeSpan(w int64) int64 { return max(1, w/mergeEntries) }

// memorySweepInterval is how often idle keys are dropped.
const memorySweepInterval = time.Minute

// NewMemoryStore returns an empty store and starts its sweep.
func NewMemoryStore() *MemoryStore {
	epoch := time.Now()
	s := newMemoryStoreAt(func() int64 { return time.Since(epoch).Microseconds() })
	go s.sweepEvery(memorySweepInterval)
	return s
}

// newMemoryStoreAt returns an empty store on the clock now, with no sweep:
// a test's clock, which only the test's goroutine moves.
func newMemoryStoreAt(now func() int64) *MemoryStore {
	return &MemoryStore{state: make(map[memoryKey]*memoryState), now: now, done: make(chan struct{})}
}

// Allow implements Store.
func (s *MemoryStore) Allow(_ context.Context, checks []Check, decisions []Decision) error {
	return s.decide(methodAllow, checks, decisions)
}

// Peek implements Store.
func (s *MemoryStore) Peek(_ context.Context, checks []Check, decisions []Decision) error {
	return s.decide(methodPeek, checks, decisions)
}

// Reset implements Store.
func (s *MemoryStore) Reset(_ context.Context, zone, key string) error {
	s.mu.Lock()
	delete(s.state, memoryKey{zone, key})
	s.mu.Unlock()
	return nil
}

// zoneDecision is one zone's part of a decision, as limit.lua computes it.
type zoneDecision struct {
	st   *memoryState
	room int64
	// held is the units in the window (leases held), reset the time until
	// some leave; f is the first admission in a log's window.
	held  float64
	reset int64
	f     int
	ok    bool
}

// decide mirrors limit.lua's decision: every zone, then the admission time,
// then the records when m is methodAllow and all admit.
func (s *MemoryStore) decide(m method, checks []Check, decisions []Decision) error {
	if err := checkInput(checks, decisions); err != nil {
		return err
	}
	wait := microseconds(requestWait(checks))
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	zs := make([]zoneDecision, len(checks))
	at, admit := now, true
	for i, c := range checks {
		z := &zs[i]
		z.st = s.state[memoryKey{c.Zone, c.Key}]
		if z.st == nil || z.st.kind != c.Limit.Algorithm {
			z.st = &memoryState{kind: c.Limit.Algorithm}
		}
		z.st.decide(z, now, c.Limit, reserved(c))
		zoneWait := int64(0)
		if c.Limit.Algorithm == SlidingLog {
			zoneWait = wait
		}
		z.ok = reserved(c) <= c.Limit.Max && z.room-now <= zoneWait
		if z.ok {
			at = max(at, z.room)
		} else {
			admit = false
		}
	}
	for i, c := range checks {
		z, cost := &zs[i], reserved(c)
		d := Decision{Allowed: z.ok, Never: cost > c.Limit.Max}
		if m == methodPeek && c.Limit.Algorithm == SlidingLog {
			d.LastMax = z.st.lastMax
		}
		if admit {
			d.Delay = time.Duration(at-now) * time.Microsecond
			if m == methodAllow {
				s.state[memoryKey{c.Zone, c.Key}] = z.st
				d.held = z.st.record(z, now, at, c.Limit, cost)
				if c.Limit.Algorithm == Concurrency {
					s.leases++
					d.held.lease = s.leases
					z.st.leases[d.held.lease] = at + microseconds(c.Limit.Window)
				}
			}
		}
		if !z.ok && !d.Never {
			z.reset = z.room - now
			d.RetryAfter = time.Duration(z.reset) * time.Microsecond
			if c.Limit.Algorithm == SlidingLog {
				d.RetryAfter -= time.Duration(wait) * time.Microsecond
			}
		} else if d.Never {
			z.reset = 0
		}
		d.Remaining = max(0, int64(math.Floor(float64(c.Limit.Max)-z.held)))
		d.Reset = time.Duration(z.reset) * time.Microsecond
		decisions[i] = d
	}
	return nil
}

// decide fills z for a request of cost under l at now, writing nothing.
func (st *memoryState) decide(z *zoneDecision, now int64, l Limit, cost int64) {
	w := microseconds(l.Window)
	z.room, z.reset = now, 0
	switch l.Algorithm {
	case SlidingLog:
		n := len(st.log)
		f := 0
		for f < n && (st.log[f].at <= now-w || st.log[f].units == 0) {
			f++ // aged out, or holding nothing: the window starts after it
		}
		var total, before int64
		for i, a := range st.log {
			total += a.units
			if i < f {
				before += a.units
			}
		}
		z.f, z.held = f, float64(total-before)
		if f < n {
			z.reset = st.log[f].at + w - now
		}
		if total-before+cost > l.Max && cost <= l.Max {
			// The newest admission that must age out for cost to fit.
			target, sum := total+cost-l.Max, int64(0)
			for _, a := range st.log {
				sum += a.units
				if sum >= target {
					z.room = a.at + w
					break
				}
			}
		}
	case SlidingCounter:
		c, p := st.rolled(now, w)
		W, e := float64(w), float64(now-now/w*w)
		z.held = float64(p)*(W-e)/W + float64(c)
		need := l.Max - cost
		if z.held > float64(need) && need >= 0 {
			if c <= need && p > 0 {
				z.room = now + int64(math.Ceil(W-float64(need-c)*W/float64(p)-e))
			} else {
				z.room = now + int64(math.Ceil((W-e)+W-float64(need)*W/float64(c)))
			}
		}
		z.reset = counterReset(c, p, W, e)
	case Concurrency:
		first := int64(math.MaxInt64)
		for _, exp := range st.leases {
			if exp > now {
				z.held++
				first = min(first, exp)
			}
		}
		if z.held > 0 {
			z.reset = first - now
		}
		if z.held+1 > float64(l.Max) {
			z.room = now + z.reset
		}
	}
}

// rolled returns a counter's units in the fixed window holding now and in
// the one before, as the state would roll to them.
func (st *memoryState) rolled(now, w int64) (c, p int64) {
	index := now / w
	switch {
	case st.index < index-1:
		return 0, 0
	case st.index == index-1:
		return 0, st.cur
	}
	return st.cur, st.prev
}

// counterReset is the time until a counter's estimate next falls by about
// one unit.
func counterReset(c, p int64, W, e float64) int64 {
	switch {
	case p > 0:
		return int64(math.Min(math.Ceil(W/float64(p)), W-e))
	case c > 0:
		return int64(math.Ceil((W - e) + W/float64(c)))
	}
	return 0
}

// record records an admission that decide admitted, at admission time at,
// and returns what it holds.
func (st *memoryState) record(z *zoneDecision, now, at int64, l Limit, cost int64) holding {
	w := microseconds(l.Window)
	z.held += float64(cost)
	switch l.Algorithm {
	case SlidingLog:
		if n := len(st.log); n > 0 && st.log[n-1].at >= at {
			at = st.log[n-1].at + 1
		}
		st.log = st.log[z.f:]
		if len(st.log) == 0 && cost == 1 {
			st.units = false // all aged out: a count log again
		}
		n, span := len(st.log), mergeSpan(w)
		if st.units && n > 0 && (n >= mergeEntries && at/span == st.log[n-1].at/span || n >= maxEntries) {
			// Merged into the newest: their units at the latest time.
			st.log[n-1] = admission{at, st.log[n-1].units + cost}
		} else {
			st.log = append(st.log, admission{at, cost})
			st.units = st.units || cost != 1 || countToUnits(n, l.Max)
		}
		st.expires, st.lastMax = at+w, l.Max
		if z.reset == 0 {
			z.reset = at + w - now
		}
		return holding{recorded: true, at: at, units: cost}
	case SlidingCounter:
		c, p := st.rolled(now, w)
		e := now - now/w*w
		st.index, st.cur, st.prev = now/w, c+cost, p
		st.expires = now - e + 2*w
		if p == 0 {
			z.reset = counterReset(c+cost, 0, float64(w), float64(e))
		}
		return holding{recorded: true, at: st.index, units: cost}
	}
	for id, exp := range st.leases {
		if exp <= now {
			delete(st.leases, id)
		}
	}
	if st.leases == nil {
		st.leases = make(map[uint64]int64)
	}
	if exp := at + w - now; z.reset == 0 || exp < z.reset {
		z.reset = exp
	}
	st.expires = max(st.expires, at+w)
	return holding{recorded: true, units: 1}
}

// Settle implements Store.
func (s *MemoryStore) Settle(_ context.Context, checks []Check, decisions []Decision) error {
	if err := checkInput(checks, decisions); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	for i, c := range checks {
		h := decisions[i].held
		decisions[i].held = holding{}
		k := memoryKey{c.Zone, c.Key}
		st := s.state[k]
		if !h.recorded {
			continue
		}
		if st == nil || st.kind != c.Limit.Algorithm {
			if c.Cost == 0 || c.Limit.Algorithm == Concurrency {
				continue
			}
			st = &memoryState{kind: c.Limit.Algorithm}
			s.state[k] = st
		}
		decisions[i].Lifts, decisions[i].charged = st.settle(h, now, c.Limit, c.Cost)
	}
	return nil
}

// settle takes back what h reserved and charges cost units from now: the
// real cost counts from when the response ended, however long it ran. It
// reports whether the zone had no room for h's reservation before (see
// Decision.Lifts).
func (st *memoryState) settle(h holding, now int64, l Limit, cost int64) (lifts bool, charged int64) {
	w := microseconds(l.Window)
	if st.kind != Concurrency {
		var z zoneDecision
		st.decide(&z, now, l, 0)
		lifts = max(0, int64(math.Floor(float64(l.Max)-z.held))) < h.units
		if h.floor {
			cost = max(0, cost-int64(math.Ceil(z.held)))
		}
	}
	switch st.kind {
	case SlidingLog:
		// The reservation is in the first entry at or after it: its own, or
		// one of its span it merged into.
		span := mergeSpan(w)
		for i, a := range st.log {
			if a.at < h.at {
				continue
			}
			switch {
			case a.at == h.at && !st.units:
				st.log = append(st.log[:i], st.log[i+1:]...)
			case a.at == h.at || st.units && h.at > now-w && a.at/span == h.at/span:
				st.log[i].units -= min(a.units, h.units)
				for len(st.log) > 0 && st.log[len(st.log)-1].units == 0 {
					st.log = st.log[:len(st.log)-1]
				}
			}
			break
		}
		if len(st.log) == 0 {
			// Redis drops an empty ring: it starts over as a count ring, its max unknown.
			st.units, st.lastMax = false, 0
		}
		if cost == 0 {
			return lifts, 0
		}
		// Recorded at its room, as a wait would be (now unless promised
		// slots or other charges fill the window): every window stays
		// within Max.
		var z zoneDecision
		st.decide(&z, now, l, cost)
		// Sums are kept modulo 2^48 in Redis: what a zone holds saturates.
		charged = st.record(&z, now, z.room, l, min(cost, maxUnits-int64(z.held))).at
	case SlidingCounter:
		c, p := st.rolled(now, w)
		switch now / w {
		case h.at:
			c = max(0, c-h.units)
		case h.at + 1:
			p = max(0, p-h.units)
		}
		st.index, st.cur, st.prev = now/w, c+cost, p
		st.expires = now - now%w + 2*w
	case Concurrency:
		delete(st.leases, h.lease)
	}
	return lifts, charged
}

// Extend implements Store: it extends the leases, then moves the log
// zones' reservations with Settle (holdReservations).
func (s *MemoryStore) Extend(ctx context.Context, checks []Check, decisions []Decision) error {
	if err := checkInput(checks, decisions); err != nil {
		return err
	}
	lost := s.extendLeases(checks, decisions)
	if err := holdReservations(ctx, checks, decisions, s.Settle); err != nil {
		return err
	}
	if lost > 0 {
		return fmt.Errorf("extending leases: %d of them: %w", lost, ErrLeaseLost)
	}
	return nil
}

// extendLeases restarts the lease time of the leases that decisions hold,
// and returns how many had expired; their decisions are marked as settled.
func (s *MemoryStore) extendLeases(checks []Check, decisions []Decision) (lost int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	for i, c := range checks {
		h := decisions[i].held
		if h.lease == 0 {
			continue
		}
		st := s.state[memoryKey{c.Zone, c.Key}]
		if st == nil || st.kind != Concurrency || st.leases[h.lease] <= now {
			decisions[i].held = holding{}
			lost++
			continue
		}
		exp := now + microseconds(c.Limit.Window)
		st.leases[h.lease] = exp
		st.expires = max(st.expires, exp)
	}
	return lost
}

func (s *MemoryStore) sweepEvery(interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-s.done:
			return
		case <-t.C:
			s.sweep()
		}
	}
}

// sweep drops state that no longer weighs on any decision.
func (s *MemoryStore) sweep() {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	for k, st := range s.state {
		if st.expires <= now {
			delete(s.state, k)
		}
	}
}

// len returns how many (zone, client) states the store holds.
func (s *MemoryStore) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.state)
}

// Close stops the sweep. The store still answers afterwards.
func (s *MemoryStore) Close() error {
	s.once.Do(func() { close(s.done) })
	return nil
}

// Interface guards
var _ Store = (*MemoryStore)(nil)
