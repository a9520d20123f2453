package slidingratelimit

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/limiter"
)

// dialGate keeps decisions away from a Redis client's connection pools while
// its server refuses connections, one per client like its breaker. go-redis
// counts failed dials, and once a pool has failed as many as it holds
// connections it stops dialing and redials in the background once a second:
// every breaker probe during an outage adds a failed dial, so after a few
// seconds of outage decisions stayed in the fail mode for up to a second after
// Redis was back. Once a decision fails to dial, the next ones first connect
// to the server themselves and call the client only when that works; the
// pools see one failed dial per outage, not one per probe.
// gateDialTimeout bounds the gate's own connection attempt, made only while
// the server refused the last one.
const gateDialTimeout = 100 * time.Millisecond

type dialGate struct {
	network, addr string
	// down is set by a failed dial and cleared by a successful connection.
	down atomic.Bool
}

// newDialGate returns the gate of a standalone client, or nil: a cluster or a
// sentinel client dials many servers, which one address cannot stand for.
func newDialGate(topology, rawURL string) *dialGate {
	if topology != "" && topology != topologyStandalone {
		return nil
	}
	opts, err := redis.ParseURL(rawURL)
	if err != nil {
		return nil
	}
	return &dialGate{network: opts.Network, addr: opts.Addr}
}

// Guard returns store behind the gate; a nil gate returns store.
func (g *dialGate) Guard(store limiter.Store) limiter.Store {
	if g == nil {
		return store
	}
	return gatedStore{g, store}
}

type gatedStore struct {
	gate *dialGate
	next limiter.Store
}

func (s gatedStore) Allow(ctx context.Context, checks []limiter.Check, decisions []limiter.Decision) error {
	g := s.gate
	if g.down.Load() {
		// Bounded by itself: callers' contexts need not carry a deadline
		// (the store ends its own calls at its timeout).
		d := net.Dialer{Timeout: gateDialTimeout}
		conn, err := d.DialContext(ctx, g.network, g.addr)
		if err != nil {
			return fmt.Errorf("connecting to redis: %w", err)
		}
		conn.Close()
		g.down.Store(false)
	}
	err := s.next.Allow(ctx, checks, decisions)
	if err != nil && isDialFailure(err) {
		g.down.Store(true)
	}
	return err
}

// isDialFailure reports whether err is a failure to connect: refused, no
// route, or a name that does not resolve.
func isDialFailure(err error) bool {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return true
	}
	var dns *net.DNSError
	return errors.As(err, &dns)
}

// outageProofPoolSize is the connection pool size of a client, unless the
// URL sets pool_size. go-redis counts a pool's failed dials over its whole
// life and, once they reach the pool size, dials only from a background loop
// that tries once a second. Behind the dial gate each outage adds one failed
// dial, so with go-redis's default (10 per CPU) the twentieth outage on two
// CPUs kept decisions in the fail mode for up to a second after Redis came
// back. The batcher never holds more than a few connections, so the size is
// only that threshold here; at this one it costs 80 KB a pool.
const outageProofPoolSize = 10_000

// poolSize returns the pool size of a client: the URL's, or
// outageProofPoolSize.
func poolSize(fromURL int) int {
	if fromURL > 0 {
		return fromURL
	}
	return outageProofPoolSize
}

// failFast returns the retry counts of a client that fails fast (see
// parseTopologyURL): no command retries unless the URL sets max_retries, and
// one dial attempt (go-redis reads no dialer retries from a URL).
func failFast(maxRetries, dialerRetries int) (int, int) {
	if maxRetries == 0 {
		maxRetries = -1
	}
	if dialerRetries == 0 {
		dialerRetries = 1
	}
	return maxRetries, dialerRetries
}
