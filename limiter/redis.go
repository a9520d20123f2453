package limiter

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// defaultKeyPrefix starts every Redis key the store writes, unless
// RedisOptions say otherwise.
const defaultKeyPrefix = "srl:"

// defaultTimeout is how long a RedisStore call waits for Redis, unless
// RedisOptions say otherwise.
const defaultTimeout = 100 * time.Millisecond

// RedisOptions configure a RedisStore. The zero value is the defaults.
type RedisOptions struct {
	// KeyPrefix starts every Redis key the store writes. Empty means
	// "srl:". A '{' or '}' in it changes the Redis Cluster hash
	// tag, putting every client in one slot.
	KeyPrefix string
	// Timeout bounds every call: it ends at its context's deadline or
	// Timeout after it started, whichever is sooner, even while Redis does
	// not answer. On a host whose CPUs hold the process back (its
	// goroutines wait to run, or its timers run late: ErrHostBusy), a
	// call whose Redis answers may take up to four Timeouts more, to be
	// decided rather than fail. Zero means 100ms.
	Timeout time.Duration
}

// RedisStore keeps each client's state in Redis, so every process using the
// same Redis shares one exact limit. Concurrent calls share round trips: the
// calls made while Redis is busy are decided together by its next script
// call (one per hash slot on Redis Cluster), and a call never waits for
// others to join it. Decisions use Redis's clock, so the hosts' clocks do
// not matter. It is safe for concurrent use; Close stops the batching, not
// the client.
//
// On Redis Cluster, a request whose zones are in different hash slots (zones
// with different client keys) is decided slot by slot: what earlier slots
// recorded is settled back to zero when a later one denies. Such a request
// does not wait: its Wait counts as zero, since the slots' admission times
// are known only one after the other and cannot be made one. Zones of one
// client key always share a slot.
type RedisStore struct {
	client  redisClient
	prefix  string
	timeout time.Duration
	cluster bool
	batch   *batcher
	// leases numbers the leases this store takes; its high half is random,
	// so two stores' leases of one client do not meet.
	leases atomic.Uint64
}

// NewRedisStore returns a store on client and starts its batching. client
// is a go-redis client: *redis.Client, *redis.ClusterClient, the failover
// client of redis.NewFailoverClient, or any redis.UniversalClient.
func NewRedisStore(client redisClient, opts RedisOptions) *RedisStore {
	if opts.KeyPrefix == "" {
		opts.KeyPrefix = defaultKeyPrefix
	}
	if opts.Timeout <= 0 {
		opts.Timeout = defaultTimeout
	}
	_, cluster := client.(*redis.ClusterClient)
	s := &RedisStore{
		client:  client,
		prefix:  opts.KeyPrefix,
		timeout: opts.Timeout,
		cluster: cluster,
		batch:   newBatcher(client, cluster, opts.Timeout),
	}
	s.leases.Store(uint64(rand.Uint32()|1) << 32)
	return s
}

// Close stops the store's batching once the calls in flight return. Calls
// waiting, and calls made after it, fail with an error. It does not close
// the client, and releases no lease: they expire after their lease time.
func (s *RedisStore) Close() error {
	s.batch.close()
	return nil
}

// Key returns the Redis key of a client in a zone: prefix{client}:zone. The
// hash tag is the client key, never a constant, so Redis Cluster spreads
// clients over all slots while all zones of one client share a slot.
func (s *RedisStore) Key(zone, client string) string {
	return s.prefix + "{" + client + "}:" + zone
}

// ParseKey reads a key back into the zone and client that Key built it
// from: ours reports whether key starts with the store's prefix at all, ok
// whether the rest has Key's layout. Client keys never hold '{' or '}'
// (BoundKey hashes them), so the first "}:" ends the client.
func (s *RedisStore) ParseKey(key string) (zone, client string, ours, ok bool) {
	rest, ours := strings.CutPrefix(key, s.prefix)
	if !ours {
		return "", "", false, false
	}
	if rest, ok = strings.CutPrefix(rest, "{"); !ok {
		return "", "", true, false
	}
	client, zone, ok = strings.Cut(rest, "}:")
	return zone, client, true, ok
}

