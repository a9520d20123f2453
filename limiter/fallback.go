package limiter

import (
	"context"
	"hash/maphash"
	"sync"
	"sync/atomic"
)

// Fallback decides in process while the shared store (Redis) is away, for
// fail_mode local, and for the clients a full Redis still holds but can no
// longer record for. Deciding from nothing would hand every client a fresh
// limit on every instance at each outage (a failover among them); so a
// Fallback starts from what the shared store last said of each client it
// saw recently (Observe, or Sighted for a store that answers only reads),
// and decides with this instance's share of each limit: Max divided by the
// instances that decide beside it (the count its caller gives), the units
// the store held divided the same way. The instances then admit together
// at most what the store had left, whatever the outage's length. When the
// store answers again (Recovered), what was admitted here is charged to it,
// so it is not forgotten in the window that spans the outage.
//
// A Fallback implements Store: its decisions are those of its MemoryStore,
// which may be shared with other Fallbacks and handlers. Concurrency zones
// take their share of leases but start from none, since leases are held
// and let go too fast for a store's last word on them to last. It is safe
// for concurrent use.
type Fallback struct {
	local *MemoryStore
	// instances counts the instances that share each limit, this one
	// included.
	instances func() int
	seed      maphash.Seed
	shards    [fallbackShards]fallbackShard
	// episode numbers the outages: a sighting is seeded into the local
	// store once in each. It starts at 1, so that 0 means never seeded.
	episode atomic.Uint64
	// active is set by each local decision and cleared by Recovered.
	active atomic.Bool
	// lost is set when the shared store failed, and may have lost what it
	// held, until Repair or Kept (see Lost).
	lost atomic.Bool
}

const (
	// fallbackShards spreads the sightings over locks.
	fallbackShards = 16
	// fallbackShardClients bounds a shard's sightings: 65,536 clients in
	// all, about 6 MB at most.
	fallbackShardClients = 4096
	// replayBatch is how many owed charges one call to the shared store
	// carries.
	replayBatch = 100
)

type fallbackShard struct {
	mu sync.Mutex
	// seen holds what the shared store last said of each client.
	seen map[memoryKey]sighting
	// owed holds the units admitted in process since the outage began.
	owed map[memoryKey]owedCharge
	// swept is when makeRoom last dropped what no longer weighs.
	swept int64
}

// sighting is what the shared store said of one client in one zone; times
// are the local store's clock, in microseconds.
type sighting struct {
	// limit is the zone's, as the check that was answered gave it.
	limit Limit
	// used is the units the client held in the window, this request's
	// included.
	used int64
	// oldest is when its oldest admission in the window was recorded, as
	// near as the answer tells (never earlier), at when the answer came,
	// expires when it no longer weighs on any decision.
	oldest, at, expires int64
	// seeded is the episode in which the sighting was seeded into the
	// local store; 0 if never.
	seeded uint64
}

// owedCharge is what one client's local admissions owe the shared store.
type owedCharge struct {
	check Check
	units int64
}

// NewFallback returns a Fallback that decides in local, sharing each limit
// among instances() instances (fewer than 1 counts as 1).
func NewFallback(local *MemoryStore, instances func() int) *Fallback {
	f := &Fallback{local: local, instances: instances, seed: maphash.MakeSeed()}
	f.episode.Store(1)
	for i := range f.shards {
		f.shards[i].seen = make(map[memoryKey]sighting)
		f.shards[i].owed = make(map[memoryKey]owedCharge)
	}
	return f
}

func (f *Fallback) shard(k memoryKey) *fallbackShard {
	return &f.shards[maphash.String(f.seed, k.client)%fallbackShards]
}

// Observe records what the shared store answered to an Allow of checks: the
// latest word on each client, which the next outage starts from.
func (f *Fallback) Observe(checks []Check, decisions []Decision) {
	if f.lost.Load() {
		// The store may have lost what it held: its answers until the
		// repair would overwrite what it had said before (see Lost).
		return
	}
	f.sight(checks, decisions, true)
}

// Sighted records what the shared store answered to a Peek of checks, for
// the clients that no local decision of this outage started from yet (the
// local store knows more of those that one did), and reports whether the
// store holds units of the client in any of the zones: a client it counts.
func (f *Fallback) Sighted(checks []Check, peeked []Decision) (known bool) {
	return f.sight(checks, peeked, false)
}

