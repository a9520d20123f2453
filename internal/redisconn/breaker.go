package redisconn

import (
	"context"
	"errors"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/limiter"
)

// ErrBreakerOpen is returned by a guarded store, at once and without calling
// the store, while its breaker is open, and to callers that waited for a probe
// that failed. Callers apply their fail mode to it as to any store error.
var ErrBreakerOpen = errors.New("circuit breaker open: store not called")

// BreakerState is the state of a Breaker.
type BreakerState int32

const (
	// BreakerClosed: every call goes to the store.
	BreakerClosed BreakerState = iota
	// BreakerOpen: calls fail with ErrBreakerOpen until the cool-down ends.
	BreakerOpen
	// BreakerHalfOpen: one call, the probe, goes to the store; the others
	// wait for its outcome.
	BreakerHalfOpen
)

// String returns "closed", "open" or "half-open".
func (s BreakerState) String() string {
	switch s {
	case BreakerClosed:
		return "closed"
	case BreakerOpen:
		return "open"
	case BreakerHalfOpen:
		return "half-open"
	}
	return "BreakerState(" + strconv.Itoa(int(s)) + ")"
}

// Defaults of BreakerOptions. The cool-downs are short because they are how
// long users keep getting the fail mode after the store is back; a probe every
// 100ms is still nothing to a store that is down.
const (
	defaultBreakerFailures    = 5
	defaultBreakerCooldown    = 25 * time.Millisecond
	defaultBreakerMaxCooldown = 100 * time.Millisecond
)

// BreakerOptions configures a Breaker. Zero (or negative) values mean the
// defaults.
type BreakerOptions struct {
	// Failures is how many consecutive failed calls open the breaker
	// (default 5). A failed dial (connection refused, unknown host) opens
	// it at once: it says the store is unreachable, and fails so fast that
	// waiting for more would only let more requests through to fail.
	Failures int
	// Cooldown is how long the breaker stays open before it lets a probe
	// through, the first time (default 25ms). Each failed probe doubles it,
	// up to MaxCooldown; closing resets it.
	Cooldown time.Duration
	// MaxCooldown bounds the cool-down (default 100ms, and never less than
	// Cooldown). It bounds how long the breaker stays open after the store
	// is back.
	MaxCooldown time.Duration
	// OnStateChange, if set, is called once for every transition, in the
	// order the transitions happened, outside the breaker's locks: fit for
	// logging each change once and setting a gauge. It may be called from
	// another goroutine than the one whose call caused the transition, and it
	// should return quickly and not panic.
	OnStateChange func(from, to BreakerState)
}

// Breaker is a circuit breaker for one backend, such as a Redis client, shared
// by every store that calls it (see Guard): the backend fails for all of them
// at once, so they open, probe and close together.
//
// Closed, it passes every call to the store and counts consecutive failures;
// a success resets the count, and Failures of them in a row open it. Open, it
// answers ErrBreakerOpen at once, without calling the store, for a cool-down.
// Then the next caller becomes the only probe (half-open) and the callers that
// come while it runs wait for its outcome, each until its own deadline: if the
// store answers, the breaker closes and they go on to the store, so a burst
// that meets a recovering store loses nothing to the half-open state; if not,
// the breaker opens for a cool-down twice as long (up to MaxCooldown) and they
// get ErrBreakerOpen. A dead store thus receives one call per cool-down
// whatever the load.
//
// A failure is any store error, including a context deadline, except a
// cancellation by the caller: when the caller's context was cancelled and the
// error wraps context.Canceled, the client went away and says nothing about
// the store, so the call counts neither as failure nor as success. Nor
// does a store's refusal of a call's own input (limiter.ErrInvalidCheck: a
// window the engine cannot keep), or one handler's bad input would open
// the breaker of every handler on that Redis; nor Redis refusing a write
// for lack of memory (OutOfMemory), since a full Redis answers; nor a
// deadline missed while this host's CPUs held the call up
// (limiter.ErrHostBusy: a connection storm), which says nothing of Redis.
//
// Callers must give every call a deadline: a probe that never returns keeps the
// breaker half-open. Results of calls that started before a transition are
// ignored. While closed, a guarded store's Allow takes no lock and allocates
// nothing. A Breaker is safe for concurrent use.
type Breaker struct {
	failures    int32
	cooldown    time.Duration
	maxCooldown time.Duration
	onChange    func(from, to BreakerState)

	// now is the clock; tests replace it before first use.
	now func() time.Time

	// epoch is the current state. Every transition installs a new epoch, so
	// an epoch's counters belong to it alone and results of calls started in
	// an older epoch land in that epoch, where they change nothing.
	epoch atomic.Pointer[breakerEpoch]

	// mu serializes transitions and the delivery of OnStateChange calls.
	mu sync.Mutex
	// nextCooldown is the cool-down of the next opening; under mu.
	nextCooldown time.Duration
	pending      []breakerChange
	delivering   bool
	// openings counts the transitions from closed to open.
	openings atomic.Int64
}