// Allow implements Store.
func (s *RedisStore) Allow(ctx context.Context, checks []Check, decisions []Decision) error {
	if err := checkInput(checks, decisions); err != nil {
		return err
	}
	if !s.cluster || len(checks) == 1 {
		return s.do(ctx, methodAllow, nil, checks, decisions, nil, requestWait(checks))
	}
	keys := s.keys(checks)
	groups := s.slotGroups(keys, all(len(checks)))
	if len(groups) == 1 {
		return s.do(ctx, methodAllow, keys, checks, decisions, groups[0], requestWait(checks))
	}
	admitted := true
	for g, idx := range groups {
		m := methodPeek
		if admitted {
			m = methodAllow
		}
		if err := s.do(ctx, m, keys, checks, decisions, idx, 0); err != nil {
			if admitted && g > 0 {
				// Best effort: the request fails either way.
				_ = s.refund(ctx, keys, checks, decisions, groups[:g])
			}
			return err
		}
		if admitted && !admittedAt(decisions, idx) {
			admitted = false
			if err := s.refund(ctx, keys, checks, decisions, groups[:g]); err != nil {
				return err
			}
		}
	}
	return nil
}

// Peek implements Store. Across Redis Cluster slots it decides as Allow
// would there: without a wait.
func (s *RedisStore) Peek(ctx context.Context, checks []Check, decisions []Decision) error {
	if err := checkInput(checks, decisions); err != nil {
		return err
	}
	if !s.cluster || len(checks) == 1 {
		if err := s.do(ctx, methodPeek, nil, checks, decisions, nil, requestWait(checks)); err != nil {
			return err
		}
	} else {
		keys := s.keys(checks)
		groups := s.slotGroups(keys, all(len(checks)))
		wait := requestWait(checks)
		if len(groups) > 1 {
			wait = 0
		}
		for _, idx := range groups {
			if err := s.do(ctx, methodPeek, keys, checks, decisions, idx, wait); err != nil {
				return err
			}
		}
	}
	if !Admitted(decisions) {
		for i := range decisions {
			decisions[i].Delay = 0
		}
	}
	return nil
}

// Interruptions counts the signs that Redis may not be the server it was:
// calls whose reply was lost with their connection (closed or reset by
// Redis, a proxy, a failover, a restart), and a script or function library
// gone from where it was loaded (a restart, a promoted replica, a flush).
// A caller that sees it grow may ask whether Redis is still the server it
// was: a restarted or promoted one may have lost writes.
func (s *RedisStore) Interruptions() uint64 { return s.batch.interruptions.Load() }

// Settle implements Store: it changes exactly the admissions that the Allow
// which filled decisions recorded, even when others were recorded after
// them.
func (s *RedisStore) Settle(ctx context.Context, checks []Check, decisions []Decision) error {
	return s.spend(ctx, methodSettle, checks, decisions, recorded)
}

// recorded reports whether d recorded an admission, which a settle changes.
func recorded(d Decision) bool { return d.held.recorded }

// SettleLater is Settle without the wait for Redis: the settle is queued
// before it returns, so that a decision asked for after it (the client's
// next request) is decided after it, in its script call or a later one;
// done is called once, from a goroutine of its own, with Settle's error,
// once Redis answered. checks and decisions are the settle's until then.
// A settle that cannot be queued so (zones in several Redis Cluster slots,
// a full queue) runs in that goroutine, as Settle does.
//
// A settle that charges any zone more than it reserved is the exception:
// SettleLater returns only once Redis answered it (done is called first,
// in the caller's goroutine). Queued, it would let the client's next
// request through another process, whose call can reach Redis before
// this one's, with the extra units not yet counted; a settle that gives
// units back only keeps a client waiting a round trip longer.
func (s *RedisStore) SettleLater(ctx context.Context, checks []Check, decisions []Decision, done func(error)) {
	if chargesMore(checks, decisions) {
		done(s.Settle(ctx, checks, decisions))
		return
	}
	if _, whole := s.holding(decisions, recorded); whole && checkInput(checks, decisions) == nil {
		r, _, err := s.request(ctx, methodSettle, nil, checks, decisions, nil, 0)
		if err == nil {
			queued, err := s.batch.queueNow(r)
			if err != nil {
				go done(err)
				return
			}
			go func() { done(s.batch.await(r, queued)) }()
			return
		}
	}
	go func() { done(s.Settle(ctx, checks, decisions)) }()
}