func (f *Fallback) sight(checks []Check, decisions []Decision, overwrite bool) (known bool) {
	now, episode := f.local.now(), f.episode.Load()
	for i, c := range checks {
		if c.Limit.Algorithm == Concurrency || decisions[i].Never {
			continue
		}
		w := microseconds(c.Limit.Window)
		s := sighting{limit: c.Limit, used: max(0, c.Limit.Max-decisions[i].Remaining), oldest: now, at: now, expires: now + w}
		if r := microseconds(decisions[i].Reset); s.limit.Algorithm == SlidingLog && r > 0 && r < w {
			s.oldest = now + r - w
		}
		if s.limit.Algorithm == SlidingCounter {
			s.expires = now + 2*w
		}
		known = known || s.used > 0
		k := memoryKey{c.Zone, c.Key}
		sh := f.shard(k)
		sh.mu.Lock()
		old, had := sh.seen[k]
		switch {
		case had && !overwrite && old.seeded == episode:
		case had || s.used > 0:
			if !had && len(sh.seen) >= fallbackShardClients {
				sh.makeRoom(now)
			}
			sh.seen[k] = s
		}
		sh.mu.Unlock()
	}
	return known
}

// makeRoom drops the sightings that no longer weigh, at most once a second
// (a scan of the shard), and one at random while the shard is still full;
// sh.mu must be held.
func (sh *fallbackShard) makeRoom(now int64) {
	if now-sh.swept >= 1e6 {
		sh.swept = now
		for k, s := range sh.seen {
			if s.expires <= now {
				delete(sh.seen, k)
			}
		}
	}
	for k := range sh.seen {
		if len(sh.seen) < fallbackShardClients {
			return
		}
		delete(sh.seen, k)
	}
}

// Seeded reports whether a local decision of this outage started from each
// check's client already (in log and counter zones; false if checks has
// none): then asking the store again tells no more.
func (f *Fallback) Seeded(checks []Check) bool {
	episode, counted := f.episode.Load(), false
	for _, c := range checks {
		if c.Limit.Algorithm == Concurrency {
			continue
		}
		counted = true
		k := memoryKey{c.Zone, c.Key}
		sh := f.shard(k)
		sh.mu.Lock()
		s, ok := sh.seen[k]
		sh.mu.Unlock()
		if !ok || s.seeded != episode {
			return false
		}
	}
	// A request of concurrency zones only: no store's word to start from.
	return counted
}

// share is one instance's part of limit among n: at least 1 of a limit that
// admits anything, so that small limits do not shut while Redis is away.
func share(limit int64, n int) int64 {
	if limit <= 0 || n <= 1 {
		return limit
	}
	return max(1, limit/int64(n))
}

// Active reports whether a local decision was made since the last
// Recovered.
func (f *Fallback) Active() bool { return f.active.Load() }

// Allow implements Store: each check decided with this instance's share of
// its limit, each client started, once an outage, from what the shared
// store last said of it.
func (f *Fallback) Allow(ctx context.Context, checks []Check, decisions []Decision) error {
	n := max(1, f.instances())
	local := f.local.shared(checks, n)
	episode := f.episode.Load()
	f.active.Store(true)
	for _, c := range checks {
		f.seedOnce(c, episode, n)
	}
	if err := f.local.Allow(ctx, local, decisions); err != nil {
		return err
	}
	if !Admitted(decisions) {
		return nil
	}
	for i, c := range checks {
		f.owe(c, decisions[i].held.units)
	}
	return nil
}

// seedOnce starts the local store's state of c's client from its sighting,
// if this outage has not started from it yet.
func (f *Fallback) seedOnce(c Check, episode uint64, n int) {
	if c.Limit.Algorithm == Concurrency {
		return
	}
	k := memoryKey{c.Zone, c.Key}
	sh := f.shard(k)
	sh.mu.Lock()
	s, ok := sh.seen[k]
	if !ok || s.seeded == episode {
		sh.mu.Unlock()
		return
	}
	s.seeded = episode
	sh.seen[k] = s
	sh.mu.Unlock()
	if s.limit.Algorithm != c.Limit.Algorithm || s.expires <= f.local.now() {
		return
	}
	// This instance's share of what the store held, rounded up.
	used := (s.used + int64(n) - 1) / int64(n)
	f.local.seed(c, used, s.oldest, s.at)
}

// owe adds units admitted in process to what c's client owes the shared
// store.
func (f *Fallback) owe(c Check, units int64) {
	if c.Limit.Algorithm == Concurrency || units == 0 {
		return
	}
	k := memoryKey{c.Zone, c.Key}
	sh := f.shard(k)
	sh.mu.Lock()
	o := sh.owed[k]
	o.check, o.units = c, max(0, o.units+units)
	sh.owed[k] = o
	sh.mu.Unlock()
}

