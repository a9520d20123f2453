// Package limiter decides whether a client may make one more request under
// one or more limits. It knows nothing of HTTP: callers build the client key,
// stores keep the state.
//
// A Limit is a zone's rule. The sliding log (the default Algorithm) admits a
// request of cost c when the units admitted in the last Window, plus c, fit
// in Max; it is exact. The sliding counter does the same with two fixed-window
// sums, in O(1) memory, approximately. A concurrency zone limits the requests
// in flight: each admitted request holds a lease until it is settled, or until
// Window after it was taken or last extended, so a process that dies holding
// leases frees them after Window. Store.Extend keeps what a running request
// holds: its leases, and its reservations in log zones.
//
// A Check asks for one client in one zone; Store.Allow decides the checks of
// one request together, all or nothing, and fills one Decision per check. The
// semantics, which every store keeps:
//
//   - Units. A request costs Check.Cost units (0 means 1). The log keeps the
//     time and the running sum of units of each admission in its window, so
//     its memory grows with the admissions, not with the units, and is
//     bounded: past 256 entries, admissions within a 256th of Window merge
//     into one entry carrying their units and the latest of their times (it
//     leaves the window no earlier than any of them, so the limit holds; a
//     client may be denied up to that span early), and a log keeps at most
//     1,170 entries. A cost above Max is never admitted: the decision says
//     Never, with no RetryAfter.
//   - Denials are free. A denied request records nothing, in any zone, so a
//     client that keeps sending while denied is let through again as soon as
//     enough of its admissions age out; RetryAfter says exactly when.
//   - Waits. A log check may accept a Wait, even of several windows: when
//     the zone cannot admit now but can within the wait, the request is
//     admitted at the earliest time it can be, its admission is recorded at that future time (so every process
//     counts it, and no later request takes its slot), and Decision.Delay says
//     how long the caller must hold the request. With several zones, the
//     admission time is the latest of theirs, and every zone records it then.
//     Counter and concurrency zones do not wait: a Check with a Wait on them
//     is an error.
//   - Settling. After a request, Store.Settle replaces what its admission cost
//     with the real cost (Check.Cost, where 0 means 0): lower, zero (a refund)
//     or higher than reserved. The real cost counts from the settle, when the
//     response ended: the reservation is taken back and the cost recorded as
//     an admission then, so a call longer than Window is charged too. A
//     charge above the reservation is recorded in full even past Max; the
//     client then waits until enough ages out. Settle also releases the
//     request's leases. Settling twice does nothing. In a log zone a
//     reservation counts from its admission until its call is settled, as
//     long as the caller extends it (Store.Extend) at least once a Window
//     (the Caddy module extends once a third of a Window): each Extend moves
//     it, with its units, to the time of the Extend, as a Settle to the same
//     cost would record it, so that it counts for a further Window from
//     then. A reservation not extended for a Window ages out like any
//     admission, and other requests may take its room until the call is
//     extended again or settled. A counter zone's reservation is not moved:
//     it counts in the fixed window it was made in, weighted in the next,
//     however long the call runs.
//   - Changing Max. Max may differ from one call to the next for the same
//     client (a tenant's quota): each call is exact for its own Max, and a
//     lowered Max denies until enough ages out.
//
// For any span of Window, the units whose admission times lie in it never
// exceed the Max of the calls that admitted them, however many processes
// share the store: every admission is decided against everything recorded
// before it, in one atomic step.
//
//	store := limiter.NewRedisStore(client, limiter.RedisOptions{})
//	defer store.Close()
//	checks := []limiter.Check{{Zone: "api", Key: limiter.BoundKey(ip), Limit: limiter.Limit{Window: time.Minute, Max: 60}}}
//	decisions := make([]limiter.Decision, len(checks))
//	if err := store.Allow(ctx, checks, decisions); err != nil {
//		// Redis is slow or down: admit, refuse or fall back, as you choose.
//	}
//	if !limiter.Admitted(decisions) {
//		// 429, Retry-After: decisions[i].RetryAfter
//	}
//
// Two stores share that contract. RedisStore keeps the state in Redis, so
// every process that points at the same Redis (a single server, Sentinel or
// Cluster) shares one exact limit; it batches concurrent calls into one
// script call and bounds each call by its own timeout, so callers need no
// deadline of their own. MemoryStore keeps the state in this process, with
// the same answers. DenyCache answers repeated denials without a round trip:
// it wraps a Store and is one.
package limiter

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Algorithm is how a zone counts.
type Algorithm uint8

