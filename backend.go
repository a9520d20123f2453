package slidingratelimit

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/redisconn"
	"github.com/slidingratelimit/caddy-sliding-ratelimit/limiter"
)

// backendConfig is what a backend is built from.
type backendConfig struct {
	// redis is the Redis URL, placeholders expanded, and topology what it
	// names; without a URL the limits are kept in process.
	redis, topology string
	keyPrefix       string
	// timeout bounds each decision by Redis.
	timeout time.Duration
	// failMode is the handler's fail_mode: with failLocal the backend
	// decides in process while Redis fails; it names the mode in logs.
	failMode string
	// zones are the identities of the handler's zones: a reset that other
	// instances announce for another zone is not its business.
	zones []string
	// periods are the zones with a period (periodZones), nil without.
	periods periodZones
	logger  *zap.Logger
}

// storeMode says where a backend's limits live.
type storeMode uint8

const (
	// inProcess: no Redis; the in-process store, so each instance counts
	// alone.
	inProcess storeMode = iota
	// redisShared: Redis, shared by every instance; fail_mode open or
	// closed.
	redisShared
	// redisWithLocal: Redis, and the in-process store decides while Redis
	// fails (fail_mode local).
	redisWithLocal
)

// backend is the store stack of one handler, built in one place (newBackend)
// and the only door to its parts: the request path, the admin API and the
// resets other instances announce all go through it, and no code but the
// stack's (this file) calls a store.
//
//	deny cache -> connection's breaker -> timing -> RedisStore
//	deny cache -> MemoryStore                (no Redis)
//	Fallback -> MemoryStore                  (fail_mode local, while Redis fails;
//	                                          any mode, for clients a full Redis holds)
//
// The dial gate is inside the go-redis client (internal/redisconn).
type backend struct {
	mode storeMode
	// cache answers repeated denials in process, in front of the store.
	cache *limiter.DenyCache
	// store is the store that records admissions: Redis or in-process.
	store limiter.Store
	// local is the in-process store, and fallback decides in it, from
	// what Redis last said, while Redis fails (mode redisWithLocal) or
	// refuses writes for lack of memory (any mode with Redis).
	local    *limiter.MemoryStore
	fallback *limiter.Fallback
	// recovering is the charging to Redis of what fallback admitted,
	// which close waits for; charging is set while one runs.
	recovering sync.WaitGroup
	charging   atomic.Bool
	// settling is the settles queued and not yet answered, or retried,
	// which close waits for; closing tells the retries to make their last
	// try.
	settling  sync.WaitGroup
	closing   chan struct{}
	closeOnce sync.Once
	// redis and conn are set with Redis: the store (which alone knows its
	// key layout) and its connection (breaker, reset bus).
	redis *limiter.RedisStore
	conn  *redisconn.Conn
	// servers names the Redis servers that answered last (see
	// redisconn.Conn.Servers): another name after an outage is a failover or
	// a restart, which may have lost writes (see recover).
	servers atomic.Value
	// interruptions is the store's Interruptions when answered last read
	// it.
	interruptions atomic.Uint64

	keyPrefix string
	timeout   time.Duration
	failMode  string
	zones     []string
	periods   periodZones
	// failures logs failed decisions, settleFailures failed settles,
	// unannounced the refunds applied but not announced, refused the
	// requests whose own figures the engine refuses.
	failures, settleFailures, unannounced, refused *failureLog
	// oomFailures logs decisions that Redis refused for lack of memory,
	// counted in oom.
	oomFailures *failureLog
	oom         prometheus.Counter
	// nevers logs the requests denied in process since no wait admits them.
	nevers   *throttle
	logger   *zap.Logger
	releases []func() error
}