// breakerEpoch is one stay in one state. state and until never change.
type breakerEpoch struct {
	state BreakerState
	// until is, when open, the end of the cool-down.
	until time.Time
	// failures counts consecutive failures, when closed.
	failures atomic.Int32

	// When half-open: probing is set while a probe runs, and wake is closed
	// when it ends, whatever its outcome; a new probe gets a new wake.
	probeMu sync.Mutex
	probing bool
	wake    chan struct{}
}

type breakerChange struct{ from, to BreakerState }

// NewBreaker returns a closed breaker.
func NewBreaker(opts BreakerOptions) *Breaker {
	b := &Breaker{
		failures:    defaultBreakerFailures,
		cooldown:    defaultBreakerCooldown,
		maxCooldown: defaultBreakerMaxCooldown,
		onChange:    opts.OnStateChange,
		now:         time.Now,
	}
	if opts.Failures > 0 {
		b.failures = int32(min(opts.Failures, 1<<30))
	}
	if opts.Cooldown > 0 {
		b.cooldown = opts.Cooldown
	}
	if opts.MaxCooldown > 0 {
		b.maxCooldown = opts.MaxCooldown
	}
	b.maxCooldown = max(b.maxCooldown, b.cooldown)
	b.nextCooldown = b.cooldown
	b.epoch.Store(&breakerEpoch{state: BreakerClosed})
	return b
}

// State returns the current state.
func (b *Breaker) State() BreakerState { return b.epoch.Load().state }

// Openings returns how many times the breaker has opened from closed since
// it was made: each an outage as its callers saw it, however many probes
// failed before it closed again.
func (b *Breaker) Openings() int64 { return b.openings.Load() }

// Guard returns a Store that calls store through the breaker: every method,
// so a Settle does not wait for a store that Allow already knows is down.
// All the stores guarded by one breaker share its state: failures of any
// open it for all.
func (b *Breaker) Guard(store limiter.Store) limiter.Store { return guardedStore{b, store} }

type guardedStore struct {
	b    *Breaker
	next limiter.Store
}

// Allow implements Store. It returns ErrBreakerOpen without calling the store
// while the breaker is open or after a failed probe, and otherwise the store's
// own error. So do the other methods.
func (g guardedStore) Allow(ctx context.Context, checks []limiter.Check, decisions []limiter.Decision) error {
	return g.b.call(ctx, g.next.Allow, checks, decisions)
}

func (g guardedStore) Peek(ctx context.Context, checks []limiter.Check, decisions []limiter.Decision) error {
	return g.b.call(ctx, g.next.Peek, checks, decisions)
}

func (g guardedStore) Settle(ctx context.Context, checks []limiter.Check, decisions []limiter.Decision) error {
	return g.b.call(ctx, g.next.Settle, checks, decisions)
}

func (g guardedStore) Extend(ctx context.Context, checks []limiter.Check, decisions []limiter.Decision) error {
	return g.b.call(ctx, g.next.Extend, checks, decisions)
}

func (g guardedStore) Reset(ctx context.Context, zone, key string) error {
	return g.b.call(ctx, func(ctx context.Context, _ []limiter.Check, _ []limiter.Decision) error {
		return g.next.Reset(ctx, zone, key)
	}, nil, nil)
}