const (
	// SlidingLog admits a request when the units admitted in the last
	// Window, plus its cost, fit in Max: exact, never more than Max in any
	// span of Window. Its memory per client grows with the admissions in
	// the window, to a bound (about 16 KB in Redis). The zero value.
	SlidingLog Algorithm = iota
	// SlidingCounter cuts time into fixed windows of Window and admits a
	// request when the units of the current fixed window, plus those of the
	// previous one weighted by the part of it the last Window still covers,
	// plus its cost, fit in Max. Its memory per client is constant; it is
	// approximate, exact only when the previous window's units were spread
	// evenly over it, and with a small Max it can deny for up to two
	// windows.
	SlidingCounter
	// Concurrency limits the requests in flight: Max leases at once, each
	// taken by an admitted request and held until Settle, or until Window
	// after it was taken or last extended (Extend).
	Concurrency
)

// String returns the algorithm's configuration name: log, counter or
// concurrency.
func (a Algorithm) String() string {
	switch a {
	case SlidingLog:
		return "log"
	case SlidingCounter:
		return "counter"
	case Concurrency:
		return "concurrency"
	}
	return fmt.Sprintf("Algorithm(%d)", uint8(a))
}

// Limit is one zone's rule: at most Max units admitted in any span of Window
// (for Concurrency: at most Max leases at once, each expiring Window after it
// was taken or last extended). Denied requests are not counted.
type Limit struct {
	// Window is the span limits are counted over, or the lease time: from a
	// microsecond to two years.
	Window time.Duration
	// Max is the units admitted in any Window, or the leases at once: from 0
	// (nothing is ever admitted) to 2^48-1.
	Max int64
	// Algorithm is how the zone counts; the zero value is SlidingLog.
	Algorithm Algorithm
}

// Check asks whether one client may make a request under one zone's limit.
type Check struct {
	// Zone names the limit; the same client key in two zones is counted apart.
	Zone string
	// Key identifies the client. Callers bound its length (see BoundKey).
	Key string
	// Limit is the zone's rule for this call; it may differ between calls.
	Limit Limit
	// Cost is what the request costs in the zone's units, from 0 to 2^53. In
	// Allow and Peek 0 means 1; in Settle it is the real cost, and 0 means 0
	// (a refund). A concurrency zone counts requests: its Cost must be 0 or 1.
	Cost int64
	// Wait is the longest the caller will hold the request for its slot in a
	// log zone; zero means no wait. It may be longer than Window, up to
	// MaxWaitWindows windows: a zone of Max n per Window with a wait w then
	// holds about n*w/Window requests in line, each admitted at its own slot.
	// A request waits at most the least Wait of its log checks. Counter and
	// concurrency zones take no wait.
	Wait time.Duration
}

// Decision is a store's answer for one Check.
type Decision struct {
	// Allowed reports whether this zone would admit the request, now or
	// within its wait. When a decision over several checks is denied by any
	// of them, nothing is recorded in any zone, including those whose
	// Allowed is true.
	Allowed bool
	// Never reports a denial that no wait lifts: the cost is above Max.
	// RetryAfter is then zero.
	Never bool
	// Remaining is how many more units the zone admits now (leases, in a
	// concurrency zone), after this request if it was recorded.
	Remaining int64
	// Reset is the time until units next leave the window: its oldest
	// admission ages out, or its oldest lease expires; zero when there is
	// none. For a denying zone, the time until it has room for this cost.
	Reset time.Duration
	// RetryAfter is, for a denying zone, exactly how long to wait before the
	// same request, with the same wait, is admitted (for a concurrency zone,
	// at most that long: a release may come sooner); zero when Allowed or
	// Never.
	RetryAfter time.Duration
	// Delay is, when the whole request is admitted, how long the caller must
	// hold it before it goes on: its admission is recorded that far in the
	// future. Zero when it goes on now, and when denied.
	Delay time.Duration
	// LastMax is set by Peek for a log zone: the Max of the newest admission
	// recorded for this client in this zone (a tenant's own quota when Max
	// varies), while the store keeps the client's state; 0 when unknown:
	// never recorded, recorded before stores kept it, or, in Redis, a Max
	// above 2^24-1 in a count log of at most 80 entries, whose header has
	// room for no more.
	LastMax int64

	// Lifts is set by Settle: just before it, the zone had no room for
	// another request reserving what this one did (in a log or counter
	// zone). Only then can a denial of such a request, cached anywhere,
	// rest on what the settle took back; when such a request fitted, any
	// denial of it had expired. A caller that announces lowered costs to
	// other processes' deny caches need do so only when Lifts is set, for a
	// zone whose requests all reserve the same under the same Max.
	Lifts bool

	// held is what the store recorded, for Settle and Extend.
	held holding
	// charged is, after Settle of a log check, the time the real cost was
	// recorded at (the store's clock, microseconds; 0: none).
	charged int64
}