// newBackend builds the stack that cfg describes; its pooled parts
// (connections, stores) are shared with other handlers and configs and kept
// across reloads.
func newBackend(cfg backendConfig) (*backend, error) {
	b := &backend{
		keyPrefix:      cfg.keyPrefix,
		timeout:        cfg.timeout,
		failMode:       cfg.failMode,
		zones:          cfg.zones,
		periods:        cfg.periods,
		failures:       newFailureLog(cfg.logger, "rate limit store unavailable; applying fail mode", time.Second),
		settleFailures: newFailureLog(cfg.logger, "settling what requests cost failed (count_status, settle, a released lease or wait): their reservations count until they age out", time.Second),
		unannounced: newFailureLog(cfg.logger, "a refund was settled in redis, but announcing it to other instances failed: "+
			"a denial they cached may refuse its client until its retry time", time.Second),
		oomFailures: newFailureLog(cfg.logger, "redis is out of memory (maxmemory reached with maxmemory-policy noeviction): it refuses the limiter's writes, "+
			"so clients it holds are decided in process from what it holds, and new clients get the fail mode; give redis more memory (docs/redis.md)", time.Second),
		refused: newFailureLog(cfg.logger, "a request the limiter cannot decide, for figures outside the engine's bounds that the config rules let through; applying fail mode without asking the store", time.Second),
		oom:     limiterMetrics.storeErrors.WithLabelValues(reasonOOM),
		nevers:  &throttle{interval: time.Second},
		logger:  cfg.logger,
		closing: make(chan struct{}),
	}
	memory, release := loadMemoryStore()
	b.releases = append(b.releases, release)
	if cfg.redis == "" {
		b.mode, b.store = inProcess, memory
		b.cache = limiter.NewDenyCache(b.clamped(memory), 0)
		return b, nil
	}
	b.local = memory
	if err := b.connect(cfg); err != nil {
		_ = b.close()
		return nil, err
	}
	return b, nil
}

// connect adds the Redis part of the stack.
func (b *backend) connect(cfg backendConfig) error {
	b.mode = redisShared
	if cfg.failMode == failLocal {
		b.mode = redisWithLocal
	}
	conn, err := redisconn.Open(cfg.topology, cfg.redis)
	if err != nil {
		return fmt.Errorf("redis: %w", err)
	}
	b.releases = append(b.releases, conn.Close)
	b.conn = conn
	b.fallback = limiter.NewFallback(b.local, conn.Instances)
	if err := conn.Check(cfg.timeout); errors.Is(err, redisconn.ErrUnreachable) {
		cfg.logger.Warn(redisSilentAtStart(cfg.failMode),
			zap.String("fail_mode", cfg.failMode), zap.Error(err))
	} else if err != nil {
		return err
	} else if err := checkRights(conn, cfg); err != nil {
		return err
	} else {
		warnMemory(conn, cfg)
		b.noteServers(cfg.timeout)
	}
	store, release, err := loadRedisStore(cfg.topology, cfg.redis, limiter.RedisOptions{
		KeyPrefix: cfg.keyPrefix,
		Timeout:   cfg.timeout,
	})
	if err != nil {
		return fmt.Errorf("redis: %w", err)
	}
	b.releases = append(b.releases, release)
	b.redis, b.store = store, store
	b.cache = limiter.NewDenyCache(b.clamped(conn.Breaker().Guard(timedStore{store})), 0)
	// Last: an announcement may come at once, and finds the stack whole.
	conn.Listen(b)
	b.releases = append(b.releases, func() error { conn.Unlisten(b); return nil })
	return nil
}

// clamped returns store, or with period zones a store that clamps their
// decisions to the period's end before the deny cache keeps them.
func (b *backend) clamped(store limiter.Store) limiter.Store {
	if len(b.periods) == 0 {
		return store
	}
	return periodStore{store, b.periods}
}

// checkRights refuses a Redis user that no decision can be made with, and
// warns of each missing right that makes the limiter work worse (see
// redisconn.Rights). Rights that could not be read are noted at debug
// level only: the decisions will say.
func checkRights(conn *redisconn.Conn, cfg backendConfig) error {
	rights, err := conn.Rights(cfg.timeout, cfg.keyPrefix)
	if err != nil {
		cfg.logger.Debug("could not check the redis user's rights", zap.String("redis", conn.Label()), zap.Error(err))
		return nil
	}
	if refusal := rights.Refusal(cfg.keyPrefix); refusal != "" {
		return errors.New(refusal)
	}
	for _, warning := range rights.Warnings() {
		cfg.logger.Warn(warning, zap.String("redis", conn.Label()))
	}
	return nil
}

