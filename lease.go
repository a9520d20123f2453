package slidingratelimit

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/limiter"
)

// A concurrency zone's admitted request holds a lease: a slot that the store
// counts until the request gives it back or its lease time passes. The
// request takes it with its other zones (all or nothing, one store call),
// gives it back when its response ends (the after-response settle, see
// Zone.counts), and the leaseKeeper extends it while the response runs, so
// that only the leases of an instance that died expire.
//
// A request of a zone that settles holds its reservation the same way: it
// counts until the call is settled, however long the call runs. Recorded
// at the admission, it would leave the window after one window, and a
// stream longer than that would stop holding its room before it is
// charged; the keeper moves it to now (limiter's Extend) as it extends a
// lease, so that it never ages out while its call runs.

// leaseKeeper extends the leases of one handler's running requests, from one
// goroutine, every sixth of the shortest lease time of its zones: a lease
// is extended once a third of its lease time has passed since it was taken
// or last extended, so at the latest half way, leaving the other half for
// an extension that fails (Redis away) to be tried again. The extensions due
// at a tick are sent together, many leases per call (see leaseBatch), so
// their cost grows with the long requests by a script call per few hundred.
type leaseKeeper struct {
	backend *backend
	every   time.Duration

	mu      sync.Mutex
	running map[*runningLease]struct{}

	quit     chan struct{}
	stopped  sync.Once
	inUse    map[*Zone]prometheus.Gauge
	lost     map[*Zone]prometheus.Counter
	failures *failureLog
	// lostLog logs leases that expired, dataLostLog leases that the store
	// lost before their lease time.
	lostLog, dataLostLog *failureLog
	dataLost             prometheus.Counter
}

// runningLease is one lease of a running request, with copies of its check
// and decision: extending changes a decision, so the keeper has its own.
type runningLease struct {
	zone     *Zone
	check    limiter.Check
	decision limiter.Decision
	src      source
	// index is the check's in its request, whose decision a moved
	// reservation replaces when the request ends.
	index int
	// extending counts the keeper's extensions in flight, which the
	// request's end waits for: a reservation moved meanwhile is the one
	// its settle must take back.
	extending sync.WaitGroup
	// due is when the lease is next extended; renewed is when it was
	// taken or last extended, so that it runs until renewed plus its lease
	// time; lost is set when it was gone first. All are guarded by the
	// keeper's mu.
	due, renewed time.Time
	lost         bool
}

// Extensions due at one tick go to the store in calls of at most
// leaseBatch leases, leaseCalls of them at once: the store puts concurrent
// calls into one script call, so a few hundred long requests cost one or
// two script calls a tick.
const (
	leaseBatch = 64
	leaseCalls = 4
)

// newLeaseKeeper starts the keeper of a handler with zones on b, or returns
// nil when no zone is a concurrency zone.
func newLeaseKeeper(zones []*Zone, b *backend, logger *zap.Logger) *leaseKeeper {
	k := &leaseKeeper{
		backend:     b,
		running:     make(map[*runningLease]struct{}),
		quit:        make(chan struct{}),
		inUse:       make(map[*Zone]prometheus.Gauge),
		lost:        make(map[*Zone]prometheus.Counter),
		failures:    newFailureLog(logger, "extending the leases of running requests failed: they expire after their lease time unless a later extension succeeds", time.Second),
		lostLog:     newFailureLog(logger, "a running request's lease expired before it was extended (the store was away for more than half the lease time?): another request may take its slot", time.Second),
		dataLostLog: newFailureLog(logger, "a running request's lease was gone from the store before its lease time ran out: the store lost its data (a restart without persistence, a FLUSHALL, an eviction), and another request may take its slot", time.Second),
		dataLost:    limiterMetrics.storeErrors.WithLabelValues(reasonDataLost),
	}
	kept := 0
	for _, z := range zones {
		if !z.holdsWhileRunning() {
			continue
		}
		kept++
		if k.every == 0 || z.limit.Window/6 < k.every {
			k.every = z.limit.Window / 6
		}
		if z.limit.Algorithm == limiter.Concurrency {
			k.inUse[z] = limiterMetrics.leasesInUse.WithLabelValues(z.Name)
			k.lost[z] = limiterMetrics.leasesLost.WithLabelValues(z.Name)
		}
	}
	if kept == 0 {
		return nil
	}
	k.every = max(k.every, time.Millisecond)
	go k.run()
	return k
}

// holdsWhileRunning reports whether the zone's admissions are kept while
// their requests run: a concurrency zone's leases, and the reservations of
// a log zone that settles.
func (z *Zone) holdsWhileRunning() bool {
	return z.limit.Algorithm == limiter.Concurrency || z.keepsReservations()
}