// storeCall is one of a Store's methods that take checks.
type storeCall func(ctx context.Context, checks []limiter.Check, decisions []limiter.Decision) error

func (b *Breaker) call(ctx context.Context, next storeCall, checks []limiter.Check, decisions []limiter.Decision) error {
	e := b.epoch.Load()
	if e.state != BreakerClosed {
		return b.callNotClosed(ctx, e, next, checks, decisions)
	}
	err := next(ctx, checks, decisions)
	if err == nil {
		// Read before writing, so that successes in a row do not bounce the
		// cache line between CPUs.
		if e.failures.Load() != 0 {
			e.failures.Store(0)
		}
		return nil
	}
	if !countsAsFailure(ctx, err) {
		return err
	}
	if IsDialError(err) {
		b.transition(e, BreakerOpen)
	} else if e.failures.Add(1) == b.failures {
		b.transition(e, BreakerOpen)
	}
	return err
}

// callNotClosed is call when the breaker was not closed at e.
func (b *Breaker) callNotClosed(ctx context.Context, e *breakerEpoch, next storeCall, checks []limiter.Check, decisions []limiter.Decision) error {
	for {
		switch e.state {
		case BreakerClosed:
			return b.call(ctx, next, checks, decisions)
		case BreakerOpen:
			if b.now().Before(e.until) {
				return ErrBreakerOpen
			}
			if probe := b.transition(e, BreakerHalfOpen); probe != nil {
				return b.probe(ctx, probe, next, checks, decisions)
			}
		case BreakerHalfOpen:
			e.probeMu.Lock()
			if !e.probing {
				// No probe runs: the last one's client went away.
				e.probing = true
				e.wake = make(chan struct{})
				e.probeMu.Unlock()
				return b.probe(ctx, e, next, checks, decisions)
			}
			wake := e.wake
			e.probeMu.Unlock()
			select {
			case <-wake:
			case <-ctx.Done():
				// The store was not called: the fail mode applies.
				return ErrBreakerOpen
			}
		default:
			panic("redisconn: invalid breaker state " + e.state.String())
		}
		// The breaker moved on (or the probe ended): look again.
		e = b.epoch.Load()
	}
}

// probe makes the one call of half-open epoch e, whose probing flag the caller
// has set, moves the breaker on by its outcome and wakes the callers waiting
// for it.
func (b *Breaker) probe(ctx context.Context, e *breakerEpoch, next storeCall, checks []limiter.Check, decisions []limiter.Decision) error {
	defer func() {
		// After the transition, so that the woken see the new state; also
		// when the store panics or the client went away, so that the next
		// caller probes.
		e.probeMu.Lock()
		e.probing = false
		close(e.wake)
		e.probeMu.Unlock()
	}()
	err := next(ctx, checks, decisions)
	switch {
	case err == nil, errors.Is(err, limiter.ErrLeaseLost), limiter.OutOfMemory(err):
		// Redis answered.
		b.transition(e, BreakerClosed)
	case countsAsFailure(ctx, err):
		b.transition(e, BreakerOpen)
	}
	return err
}

// countsAsFailure reports whether err, returned by the store for a call with
// ctx, says something is wrong with the store: everything but a cancellation
// by the caller, a lease that had expired, a check the engine refuses for its
// own figures, Redis refusing a write for lack of memory (a full Redis
// still answers, and reads it still serves, so its refusals open the breaker
// for no one: the backend decides those requests from what Redis holds), and
// a deadline that passed while the goroutines of this process waited for
// its CPUs (limiter.ErrHostBusy): counted, a connection storm would open the
// breaker and fail open the requests that Redis would have decided.
func countsAsFailure(ctx context.Context, err error) bool {
	if errors.Is(err, limiter.ErrLeaseLost) || errors.Is(err, limiter.ErrInvalidCheck) || limiter.OutOfMemory(err) ||
		errors.Is(err, limiter.ErrHostBusy) {
		return false
	}
	return ctx.Err() != context.Canceled || !errors.Is(err, context.Canceled)
}