// warnMemory warns at start when Redis, once full, would evict limit state
// or refuse the limiter's writes (see redisconn.MemoryWarning). A Redis that
// does not tell (INFO disabled) is noted at debug level only.
func warnMemory(conn *redisconn.Conn, cfg backendConfig) {
	maxmemory, policy, err := conn.Memory(cfg.timeout)
	if err != nil {
		cfg.logger.Debug("could not read redis's memory settings", zap.String("redis", conn.Label()), zap.Error(err))
		return
	}
	if warning := redisconn.MemoryWarning(maxmemory, policy); warning != "" {
		cfg.logger.Warn(warning, zap.String("redis", conn.Label()),
			zap.String("maxmemory_policy", policy), zap.Int64("maxmemory", maxmemory))
	}
}

// source says who decided a request.
type source uint8

const (
	fromStore   source = iota // the store (Redis or in-process)
	fromCache                 // the deny cache, without a store call
	fromLocal                 // the in-process fallback, for fail_mode local
	fromNoStore               // no one: the request can never be admitted (neverFits)
)

// allowed and denied are the metrics results of an admission and a denial
// by s.
func (s source) allowed() string {
	if s == fromLocal {
		return resultLocalAllowed
	}
	return resultAllowed
}

func (s source) denied() string {
	if s == fromLocal {
		return resultLocalDenied
	}
	return resultDenied
}

// neverFits reports whether a zone of checks can never admit the request:
// its cost is above the max of its call, the zone's or a tenant's, which
// is known before any store call. Then no store is asked, in no zone (a
// request is admitted in all its zones or in none), and decisions say so:
// Never in each such zone, with the max as what remains, since nothing was
// read; the other zones, not asked, admit. Every such request would be
// denied the same way, and a store call costs as much as one that fits:
// the deny cache cannot hold such a denial, which is no block that ends.
func neverFits(checks []limiter.Check, decisions []limiter.Decision) bool {
	never := false
	for _, c := range checks {
		never = never || max(c.Cost, 1) > c.Limit.Max
	}
	if !never {
		return false
	}
	for i, c := range checks {
		decisions[i] = limiter.Decision{Remaining: c.Limit.Max, Never: true}
		if max(c.Cost, 1) <= c.Limit.Max {
			decisions[i] = limiter.Decision{Allowed: true, Remaining: unread}
		}
	}
	return true
}

// neverDenied counts a request denied since it can never fit in zone and,
// at most once a second, logs how many were since the last line (in all
// the handler's zones), naming zone; it reports whether it logged.
func (b *backend) neverDenied(zone string, max int64) bool {
	count, due := b.nevers.event()
	if due {
		b.logger.Info("requests that cost more than the zone's max denied without a store call: no wait admits them",
			zap.String("zone", zone), zap.Int64("max", max), zap.Int64("requests", count))
	}
	return due
}

// decide decides checks: from the deny cache, or the store behind it. When
// the store fails and the caller is still there, the failure is logged and,
// with fail_mode local, the in-process store decides instead: then the
// source says so and the error is nil. The Redis store ends each call at its
// own timeout, so a request creates no timer. Checks the engine refuses
// for their own figures (limiter.ErrInvalidCheck) are no store failure: they
// are logged apart and go to no fallback, which would refuse them the same;
// a denial from the cache leaves the zones it did not read unread
// (markUnread).
func (b *backend) decide(ctx context.Context, checks []limiter.Check, decisions []limiter.Decision) (source, error) {
	hit, err := b.cache.AllowCached(ctx, checks, decisions)
	if errors.Is(err, limiter.ErrInvalidCheck) {
		b.refused.record(b.failMode, err)
		return fromNoStore, err
	}
	src := fromStore
	if hit {
		src = fromCache
		markUnread(decisions)
	}
	if err == nil {
		if !hit && b.fallback != nil {
			b.answered(checks, decisions)
		}
		return src, nil
	}
	if ctx.Err() != nil {
		// A caller that went away: nothing failed, and no one waits.
		return src, err
	}
	if limiter.OutOfMemory(err) {
		return b.decideFull(ctx, checks, decisions, err)
	}
	b.failed(err)
	if b.mode != redisWithLocal {
		return src, err
	}
	// The in-process store never fails.
	_ = b.fallback.Allow(ctx, checks, decisions)
	b.periods.clamp(checks, decisions, periodNow())
	return fromLocal, nil
}

