package limiter

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

const (
	// slowCall is how long a call may hold its turn. A call out longer is
	// waiting for the network, not for Redis's CPU: it passes its turn on, so
	// the requests queued behind it go out now instead of after its reply.
	// Against a Redis 50ms away, a request would otherwise wait a round trip
	// for a turn and another for its reply: the whole of a 100ms timeout.
	slowCall = 5 * time.Millisecond
	// maxCalls bounds the calls in flight, slow ones included, and so the
	// connections the batcher holds: go-redis's smallest default pool (one
	// CPU) has 10.
	maxCalls = 8
	// warmAfter slow calls in a row that Redis answered, with no fast one
	// between them, make the next slow call open connections ahead of need
	// (see warm), at most once every warmEvery. One slow call is a hiccup,
	// or the first call's script load; a far Redis makes every call slow.
	// Calls that got no reply do not count: more connections do not help a
	// Redis that is stuck or gone.
	warmAfter = 3
	warmEvery = time.Second
	// warmBackoff is how long a warm that failed holds off the next.
	warmBackoff = 10 * time.Second
)

// flusher is one of the batcher's goroutines that send batches. It takes a
// batch only while it holds a turn, and holds it until its call returns or
// has been out slowCall: so a near Redis gets few calls with large batches,
// and a far one up to maxCalls in flight.
type flusher struct {
	b     *batcher
	batch []*request
	work  batchWork
	// handOff passes the turn on when the call is slow; passed says the
	// turn of the current call was passed on, by it or at the call's end.
	handOff *time.Timer
	passed  atomic.Bool
}

func newFlusher(b *batcher) *flusher {
	f := &flusher{b: b, batch: make([]*request, 0, maxBatch)}
	f.handOff = time.AfterFunc(time.Hour, func() {
		f.passTurn()
		// While this call holds its connection: warm's commands then
		// take new ones, not the one the next call will want.
		if b.slowStreak.Load() >= warmAfter {
			b.warm()
		}
	})
	f.handOff.Stop()
	return f
}

// passTurn gives the turn back, once per call. A hand-off that fires after
// the call ended, stopped too late, may pass the next call's turn early;
// the count of turns stays right.
func (f *flusher) passTurn() {
	if f.passed.CompareAndSwap(false, true) {
		<-f.b.turns
	}
}

// run sends batches until Close.
func (f *flusher) run() {
	b := f.b
	defer b.wg.Done()
	defer f.handOff.Stop()
	for {
		select {
		case b.turns <- struct{}{}:
		case <-b.done:
			return
		}
		select {
		case r := <-b.queue:
			f.batch = append(f.batch[:0], r)
		case <-b.done:
			<-b.turns
			return
		}
		zones := len(f.batch[0].keys)
	more:
		for len(f.batch) < maxBatch && zones < maxBatchZones {
			select {
			case r := <-b.queue:
				f.batch = append(f.batch, r)
				zones += len(r.keys)
			default:
				break more
			}
		}
		f.passed.Store(false)
		f.handOff.Reset(slowCall)
		answered := b.send(&f.work, f.batch)
		switch {
		case f.handOff.Stop():
			if b.slowStreak.Load() != 0 {
				b.slowStreak.Store(0)
			}
		case answered:
			b.slowStreak.Add(1)
		}
		f.passTurn()
		clear(f.batch)
	}
}

// warm opens connections ahead of need, when calls are slow. A new
// connection costs a handshake round trip before its first call; with Redis
// far away, that is what pushes a decision past its deadline, and slow calls
// are what makes the batcher send more calls at once. It runs one cheap
// command on maxCalls connections at once, outside any decision's deadline,
// which makes the pool hold that many (on a cluster, as many in all).
func (b *batcher) warm() {
	now := time.Now().UnixNano()
	last := b.lastWarm.Load()
	if now-last < int64(warmEvery) || !b.lastWarm.CompareAndSwap(last, now) {
		return
	}
	if p, ok := b.client.(interface{ PoolStats() *redis.PoolStats }); ok && p.PoolStats().TotalConns >= maxCalls {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return
	}
	b.wg.Add(maxCalls)
	for range maxCalls {
		go func() {
			defer b.wg.Done()
			ctx, cancel := context.WithTimeout(b.ctx, b.warmTimeout)
			defer cancel()
			if limitScript.Exists(ctx, b.client).Err() != nil {
				// Redis is not far but stuck, or gone: do not
				// open connections to it every second.
				b.lastWarm.Store(time.Now().Add(warmBackoff - warmEvery).UnixNano())
			}
		}()
	}
}