// chargesMore reports whether a settle of checks records more units in a
// zone than its admission reserved.
func chargesMore(checks []Check, decisions []Decision) bool {
	for i, d := range decisions {
		if d.held.recorded && i < len(checks) && checks[i].Cost > d.held.units {
			return true
		}
	}
	return false
}

// holding counts the decisions that hold something for holds (a settle,
// an extend), and reports whether a call of them is one request: each
// holds, and they share a slot.
func (s *RedisStore) holding(decisions []Decision, holds func(Decision) bool) (held int, whole bool) {
	for _, d := range decisions {
		if holds(d) {
			held++
		}
	}
	return held, held > 0 && held == len(decisions) && (!s.cluster || held == 1)
}

// Extend implements Store: one script call extends the leases, another
// moves the log zones' reservations, as a Settle of each to what it
// reserved (holdReservations); the script finds a moved record again by
// the time that settle recorded it at, as it finds an admission. A store
// error on the leases is returned before the reservations are moved.
func (s *RedisStore) Extend(ctx context.Context, checks []Check, decisions []Decision) error {
	lost := s.spend(ctx, methodExtend, checks, decisions, func(d Decision) bool { return d.held.lease != 0 })
	if lost != nil && !errors.Is(lost, ErrLeaseLost) {
		return lost
	}
	if err := holdReservations(ctx, checks, decisions, s.Settle); err != nil {
		return err
	}
	return lost
}

// spend runs m, a settle or an extend, for the checks whose decisions hold
// something for it, slot by slot.
func (s *RedisStore) spend(ctx context.Context, m method, checks []Check, decisions []Decision, holds func(Decision) bool) error {
	if err := checkInput(checks, decisions); err != nil {
		return err
	}
	held, whole := s.holding(decisions, holds)
	if held == 0 {
		return nil
	}
	if whole {
		return s.do(ctx, m, nil, checks, decisions, nil, 0)
	}
	idx := make([]int, 0, held)
	for i, d := range decisions {
		if holds(d) {
			idx = append(idx, i)
		}
	}
	keys := s.keys(checks)
	var lost error
	for _, g := range s.slotGroups(keys, idx) {
		err := s.do(ctx, m, keys, checks, decisions, g, 0)
		if errors.Is(err, ErrLeaseLost) {
			lost = err
			continue
		}
		if err != nil {
			return err
		}
	}
	return lost
}

// Reset implements Store.
func (s *RedisStore) Reset(ctx context.Context, zone, key string) error {
	return s.client.Del(ctx, s.Key(zone, key)).Err()
}

// do runs m for the checks at idx (whose keys share a slot; all of them
// when nil, and keys then nil too) through the batcher, with their decisions
// as its input and, after it, its output. It ends at ctx's deadline or the
// store's timeout, whichever is sooner, with one clock read.
func (s *RedisStore) do(ctx context.Context, m method, keys []string, checks []Check, decisions []Decision, idx []int, wait time.Duration) error {
	r, sub, err := s.request(ctx, m, keys, checks, decisions, idx, wait)
	if err != nil {
		return err
	}
	sent := r.decisions
	err = s.batch.do(r)
	if sub && (err == nil || errors.Is(err, ErrLeaseLost)) {
		for j, i := range idx {
			decisions[i] = sent[j]
		}
	}
	return err
}