// answered takes note of Redis's answer to checks: the fallback starts from
// it in the next outage (fail_mode local), and the first answer after one
// charges Redis with what the fallback admitted meanwhile.
func (b *backend) answered(checks []limiter.Check, decisions []limiter.Decision) {
	if n := b.redis.Interruptions(); n != b.interruptions.Load() {
		// A connection closed under a call, a script gone: Redis may
		// have restarted.
		b.interruptions.Store(n)
		b.fallback.Lost()
	}
	if (b.fallback.Active() || b.fallback.Losing()) && b.charging.CompareAndSwap(false, true) {
		b.recovering.Go(func() {
			defer b.charging.Store(false)
			b.recover()
		})
	}
	// In every fail mode: a failover that loses writes is repaired from
	// what Redis said (see limiter.Fallback.Repair).
	b.fallback.Observe(checks, decisions)
}

// recover charges Redis, when it answers after failing, with what it may
// have lost (a failover, a restart) and what the fallback admitted while it
// was away or full: the charges come after the outage's last local
// decision, so the windows that span it hold what the instances admitted
// on both sides.
func (b *backend) recover() {
	ctx, cancel := context.WithTimeout(context.Background(), b.operatorTimeout())
	defer cancel()
	if b.fallback.Losing() && !b.repair(ctx) {
		return
	}
	clients, err := b.fallback.Recovered(ctx, b.redis)
	if err != nil {
		b.settleFailures.record(b.failMode, fmt.Errorf("charging redis with what was admitted in process while it was away: %w", err))
		return
	}
	if clients > 0 {
		b.logger.Info("redis answers again: what was admitted in process meanwhile is charged to it",
			zap.String("redis", b.conn.Label()), zap.Int("clients", clients))
	}
}

// repair charges Redis, when it answers after failing as another server
// than before (a failover, a restart: see redisconn.Conn.Servers) or as one
// that does not say, each client this instance saw in its window at least
// what Redis last said of it (limiter.Fallback.Repair). It reports whether
// Redis took the charges.
func (b *backend) repair(ctx context.Context) bool {
	before, _ := b.servers.Load().(string)
	now, err := b.conn.Servers(ctx)
	if err == nil && now != "" && now == before {
		b.fallback.Kept()
		return true
	}
	clients, err := b.fallback.Repair(ctx, b.redis)
	if err != nil {
		b.settleFailures.record(b.failMode, fmt.Errorf("charging redis, back after failing, with what it may have lost: %w", err))
		return false
	}
	if now != "" {
		b.servers.Store(now)
	}
	b.logger.Info("redis answers again, as another server (a failover or a restart) or one that does not name itself: "+
		"each client seen in its window is charged at least what redis last said of it, so that lost writes hand out no fresh limit",
		zap.String("redis", b.conn.Label()), zap.Int("clients_charged", clients))
	return true
}

// noteServers names the servers Redis answers from at start (see repair).
func (b *backend) noteServers(timeout time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), max(timeout, time.Second))
	defer cancel()
	if servers, err := b.conn.Servers(ctx); err == nil {
		b.servers.Store(servers)
	}
}

// decideFull decides checks that Redis refused to record for lack of
// memory (maxmemory with noeviction). A full Redis still answers reads:
// the clients it holds are decided in process from what it holds (once an
// outage: later, the in-process store knows more), exact as the fallback
// is; a client it holds nothing of gets the fail mode, or with fail_mode
// local the in-process store too. Neither counts as a Redis failure.
func (b *backend) decideFull(ctx context.Context, checks []limiter.Check, decisions []limiter.Decision, oom error) (source, error) {
	b.oom.Inc()
	b.oomFailures.record(b.failMode, oom)
	if !b.fallback.Seeded(checks) {
		peeked := make([]limiter.Decision, len(checks))
		err := b.redis.Peek(ctx, checks, peeked)
		if err != nil && ctx.Err() != nil {
			return fromStore, err
		}
		known := err == nil && b.fallback.Sighted(checks, peeked)
		if !known && b.mode != redisWithLocal {
			return fromStore, oom
		}
	}
	// The in-process store never fails.
	_ = b.fallback.Allow(ctx, checks, decisions)
	b.periods.clamp(checks, decisions, periodNow())
	return fromLocal, nil
}

