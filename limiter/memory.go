package limiter

import (
	"context"
	"math"
	"slices"
	"sync"
	"time"
)

// MemoryStore keeps client state in this process with the same semantics and
// replies as RedisStore, for a single instance or as the fallback while Redis
// is away. Its clock is the process's monotonic clock. Idle keys are dropped
// by a sweep once they no longer weigh. It is safe for concurrent use; Close
// stops the sweep.
type MemoryStore struct {
	mu    sync.Mutex
	state map[memoryKey]*memoryState
	// clock returns the time since the store started; tests replace it.
	clock func() time.Duration
	done  chan struct{}
	once  sync.Once
}

type memoryKey struct{ zone, client string }

// memoryState is one client's state in one zone. Times are offsets from the
// store's epoch.
type memoryState struct {
	// at holds the admission times of a log zone, oldest first.
	at []time.Duration
	// index, cur and prev are a counter zone's current fixed window and the
	// admissions in it and in the one before.
	index, cur, prev int64
	// expires is when the state stops weighing on any decision.
	expires time.Duration
}

// memorySweepInterval is how often idle keys are dropped.
const memorySweepInterval = time.Minute

// NewMemoryStore returns an empty store and starts its sweep.
func NewMemoryStore() *MemoryStore {
	epoch := time.Now()
	s := &MemoryStore{
		state: make(map[memoryKey]*memoryState),
		clock: func() time.Duration { return time.Since(epoch) },
		done:  make(chan struct{}),
	}
	go s.sweepEvery(memorySweepInterval)
	return s
}

// Allow implements Store.
func (s *MemoryStore) Allow(_ context.Context, checks []Check, decisions []Decision) error {
	s.decide(true, checks, decisions)
	return nil
}

// Peek implements Inspector.
func (s *MemoryStore) Peek(_ context.Context, checks []Check, decisions []Decision) error {
	s.decide(false, checks, decisions)
	return nil
}

// Reset implements Inspector.
func (s *MemoryStore) Reset(_ context.Context, zone, key string) error {
	s.mu.Lock()
	delete(s.state, memoryKey{zone, key})
	s.mu.Unlock()
	return nil
}

// decide mirrors limit.lua: evaluate every zone, then record in all of them
// only if record is set and all admit.
func (s *MemoryStore) decide(record bool, checks []Check, decisions []Decision) {
	now := s.clock()
	s.mu.Lock()
	defer s.mu.Unlock()

	admit := true
	for i, c := range checks {
		st := s.state[memoryKey{c.Zone, c.Key}]
		if st == nil {
			st = &memoryState{}
		}
		decisions[i] = st.evaluate(now, c.Limit)
		if !decisions[i].Allowed {
			admit = false
		}
	}
	if !record || !admit {
		return
	}
	for i, c := range checks {
		k := memoryKey{c.Zone, c.Key}
		st := s.state[k]
		if st == nil {
			st = &memoryState{}
			s.state[k] = st
		}
		decisions[i] = st.record(now, c.Limit)
	}
}

// evaluate trims or rolls the state to now and decides without recording.
func (st *memoryState) evaluate(now time.Duration, l Limit) Decision {
	if l.Algorithm == SlidingCounter {
		count, elapsed := st.roll(now, l.Window)
		if count+1 <= float64(l.Max) {
			return Decision{Allowed: true, Remaining: int64(float64(l.Max) - count), Reset: st.counterReset(l.Window, elapsed), token: -1}
		}
		wait := st.counterWait(l, elapsed)
		return Decision{Reset: wait, RetryAfter: wait, token: -1}
	}
	st.trim(now, l.Window)
	n := int64(len(st.at))
	if n >= l.Max {
		// The (n-max+1)-th oldest admission must age out first.
		wait := st.at[n-l.Max] + l.Window - now
		return Decision{Reset: wait, RetryAfter: wait, token: -1}
	}
	d := Decision{Allowed: true, Remaining: l.Max - n, token: -1}
	if n > 0 {
		d.Reset = st.at[0] + l.Window - now
	}
	return d
}

