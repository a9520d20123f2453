// Package redisconn is the Redis connection that sliding_ratelimit handlers
// share: one per topology and URL, kept across config reloads, with what
// lives as long as it does. A Conn holds
//
//   - the go-redis client the stores send their script calls through, which
//     sends every command once (see Open), with a dial gate on each server's
//     client (dialgate.go) and, on Redis Cluster, hooks that stop its own
//     retry loop (sendonce.go);
//   - the circuit breaker that guards every handler's store on this Redis
//     (any limiter.Store), and its circuit_state series, labelled by the
//     Redis it guards (breaker.go);
//   - the start-up check (check.go) and that of the Redis user's rights
//     (rights.go);
//   - the watch on Redis's evictions, each of which restarts a client's
//     limit, and its redis_evicted_keys_total series (evictions.go);
//   - go-redis's own log lines, routed through Caddy's logger (logging.go);
//   - the reset bus: the subscriber that hears what other instances
//     announce, and the announcements of this one (resets.go).
//
// The topology is decided once, when the URL is parsed (options.go). This
// package knows nothing of zones, keys or requests: the breaker passes the
// stores' calls through as they are, and the reset bus carries Redis keys
// that the stores build.
package redisconn

import (
	"context"
	"errors"
	"sync/atomic"

	"github.com/caddyserver/caddy/v2"
	"github.com/redis/go-redis/v9"
)

// pool holds the connections, one per topology and URL, shared by every
// handler that names them and kept across config reloads: a reload does not
// reconnect.
var pool = caddy.NewUsagePool()

// Conn is one use of a pooled connection to Redis. Uses of the same topology
// and URL share the connection, which closes when the last use is closed. A
// Conn is safe for concurrent use.
type Conn struct {
	s       *shared
	poolKey string
	closed  atomic.Bool
}

// shared is what the uses of one connection share.
type shared struct {
	// client sends every command once, whatever the URL says about retries
	// (see newClients): the stores' script calls, the start-up check, the
	// reset subscriber.
	client redis.UniversalClient
	// announcer publishes resets: client, or, when the URL sets
	// max_retries, a client that retries as it says.
	announcer redis.UniversalClient
	breaker   *Breaker
	// label names the Redis in metrics and logs: host:port.
	label     string
	resets    *resetBus
	evictions *evictionWatch
}

func (s *shared) Destruct() error {
	s.resets.stop()
	s.evictions.stop()
	circuitState.DeleteLabelValues(s.label)
	if s.announcer != s.client {
		return errors.Join(s.announcer.Close(), s.client.Close())
	}
	return s.client.Close()
}

// Open returns a use of the connection to the Redis that topology ("" is
// Standalone) and rawURL name, making the connection if no other use holds
// it. It fails only on a URL that go-redis refuses; it does not dial (see
// Check). Close releases the use.
func Open(topology, rawURL string) (*Conn, error) {
	routeLog()
	poolKey := topology + " " + rawURL
	v, _, err := pool.LoadOrNew(poolKey, func() (caddy.Destructor, error) {
		o, err := parse(topology, rawURL)
		if err != nil {
			return nil, err
		}
		client, announcer := o.clients()
		return &shared{
			client:    client,
			announcer: announcer,
			breaker:   newBreaker(o.label),
			label:     o.label,
			resets:    newResetBus(client, announcer),
			evictions: watchEvictions(client, o.label),
		}, nil
	})
	if err != nil {
		return nil, err
	}
	return &Conn{s: v.(*shared), poolKey: poolKey}, nil
}

// Client is the client for the stores: it never sends a command again, so a
// script call whose reply was lost fails instead of recording twice.
func (c *Conn) Client() redis.UniversalClient { return c.s.client }

// Breaker is the circuit breaker of this Redis, shared by every use.
func (c *Conn) Breaker() *Breaker { return c.s.breaker }

// Label names the Redis for people and metrics: host:port of the server, or
// of the first address of a cluster's or sentinel's URL; never credentials.
func (c *Conn) Label() string { return c.s.label }

// Listen passes the announcements made on the connection to l from now on,
// starting the subscriber if it is not running.
func (c *Conn) Listen(l Listener) { c.s.resets.listen(l) }

// Unlisten stops passing announcements to l.
func (c *Conn) Unlisten(l Listener) { c.s.resets.unlisten(l) }

// Subscriptions counts the subscriber's (re)subscriptions so far: 0 until
// it has subscribed once.
func (c *Conn) Subscriptions() int {
	b := c.s.resets
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.subscriptions
}

// Instances returns how many instances share this Redis, this one included,
// as last counted while Redis answered (see rollCall): those whose
// heartbeats were heard within three intervals (heartbeatInterval) of the
// last heartbeat of this connection that came back. It is 1 until this
// connection's subscriber has heard its own heartbeat.
func (c *Conn) Instances() int { return c.s.resets.roll.count() }

// AnnounceReset tells every instance that key (a full Redis key) was reset,
// and waits until this instance's subscriber has received the announcement,
// which Redis delivers to every subscriber in the same PUBLISH, or until
// EchoTimeout. echoed reports whether it came back in time: if not, other
// instances may be disconnected from pub/sub too.
func (c *Conn) AnnounceReset(ctx context.Context, key string) (echoed bool, err error) {
	return c.s.resets.publish(ctx, key)
}

// AnnounceFreed tells every instance that key (a full Redis key) has room
// again, without waiting for the echo.
func (c *Conn) AnnounceFreed(ctx context.Context, key string) error {
	return c.s.resets.publisher.Publish(ctx, resetChannel, freedMark+" "+key).Err()
}

// Close releases this use of the connection; a second Close does nothing.
func (c *Conn) Close() error {
	if c.closed.Swap(true) {
		return nil
	}
	_, err := pool.Delete(c.poolKey)
	return err
}