// markUnread marks the decisions that a denial from the deny cache did not
// read: the zones that admit, of which the cache knows nothing (the store
// was not asked), so their headers are left out rather than shown as spent.
func markUnread(decisions []limiter.Decision) {
	for i := range decisions {
		if decisions[i].Allowed {
			decisions[i].Remaining = unread
		}
	}
}

// lowering says which denials a settle that changes a check's cost may
// undo.
type lowering uint8

const (
	// notLowered: the cost is the same or higher; no denial lifts.
	notLowered lowering = iota
	// loweredHere: a denial this instance's cache holds may lift.
	loweredHere
	// loweredEverywhere: a denial any instance caches may lift, since one
	// may rest on the admission (see Zone.denialMayRestOn).
	loweredEverywhere
	// loweredIfNoRoom: as loweredEverywhere when the store says the zone
	// had no room for the request's reservation before the settle
	// (limiter.Decision.Lifts); else as loweredHere.
	loweredIfNoRoom
)

// settle replaces what src recorded for checks with each check's Cost, the
// real cost (0 takes an admission back), and forgets the denials a lower
// cost may undo, as lowered says for each: in this instance's deny cache,
// and on every instance through an announcement. A failure is logged: the
// reservations then count until they age out.
//
// In Redis, it returns once the settle is queued, before Redis answers:
// the response is then not held for a round trip (with HTTP/1.1, nor is
// the next request on its connection), and the client's next decision,
// queued after it, is still decided after it. What follows the answer runs
// when it comes; checks and decisions are the settle's (its settlement's)
// until then, and close waits for it. A settle that charges more than was
// reserved is answered before it returns (limiter.RedisStore.SettleLater),
// so that the client's next request, through any instance, counts it.
//
// A settle that Redis did not take (a deadline, a lost connection, Redis
// away) is sent again until it does (retrySettle): its reservation holds
// the room meanwhile, and a charge above the reservation is not lost.
func (b *backend) settle(ctx context.Context, checks []limiter.Check, decisions []limiter.Decision, lowered []lowering, src source) {
	if src == fromStore && b.redis != nil {
		b.settling.Add(1)
		b.redis.SettleLater(ctx, checks, decisions, func(err error) {
			if settleAgain(err) {
				go b.retrySettle(ctx, checks, decisions, lowered, src, err)
				return
			}
			defer b.settling.Done()
			if err == nil {
				b.settled(ctx, checks, decisions, lowered, src)
			}
			b.settleFailed(err)
		})
		return
	}
	b.settleFailed(b.settleIn(ctx, checks, decisions, lowered, src))
}

// Settles Redis did not take are tried again after settleRetryFirst, then
// at twice the last wait, up to settleRetryMax: a Redis that is back takes
// them within a second or two, and one that is away gets few calls.
const (
	settleRetryFirst = 50 * time.Millisecond
	settleRetryMax   = 2 * time.Second
)

// settleAgain reports whether a settle that failed with err is to be sent
// again: any failure but one of its own input or of a lease that expired,
// which no retry changes. A settle whose reply was lost may have been
// recorded: sent again, it records the cost twice (the script finds no
// reservation to take back), which charges the client twice and never
// admits anyone.
func settleAgain(err error) bool {
	return err != nil && !errors.Is(err, limiter.ErrInvalidCheck) && !errors.Is(err, limiter.ErrLeaseLost)
}

