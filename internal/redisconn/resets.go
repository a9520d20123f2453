package redisconn

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
)

// Resets across instances
//
// Every instance keeps a deny cache: a key Redis denied is rejected locally
// until its retry time, without asking Redis. That is exact only while no
// admission leaves a window early, and an admin reset makes all of them leave
// at once. So an instance that resets a key in Redis then announces it with
// PUBLISH on resetChannel, and every instance passes the key to the
// listeners of its connection to that Redis, which forget it.
//
// Each connection has one resetBus: one subscriber goroutine for the life of
// the connection, started when the first listener comes, stopped when the
// connection closes. go-redis reconnects and resubscribes by itself after a
// network error or a failover, but an announcement published while the
// subscriber was away is lost. Redis confirms every (re)subscription with a
// "subscribe" reply, which go-redis's ChannelWithSubscriptions hands on; on
// each one the bus tells its listeners (Listener.Subscribed), which clear
// their deny caches entirely: exact again at the cost of one Redis call per
// denied client. That covers the time before the first subscription too.
//
// What stays inexact: a subscriber whose connection is dead without either
// side noticing misses announcements until go-redis's health check (a PING
// after 3 s without traffic, 5 s to answer) reconnects it; meanwhile that
// instance may keep denying a reset key from its cache, never longer than
// the denial's retry time. Pub/sub ignores Redis databases, so an instance on
// another database with the same key prefix forgets keys it need not, which
// costs one Redis call each and is never wrong.

// Announcement is what an instance announced about a key.
type Announcement uint8

const (
	// Reset: an operator reset the key; every admission in it is gone.
	Reset Announcement = iota
	// Freed: an admission that took the key's last room was given back (a
	// count_status refund), so a denial cached meanwhile no longer holds.
	Freed
)

// A Listener hears the announcements made on a connection, its own
// included. Its methods run on the subscriber goroutine, one at a time, and
// must not block.
type Listener interface {
	// Announced passes a key (a full Redis key) and what happened to it.
	Announced(key string, what Announcement)
	// Subscribed runs on every (re)subscription, the first included:
	// announcements made before it may have been missed.
	Subscribed()
}

// resetChannel is the Redis pub/sub channel on which instances announce
// resets. A message is "<nonce> <Redis key>": the nonce, which holds no
// space, lets the announcing instance see its own message come back.
const resetChannel = "sliding_ratelimit:resets"

// freedMark stands in a message's nonce for Freed. It holds a character no
// nonce has.
const freedMark = "!refund"

// EchoTimeout bounds how long AnnounceReset waits for this instance's
// subscriber to receive its own announcement.
const EchoTimeout = time.Second

// resetStopTimeout bounds how long closing a connection waits for its
// subscriber to end; closing it can wait for a reconnection in progress.
const resetStopTimeout = time.Second

// resetBus is the reset subscriber of one connection and its listeners. It
// is safe for concurrent use.
type resetBus struct {
	// client subscribes; publisher announces (see shared.announcer).
	client, publisher redis.UniversalClient
	// ctx is cancelled by stop, to abort a first subscription in progress.
	ctx    context.Context
	cancel context.CancelFunc
	// done is closed when the subscriber goroutine ends, and its
	// heartbeats with it.
	done chan struct{}
	// roll counts the instances heard on the connection (instances.go).
	roll *rollCall

	mu        sync.Mutex
	listeners map[Listener]struct{}
	// echoes holds a channel per announcement this instance is waiting to
	// see come back, by nonce.
	echoes        map[string]chan struct{}
	pubsub        *redis.PubSub
	started       bool
	stopped       bool
	subscriptions int
}

// newResetBus returns the bus of client, which announces through
// publisher; the subscriber starts with the first listener.
func newResetBus(client, publisher redis.UniversalClient) *resetBus {
	ctx, cancel := context.WithCancel(context.Background())
	return &resetBus{
		client:    client,
		publisher: publisher,
		ctx:       ctx,
		cancel:    cancel,
		done:      make(chan struct{}),
		roll:      newRollCall(),
		listeners: make(map[Listener]struct{}),
		echoes:    make(map[string]chan struct{}),
	}
}

// listen passes announcements to l from now on, and starts the subscriber if
// it is not running.
func (b *resetBus) listen(l Listener) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.stopped {
		return
	}
	b.listeners[l] = struct{}{}
	if !b.started {
		b.started = true
		go b.run()
	}
}