// holding is what one admitted check recorded.
type holding struct {
	// recorded is set from Allow until Settle.
	recorded bool
	// at is the log's admission time in the store's clock (microseconds),
	// the time Extend last moved the reservation to, or the counter's fixed
	// window index.
	at int64
	// units is what was reserved.
	units int64
	// lease identifies a concurrency zone's lease.
	lease uint64
	// floor makes a settle a floor: the check's Cost is what its zone must
	// hold at least, and only what it holds below that is recorded (see
	// Fallback.Repair).
	floor bool
}

// Store decides checks atomically and records admissions. Its methods are
// safe for concurrent use.
type Store interface {
	// Allow decides all checks together, all or nothing: the request is
	// admitted only if every check admits it, and only then is it recorded,
	// in every zone. decisions must have the same length as checks; Allow
	// fills it.
	Allow(ctx context.Context, checks []Check, decisions []Decision) error
	// Peek decides checks as Allow would, but records nothing: Remaining is
	// what is left now.
	Peek(ctx context.Context, checks []Check, decisions []Decision) error
	// Settle replaces what the Allow that filled decisions recorded (or
	// what Extend last moved it to) with checks[i].Cost (0 takes the
	// admission back), and releases its leases. The cost counts from the
	// settle, as an admission then (or just after the newest): the
	// reservation is taken back, if it has not aged out, and the cost
	// recorded anew. It marks the decisions as settled, so a second Settle
	// does nothing, and changes none of their exported figures but Lifts.
	Settle(ctx context.Context, checks []Check, decisions []Decision) error
	// Extend keeps what the running request of decisions holds. It restarts
	// the lease time of its leases. It moves its reservations in log zones
	// to now, with their units (checks[i].Cost is not read): each is settled
	// to what it reserved, as Settle would (taken back, if it has not aged
	// out, and recorded now, or just after the newest admission, or at its
	// room when the window is over Max), and the decision then holds the
	// new record, for the next Extend and the final Settle; so a reservation
	// extended at least once a Window counts until its call is settled. It
	// leaves counter zones as they are, and decisions already settled, and
	// changes none of the decisions' exported figures. It is meant for a
	// request that has gone on (after its Delay): then it makes no room that
	// any request had not before, since a moved reservation keeps its units
	// and leaves the window no earlier; one whose slot has not come is moved
	// as a Settle to the same cost would move it, to its room from now. A
	// lease that expired first is lost: Extend then returns an error that
	// wraps ErrLeaseLost, after extending the others and moving the
	// reservations. Settle and later Extends must be given the decisions
	// Extend updated, not copies made before it: an older copy names a
	// record that is gone.
	Extend(ctx context.Context, checks []Check, decisions []Decision) error
	// Reset forgets a client's state in a zone.
	Reset(ctx context.Context, zone, key string) error
}

// method is what a store is asked to do with a request's checks: the Store
// method it carries out, in the words the stores share. The script has
// opcodes of its own on the wire (script.go); RedisStore translates.
type method uint8

const (
	methodPeek method = iota
	methodAllow
	methodSettle
	methodExtend
)

// ErrLeaseLost is the error of Extend for a lease that had expired.
var ErrLeaseLost = errors.New("lease expired before it was extended")

// Admitted reports whether every decision allows the request.
func Admitted(decisions []Decision) bool {
	for _, d := range decisions {
		if !d.Allowed {
			return false
		}
	}
	return true
}

const (
	// maxUnits bounds Max: a log zone's running sums are kept modulo 2^48.
	maxUnits = 1<<48 - 1
	// maxCost bounds a cost: integers stay exact in Redis's Lua up to 2^53.
	maxCost = 1 << 53
	// maxWindow bounds Window: times are kept modulo 2^48 microseconds (8.9
	// years), and a key may hold times from three windows back to one ahead.
	maxWindow = 2 * 365 * 24 * time.Hour
)

// MaxWaitWindows is the longest Check.Wait a store accepts, in windows of
// the check's zone; a Wait is also at most two years.
const MaxWaitWindows = 16

// ErrInvalidCheck is wrapped by the error of a call whose own input no
// store can decide: a Limit or Check outside the bounds documented on
// their fields, or decisions of the wrong length. It says nothing of the
// store: a caller that counts store failures (a circuit breaker) leaves it
// out.
var ErrInvalidCheck = errors.New("check outside the engine's bounds")

// invalidCheck is an error of a call's input, which Is ErrInvalidCheck.
type invalidCheck string

func (e invalidCheck) Error() string        { return string(e) }
func (e invalidCheck) Is(target error) bool { return target == ErrInvalidCheck }