// retrySettle sends a settle that failed with err again until Redis takes
// it, the longest window of its checks has passed (its reservation has aged
// out, and a charge that late counts in a window of its own), or the
// backend closes, which gets one last try.
func (b *backend) retrySettle(ctx context.Context, checks []limiter.Check, decisions []limiter.Decision, lowered []lowering, src source, err error) {
	defer b.settling.Done()
	var window time.Duration
	for _, c := range checks {
		window = max(window, c.Limit.Window)
	}
	until := time.Now().Add(window)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for wait := settleRetryFirst; settleAgain(err) && time.Now().Before(until); wait = min(2*wait, settleRetryMax) {
		timer.Reset(wait)
		last := false
		select {
		case <-timer.C:
		case <-b.closing:
			last = true
		}
		err = b.redis.Settle(ctx, checks, decisions)
		if last {
			break
		}
	}
	if err == nil {
		b.settled(ctx, checks, decisions, lowered, src)
	}
	b.settleFailed(err)
}

// settleFailed counts and logs a settle that failed with err, if it did.
func (b *backend) settleFailed(err error) {
	if err == nil {
		return
	}
	if limiter.OutOfMemory(err) {
		limiterMetrics.storeErrors.WithLabelValues(reasonOOM).Inc()
	}
	b.settleFailures.record(b.failMode, err)
}

// failed counts and logs, throttled, a decision that the store failed: a
// Redis out of memory apart, since it fails every write until someone
// frees memory or changes its policy, and the line says so.
func (b *backend) failed(err error) {
	if limiter.OutOfMemory(err) {
		b.oom.Inc()
		b.oomFailures.record(b.failMode, err)
		return
	}
	b.failures.record(b.failMode, err)
	// Redis may come back as a replica that lost the last writes.
	if b.fallback != nil {
		b.fallback.Lost()
	}
}

// settleIn settles checks in the store that src says took them, and waits
// for it.
func (b *backend) settleIn(ctx context.Context, checks []limiter.Check, decisions []limiter.Decision, lowered []lowering, src source) error {
	var store limiter.Store = b.store
	if src == fromLocal {
		store = b.fallback
	}
	if err := store.Settle(ctx, checks, decisions); err != nil {
		return err
	}
	b.settled(ctx, checks, decisions, lowered, src)
	return nil
}

// settled forgets the denials that the settle of checks may undo, as
// lowered says.
func (b *backend) settled(ctx context.Context, checks []limiter.Check, decisions []limiter.Decision, lowered []lowering, src source) {
	for i, c := range checks {
		if lowered[i] == notLowered {
			continue
		}
		b.cache.Forget(c.Zone, c.Key)
		everywhere := lowered[i] == loweredEverywhere || lowered[i] == loweredIfNoRoom && decisions[i].Lifts
		if everywhere && src == fromStore && b.redis != nil {
			// The settle was applied: a refused announcement (a
			// user without the channels) is not a failed settle.
			if err := b.conn.AnnounceFreed(ctx, b.redis.Key(c.Zone, c.Key)); err != nil {
				b.unannounced.record(b.failMode, err)
			}
		}
	}
}

// extend restarts the lease time of the leases that decisions hold, in the
// store that src says took them.
func (b *backend) extend(ctx context.Context, checks []limiter.Check, decisions []limiter.Decision, src source) error {
	var store limiter.Store = b.store
	if src == fromLocal {
		store = b.fallback
	}
	return store.Extend(ctx, checks, decisions)
}

// operatorMinTimeout is the least time an operator's call (the admin API)
// gives a store: more than a request's decision gets, since nobody waits
// behind it.
const operatorMinTimeout = time.Second

func (b *backend) operatorTimeout() time.Duration {
	return max(b.timeout, operatorMinTimeout)
}