// IsDialError reports whether err is a failure to connect: refused, no
// route, or a name that does not resolve. The breaker opens at once on one;
// callers that keep their own account of a server's reachability can use
// the same test.
func IsDialError(err error) bool {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return true
	}
	var dns *net.DNSError
	return errors.As(err, &dns)
}

// transition moves the breaker from epoch from to a new epoch in state to and
// returns it, or returns nil if the breaker has already left from. It then
// delivers pending OnStateChange calls unless another goroutine is at it.
func (b *Breaker) transition(from *breakerEpoch, to BreakerState) *breakerEpoch {
	b.mu.Lock()
	if b.epoch.Load() != from {
		b.mu.Unlock()
		return nil
	}
	e := &breakerEpoch{state: to}
	switch to {
	case BreakerOpen:
		if from.state == BreakerClosed {
			// The store answered since the last opening.
			b.nextCooldown = b.cooldown
			b.openings.Add(1)
		}
		e.until = b.now().Add(b.nextCooldown)
		b.nextCooldown = min(2*b.nextCooldown, b.maxCooldown)
	case BreakerHalfOpen:
		e.probing = true
		e.wake = make(chan struct{})
	}
	b.epoch.Store(e)
	if b.onChange == nil {
		b.mu.Unlock()
		return e
	}
	b.pending = append(b.pending, breakerChange{from.state, to})
	if b.delivering {
		// The delivering goroutine will call OnStateChange for this one
		// too, after the earlier transitions.
		b.mu.Unlock()
		return e
	}
	b.delivering = true
	b.deliver()
	return e
}

// deliver calls OnStateChange for the pending transitions, in order, without
// holding mu, until none is left. It is called with mu held and delivering
// set, and returns with mu released.
func (b *Breaker) deliver() {
	done := false
	defer func() {
		if !done {
			// OnStateChange panicked (mu is not held then): let the next
			// transition deliver.
			b.mu.Lock()
			b.delivering = false
			b.mu.Unlock()
		}
	}()
	for len(b.pending) > 0 {
		changes := b.pending
		b.pending = nil
		b.mu.Unlock()
		for _, c := range changes {
			b.onChange(c.from, c.to)
		}
		b.mu.Lock()
	}
	b.delivering = false
	b.mu.Unlock()
	done = true
}

// circuitState is one series per connection (each has one breaker),
// labelled by the Redis it guards: host:port, never credentials.
var circuitState = prometheus.NewGaugeVec(prometheus.GaugeOpts{
	Namespace: "caddy", Subsystem: "sliding_ratelimit", Name: "circuit_state",
	Help: "State of the circuit breaker around each Redis: 0 closed, 1 open, 2 half-open.",
}, []string{"redis"})

// CircuitState is the circuit_state metric of every connection, for the
// caller to register on each config's metrics registry.
func CircuitState() *prometheus.GaugeVec { return circuitState }

// newBreaker returns the circuit breaker of one connection, shared by every
// handler on it: they all fail together when that Redis does, so they open,
// probe and close together, each state change is logged once, and the
// circuit_state series of that Redis follows it. It logs with Caddy's
// default logger of the moment, since the connection outlives the configs
// whose handlers use it (and their loggers).
func newBreaker(label string) *Breaker {
	gauge := circuitState.WithLabelValues(label)
	gauge.Set(float64(BreakerClosed))
	return NewBreaker(BreakerOptions{
		OnStateChange: func(from, to BreakerState) {
			gauge.Set(float64(to))
			logger := caddy.Log().Named("http.handlers.sliding_ratelimit")
			switch {
			case from == BreakerClosed:
				logger.Warn("redis failing: circuit breaker open, applying each handler's fail mode without calling redis",
					zap.String("redis", label))
			case to == BreakerClosed:
				logger.Info("redis answers again: circuit breaker closed", zap.String("redis", label))
			default:
				// Probes, several a second while Redis is away: the two
				// lines above tell the story.
				logger.Debug("circuit breaker state changed",
					zap.String("redis", label), zap.String("from", from.String()), zap.String("to", to.String()))
			}
		},
	})
}
