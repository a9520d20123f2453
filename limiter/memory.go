package limiter

import (
	"context"
	"sync"
	"time"
)

// MemoryStore keeps admissions in this process with the same semantics and
// replies as RedisStore, for a single instance or as the fallback while Redis
// is away. Its clock is the process's monotonic clock. Idle keys are dropped
// by a sweep once their admissions have aged out. It is safe for concurrent
// use; Close stops the sweep.
type MemoryStore struct {
	mu    sync.Mutex
	sets  map[memoryKey]*admissions
	epoch time.Time
	done  chan struct{}
	once  sync.Once
}

type memoryKey struct{ zone, client string }

// admissions holds one client's admission times in one zone, oldest first,
// as offsets from the store's epoch.
type admissions struct {
	at     []time.Duration
	window time.Duration
}

// memorySweepInterval is how often idle keys are dropped.
const memorySweepInterval = time.Minute

// NewMemoryStore returns an empty store and starts its sweep.
func NewMemoryStore() *MemoryStore {
	s := &MemoryStore{
		sets:  make(map[memoryKey]*admissions),
		epoch: time.Now(),
		done:  make(chan struct{}),
	}
	go s.sweepEvery(memorySweepInterval)
	return s
}

// Allow implements Store.
func (s *MemoryStore) Allow(_ context.Context, checks []Check, decisions []Decision) error {
	now := time.Since(s.epoch)
	s.mu.Lock()
	defer s.mu.Unlock()

	admit := true
	for i, c := range checks {
		set := s.sets[memoryKey{c.Zone, c.Key}]
		if set != nil {
			set.trim(now, c.Limit.Window)
		}
		d := Decision{Allowed: true, Remaining: c.Limit.Max}
		if set != nil && len(set.at) > 0 {
			d.Remaining -= int64(len(set.at))
			d.Reset = set.at[0] + c.Limit.Window - now
			if count := int64(len(set.at)); count >= c.Limit.Max {
				// The (count-max+1)-th oldest admission must age out first.
				d = Decision{RetryAfter: set.at[count-c.Limit.Max] + c.Limit.Window - now}
				d.Reset = d.RetryAfter
				admit = false
			}
		}
		decisions[i] = d
	}
	if !admit {
		return nil
	}
	for i, c := range checks {
		k := memoryKey{c.Zone, c.Key}
		set := s.sets[k]
		if set == nil {
			set = &admissions{}
			s.sets[k] = set
		}
		set.window = c.Limit.Window
		at := now
		// Strictly increasing, as in the Redis script.
		if n := len(set.at); n > 0 && set.at[n-1] >= at {
			at = set.at[n-1] + 1
		}
		set.at = append(set.at, at)
		decisions[i].Remaining--
		if len(set.at) == 1 {
			decisions[i].Reset = c.Limit.Window
		}
	}
	return nil
}

// trim drops admissions that have left the window ending at now.
func (a *admissions) trim(now, window time.Duration) {
	i := 0
	for i < len(a.at) && a.at[i] <= now-window {
		i++
	}
	a.at = a.at[i:]
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

// sweep drops keys whose newest admission has aged out.
func (s *MemoryStore) sweep() {
	now := time.Since(s.epoch)
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, set := range s.sets {
		if n := len(set.at); n == 0 || set.at[n-1] <= now-set.window {
			delete(s.sets, k)
		}
	}
}

// Len returns how many client keys the store holds.
func (s *MemoryStore) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.sets)
}

// Close stops the sweep. The store still answers afterwards.
func (s *MemoryStore) Close() error {
	s.once.Do(func() { close(s.done) })
	return nil
}