// peek reads a client's state in a zone from the store, recording nothing:
// the decision a request of check would get, and the units the zone's
// window holds, read in the same call as the room left under the largest
// max, exact even past check's max (after a charge above a reservation).
func (b *backend) peek(ctx context.Context, check limiter.Check) (d limiter.Decision, used int64, err error) {
	ctx, cancel := context.WithTimeout(ctx, b.operatorTimeout())
	defer cancel()
	if check.Limit.Algorithm == limiter.Concurrency {
		// Its leases are requests: what is used is what is not left.
		decisions := make([]limiter.Decision, 1)
		err = b.store.Peek(ctx, []limiter.Check{check}, decisions)
		return decisions[0], max(check.Limit.Max-decisions[0].Remaining, 0), err
	}
	// all keeps check's wait: a call waits only if each of its checks may.
	all := check
	all.Limit.Max, all.Cost = maxMaxRequests, 0
	checks, decisions := []limiter.Check{check, all}, make([]limiter.Decision, 2)
	err = b.store.Peek(ctx, checks, decisions)
	b.periods.clamp(checks, decisions, periodNow())
	return decisions[0], maxMaxRequests - decisions[1].Remaining, err
}

// resetDone records the stores that one reset has reached, so that handlers
// that share a store reset each key in it once.
type resetDone map[resetTarget]bool

type resetTarget struct {
	state any
	key   string
}

// reset forgets a client's admissions in a zone: in each of the backend's
// stores that done does not hold yet, and in the deny cache. It returns the
// reset that the other instances must hear of, nil without Redis or when
// another handler's reset of the same store announces it.
func (b *backend) reset(ctx context.Context, zone, key string, done resetDone) (*announcement, error) {
	// Directly, not through pub/sub: this instance is exact as soon as the
	// stores are, even while its subscriber is away. Also after an error:
	// the store may have reset the key before failing, and forgetting costs
	// one store call at most.
	defer b.cache.Forget(zone, key)
	var announce *announcement
	reset, err := b.resetOnce(ctx, b.state(), b.store, zone, key, done)
	if reset && b.redis != nil {
		announce = &announcement{conn: b.conn, key: b.redis.Key(zone, key), timeout: b.operatorTimeout()}
	}
	if b.fallback != nil {
		_, localErr := b.resetOnce(ctx, b.local, b.fallback, zone, key, done)
		err = errors.Join(err, localErr)
	}
	return announce, err
}

// resetOnce resets a client in the store whose state is state, unless done
// says it is reset already, and reports whether it did.
func (b *backend) resetOnce(ctx context.Context, state any, store limiter.Store, zone, key string, done resetDone) (bool, error) {
	t := resetTarget{state, key}
	if done[t] {
		return false, nil
	}
	done[t] = true
	ctx, cancel := context.WithTimeout(ctx, b.operatorTimeout())
	defer cancel()
	if err := store.Reset(ctx, zone, key); err != nil {
		return false, err
	}
	return true, nil
}

// announcement is a reset for the other instances to hear of: the store's
// key, on the backend's connection.
type announcement struct {
	conn    *redisconn.Conn
	key     string
	timeout time.Duration
}

// send announces the reset and reports whether this instance's own
// subscriber heard it within redisconn.EchoTimeout: if not, other instances
// may be disconnected from pub/sub too.
func (a *announcement) send(ctx context.Context) (echoed bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, a.timeout)
	defer cancel()
	return a.conn.AnnounceReset(ctx, a.key)
}

// blocked lists the clients that the deny cache holds as denied, the
// longest wait first, at most limit of them, and counts them all. It costs
// no store call.
func (b *backend) blocked(limit int) ([]limiter.DeniedKey, int) {
	return b.cache.Denied(nil, limit)
}

// redisState identifies the state of a Redis store: handlers with the same
// connection and key prefix read and write the same keys.
type redisState struct {
	client any
	prefix string
}

// state identifies where the backend's store keeps its state: backends with
// the same one share the state of zones of the same identity.
func (b *backend) state() any {
	if b.redis != nil {
		return redisState{b.conn.Client(), b.keyPrefix}
	}
	return b.store
}

// Announced implements redisconn.Listener: it forgets key in the deny cache
// and, for a reset, in the in-process fallback too, if key is one of the
// backend's.
func (b *backend) Announced(key string, what redisconn.Announcement) {
	zone, client, ours, ok := b.redis.ParseKey(key)
	switch {
	case !ours:
		// Another key prefix: another handler's keys.
		return
	case ok && !slices.Contains(b.zones, b.periods.base(zone)):
		// A period zone's state names its period too.
		return
	case !ok || b.redis.Key(zone, client) != key:
		// A key of this prefix in a layout this version does not know,
		// from another version during an upgrade: forgetting everything is
		// exact, forgetting nothing may not be.
		b.cache.Clear()
		return
	}
	b.cache.Forget(zone, client)
	if b.fallback != nil && what == redisconn.Reset {
		// The in-process store never fails.
		_ = b.fallback.Reset(context.Background(), zone, client)
	}
}