// checkInput reports the first check that no store can decide, naming it and
// what is wrong, or decisions of the wrong length.
func checkInput(checks []Check, decisions []Decision) error {
	if len(decisions) != len(checks) {
		return invalidCheck(fmt.Sprintf("%d decisions for %d checks", len(decisions), len(checks)))
	}
	for i, c := range checks {
		l := c.Limit
		var problem string
		switch {
		case l.Algorithm > Concurrency:
			problem = fmt.Sprintf("unknown algorithm %d", l.Algorithm)
		case l.Window < time.Microsecond:
			problem = fmt.Sprintf("window %v is shorter than a microsecond", l.Window)
		case l.Window > maxWindow:
			problem = fmt.Sprintf("window %v is longer than %v", l.Window, maxWindow)
		case l.Max < 0:
			problem = fmt.Sprintf("max %d is negative", l.Max)
		case l.Max > maxUnits:
			problem = fmt.Sprintf("max %d is above 2^48-1", l.Max)
		case c.Cost < 0:
			problem = fmt.Sprintf("cost %d is negative", c.Cost)
		case c.Cost > maxCost:
			problem = fmt.Sprintf("cost %d is above 2^53", c.Cost)
		case c.Wait < 0:
			problem = fmt.Sprintf("wait %v is negative", c.Wait)
		case c.Wait > MaxWaitWindows*l.Window || c.Wait > maxWindow:
			problem = fmt.Sprintf("wait %v is longer than %d windows of %v, or two years", c.Wait, MaxWaitWindows, l.Window)
		case c.Wait > 0 && l.Algorithm != SlidingLog:
			problem = fmt.Sprintf("a %s zone takes no wait (wait %v)", l.Algorithm, c.Wait)
		case c.Cost > 1 && l.Algorithm == Concurrency:
			problem = fmt.Sprintf("a concurrency zone counts requests: cost %d, want 0 or 1", c.Cost)
		}
		if problem != "" {
			return invalidCheck(fmt.Sprintf("check %d (zone %q): %s", i, c.Zone, problem))
		}
	}
	return nil
}

// reserved is what Allow reserves for c: its cost, where 0 means 1.
func reserved(c Check) int64 { return max(c.Cost, 1) }

// requestWait is how long a request of checks may wait for its slot: the
// least of its log checks' waits.
func requestWait(checks []Check) time.Duration {
	wait := time.Duration(-1)
	for _, c := range checks {
		if c.Limit.Algorithm != SlidingLog {
			continue
		}
		if wait < 0 || c.Wait < wait {
			wait = c.Wait
		}
	}
	return max(wait, 0)
}

// microseconds is d in whole microseconds, the stores' unit, rounded down.
func microseconds(d time.Duration) int64 { return int64(d / time.Microsecond) }

// settled marks decisions as settled: their holdings are spent.
func settled(decisions []Decision) {
	for i := range decisions {
		decisions[i].held = holding{}
	}
}

// holdReservations moves the reservations that decisions hold in log zones
// to now, for Extend (see Store.Extend), with settle, the store's own Settle:
// it settles each of them, on a copy of its decision, to the units it
// reserved, and the decision then holds the record that settle made (its
// time, which the store reports as charged), with the same units, and
// nothing else of it changes (Lifts, charged). A settle finds the record
// again by that time and those units, as it finds an admission. On an
// error, the decisions whose settle was done hold their new records, the
// others what they held.
//
// A hold announces nothing to deny caches, and DenyCache forgets nothing
// for it: a cached denial rests on units that only leave the window by
// ageing out, and a moved reservation whose time has come keeps its units
// and is recorded no earlier than it was (now, just after the newest
// admission, or later), so it leaves no window before it would have, and
// every denial still holds.
func holdReservations(ctx context.Context, checks []Check, decisions []Decision, settle func(context.Context, []Check, []Decision) error) error {
	var idx []int
	for i, d := range decisions {
		if d.held.recorded && checks[i].Limit.Algorithm == SlidingLog {
			idx = append(idx, i)
		}
	}
	if len(idx) == 0 {
		return nil
	}
	held, moved := make([]Check, len(idx)), make([]Decision, len(idx))
	for j, i := range idx {
		held[j], moved[j] = checks[i], decisions[i]
		held[j].Cost, moved[j].charged = decisions[i].held.units, 0
	}
	err := settle(ctx, held, moved)
	for j, i := range idx {
		if !moved[j].held.recorded && moved[j].charged != 0 {
			decisions[i].held.at = moved[j].charged
		}
	}
	return err
}

// holds reports whether any decision holds something to settle.
func holds(decisions []Decision) bool {
	for _, d := range decisions {
		if d.held.recorded {
			return true
		}
	}
	return false
}
