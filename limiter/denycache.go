package limiter

import (
	"context"
	"hash/maphash"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// defaultDenyCacheEntries is the bound of a DenyCache made with maxEntries
// <= 0.
const defaultDenyCacheEntries = 100_000

// denyCacheShards is the most shards a DenyCache has; fewer when maxEntries is
// smaller. A power of two, so a shard is picked with a mask.
const denyCacheShards = 32

// denyCacheDriftDivisor sets the clock-rate margin: a denial with retry d is
// cached for d - d/denyCacheDriftDivisor, 1000 ppm less than d. See DenyCache.
const denyCacheDriftDivisor = 1000

// denyCacheRounding is subtracted from every cached retry besides the drift
// margin: the Redis script rounds a counter zone's wait up to the microsecond.
const denyCacheRounding = time.Microsecond

// denyCacheEvictSamples is how many random entries of a full shard are looked
// at to choose the one to evict.
const denyCacheEvictSamples = 8

// DenyCache is a Store that remembers, in this process, which (zone, client
// key) pairs are denied and until when, and answers requests for them without
// calling the wrapped store. Admissions always come from the wrapped store;
// Peek, Settle, Extend and Reset go to it.
//
// # Why it is exact
//
// In the sliding log a zone admits a request of cost c under max m with wait
// w when the units that will still be in its window at now + w, plus c, fit
// in m: it has room at the time its j-th newest admission ages out (see the
// package doc). Denied requests record nothing; admissions leave the window
// only by ageing out; and other callers (other Caddy instances on the same
// Redis) can only add admissions, a promised one (a wait) at its future
// time. So when the store denies a check with Reset d (the time until it has
// room for c under m), computed at store time R, no request of cost >= c
// under max <= m has room anywhere before R + d: the units held can only fall
// by admissions ageing out, a larger cost or a lower max needs more of them
// to, and the first that makes room for c goes at R + d exactly. A request
// with wait w' is then denied while now + w' < R + d, so denying it here is
// the store's own answer, without the round trip. The sliding counter is the
// same without waits: its estimate falls only as time passes, other callers
// can only raise it, a larger cost or lower max needs it lower, and Reset is
// the first time the estimate admits again (rounded up to the microsecond).
// A concurrency zone's denial is never cached: a release can come at any
// moment.
//
// The cache does not know R in its own clock. The store read its clock
// somewhere between the moment Allow called it (t0, this process's monotonic
// clock) and the moment it returned (t1). The cache keeps "room at t0 + d",
// never t1 + d: since t0 <= R, t0 + d <= R + d, so the cached room is never
// later than the true one, and the cache never denies a request the store
// would admit. Using t1 would deny requests in [R + d, t1 + d), up to a whole
// round trip, that the store admits. The price of the safe side is that the
// entry expires up to one round trip early, and the few requests in that gap
// reach the store, which denies them and refreshes the entry: a little more
// traffic, never a wrong answer.
//
// Measuring d on the store's clock and waiting it out on ours also assumes the
// two clocks run at the same rate. NTP slews a clock by at most 500 ppm, so two
// hosts' clocks may drift apart by up to about 1000 ppm; the cache therefore
// keeps a denial for d - d/1000 - 1µs (a 1 s retry 1 ms less, a 1 h retry 3.6 s
// less; the microsecond covers the store's rounding), again erring towards
// asking the store.
//
// The argument holds while no admission leaves a window early. Extend, which
// moves a running request's reservation to a later time with its units, does
// not make one leave early. Three things do, and the caller must handle them:
//   - an operator reset of a key in the store, or a settle that lowers what an
//     admission cost: Reset and Settle forget the key here after the store
//     acted, and a denial read from the store before that and returned after
//     is not cached (Forget starts a new generation of the key's shard, so
//     denials of other keys in flight meanwhile are cached as usual); other
//     processes must be told (the Caddy module announces such resets);
//   - a zone whose Limit changes in a way a later check does not show (the
//     window, or the algorithm): entries are keyed by (zone, key), and carry
//     the cost and max they were denied for, not the window; call Clear (or
//     make a new DenyCache) then; the Caddy handler makes a new cache per
//     configuration;
//   - store state lost (a Redis restart or flush), or admissions the store
//     takes back itself: on Redis Cluster, a request whose zones have
//     different client keys is decided slot by slot and what one slot
//     recorded is settled back when a later slot denies; a key denied by
//     another instance in between, because of that short-lived admission,
//     may stay denied here for up to its RetryAfter although the store would
//     admit it again after the refund.
//
// # Answers
//
// On a cache hit (any check is answered by a cached denial) Allow does not
// call the wrapped store and records nothing, as the store would not for a
// denied request. Each cached check gets Allowed false, Remaining 0, Reset
// the true time until it has room, counted from when the store's answer came
// back (not the entry's trimmed expiry), and RetryAfter that less the
// request's wait, so a client is never told to come back early; every other
// check gets Decision{Allowed: true} with Remaining and Reset zero: on a hit
// only the denying decisions carry meaning. AllowCached reports whether the
// answer was a hit.
//
// # Memory and concurrency
//
// The cache holds at most maxEntries entries, one per (zone, key): the last
// denial of that key, unless an earlier one answers all its requests and for
// longer. When full, it drops expired entries first and otherwise the one
// expiring soonest among a few chosen at random (O(1) amortised). Expired
// entries are also dropped when looked up; there is no background goroutine. Entries live in up to 32
// shards with their own locks, chosen by a hash of zone and key, and a hit
// takes only a read lock and allocates nothing. A DenyCache is safe for
// concurrent use.
type DenyCache struct {
	next   Store
	epoch  time.Time
	seed   maphash.Seed
	shards []denyShard
	mask   uint64

	entries   atomic.Int64
	hits      atomic.Uint64
	evictions atomic.Uint64
}

// denyCacheStats counts a DenyCache's work since it was made.
type denyCacheStats struct {
	// Hits is how many Allow calls were answered from the cache.
	Hits uint64
	// Evictions is how many entries were dropped before they expired to make
	// room for another.
	Evictions uint64
	// Entries is how many entries the cache holds, expired ones not yet
	// dropped included.
	Entries int
}

// denyKey is an entry's map key: a struct, not a concatenation, so that a
// lookup builds no string.
type denyKey struct{ zone, key string }

type denySlot struct {
	k denyKey
	// until is when the zone has room, in nanoseconds of the cache's
	// monotonic clock (since its epoch), trimmed: no later than the room
	// anywhere of a request of at least cost under at most max.
	until int64
	// retryAt is the room a client is told to wait for, on the same clock:
	// the store's exact time counted from when its answer came back, never
	// earlier than the true room, and never trimmed.
	retryAt int64
	// cost and max are the denied check's; waits says its zone waits (a
	// log zone): a request's wait brings its own end of the denial nearer.
	cost, max int64
	waits     bool
}

// answers reports whether the cached denial sl answers check c of a request
// with wait wait at now, and if so with what decision.
func (sl *denySlot) answers(c Check, wait time.Duration, now int64) (Decision, bool) {
	waits := c.Limit.Algorithm == SlidingLog
	if waits != sl.waits || reserved(c) < sl.cost || c.Limit.Max > sl.max {
		return Decision{}, false
	}
	if !waits {
		wait = 0
	}
	if now+int64(wait) >= sl.until {
		return Decision{}, false
	}
	left := time.Duration(sl.retryAt - now)
	return Decision{Reset: left, RetryAfter: left - wait}, true
}

type denyShard struct {
	mu    sync.RWMutex
	index map[denyKey]int32 // position in slots
	slots []denySlot
	max   int
	// gen changes on Clear and on Forget of a key of the shard; a denial
	// read from the store under an older generation is not cached.
	gen uint64
	// minUntil is at most the smallest until in slots (MaxInt64 when there is
	// none): the earliest time an entry can have expired.
	minUntil int64
	// sinceSweep counts insertions since the last sweep of expired entries,
	// which is made only every max/4 insertions into a full shard, so that its
	// cost is O(1) per insertion.
	sinceSweep int
	_          [64]byte // keeps hot shards off each other's cache lines
}

// NewDenyCache returns a deny cache in front of next holding at most
// maxEntries denied (zone, key) pairs; maxEntries <= 0 means 100,000.
func NewDenyCache(next Store, maxEntries int) *DenyCache {
	if maxEntries <= 0 {
		maxEntries = defaultDenyCacheEntries
	}
	n := denyCacheShards
	for n > 1 && n > maxEntries {
		n /= 2
	}
	c := &DenyCache{
		next:   next,
		epoch:  time.Now(),
		seed:   maphash.MakeSeed(),
		shards: make([]denyShard, n),
		mask:   uint64(n - 1),
	}
	for i := range c.shards {
		s := &c.shards[i]
		s.max = maxEntries / n
		if i < maxEntries%n {
			s.max++
		}
		s.index = make(map[denyKey]int32)
		s.minUntil = math.MaxInt64
	}
	return c
}

// Allow implements Store: see AllowCached.
func (c *DenyCache) Allow(ctx context.Context, checks []Check, decisions []Decision) error {
	_, err := c.AllowCached(ctx, checks, decisions)
	return err
}

// AllowCached decides checks like Allow and reports whether the answer came
// from the cache (hit), in which case the wrapped store was not called and
// only the denying decisions carry meaning (see DenyCache). Otherwise it is
// the wrapped store's answer, and its denials are remembered.
func (c *DenyCache) AllowCached(ctx context.Context, checks []Check, decisions []Decision) (hit bool, err error) {
	if len(decisions) == len(checks) && c.cached(checks, decisions) {
		return true, nil
	}
	return false, c.ask(ctx, checks, decisions)
}

// cached answers checks from the cache alone, without the wrapped store:
// it reports true, and fills decisions, if a cached denial answers a check.
func (c *DenyCache) cached(checks []Check, decisions []Decision) bool {
	if c.entries.Load() == 0 {
		return false
	}
	now := c.now()
	wait := requestWait(checks)
	hit := false
	for i, ch := range checks {
		decisions[i] = Decision{Allowed: true}
		if ch.Limit.Algorithm == Concurrency {
			continue
		}
		if d, ok := c.lookup(ch, wait, now); ok {
			decisions[i] = d
			hit = true
		}
	}
	if hit {
		c.hits.Add(1)
	}
	return hit
}

// ask calls the wrapped store and remembers its denials.
func (c *DenyCache) ask(ctx context.Context, checks []Check, decisions []Decision) error {
	var gensBuf [4]uint64
	gens := gensBuf[:0]
	for _, ch := range checks {
		s := c.shard(ch.Zone, ch.Key)
		s.mu.RLock()
		gens = append(gens, s.gen)
		s.mu.RUnlock()
	}
	// Read before the call: the store's clock read comes later, so start+d is
	// never after the store's own room (see DenyCache).
	start := c.now()
	if err := c.next.Allow(ctx, checks, decisions); err != nil {
		return err
	}
	end := c.now()
	for i := range decisions {
		d, ch := decisions[i].Reset, checks[i]
		if decisions[i].Allowed || decisions[i].Never || d <= 0 || i >= len(checks) || ch.Limit.Algorithm == Concurrency {
			continue
		}
		c.remember(denySlot{
			k:       denyKey{ch.Zone, ch.Key},
			until:   start + int64(d-d/denyCacheDriftDivisor-denyCacheRounding),
			retryAt: end + int64(d),
			cost:    reserved(ch),
			max:     ch.Limit.Max,
			waits:   ch.Limit.Algorithm == SlidingLog,
		}, gens[i])
	}
	return nil
}

// Peek implements Store by asking the wrapped store; the cache is neither
// consulted nor changed.
func (c *DenyCache) Peek(ctx context.Context, checks []Check, decisions []Decision) error {
	return c.next.Peek(ctx, checks, decisions)
}

// Settle implements Store: it settles in the wrapped store, then forgets the
// keys whose admissions now cost less than they reserved, whose denials may
// no longer hold.
func (c *DenyCache) Settle(ctx context.Context, checks []Check, decisions []Decision) error {
	var lowered []int
	for i, d := range decisions {
		if i < len(checks) && d.held.recorded && checks[i].Limit.Algorithm != Concurrency && checks[i].Cost < d.held.units {
			lowered = append(lowered, i)
		}
	}
	err := c.next.Settle(ctx, checks, decisions)
	// Even on an error: the store may have settled before failing, and
	// forgetting costs one store call at most.
	for _, i := range lowered {
		c.Forget(checks[i].Zone, checks[i].Key)
	}
	return err
}

// Extend implements Store by asking the wrapped store, and forgets nothing:
// it frees no room. A lease extended stays held; a log zone's reservation
// moved to now (see Store.Extend) keeps its units and is recorded no earlier
// than it was, so it leaves every window no earlier than before, and a
// denial cached before it holds as long after it. Settle, which takes the
// moved record back, forgets the key when it lowers the cost.
func (c *DenyCache) Extend(ctx context.Context, checks []Check, decisions []Decision) error {
	return c.next.Extend(ctx, checks, decisions)
}

// Reset implements Store: it resets key in zone in the wrapped store, then
// forgets its entry here.
func (c *DenyCache) Reset(ctx context.Context, zone, key string) error {
	err := c.next.Reset(ctx, zone, key)
	// Even on an error: the store may have reset the key before failing, and
	// forgetting costs one store call at most.
	c.Forget(zone, key)
	return err
}

// Forget drops the entry of key in zone, if any, and keeps denials of keys
// of its shard read from the store before it from being cached. Call it
// after resetting the key in the store by other means (Reset and Settle do
// it).
func (c *DenyCache) Forget(zone, key string) {
	s := c.shard(zone, key)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.gen++
	if i, ok := s.index[denyKey{zone, key}]; ok {
		c.removeAt(s, int(i))
	}
}

// Clear drops every entry. Call it when a zone's limit changes.
func (c *DenyCache) Clear() {
	for i := range c.shards {
		s := &c.shards[i]
		s.mu.Lock()
		s.gen++
		c.entries.Add(-int64(len(s.slots)))
		s.index = make(map[denyKey]int32)
		s.slots = nil
		s.minUntil = math.MaxInt64
		s.sinceSweep = 0
		s.mu.Unlock()
	}
}

// DeniedKey is one client a DenyCache holds as denied.
type DeniedKey struct {
	// Zone and Key are the denied check's, as its caller passed them.
	Zone, Key string
	// RetryAfter is the time left until the client may retry: what a denial
	// from the cache tells it now (see DenyCache), always greater than zero.
	RetryAfter time.Duration
}

// Denied lists the clients the cache holds as denied now, the longest wait
// first (equal waits by zone, then key), at most n of them, appended to
// dst[:0]; total is the number of all of them. Entries that have expired are
// neither listed nor counted.
//
// It visits the shards one at a time, each under its read lock for a single
// pass over its entries, so cache hits never wait for it and an insertion
// waits for one shard's pass at most. It allocates nothing when dst has room
// for n entries.
func (c *DenyCache) Denied(dst []DeniedKey, n int) (denied []DeniedKey, total int) {
	dst = dst[:0]
	if n > 0 {
		dst = slices.Grow(dst, min(n, int(c.entries.Load())))
	}
	now := c.now()
	// dst is a min-heap of the n longest waits seen so far, the shortest at
	// dst[0], so that a longer one replaces it in O(log n).
	for i := range c.shards {
		s := &c.shards[i]
		s.mu.RLock()
		for j := range s.slots {
			sl := &s.slots[j]
			if sl.until <= now {
				continue
			}
			total++
			e := DeniedKey{Zone: sl.k.zone, Key: sl.k.key, RetryAfter: time.Duration(sl.retryAt - now)}
			switch {
			case len(dst) < n:
				dst = append(dst, e)
				deniedUp(dst, len(dst)-1)
			case n > 0 && deniedBefore(e, dst[0]):
				dst[0] = e
				deniedDown(dst, 0)
			}
		}
		s.mu.RUnlock()
	}
	slices.SortFunc(dst, func(a, b DeniedKey) int {
		if deniedBefore(a, b) {
			return -1
		}
		if deniedBefore(b, a) {
			return 1
		}
		return 0
	})
	return dst, total
}

// deniedBefore reports whether a is listed before b: a longer wait, then the
// smaller zone and key.
func deniedBefore(a, b DeniedKey) bool {
	if a.RetryAfter != b.RetryAfter {
		return a.RetryAfter > b.RetryAfter
	}
	if a.Zone != b.Zone {
		return a.Zone < b.Zone
	}
	return a.Key < b.Key
}

// deniedUp restores the heap order of h (the entry listed last at h[0])
// after h[i] was added.
func deniedUp(h []DeniedKey, i int) {
	for i > 0 {
		parent := (i - 1) / 2
		if !deniedBefore(h[parent], h[i]) {
			return
		}
		h[parent], h[i] = h[i], h[parent]
		i = parent
	}
}

// deniedDown restores the heap order of h after h[i] was replaced.
func deniedDown(h []DeniedKey, i int) {
	for {
		last := i
		for child := 2*i + 1; child <= 2*i+2 && child < len(h); child++ {
			if deniedBefore(h[last], h[child]) {
				last = child
			}
		}
		if last == i {
			return
		}
		h[i], h[last] = h[last], h[i]
		i = last
	}
}

// stats returns the cache's counters.
func (c *DenyCache) stats() denyCacheStats {
	return denyCacheStats{
		Hits:      c.hits.Load(),
		Evictions: c.evictions.Load(),
		Entries:   int(c.entries.Load()),
	}
}

// now reads the cache's monotonic clock.
func (c *DenyCache) now() int64 { return int64(time.Since(c.epoch)) }

func (c *DenyCache) shard(zone, key string) *denyShard {
	h := maphash.String(c.seed, key) ^ maphash.String(c.seed, zone)*0x9e3779b97f4a7c15
	return &c.shards[h&c.mask]
}

// lookup returns the decision of a cached denial of check ch (in a request
// with wait wait) at now, if one answers it; an expired entry is dropped.
func (c *DenyCache) lookup(ch Check, wait time.Duration, now int64) (Decision, bool) {
	k := denyKey{ch.Zone, ch.Key}
	s := c.shard(ch.Zone, ch.Key)
	s.mu.RLock()
	i, ok := s.index[k]
	var sl denySlot
	if ok {
		sl = s.slots[i]
	}
	s.mu.RUnlock()
	if !ok {
		return Decision{}, false
	}
	if sl.until > now {
		return sl.answers(ch, wait, now)
	}
	s.mu.Lock()
	if i, ok := s.index[k]; ok && s.slots[i].until <= now {
		c.removeAt(s, int(i))
	}
	s.mu.Unlock()
	return Decision{}, false
}

// remember caches the denial sl, unless its key's shard moved on from
// generation gen (a key was forgotten or the cache cleared meanwhile). An
// entry already cached for the key stays only if it answers every request sl
// answers, for as long.
func (c *DenyCache) remember(sl denySlot, gen uint64) {
	s := c.shard(sl.k.zone, sl.k.key)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.gen != gen {
		return
	}
	now := c.now()
	if sl.until <= now {
		return
	}
	if i, ok := s.index[sl.k]; ok {
		old := &s.slots[i]
		if old.waits != sl.waits || old.cost > sl.cost || old.max < sl.max || old.until < sl.until {
			*old = sl
			s.minUntil = min(s.minUntil, sl.until)
		}
		return
	}
	if len(s.slots) >= s.max {
		c.evict(s, now)
	}
	s.index[sl.k] = int32(len(s.slots))
	s.slots = append(s.slots, sl)
	s.minUntil = min(s.minUntil, sl.until)
	s.sinceSweep++
	c.entries.Add(1)
}

// evict makes room for one entry in the full shard s: expired entries go
// first, otherwise the one expiring soonest of a few picked at random.
func (c *DenyCache) evict(s *denyShard, now int64) {
	if now >= s.minUntil && s.sinceSweep >= max(1, s.max/4) {
		c.sweep(s, now)
		if len(s.slots) < s.max {
			return
		}
	}
	victim := -1
	for range denyCacheEvictSamples {
		i := rand.IntN(len(s.slots))
		if s.slots[i].until <= now {
			c.removeAt(s, i)
			return
		}
		if victim < 0 || s.slots[i].until < s.slots[victim].until {
			victim = i
		}
	}
	c.removeAt(s, victim)
	c.evictions.Add(1)
}

// sweep drops every expired entry of s.
func (c *DenyCache) sweep(s *denyShard, now int64) {
	// Downwards, so the entry removeAt moves into i has been looked at.
	for i := len(s.slots) - 1; i >= 0; i-- {
		if s.slots[i].until <= now {
			c.removeAt(s, i)
		}
	}
	s.minUntil = math.MaxInt64
	for i := range s.slots {
		s.minUntil = min(s.minUntil, s.slots[i].until)
	}
	s.sinceSweep = 0
}

// removeAt drops slot i of s, moving the last slot into its place.
func (c *DenyCache) removeAt(s *denyShard, i int) {
	last := len(s.slots) - 1
	delete(s.index, s.slots[i].k)
	if i != last {
		s.slots[i] = s.slots[last]
		s.index[s.slots[i].k] = int32(i)
	}
	s.slots[last] = denySlot{} // let the key strings go
	s.slots = s.slots[:last]
	if last == 0 {
		s.minUntil = math.MaxInt64
	}
	c.entries.Add(-1)
}