// Subscribed implements redisconn.Listener: announcements may have been
// missed, so the whole deny cache goes.
func (b *backend) Subscribed() {
	b.cache.Clear()
}

// close releases this use of the pooled parts.
func (b *backend) close() error {
	b.closeOnce.Do(func() { close(b.closing) })
	b.settling.Wait()
	b.recovering.Wait()
	var first error
	for i := len(b.releases) - 1; i >= 0; i-- {
		if err := b.releases[i](); err != nil && first == nil {
			first = err
		}
	}
	b.releases = nil
	return first
}

// stores holds the Redis stores and the in-process store, one per distinct
// configuration, shared by every handler that names it and kept across config
// reloads: a reload neither reconnects nor forgets in-process limits.
var stores = caddy.NewUsagePool()

// memoryStoreKey is the pool key of the single in-process store.
const memoryStoreKey = "memory"

type memoryStore struct{ *limiter.MemoryStore }

func (m memoryStore) Destruct() error { return m.Close() }

// loadMemoryStore returns the process's in-process store and the function
// that releases this use of it.
func loadMemoryStore() (*limiter.MemoryStore, func() error) {
	v, _, _ := stores.LoadOrNew(memoryStoreKey, func() (caddy.Destructor, error) {
		return memoryStore{limiter.NewMemoryStore()}, nil
	})
	return v.(memoryStore).MemoryStore, func() error {
		_, err := stores.Delete(memoryStoreKey)
		return err
	}
}

// redisStore is a pooled store with the use of the connection it holds.
type redisStore struct {
	*limiter.RedisStore
	conn *redisconn.Conn
}

func (s redisStore) Destruct() error {
	s.RedisStore.Close()
	return s.conn.Close()
}

// loadRedisStore returns the shared store for a topology, URL, key prefix
// and timeout, and the function that releases this use of it. Handlers that
// agree on all four share one store, and so one batch of decisions per
// script call; the store lives as long as the handlers that use it, and
// holds its connection that long.
func loadRedisStore(topology, rawURL string, opts limiter.RedisOptions) (*limiter.RedisStore, func() error, error) {
	poolKey := fmt.Sprintf("redis store %s %s %q %d", topology, rawURL, opts.KeyPrefix, opts.Timeout)
	v, _, err := stores.LoadOrNew(poolKey, func() (caddy.Destructor, error) {
		conn, err := redisconn.Open(topology, rawURL)
		if err != nil {
			return nil, err
		}
		return redisStore{limiter.NewRedisStore(conn.Client(), opts), conn}, nil
	})
	if err != nil {
		return nil, nil, err
	}
	return v.(redisStore).RedisStore, func() error {
		_, err := stores.Delete(poolKey)
		return err
	}, nil
}

// timedStore observes how long each Redis decision takes, errors included.
type timedStore struct{ *limiter.RedisStore }

func (s timedStore) Allow(ctx context.Context, checks []limiter.Check, decisions []limiter.Decision) error {
	start := time.Now()
	err := s.RedisStore.Allow(ctx, checks, decisions)
	limiterMetrics.redisDuration.Observe(time.Since(start).Seconds())
	return err
}

// redisSilentAtStart is the warning of a Redis that does not answer at load:
// what each fail mode does meanwhile, since with open it is every limit off.
func redisSilentAtStart(failMode string) string {
	const msg = "redis not reachable at provision: "
	switch failMode {
	case failClosed:
		return msg + "requests are refused with 503 (fail_mode closed) until it answers"
	case failLocal:
		return msg + "each instance counts alone in process (fail_mode local) until it answers"
	}
	return msg + "requests pass unlimited (fail_mode open) until it answers; decisions_total counts them as failed_open"
}
