package limiter

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// ErrBreakerOpen is returned by Breaker.Allow, at once and without calling the
// store, while the breaker is open or while another caller's probe is running.
// Callers apply their fail mode to it as to any store error.
var ErrBreakerOpen = errors.New("circuit breaker open: store not called")

// BreakerState is the state of a Breaker.
type BreakerState int32

const (
	// BreakerClosed: every call goes to the store.
	BreakerClosed BreakerState = iota
	// BreakerOpen: calls fail with ErrBreakerOpen until the cool-down ends.
	BreakerOpen
	// BreakerHalfOpen: one call, the probe, goes to the store; the others
	// fail with ErrBreakerOpen until it answers.
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

// Defaults of BreakerOptions.
const (
	DefaultBreakerFailures = 5
	DefaultBreakerCooldown = time.Second
)

// BreakerOptions configures a Breaker. Zero (or negative) values mean the
// defaults.
type BreakerOptions struct {
	// Failures is how many consecutive failed calls open the breaker
	// (default 5).
	Failures int
	// Cooldown is how long the breaker stays open before it lets one probe
	// through (default 1s).
	Cooldown time.Duration
	// OnStateChange, if set, is called once for every transition, in the
	// order the transitions happened, outside the breaker's locks: fit for
	// logging each change once and setting a gauge. It may be called from
	// another goroutine than the one whose call caused the transition, and it
	// should return quickly and not panic.
	OnStateChange func(from, to BreakerState)
}

// Breaker is a circuit breaker around a Store, itself a Store.
//
// Closed, it passes every call to the store and counts consecutive failures;
// a success resets the count, and Failures of them in a row open it. Open, it
// answers ErrBreakerOpen at once, without calling the store, for Cooldown.
// Then the next caller becomes the only probe (half-open): if the store
// answers, the breaker closes; if not, it opens for another Cooldown.
//
// A failure is any store error, including a context deadline, except a
// cancellation by the caller: when the caller's context was cancelled and the
// error wraps context.Canceled, the client went away and says nothing about
// the store, so the call counts neither as failure nor as success.
//
// Callers must give every call a deadline: a probe that never returns keeps the
// breaker half-open. Results of calls that started before a transition are
// ignored. While closed, Allow takes no lock and allocates nothing; it is safe
// for concurrent use.
type Breaker struct {
	next     Store
	failures int32
	cooldown time.Duration
	onChange func(from, to BreakerState)

	// now is the clock; tests replace it before first use.
	now func() time.Time

	// epoch is the current state. Every transition installs a new epoch, so
	// an epoch's counters belong to it alone and results of calls started in
	// an older epoch land in that epoch, where they change nothing.
	epoch atomic.Pointer[breakerEpoch]

	// mu serializes transitions and the delivery of OnStateChange calls.
	mu         sync.Mutex
	pending    []breakerChange
	delivering bool
}

// breakerEpoch is one stay in one state. state and until never change.
type breakerEpoch struct {
	state BreakerState
	// until is, when open, the end of the cool-down.
	until time.Time
	// failures counts consecutive failures, when closed.
	failures atomic.Int32
	// probing is set, when half-open, while a probe runs.
	probing atomic.Bool
}

type breakerChange struct{ from, to BreakerState }

// NewBreaker returns a closed breaker around next.
func NewBreaker(next Store, opts BreakerOptions) *Breaker {
	b := &Breaker{
		next:     next,
		failures: DefaultBreakerFailures,
		cooldown: DefaultBreakerCooldown,
		onChange: opts.OnStateChange,
		now:      time.Now,
	}
	if opts.Failures > 0 {
		b.failures = int32(min(opts.Failures, 1<<30))
	}
	if opts.Cooldown > 0 {
		b.cooldown = opts.Cooldown
	}
	b.epoch.Store(&breakerEpoch{state: BreakerClosed})
	return b
}

// State returns the current state.
func (b *Breaker) State() BreakerState { return b.epoch.Load().state }

// Allow implements Store. It returns ErrBreakerOpen without calling the store
// while the breaker is open or another caller's probe runs, and otherwise the
// store's own error.
func (b *Breaker) Allow(ctx context.Context, checks []Check, decisions []Decision) error {
	e := b.epoch.Load()
	if e.state != BreakerClosed {
		return b.allowNotClosed(ctx, e, checks, decisions)
	}
	err := b.next.Allow(ctx, checks, decisions)
	if err == nil {
		// Read before writing, so that successes in a row do not bounce the
		// cache line between CPUs.
		if e.failures.Load() != 0 {
			e.failures.Store(0)
		}
		return nil
	}
	if countsAsFailure(ctx, err) && e.failures.Add(1) == b.failures {
		b.transition(e, BreakerOpen)
	}
	return err
}

// allowNotClosed is Allow when the breaker was not closed at e.
func (b *Breaker) allowNotClosed(ctx context.Context, e *breakerEpoch, checks []Check, decisions []Decision) error {
	for {
		switch e.state {
		case BreakerClosed:
			return b.Allow(ctx, checks, decisions)
		case BreakerOpen:
			if b.now().Before(e.until) {
				return ErrBreakerOpen
			}
			if probe := b.transition(e, BreakerHalfOpen); probe != nil {
				return b.probe(ctx, probe, checks, decisions)
			}
			// Another caller moved the breaker on first: look again.
			e = b.epoch.Load()
		case BreakerHalfOpen:
			// probing is false only after a probe whose client went away.
			if e.probing.Load() || !e.probing.CompareAndSwap(false, true) {
				return ErrBreakerOpen
			}
			return b.probe(ctx, e, checks, decisions)
		default:
			panic("limiter: invalid breaker state " + e.state.String())
		}
	}
}

// probe makes the one call of half-open epoch e, whose probing flag the caller
// has set, and moves the breaker on by its outcome.
func (b *Breaker) probe(ctx context.Context, e *breakerEpoch, checks []Check, decisions []Decision) error {
	returned := false
	defer func() {
		if !returned {
			// The store panicked: let the next caller probe.
			e.probing.Store(false)
		}
	}()
	err := b.next.Allow(ctx, checks, decisions)
	returned = true
	switch {
	case err == nil:
		b.transition(e, BreakerClosed)
	case countsAsFailure(ctx, err):
		b.transition(e, BreakerOpen)
	default:
		// The client went away: no verdict, the next caller probes.
		e.probing.Store(false)
	}
	return err
}

// countsAsFailure reports whether err, returned by the store for a call with
// ctx, says something is wrong with the store: everything but a cancellation
// by the caller.
func countsAsFailure(ctx context.Context, err error) bool {
	return ctx.Err() != context.Canceled || !errors.Is(err, context.Canceled)
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
		e.until = b.now().Add(b.cooldown)
	case BreakerHalfOpen:
		e.probing.Store(true)
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
