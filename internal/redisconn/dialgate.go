package redisconn

import (
	"fmt"
	"net"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// dialGate keeps a Redis server's connection pool from dialing while the
// server refuses connections. go-redis counts a pool's failed dials and,
// once they reach its pool size, stops dialing and tries again once a second
// in the background (go-redis issue #3062, open as of v9.23.0; drop the gate
// and outageProofPoolSize once it is fixed): every breaker probe during an
// outage added a failed dial, so after a few seconds of outage decisions
// stayed in the fail mode for up to a second after Redis was back. Once a dial fails, the gate makes each
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
	if err != nil && IsDialError(err) {
		g.down.Store(true)
	}
}
