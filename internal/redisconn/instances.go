package redisconn

import (
	"context"
	"math/rand/v2"
	"strconv"
	"sync"
	"time"
)

// The instances on one Redis
//
// With fail_mode local each instance decides alone while Redis is away. For
// the instances of a fleet to share what is left of a limit, rather than
// each hand out all of it, each must know how many decide beside it when
// Redis goes. So the subscriber of each connection also publishes the
// connection's id on instanceChannel every heartbeatInterval, and counts the
// ids it hears: an instance is alive while it was heard within
// heartbeatsMissed intervals of the last time this one heard its own
// heartbeat come back. Reckoning from that echo, not from the clock, keeps
// the count as it was when Redis went away: during an outage nobody is
// heard, and nobody is forgotten.
//
// An id belongs to a connection, not to a process: one Caddy that reaches the
// same Redis through two URLs counts twice, which makes each share smaller,
// never larger. Pub/sub ignores databases and key prefixes, so every
// instance on that Redis is counted, whatever it limits: the same.

// instanceChannel is the pub/sub channel of heartbeats; a message is the id
// of the connection that sends it.
const instanceChannel = "sliding_ratelimit:instances"

const (
	// heartbeatInterval is how often a connection says it is alive.
	heartbeatInterval = 2 * time.Second
	// heartbeatsMissed is how many intervals an instance may go unheard
	// before it is no longer counted.
	heartbeatsMissed = 3
)

// rollCall counts the instances heard on one connection. It is safe for
// concurrent use.
type rollCall struct {
	// id is this connection's, in its heartbeats.
	id  string
	now func() time.Time

	mu   sync.Mutex
	seen map[string]time.Time
	// echoed is when this connection last heard its own heartbeat.
	echoed time.Time
}

func newRollCall() *rollCall {
	return &rollCall{
		id:   strconv.FormatUint(rand.Uint64(), 36),
		now:  time.Now,
		seen: make(map[string]time.Time),
	}
}

// heard records a heartbeat.
func (r *rollCall) heard(id string) {
	if id == "" {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.now()
	r.seen[id] = now
	if id == r.id {
		r.echoed = now
	}
	if len(r.seen) > 64 {
		r.forget(now)
	}
}

// count returns how many instances were alive when this one last heard its
// own heartbeat, itself included; 1 before it ever did.
func (r *rollCall) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.echoed.IsZero() {
		return 1
	}
	since, n := r.echoed.Add(-heartbeatsMissed*heartbeatInterval), 0
	for _, at := range r.seen {
		if !at.Before(since) {
			n++
		}
	}
	return max(n, 1)
}

// forget drops the instances that count no longer counts, so that a fleet
// whose instances come and go keeps a bounded map; r.mu must be held.
func (r *rollCall) forget(now time.Time) {
	from := now
	if r.echoed.Before(now) {
		from = r.echoed
	}
	since := from.Add(-heartbeatsMissed * heartbeatInterval)
	for id, at := range r.seen {
		if at.Before(since) {
			delete(r.seen, id)
		}
	}
}

// beat sends this connection's heartbeat with publish until ctx ends, the
// first at once.
func (r *rollCall) beat(ctx context.Context, publish func(ctx context.Context, id string) error) {
	tick := time.NewTicker(heartbeatInterval)
	defer tick.Stop()
	for {
		// A failed heartbeat is a Redis away: the count stands still, as
		// it should, until one comes back.
		pctx, cancel := context.WithTimeout(ctx, heartbeatInterval)
		_ = publish(pctx, r.id)
		cancel()
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}
