package limiter

import (
	"context"
	"math"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

const (
	// minTurns is the fewest calls in flight: one would leave Redis idle
	// while a reply travels back and the next batch is written.
	minTurns = 2
	// maxCalls bounds the calls in flight, and so the connections the
	// batcher holds: go-redis's smallest default pool (one CPU) has 10.
	maxCalls = 8
	// paceEpoch is how long the least network time a call measured counts:
	// the least of this epoch and the last, so a Redis that moved further
	// away is seen within two.
	paceEpoch = time.Second
	// paceWeight is the weight of each call's time in Redis in the
	// running mean (1/paceWeight).
	paceWeight = 8
	// warmAfter is how many calls of an epoch must have measured a far
	// Redis before warm runs.
	warmAfter = 3
	// warmEvery bounds how often warm runs.
	warmEvery = time.Second
	// warmBackoff is how long a warm that failed holds off the next.
	warmBackoff = 10 * time.Second
)

// flusher is one of the batcher's goroutines that send batches, the i-th of
// maxCalls. It takes batches only while i is below the batcher's turns: so
// there are never more calls in flight than turns, and a request that finds
// a flusher idle goes out at once.
type flusher struct {
	b     *batcher
	i     int32
	batch []*request
	work  batchWork
	// wake tells the flusher that the turns changed.
	wake chan struct{}
}

func newFlusher(b *batcher, i int) *flusher {
	return &flusher{b: b, i: int32(i), batch: make([]*request, 0, maxBatch), wake: make(chan struct{}, 1)}
}

// run sends batches until Close.
func (f *flusher) run() {
	b := f.b
	defer b.wg.Done()
	for {
		for f.i >= b.turns.Load() {
			select {
			case <-f.wake:
			case <-b.done:
				return
			}
		}
		select {
		case r := <-b.queue:
			f.batch = append(f.batch[:0], r)
		case <-f.wake:
			continue
		case <-b.done:
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
		b.send(&f.work, f.batch)
		clear(f.batch)
	}
}

// pace sets how many calls may be in flight from what each call measured:
// its round trip, and the time Redis spent in it (the script's reply says).
// The rest, the network's and the client's, is what a call spends outside
// Redis. To keep Redis busy without queueing calls inside it, there are as
// many calls in flight as fit in one call's whole time, one in Redis at a
// time: 1 + net / redis. A far Redis, or one with little to do, gets many
// (every request goes out at once, one round trip plus Redis's time); a
// Redis whose CPU is the bottleneck, whose calls grow with the load, few,
// with large batches (fewer calls cost it less per decision).
//
// net is the least measured in the last epoch or two, not the mean: calls
// queued inside Redis behind others' calls would count that wait as
// network, and make more calls, which queue more.
type pace struct {
	mu sync.Mutex
	// epoch started at start; least and before are the least network
	// times of this epoch and the last (0: none).
	start         time.Time
	least, before time.Duration
	// calls counts this epoch's calls.
	calls int
	// redis is the running mean of a call's time in Redis.
	redis time.Duration
}

// observe counts a call that took rtt, redis of it in Redis, and returns
// the turns that follow, and the least network time, of calls this epoch
// at least.
func (p *pace) observe(now time.Time, rtt, redis time.Duration) (turns int32, net time.Duration, calls int) {
	net = max(rtt-redis, 0)
	redis = max(redis, time.Microsecond)
	p.mu.Lock()
	defer p.mu.Unlock()
	if now.Sub(p.start) >= paceEpoch {
		p.start, p.before, p.least, p.calls = now, p.least, 0, 0
	}
	p.calls++
	if p.least == 0 || net < p.least {
		p.least = max(net, 1)
	}
	if p.redis == 0 {
		p.redis = redis
	} else {
		p.redis += (redis - p.redis) / paceWeight
	}
	net = p.least
	if p.before != 0 && p.before < net {
		net = p.before
	}
	turns = int32(min(1+math.Ceil(float64(net)/float64(p.redis)), maxCalls))
	return max(turns, minTurns), net, p.calls
}

// setTurns lets n calls be in flight, and tells the flushers whose turn
// came or went.
func (b *batcher) setTurns(n int32) {
	old := b.turns.Swap(n)
	for i := min(old, n); i < max(old, n); i++ {
		select {
		case b.flushers[i].wake <- struct{}{}:
		default:
		}
	}
}

// measured counts a call that Redis answered, started at start, that
// spent redis in Redis.
func (b *batcher) measured(start time.Time, redis time.Duration) {
	now := time.Now()
	turns, net, calls := b.pace.observe(now, now.Sub(start), redis)
	if turns != b.turns.Load() {
		b.setTurns(turns)
	}
	// Two round trips of a handshake would take a tenth of a decision's
	// time: the connections are opened ahead of need. One slow call is a
	// hiccup; a far Redis makes every call slow.
	if net >= b.warmTimeout/40 && calls >= warmAfter {
		b.warm()
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
