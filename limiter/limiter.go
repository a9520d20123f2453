// Package limiter decides whether a client may make one more request under
// one or more sliding-window limits. It knows nothing of HTTP: callers build
// the client key, stores keep the state.
//
// A Limit is a zone's rule: at most Max admitted requests in any span of
// Window. Denied requests are not counted, so a client that keeps sending
// while denied is let through again as soon as its oldest admission ages out.
// A Check asks for one client in one zone; Store.Allow decides the checks of
// one request together, all or nothing, and fills one Decision per check:
// whether it is allowed, how many requests remain, when a slot frees (Reset)
// and, when denied, exactly how long to wait (RetryAfter).
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
// the same answers. Both are Inspectors (Peek, Reset, for operators) and
// Refunders (take back an admission, for a request that turned out not to
// count). DenyCache answers repeated denials without a round trip, and
// Breaker stops calling a failing store for a while.
//
// The sliding log (the default Algorithm) is exact: each zone keeps the times
// of its last Max admissions. The sliding counter is approximate and keeps
// three numbers whatever Max is.
package limiter

import (
	"context"
	"time"
)

// Algorithm is how a zone counts.
type Algorithm uint8

const (
	// SlidingLog keeps the time of every admission in the window: exact, and
	// memory grows with Max. The zero value.
	SlidingLog Algorithm = iota
	// SlidingCounter keeps two fixed-window counts and weighs the previous
	// one by how much of it the sliding window still covers: O(1) memory per
	// key, approximate.
	SlidingCounter
)

// String returns the algorithm's configuration name: log or counter.
func (a Algorithm) String() string {
	if a == SlidingCounter {
		return "counter"
	}
	return "log"
}

// Limit is one zone's rule: at most Max admitted requests in any span of
// Window. Denied requests are not counted.
type Limit struct {
	Window    time.Duration
	Max       int64
	Algorithm Algorithm
}

// Check asks whether one client may make a request under one zone's limit.
type Check struct {
	// Zone names the limit; the same client key in two zones is counted apart.
	Zone string
	// Key identifies the client. Callers bound its length (see BoundKey).
	Key   string
	Limit Limit
}

// Decision is a store's answer for one Check.
type Decision struct {
	// Allowed reports whether this zone would admit the request. When a
	// decision over several checks is denied by any of them, nothing is
	// recorded in any zone, including those whose Allowed is true.
	Allowed bool
	// Remaining is how many more requests the zone admits now, after this one
	// if it was recorded.
	Remaining int64
	// Reset is the time until the oldest admission in the window ages out,
	// freeing one slot; zero when the window holds no admission.
	Reset time.Duration
	// RetryAfter is, for a denying zone, the exact time until it admits again;
	// zero when Allowed.
	RetryAfter time.Duration

	// token is what the store recorded, for a refund: the admission's time
	// in the store's unit, or a counter's window index; -1 for nothing.
	token int64
}

// Store decides checks atomically and records admissions.
//
// Allow decides all checks together, all or nothing: the request is admitted
// only if every check admits it, and only then is it recorded, in every zone.
// decisions must have the same length as checks; Allow fills it. Allow is safe
// for concurrent use.
type Store interface {
	Allow(ctx context.Context, checks []Check, decisions []Decision) error
}

// Inspector reads and resets client state, for operators.
type Inspector interface {
	// Peek decides checks as Allow would, but records nothing: Remaining is
	// what is left now.
	Peek(ctx context.Context, checks []Check, decisions []Decision) error
	// Reset forgets a client's admissions in a zone.
	Reset(ctx context.Context, zone, key string) error
}

// Refunder takes back admissions, for a request that was admitted but is not
// to count after all (a response status that is not counted, or another
// zone in another Redis Cluster slot that denied it).
type Refunder interface {
	// Refund takes back exactly the admissions that the Allow which filled
	// decisions recorded for checks, even when others were recorded after
	// them; an admission that has aged out meanwhile is left alone. It
	// marks decisions as refunded, so a second Refund does nothing, and
	// changes none of their exported figures.
	Refund(ctx context.Context, checks []Check, decisions []Decision) error
}

// Admitted reports whether every decision allows the request.
func Admitted(decisions []Decision) bool {
	for _, d := range decisions {
		if !d.Allowed {
			return false
		}
	}
	return true
}
