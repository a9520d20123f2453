package slidingratelimit

import (
	"fmt"
	"net"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/limiter"
)

// dialGate keeps a Redis server's connection pool from dialing while the
// server refuses connections. go-redis counts a pool's failed dials and,
// once they reach its pool size, stops dialing and tries again once a second
// in the background: every breaker probe during an outage added a failed
// dial, so after a few seconds of outage decisions stayed in the fail mode for
// up to a second after Redis was back. Once a dial fails, the gate makes each
// command first connect to the server itself, and lets it reach the pool only
// when that works: the pool sees one failed dial per outage, not one per
// probe.
//
// It is a go-redis Limiter, which the client consults before it takes a
// connection, so it sits on the client of each server: the one of a single
// server, or each node's on a cluster. A sentinel-managed client has none:
// its primary's address moves with a failover, which the client learns from
// the sentinels, so a gate probing one address would hold decisions away
// from the new primary.
type dialGate struct {
	network, addr string
	// down is set by a failed dial and cleared by a successful connection.
	down atomic.Bool
}

// gateDialTimeout bounds the gate's own connection attempt, made only while
// the server refused the last one.
const gateDialTimeout = 100 * time.Millisecond

var _ redis.Limiter = (*dialGate)(nil)

// gateDials installs a dial gate on each server's client that opts make.
func gateDials(opts *redis.Options) {
	opts.Limiter = &dialGate{network: opts.Network, addr: opts.Addr}
}

// gateNodeDials installs a dial gate on each node's client of a cluster.
func gateNodeDials(opts *redis.ClusterOptions) {
	opts.NewClient = func(node *redis.Options) *redis.Client {
		gateDials(node)
		return redis.NewClient(node)
	}
}

// Allow implements redis.Limiter.
func (g *dialGate) Allow() error {
	if !g.down.Load() {
		return nil
	}
	conn, err := net.DialTimeout(g.network, g.addr, gateDialTimeout)
	if err != nil {
		return fmt.Errorf("connecting to redis: %w", err)
	}
	conn.Close()
	g.down.Store(false)
	return nil
}

// ReportResult implements redis.Limiter.
func (g *dialGate) ReportResult(err error) {
	if err != nil && limiter.IsDialError(err) {
		g.down.Store(true)
	}
}

// outageProofPoolSize is the connection pool size of a client, unless the
// URL sets pool_size. Even behind the dial gate each outage adds one failed
// dial to go-redis's count (see dialGate), so with go-redis's default (10 per
// CPU) the twentieth outage on two CPUs kept decisions in the fail mode for
// up to a second after Redis came back; without a gate (sentinel), a long
// outage adds up to ten a second. The batcher never holds more than a few
// connections, so the size is only that threshold here; at this one it costs
// 80 KB a pool.
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