// Peek implements Store, with this instance's share of each limit.
func (f *Fallback) Peek(ctx context.Context, checks []Check, decisions []Decision) error {
	return f.local.Peek(ctx, f.local.shared(checks, max(1, f.instances())), decisions)
}

// Settle implements Store; what the settle changes, the shared store is
// owed too.
func (f *Fallback) Settle(ctx context.Context, checks []Check, decisions []Decision) error {
	for i, c := range checks {
		if h := decisions[i].held; h.recorded {
			f.owe(c, c.Cost-h.units)
		}
	}
	return f.local.Settle(ctx, f.local.shared(checks, max(1, f.instances())), decisions)
}

// Extend implements Store.
func (f *Fallback) Extend(ctx context.Context, checks []Check, decisions []Decision) error {
	return f.local.Extend(ctx, f.local.shared(checks, max(1, f.instances())), decisions)
}

// Reset implements Store: it forgets the client here, and what the shared
// store said of it.
func (f *Fallback) Reset(ctx context.Context, zone, key string) error {
	k := memoryKey{zone, key}
	sh := f.shard(k)
	sh.mu.Lock()
	delete(sh.seen, k)
	delete(sh.owed, k)
	sh.mu.Unlock()
	return f.local.Reset(ctx, zone, key)
}

// Recovered ends the outage when the shared store answers again, if a local
// decision was made since the last call: the next outage starts from the
// store's answers again, and what was admitted here meanwhile is charged to
// shared, each client's units as one admission at its earliest room from
// now, as a settle charges (so no window there goes over its max, and the
// charge counts longer than the local admissions would have, never
// shorter). It returns how many clients were charged. Only one call does
// the work of an outage; the others return at once.
func (f *Fallback) Recovered(ctx context.Context, shared Store) (clients int, err error) {
	if !f.active.Swap(false) {
		return 0, nil
	}
	f.episode.Add(1)
	var owed []owedCharge
	for i := range f.shards {
		sh := &f.shards[i]
		sh.mu.Lock()
		for _, o := range sh.owed {
			if o.units > 0 {
				owed = append(owed, o)
			}
		}
		clear(sh.owed)
		sh.mu.Unlock()
	}
	for len(owed) > 0 {
		batch := owed[:min(len(owed), replayBatch)]
		owed = owed[len(batch):]
		checks, decisions := make([]Check, len(batch)), make([]Decision, len(batch))
		for i, o := range batch {
			checks[i] = o.check
			checks[i].Cost, checks[i].Wait = o.units, 0
			// A reservation the store cannot have: the settle takes
			// nothing back, and records the units anew.
			decisions[i].held = holding{recorded: true, at: -1}
		}
		if err := shared.Settle(ctx, checks, decisions); err != nil {
			return clients, err
		}
		clients += len(batch)
	}
	return clients, nil
}

// shared returns checks with each limit's Max cut to one instance's share
// of n.
func (s *MemoryStore) shared(checks []Check, n int) []Check {
	if n <= 1 {
		return checks
	}
	out := make([]Check, len(checks))
	for i, c := range checks {
		out[i] = c
		out[i].Limit.Max = share(c.Limit.Max, n)
	}
	return out
}

// seed replaces the state of c's client with used units, the oldest
// recorded at oldest and the rest at at (the store's clock, microseconds):
// never earlier than they were, so that none leaves the window before it
// would have. A counter holds them in the fixed window of at.
func (s *MemoryStore) seed(c Check, used, oldest, at int64) {
	k := memoryKey{c.Zone, c.Key}
	w := microseconds(c.Limit.Window)
	s.mu.Lock()
	defer s.mu.Unlock()
	if used <= 0 {
		delete(s.state, k)
		return
	}
	st := &memoryState{kind: c.Limit.Algorithm}
	switch c.Limit.Algorithm {
	case SlidingLog:
		st.units, st.lastMax, st.expires = true, c.Limit.Max, at+w
		if oldest < at && used > 1 {
			st.log = []admission{{oldest, 1}, {at, used - 1}}
		} else {
			st.log = []admission{{at, used}}
		}
	case SlidingCounter:
		st.index, st.cur, st.expires = at/w, used, at-at%w+2*w
	default:
		return
	}
	s.state[k] = st
}