// unlisten stops passing announcements to l.
func (b *resetBus) unlisten(l Listener) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.listeners, l)
}

// stop ends the subscriber. The client is closed after it.
func (b *resetBus) stop() {
	b.mu.Lock()
	b.stopped = true
	started, ps := b.started, b.pubsub
	b.mu.Unlock()
	b.cancel()
	if !started {
		return
	}
	if ps != nil {
		// Close waits for a reconnection in progress, up to the dial timeout
		// when Redis is unreachable; shutdown need not.
		go func() { _ = ps.Close() }()
	}
	select {
	case <-b.done:
	case <-time.After(resetStopTimeout):
	}
}

// run is the subscriber goroutine; it runs the heartbeats beside it.
func (b *resetBus) run() {
	var beats sync.WaitGroup
	defer close(b.done)
	defer beats.Wait()
	// Subscribe records the channels even when Redis is down, and go-redis
	// keeps trying to connect.
	ps := b.client.Subscribe(b.ctx, resetChannel, instanceChannel)
	b.mu.Lock()
	if b.stopped {
		b.mu.Unlock()
		_ = ps.Close()
		return
	}
	b.pubsub = ps
	b.mu.Unlock()
	beats.Go(func() {
		b.roll.beat(b.ctx, func(ctx context.Context, id string) error {
			return b.publisher.Publish(ctx, instanceChannel, id).Err()
		})
	})
	for msg := range ps.ChannelWithSubscriptions() {
		switch m := msg.(type) {
		case *redis.Subscription:
			// One reply per channel: the resets' tells of a new
			// subscription.
			if m.Kind == "subscribe" && m.Channel == resetChannel {
				b.subscribed()
			}
		case *redis.Message:
			if m.Channel == instanceChannel {
				b.roll.heard(m.Payload)
				continue
			}
			b.deliver(m.Payload)
		}
	}
}

// subscribed runs on every (re)subscription: announcements made before it
// may have been missed, so every listener is told.
func (b *resetBus) subscribed() {
	b.mu.Lock()
	b.subscriptions++
	again := b.subscriptions > 1
	listeners := b.snapshot()
	b.mu.Unlock()
	for _, l := range listeners {
		l.Subscribed()
	}
	if again {
		caddy.Log().Named("sliding_ratelimit").Info("subscribed to resets again after a disconnection: deny caches cleared, since resets announced meanwhile were missed",
			zap.Int("handlers", len(listeners)))
	}
}

// deliver passes one announcement to every listener, then wakes the admin
// reset waiting for it, if it is this instance's own.
func (b *resetBus) deliver(payload string) {
	nonce, key, ok := strings.Cut(payload, " ")
	if !ok {
		nonce, key = "", payload
	}
	b.mu.Lock()
	listeners := b.snapshot()
	b.mu.Unlock()
	what := Reset
	if nonce == freedMark {
		what = Freed
	}
	for _, l := range listeners {
		l.Announced(key, what)
	}
	if nonce == "" || nonce == freedMark {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if echo, ok := b.echoes[nonce]; ok {
		close(echo)
		delete(b.echoes, nonce)
	}
}

// snapshot returns the listeners; b.mu must be held.
func (b *resetBus) snapshot() []Listener {
	out := make([]Listener, 0, len(b.listeners))
	for l := range b.listeners {
		out = append(out, l)
	}
	return out
}

// publish announces that key (a full Redis key) was reset, and waits until
// this instance's subscriber has received the announcement, which Redis
// delivers to every subscriber in the same PUBLISH, or until
// EchoTimeout. echoed reports whether it came back in time.
func (b *resetBus) publish(ctx context.Context, key string) (echoed bool, err error) {
	nonce := strconv.FormatUint(rand.Uint64(), 36)
	echo := make(chan struct{})
	b.mu.Lock()
	b.echoes[nonce] = echo
	b.mu.Unlock()
	defer func() {
		b.mu.Lock()
		delete(b.echoes, nonce)
		b.mu.Unlock()
	}()
	if err := b.publisher.Publish(ctx, resetChannel, nonce+" "+key).Err(); err != nil {
		return false, fmt.Errorf("announcing the reset to other instances: %w", err)
	}
	timer := time.NewTimer(EchoTimeout)
	defer timer.Stop()
	select {
	case <-echo:
		return true, nil
	case <-timer.C:
	case <-ctx.Done():
	}
	return false, nil
}