// keepsReservations reports whether the reservations of the zone's running
// calls are kept while they run, and so known (leaseKeeper.reserved): a
// log zone that settles.
func (z *Zone) keepsReservations() bool {
	return z.limit.Algorithm == limiter.SlidingLog && z.units != nil && z.units.settle != nil
}

// around returns next, wrapped so that the leases and reservations req
// holds are kept while next runs: from when it starts (after any wait)
// until it returns, which is before the after-response settle releases
// them. Without either it is next.
func (k *leaseKeeper) around(next caddyhttp.Handler, req *request, src source) caddyhttp.Handler {
	if k == nil {
		return next
	}
	var leases []*runningLease
	for i, z := range req.zones {
		if z.holdsWhileRunning() {
			leases = append(leases, &runningLease{zone: z, check: req.checks[i], decision: req.decisions[i], src: src, index: i})
		}
	}
	if len(leases) == 0 {
		return next
	}
	return caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		k.add(leases)
		defer k.remove(leases, req)
		return next.ServeHTTP(w, r)
	})
}

func (k *leaseKeeper) add(leases []*runningLease) {
	now := time.Now()
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, l := range leases {
		l.due, l.renewed = now.Add(l.check.Limit.Window/3), now
		k.running[l] = struct{}{}
		if g := k.inUse[l.zone]; g != nil {
			g.Inc()
		}
	}
}

// remove ends the keeping of req's leases and reservations, once the
// extensions in flight are answered, and hands req the reservations as
// they were last moved, for its settle.
func (k *leaseKeeper) remove(leases []*runningLease, req *request) {
	k.mu.Lock()
	for _, l := range leases {
		delete(k.running, l)
		if g := k.inUse[l.zone]; g != nil {
			g.Dec()
		}
	}
	k.mu.Unlock()
	for _, l := range leases {
		l.extending.Wait()
		if l.zone.limit.Algorithm != limiter.Concurrency {
			k.mu.Lock()
			req.decisions[l.index] = l.decision
			k.mu.Unlock()
		}
	}
}

// held counts the leases that requests of this handler run under in the
// zone of that identity for the client key.
func (k *leaseKeeper) held(identity, key string) int64 {
	return k.sum(identity, key, func(*runningLease) int64 { return 1 })
}

// reserved sums the units that requests of this handler hold as
// reservations while they run, in the store's state (the zone's identity,
// or its period's) for the client key: what they reserved, recorded in the
// store that decides (a call that the fallback admitted while Redis failed
// is not). A call held for its slot (a wait) is kept only once it goes on,
// and one whose response ended only until its settle begins.
func (k *leaseKeeper) reserved(state, key string) int64 {
	return k.sum(state, key, func(l *runningLease) int64 {
		if l.src != fromStore || !l.zone.keepsReservations() {
			return 0
		}
		return max(l.check.Cost, 1)
	})
}

// sum adds up what of each running request's hold in the state for the
// client key counts.
func (k *leaseKeeper) sum(state, key string, counts func(*runningLease) int64) int64 {
	if k == nil {
		return 0
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	var n int64
	for l := range k.running {
		if l.check.Zone == state && l.check.Key == key {
			n += counts(l)
		}
	}
	return n
}

func (k *leaseKeeper) run() {
	tick := time.NewTicker(k.every)
	defer tick.Stop()
	quit := k.quit
	for {
		select {
		case <-quit:
			quit = nil
		case now := <-tick.C:
			k.extendDue(now)
		}
		if quit == nil && k.idle() {
			return
		}
	}
}

// idle reports whether no request holds a lease of the keeper's.
func (k *leaseKeeper) idle() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.running) == 0
}

// stop ends the keeper once no request holds a lease of its: after a
// config reload, a request of the old config may run on (a WebSocket that
// reverse_proxy keeps with stream_close_delay), and keeps its slot while
// it runs. A lease that the store behind the old config no longer takes
// (its Redis changed) expires after its lease time.
func (k *leaseKeeper) stop() {
	if k == nil {
		return
	}
	k.stopped.Do(func() { close(k.quit) })
}