// request makes do's request; sub says that it holds the checks at idx
// alone, whose decisions do copies back.
func (s *RedisStore) request(ctx context.Context, m method, keys []string, checks []Check, decisions []Decision, idx []int, wait time.Duration) (r *request, sub bool, err error) {
	if n := len(idx); idx == nil && len(checks) > 255 || n > 255 {
		return nil, false, fmt.Errorf("%d checks in one request, want at most 255", max(n, len(checks)))
	}
	r = &request{
		ctx:    ctx,
		op:     scriptOps[m],
		keys:   keys,
		checks: checks,
		wait:   wait,
	}
	deadline := time.Now().Add(s.timeout)
	if keys == nil {
		r.keys = s.appendKeys(r.key[:0], checks)
	}
	sub = idx != nil && len(idx) != len(checks)
	if sub {
		r.keys, r.checks = make([]string, len(idx)), make([]Check, len(idx))
		r.decisions = make([]Decision, len(idx))
		for j, i := range idx {
			r.keys[j], r.checks[j], r.decisions[j] = keys[i], checks[i], decisions[i]
		}
	} else {
		r.decisions = decisions
	}
	if m == methodAllow {
		for j, c := range r.checks {
			if c.Limit.Algorithm == Concurrency {
				if r.leases == nil {
					r.leases = make([]uint64, len(r.checks))
				}
				r.leases[j] = s.leases.Add(1)
			}
		}
	}
	args := r.arg[:0]
	if len(r.checks) > 1 {
		args = make([]byte, 0, requestArgLen+zoneArgLen*len(r.checks))
	}
	r.args = appendRequest(args, r.op, r.checks, r.decisions, wait, r.leases)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	r.deadline.Store(deadline)
	if s.cluster {
		r.slot = hashSlot(r.keys[0])
	}
	return r, sub, nil
}

// scriptOps are the script's opcodes of the stores' methods.
var scriptOps = [...]op{methodPeek: opPeek, methodAllow: opAllow, methodSettle: opSettle, methodExtend: opExtend}

// admittedAt reports whether the decisions at idx all admit.
func admittedAt(decisions []Decision, idx []int) bool {
	for _, i := range idx {
		if !decisions[i].Allowed {
			return false
		}
	}
	return true
}

// refund takes back what the checks of groups recorded (settles it to zero),
// and reports their zones as not consumed.
func (s *RedisStore) refund(ctx context.Context, keys []string, checks []Check, decisions []Decision, groups [][]int) error {
	zero := make([]Check, len(checks))
	for i, c := range checks {
		zero[i] = c
		zero[i].Cost = 0
	}
	for _, idx := range groups {
		if err := s.do(ctx, methodSettle, keys, zero, decisions, idx, 0); err != nil {
			return fmt.Errorf("refunding admissions: %w", err)
		}
		for _, i := range idx {
			decisions[i].Lifts = false // a decision, not a settle
			decisions[i].Remaining += reserved(checks[i])
		}
	}
	for i := range decisions {
		decisions[i].Delay = 0
	}
	return nil
}

func (s *RedisStore) keys(checks []Check) []string {
	return s.appendKeys(make([]string, 0, len(checks)), checks)
}

func (s *RedisStore) appendKeys(keys []string, checks []Check) []string {
	for _, c := range checks {
		keys = append(keys, s.Key(c.Zone, c.Key))
	}
	return keys
}

// all returns the indexes of n checks.
func all(n int) []int {
	idx := make([]int, n)
	for i := range idx {
		idx[i] = i
	}
	return idx
}

// slotGroups returns the indexes idx grouped by the Redis Cluster slot of
// their keys, in the order the slots first appear: one group on a single
// server.
func (s *RedisStore) slotGroups(keys []string, idx []int) [][]int {
	if !s.cluster || len(idx) < 2 {
		return [][]int{idx}
	}
	var groups [][]int
	var slots []uint16
	for _, i := range idx {
		slot := hashSlot(keys[i])
		g := 0
		for g < len(slots) && slots[g] != slot {
			g++
		}
		if g == len(slots) {
			slots = append(slots, slot)
			groups = append(groups, nil)
		}
		groups[g] = append(groups[g], i)
	}
	return groups
}

// Interface guards
var (
	_ Store       = (*RedisStore)(nil)
	_ redisClient = (*redis.Client)(nil)
	_ redisClient = (*redis.ClusterClient)(nil)
	_ redisClient = redis.UniversalClient(nil)
)
