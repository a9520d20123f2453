// Package limiter decides whether a client may make one more request under one
// or more sliding-window limits. It knows nothing of HTTP or Caddy: callers
// build the client key, stores keep the state.
//
// Two stores share one contract (see Store): RedisStore, whose state is shared
// by every process that points at the same Redis, and MemoryStore, whose state
// lives in this process.
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
	// Cached reports that a deny cache answered without asking the store.
	// Then only the denying decisions carry figures.
	Cached bool

	// token is what a Redis script call recorded, for a refund; -1 for
	// nothing.
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

// Admitted reports whether every decision allows the request.
func Admitted(decisions []Decision) bool {
	for _, d := range decisions {
		if !d.Allowed {
			return false
		}
	}
	return true
}
