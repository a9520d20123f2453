package limiter

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

const (
	// batchTurns is how many script calls may be in flight at once before
	// any is out longer than its hand-off (pace). One would leave Redis idle
	// while a reply travels back and the next batch is written; two keep it
	// busy, and more only split batches smaller, which costs Redis more per
	// decision.
	batchTurns = 2
	// maxCalls bounds the calls in flight, handed off ones included, and so
	// the connections the batcher holds: go-redis's smallest default pool
	// (one CPU) has 10.
	maxCalls = 8
	// paceWeight is the weight of each call's times in the running means
	// (1/paceWeight).
	paceWeight = 8
	// warmAfter calls in a row that measured a far Redis make the next
	// call warm. One is a hiccup; a far Redis makes every call far.
	warmAfter = 3
	// warmEvery bounds how often warm runs.
	warmEvery = time.Second
	// warmBackoff is how long a warm that failed holds off the next.
	warmBackoff = 10 * time.Second
)

// flusher is one of the batcher's goroutines that send batches. It takes a
// batch only while it holds a turn, and holds it until its call returns or
// has been out its hand-off (pace): so a Redis whose CPU is busy gets few
// calls with large batches, and a far one up to maxCalls in flight, one
// leaving every hand-off while the others travel.
type flusher struct {
	b     *batcher
	batch []*request
	work  batchWork
	// handOff passes the turn on when the call is out long; passed says
	// the turn of the current call was passed on, by it or at the call's
	// end.
	handOff *time.Timer
	passed  atomic.Bool
}

func newFlusher(b *batcher) *flusher {
	f := &flusher{b: b, batch: make([]*request, 0, maxBatch)}
	f.handOff = time.AfterFunc(time.Hour, func() {
		f.passTurn()
		// While this call holds its connection: warm's commands then
		// take new ones, not the one the next call will want.
		if b.warmSoon.Load() && b.warmSoon.CompareAndSwap(true, false) {
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
		f.handOff.Reset(time.Duration(b.handOff.Load()))
		b.send(&f.work, f.batch)
		f.handOff.Stop()
		f.passTurn()
		clear(f.batch)
	}
}

// pace sets how long a call holds its turn, from what each call measures:
// its round trip, and the time Redis spent in it (the script's reply says).
// A call out longer than twice Redis's mean time per call is waiting for the
// network, not for Redis's CPU: it hands its turn on. So calls leave no
// closer together than Redis can run them, and batches stay large while its
// CPU is what they wait for (its calls grow with their batches, and calls
// queued in it make the round trips longer); and no further apart than a
// round trip spread over maxCalls calls, so that with Redis far away a
// request waits for its call a small part of a round trip, whatever the
// distance, and one that finds a turn free goes out at once.
type pace struct {
	mu sync.Mutex
	// redis and rtt are running means of a call's time in Redis and of
	// its round trip.
	redis, rtt time.Duration
}

// observe counts a call that took rtt, redis of it in Redis, and returns
// the hand-off that follows.
func (p *pace) observe(rtt, redis time.Duration) time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.rtt == 0 {
		p.redis, p.rtt = redis, rtt
	} else {
		p.redis += (redis - p.redis) / paceWeight
		p.rtt += (rtt - p.rtt) / paceWeight
	}
	return max(2*p.redis, p.rtt/maxCalls)
}

// measured counts a call that Redis answered, started at start, that
// spent inRedis in Redis.
//
// A call on a new connection pays a handshake's round trips first: far,
// when two round trips would take a tenth of a decision's time, that is a
// deadline. So warmAfter far calls in a row make the next call open
// connections ahead of need (warm), outside any deadline.
func (b *batcher) measured(start time.Time, inRedis time.Duration) {
	now := time.Now()
	rtt := now.Sub(start)
	b.handOff.Store(int64(b.pace.observe(rtt, inRedis)))

	if rtt-inRedis < b.warmTimeout/40 {
		if b.farStreak.Load() != 0 {
			b.farStreak.Store(0)
		}
	} else if b.farStreak.Add(1) >= warmAfter {
		b.warmSoon.Store(true)
	}
}

// warm opens connections ahead of need, when Redis is far. A new connection
// costs a handshake round trip before its first call; with Redis far away,
// that is what pushes a decision past its deadline, and a far Redis is what
// makes the batcher send more calls at once. It runs one cheap command on
// maxCalls connections at once, outside any decision's deadline, which makes
// the pool hold that many (on a cluster, as many in all).
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