// record adds one admission; evaluate must have admitted it at the same now.
func (st *memoryState) record(now time.Duration, l Limit) Decision {
	if l.Algorithm == SlidingCounter {
		count, elapsed := st.roll(now, l.Window)
		st.cur++
		st.expires = now - elapsed + 2*l.Window
		return Decision{Allowed: true, Remaining: int64(math.Floor(float64(l.Max) - (count + 1))), Reset: st.counterReset(l.Window, elapsed), token: st.index}
	}
	d := Decision{Allowed: true, Remaining: l.Max - int64(len(st.at)) - 1, Reset: l.Window}
	if len(st.at) > 0 {
		d.Reset = st.at[0] + l.Window - now
	}
	at := now
	// Strictly increasing, as in the Redis script.
	if n := len(st.at); n > 0 && st.at[n-1] >= at {
		at = st.at[n-1] + 1
	}
	st.at = append(st.at, at)
	st.expires = at + l.Window
	d.token = int64(at)
	return d
}

// Refund implements Refunder.
func (s *MemoryStore) Refund(_ context.Context, checks []Check, decisions []Decision) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, c := range checks {
		token := decisions[i].token
		decisions[i].token = -1
		if token < 0 {
			continue
		}
		if st := s.state[memoryKey{c.Zone, c.Key}]; st != nil {
			st.refund(c.Limit, token)
		}
	}
	return nil
}

// refund takes back the admission whose token record returned.
func (st *memoryState) refund(l Limit, token int64) {
	if l.Algorithm == SlidingCounter {
		switch {
		case st.index == token && st.cur > 0:
			st.cur--
		case st.index == token+1 && st.prev > 0:
			st.prev--
		}
		return
	}
	at := time.Duration(token)
	if i, found := slices.BinarySearch(st.at, at); found {
		st.at = slices.Delete(st.at, i, i+1)
	}
}

// trim drops admissions that have left the window ending at now.
func (st *memoryState) trim(now, window time.Duration) {
	i := 0
	for i < len(st.at) && st.at[i] <= now-window {
		i++
	}
	st.at = st.at[i:]
}

// roll moves a counter to the fixed window holding now and returns the
// weighted count and the time elapsed in the current fixed window.
func (st *memoryState) roll(now, window time.Duration) (count float64, elapsed time.Duration) {
	index := int64(now / window)
	switch {
	case st.index == index:
	case st.index == index-1:
		st.prev, st.cur = st.cur, 0
	default:
		st.prev, st.cur = 0, 0
	}
	st.index = index
	elapsed = now - time.Duration(index)*window
	w := float64(window)
	return float64(st.prev)*(w-float64(elapsed))/w + float64(st.cur), elapsed
}

// counterWait is the time until a counter's estimate admits one more.
func (st *memoryState) counterWait(l Limit, elapsed time.Duration) time.Duration {
	w, e, c, p, max := float64(l.Window), float64(elapsed), float64(st.cur), float64(st.prev), float64(l.Max)
	if c+1 <= max && p > 0 {
		return time.Duration(math.Ceil(w - (max-1-c)*w/p - e))
	}
	return time.Duration(math.Ceil((w - e) + w - (max-1)*w/c))
}

// counterReset is the time until a counter's estimate next falls by about one.
func (st *memoryState) counterReset(window, elapsed time.Duration) time.Duration {
	switch {
	case st.prev > 0:
		return min(window/time.Duration(st.prev), window-elapsed)
	case st.cur > 0:
		return window - elapsed + window/time.Duration(st.cur)
	}
	return 0
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
	now := s.clock()
	s.mu.Lock()
	defer s.mu.Unlock()
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
var (
	_ Store     = (*MemoryStore)(nil)
	_ Inspector = (*MemoryStore)(nil)
	_ Refunder  = (*MemoryStore)(nil)
)