// extendDue extends the leases due at now, and returns when every extension
// has been answered.
func (k *leaseKeeper) extendDue(now time.Time) {
	var due []*runningLease
	k.mu.Lock()
	for l := range k.running {
		if !l.lost && !now.Before(l.due) {
			l.extending.Add(1)
			due = append(due, l)
		}
	}
	k.mu.Unlock()
	// A call goes to one store: the fallback's leases apart.
	slices.SortFunc(due, func(a, b *runningLease) int { return int(a.src) - int(b.src) })
	batches := make(chan []*runningLease)
	var wg sync.WaitGroup
	for range min(leaseCalls, (len(due)+leaseBatch-1)/leaseBatch) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for batch := range batches {
				k.extend(batch)
			}
		}()
	}
	for len(due) > 0 {
		n := min(len(due), leaseBatch)
		for i := 1; i < n; i++ {
			if due[i].src != due[0].src {
				n = i
				break
			}
		}
		batches <- due[:n]
		due = due[n:]
	}
	close(batches)
	wg.Wait()
}

// extend extends the leases and moves the reservations of one store in one
// call, and notes the outcome: each due again a third of its lease time
// later; or, when the store says that a lease expired first, each lease
// extended alone to find which; or, on a store error, all due at the next
// tick. Each is marked done with extending.
func (k *leaseKeeper) extend(batch []*runningLease) {
	defer func() {
		for _, l := range batch {
			l.extending.Done()
		}
	}()
	k.extendOnce(batch)
}

func (k *leaseKeeper) extendOnce(batch []*runningLease) {
	start := time.Now()
	checks := make([]limiter.Check, len(batch))
	decisions := make([]limiter.Decision, len(batch))
	for i, l := range batch {
		// Copies: the store marks a lost lease's decision, and the lease's
		// own is kept for finding it.
		checks[i], decisions[i] = l.check, l.decision
	}
	err := k.backend.extend(context.Background(), checks, decisions, batch[0].src)
	// Each decision holds the record its reservation has now: moved, even
	// when a lease was lost, or where it was when the call failed before it.
	k.mu.Lock()
	for i, l := range batch {
		if l.zone.limit.Algorithm != limiter.Concurrency {
			l.decision = decisions[i]
		}
	}
	k.mu.Unlock()
	if errors.Is(err, limiter.ErrLeaseLost) && len(batch) > 1 {
		for _, l := range batch {
			if l.zone.limit.Algorithm == limiter.Concurrency {
				k.extendOnce([]*runningLease{l})
			} else {
				k.noteExtended(l, start)
			}
		}
		return
	}
	if limiter.OutOfMemory(err) {
		limiterMetrics.storeErrors.WithLabelValues(reasonOOM).Inc()
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, l := range batch {
		_, running := k.running[l]
		switch {
		case err == nil:
			l.due, l.renewed = start.Add(l.check.Limit.Window/3), start
		case l.zone.limit.Algorithm != limiter.Concurrency && errors.Is(err, limiter.ErrLeaseLost):
			// A reservation is never lost: the batch's lease was.
			l.due, l.renewed = start.Add(l.check.Limit.Window/3), start
		case !running:
			// Its request ended meanwhile, and gave the lease back.
		case errors.Is(err, limiter.ErrLeaseLost):
			l.lost = true
			k.lost[l.zone].Inc()
			if start.Before(l.renewed.Add(l.check.Limit.Window)) {
				// Asked before its lease time ran out: it did not expire.
				k.dataLost.Inc()
				k.dataLostLog.record(k.backend.failMode, err)
			} else {
				k.lostLog.record(k.backend.failMode, err)
			}
		default:
			k.failures.record(k.backend.failMode, err)
		}
	}
}

// noteExtended marks l, a moved reservation, due again a third of its
// window after start.
func (k *leaseKeeper) noteExtended(l *runningLease, start time.Time) {
	k.mu.Lock()
	defer k.mu.Unlock()
	l.due, l.renewed = start.Add(l.check.Limit.Window/3), start
}

// leaseRetryAfter is what a denial by a concurrency zone tells the client to
// wait: the shortest time Retry-After can say.
const leaseRetryAfter = time.Second

// leaseAnswers sets what the decisions of concurrency zones tell the client.
// No time until a slot frees is true for them: one frees when a request in
// flight ends, which may be at any moment; the store's RetryAfter is when
// the oldest lease expires, which is true only of a lease that nobody
// extends any more (its instance died). So a denial says Retry-After: 1,
// the shortest wait the header can say, its reset is that second too, and
// an admission has no reset (the RateLimit header leaves t out for such a
// zone).
func leaseAnswers(zones []*Zone, decisions []limiter.Decision) {
	for i, z := range zones {
		if z.limit.Algorithm != limiter.Concurrency {
			continue
		}
		d := &decisions[i]
		d.Reset = 0
		if !d.Allowed && !d.Never {
			d.RetryAfter, d.Reset = leaseRetryAfter, leaseRetryAfter
		}
	}
}
