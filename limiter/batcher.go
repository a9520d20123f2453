package limiter

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// redisClient is what a RedisStore needs of a go-redis client: scripts,
// commands it builds itself, pipelines and DEL. *redis.Client,
// *redis.ClusterClient, the failover client of redis.NewFailoverClient and
// redis.UniversalClient all have it.
type redisClient interface {
	redis.Scripter
	Process(ctx context.Context, cmd redis.Cmder) error
	Pipeline() redis.Pipeliner
	Del(ctx context.Context, keys ...string) *redis.IntCmd
}

const (
	// batchQueue is how many requests may wait for a flusher.
	batchQueue = 4096
	// batchTurns is how many script calls may be in flight at once before
	// any is out longer than its hand-off (pace). One: a second call in
	// flight on a near Redis only splits the batches smaller, which costs
	// Redis and Caddy more per decision, and on shared CPUs that is what
	// bounds throughput; the hand-off sends another call once the first is
	// out longer than Redis takes to run it, which covers the time a reply
	// travels back, a Redis busy with other instances' calls, and a far one.
	batchTurns = 1
	// handOffRedis is how many of Redis's mean times per call a call holds
	// its turn, at least. Fewer split batches on a near Redis (under the
	// bench's many clients load, two made 1.4 times the calls per request
	// of three, for no more throughput); more hold a far Redis's calls
	// longer (1 ms away, p50 added: 2.1 ms at two, 2.4 at three and four).
	handOffRedis = 3
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
	// maxGraces is how many times a deadline moves on by a timeout while
	// the host is busy and Redis answers. Under 5,000 clients connecting
	// at once on 2 CPUs, a decision waited up to about 300ms for its
	// goroutines to run (flushers, their replies' readers).
	maxGraces = 4
	// busyMemory is how many timeouts after the host was last found busy
	// its calls still last their requests' graces: a call must last from
	// before the look that finds the host busy, and a client that sends a
	// few requests a second is looked at seconds apart. With 10 (a
	// second), the spend fleet lost a decision to the fail mode in 2 of 3
	// runs on a loaded machine; with 100, none in 6.
	busyMemory = 100
)

// errClosed is the error of a RedisStore call made after Close.
var errClosed = errors.New("redis store closed")

// errTimeout answers a request that Redis did not decide within its
// deadline.
var errTimeout = fmt.Errorf("redis did not answer in time: %w", context.DeadlineExceeded)

// ErrHostBusy is wrapped by the error of a call that missed its deadline,
// and the graces it got, while this host's CPUs were what held it up: its
// goroutines waited to run, runnable, for a tenth of the timeout or more
// (the Go runtime's /sched/latencies, 99th percentile), or a timer of the
// batcher ran that late (the kernel gave the process's threads no CPU).
// Redis may well have answered in time. A circuit breaker should not count it as Redis failing.
// The error also wraps context.DeadlineExceeded.
var ErrHostBusy = errors.New("this host's CPUs were too busy to run the decision in time")

// errHostBusy answers a request that missed its deadline and its grace
// while the host was busy.
var errHostBusy = fmt.Errorf("rate limit decision not made in time: %w (%w)", ErrHostBusy, context.DeadlineExceeded)

// batcher sends the requests of concurrent callers to Redis together: one
// limit.lua call per batch (per slot on a cluster), so a flood of decisions
// costs one round trip and one script call per batch. It never waits to fill
// a batch: a flusher takes whatever is queued when it has a turn, so a lone
// request goes out at once and batches grow only while Redis is busy. One
// call is in flight while Redis's CPU is what it waits for, more while it is
// the network: how long a call holds its turn follows what the calls measure
// (pace, below).
//
// Deadlines cost no timer per request: every request waits in a FIFO, and
// one watcher, with one timer, answers those whose deadline passes. The
// FIFO is in deadline order but for requests whose context ends sooner, and
// those wake up by their context.
//
// A deadline that passes while the host's own CPUs are behind (thousands of
// connections arriving at once, other processes taking the CPUs) says
// nothing of Redis: the reply may be there, unread, its goroutine waiting
// to run, or the request waiting for a flusher that is. While the host is
// busy (hostBusy) and Redis is not silent (no call has been out maxGraces
// timeouts with nothing read), such a request gets a grace of another
// timeout, up to maxGraces (it moves to a second FIFO, late), and it is
// decided when Redis's answer is read: while the host was busy lately,
// each call lasts its requests' graces, and ends sooner once none of them
// waits for it (callLife). So a
// decision waits at most 1+maxGraces timeouts on a busy host. Past its
// graces, or when Redis is silent, it takes the fail mode with
// ErrHostBusy, which the breaker leaves uncounted. A request that waited
// on a slow Redis while the host is not busy times out at its deadline.
type batcher struct {
	client  redisClient
	cluster bool
	timeout time.Duration
	// warmTimeout bounds the opening of a connection by warm.
	warmTimeout time.Duration
	queue       chan *request
	// turns holds a token for each call that has the right to take a batch:
	// batchTurns of them, so at most that many calls are out at once before
	// one is out longer than handOff (ns), which pace sets.
	turns   chan struct{}
	handOff atomic.Int64
	pace    pace
	// ctx ends at close; it bounds the connections warm opens.
	ctx    context.Context
	cancel context.CancelFunc
	// now, when set (by tests), is the time in microseconds the script
	// decides at, in place of Redis's clock.
	now func() int64
	// farStreak counts the calls in a row that measured a far Redis;
	// warmSoon asks the next call to warm.
	farStreak atomic.Int64
	warmSoon  atomic.Bool
	lastWarm  atomic.Int64
	// interruptions counts the signs that Redis may not be the server it
	// was (see RedisStore.Interruptions).
	interruptions atomic.Uint64
	done          chan struct{}
	wg            sync.WaitGroup

	// mu guards closed, watch, late, the requests' graces and lag. Requests
	// join watch under it and Close sets closed under it, so Close answers
	// every request it missed.
	mu     sync.Mutex
	closed bool
	watch  []*request
	// late holds the graced requests, in the order of their new deadlines.
	late []*request
	wake chan struct{}
	// lag, read at most every timeout/hostBusyShare (at lagAt), says
	// whether the host is busy: until busyUntil, a timeout after the last
	// look that found it busy, since one look sees few goroutines.
	lag   hostLag
	lagAt time.Time
	// waited is lag.waited; tests replace it to make the host busy.
	waited    func() time.Duration
	busyUntil atomicTime
	// replied is when a call's reply was last read (atomicTime).
	replied atomicTime
	// out counts the calls in flight, and quietFrom is when the last one
	// went out while none was: Redis is silent while calls are out and
	// nothing was read since quietFrom or replied, whichever is later. A
	// Redis no one asked says nothing, whatever the time since its last
	// reply (a fleet of a few calls a second).
	out       atomic.Int64
	quietFrom atomicTime
	// library says whether calls go through the library.
	library library
}

// newBatcher starts a batcher for a store whose calls end after timeout.
func newBatcher(client redisClient, cluster bool, timeout time.Duration) *batcher {
	b := &batcher{
		client:  client,
		cluster: cluster,
		timeout: timeout,
		// A connection whose handshake and first command take longer
		// than two timeouts could not decide anything in time anyway.
		warmTimeout: 2 * timeout,
		queue:       make(chan *request, batchQueue),
		turns:       make(chan struct{}, batchTurns),
		done:        make(chan struct{}),
		wake:        make(chan struct{}, 1),
	}
	b.waited = b.lag.waited
	b.ctx, b.cancel = context.WithCancel(context.Background())
	// Until a call measures: Redis's own time in a small call, at most.
	b.handOff.Store(int64(time.Millisecond))
	b.wg.Add(maxCalls + 1)
	for range maxCalls {
		go newFlusher(b).run()
	}
	go b.watchDeadlines()
	return b
}

// close stops the flushers once their calls return, and answers every
// request still waiting with errClosed.
func (b *batcher) close() {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return
	}
	b.closed = true
	close(b.done)
	b.cancel()
	b.mu.Unlock()
	b.wg.Wait()
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, r := range b.watch {
		r.abandon(errClosed)
	}
	for _, r := range b.late {
		r.abandon(errClosed)
	}
	b.watch, b.late = nil, nil
}

// do queues r and waits for its answer, its deadline or its context.
func (b *batcher) do(r *request) error {
	if err := b.watchFor(r); err != nil {
		return err
	}
	return b.await(r, false)
}

// queueNow puts r on the queue unless it is full, and reports whether it
// did: a decision queued after it is then decided after it, in its call or
// a later one. await(r, queued) gives its answer. The error is the
// batcher's closing.
func (b *batcher) queueNow(r *request) (queued bool, err error) {
	if err := b.watchFor(r); err != nil {
		return false, err
	}
	select {
	case b.queue <- r:
		return true, nil
	default:
		return false, nil
	}
}

// watchFor puts r on the watch list, which answers it at its deadline.
func (b *batcher) watchFor(r *request) error {
	r.done = make(chan struct{})
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return errClosed
	}
	b.watch = append(b.watch, r)
	if len(b.watch) == 1 {
		select {
		case b.wake <- struct{}{}:
		default:
		}
	}
	return nil
}

// await queues r, unless it is (queued), and waits for its answer.
func (b *batcher) await(r *request, queued bool) error {
	if !queued {
		select {
		case b.queue <- r:
			queued = true
		case <-r.done:
		case <-r.ctx.Done():
			giveUp(r, r.ctx.Err())
			<-r.done
		}
	}
	if queued {
		select {
		case <-r.done:
		case <-r.ctx.Done():
			giveUp(r, r.ctx.Err())
			<-r.done
		}
	}
	// The watch list holds r until the watcher passes it, up to a timeout
	// from now. What r refers to of its caller (its context, and with it
	// everything the server keeps of the request; its checks and
	// decisions) must not live that long: under load it would be most of
	// the heap that every garbage collection marks. No flusher reads
	// them once r is answered.
	r.ctx, r.checks, r.decisions = nil, nil, nil
	return r.err
}

// watchDeadlines answers requests whose deadline has passed, waking for the
// oldest one.
func (b *batcher) watchDeadlines() {
	defer b.wg.Done()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	// due is when the timer was set to fire: how late it ran is how late
	// this host ran the process, whoever took its CPUs.
	var due time.Time
	for {
		fired := false
		select {
		case <-b.done:
			return
		case <-b.wake:
		case <-timer.C:
			fired = true
		}
		now := time.Now()
		b.mu.Lock()
		if fired {
			b.lag.ranLate(due, now)
			if now.Sub(due) >= b.timeout/hostBusyShare {
				// Looked at now, not at the next tenth of a timeout:
				// the deadlines passing now are the late ones.
				b.lagAt = time.Time{}
			}
		}
		var graced []*request
		b.watch, graced = b.pass(b.watch, false, now, graced)
		b.late, graced = b.pass(b.late, true, now, graced)
		b.late = append(b.late, graced...)
		next := time.Duration(-1)
		for _, q := range [][]*request{b.watch, b.late} {
			if len(q) > 0 {
				if d := q[0].deadline.Load().Sub(now); next < 0 || d < next {
					next = max(d, 0)
				}
			}
		}
		b.mu.Unlock()
		if next >= 0 {
			due = now.Add(next)
			timer.Reset(next)
		}
	}
}

// pass drops from q, watch or late, the requests answered and those whose
// deadline passed by now, up to the first that still waits, and returns
// what is left, and graced with those graced on the way (which join late).
// Called with mu held.
func (b *batcher) pass(q []*request, late bool, now time.Time, graced []*request) ([]*request, []*request) {
	i := 0
	for ; i < len(q); i++ {
		r := q[i]
		if r.state.Load() != pending {
			continue
		}
		if r.graces > 0 && !late {
			// Graced by a flusher (overdue) while it waited here.
			graced = append(graced, r)
			continue
		}
		if r.deadline.Load().After(now) {
			break
		}
		if b.overdue(r, now) {
			graced = append(graced, r)
		}
	}
	n := copy(q, q[i:])
	clear(q[n:])
	return q[:n], graced
}

// overdue deals with r, pending past its deadline at now: it moves the
// deadline on by one timeout (a grace) if the host is busy, Redis answers
// and r has graces left, and otherwise answers it with the error that says
// why it is late. It reports whether r was graced. Called with mu held.
func (b *batcher) overdue(r *request, now time.Time) (graced bool) {
	busy := b.hostBusy(now)
	if busy && r.graces < maxGraces && !b.silent(now) {
		r.graces++
		r.deadline.Store(r.deadline.Load().Add(b.timeout))
		return true
	}
	if busy {
		giveUp(r, errHostBusy)
	} else {
		giveUp(r, errTimeout)
	}
	return false
}

// giveUp answers r with err, without its call's reply, unless it was
// answered already.
func giveUp(r *request, err error) {
	if !r.abandon(err) {
		return
	}
	if life := r.life.Load(); life != nil {
		life.gaveUp()
	}
}

// callLife is one call in flight as its requests' deadlines see it. It
// ends once none of them may take its reply: a call that outlived its
// callers could record admissions no one is told of (a Redis back from a
// restart, which go-redis dials again), counted for no one. Ending it
// stops go-redis before it sends or dials; a reply it already waits for
// it still reads, until the call's own deadline.
type callLife struct {
	cancel context.CancelFunc
	// waiting counts the requests that may yet take the reply.
	waiting atomic.Int32
}

// gaveUp counts a request that took its deadline's answer.
func (l *callLife) gaveUp() {
	if l.waiting.Add(-1) == 0 {
		l.cancel()
	}
}

// silent reports whether Redis has left calls unanswered for maxGraces
// timeouts by now: then a busy host is not all that holds decisions up.
func (b *batcher) silent(now time.Time) bool {
	if b.out.Load() == 0 {
		return false
	}
	heard := b.quietFrom.Load()
	if replied := b.replied.Load(); replied.After(heard) {
		heard = replied
	}
	return now.Sub(heard) >= maxGraces*b.timeout
}

// calling counts a call going out, at now, until its end returns; end
// takes the call's error, which says whether Redis replied.
func (b *batcher) calling(now time.Time) (end func(error)) {
	if b.out.Add(1) == 1 {
		b.quietFrom.Store(now)
	}
	return func(err error) {
		var reply redis.Error
		if err == nil || errors.As(err, &reply) {
			b.replied.Store(time.Now())
		}
		b.out.Add(-1)
	}
}

// callErr returns the error of a call: err, unless it is the call's deadline
// passing while the host is busy, whose requests are then answered with
// errHostBusy.
func (b *batcher) callErr(err error) error {
	var netErr net.Error
	if err == nil || !errors.Is(err, context.DeadlineExceeded) && !(errors.As(err, &netErr) && netErr.Timeout()) {
		return err
	}
	b.mu.Lock()
	busy := b.hostBusy(time.Now())
	b.mu.Unlock()
	if busy {
		return errHostBusy
	}
	return err
}

// sendLate reports whether r, which a flusher took past its deadline, is
// to be sent still: the watcher or overdue graced it.
func (b *batcher) sendLate(r *request, now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if r.state.Load() != pending {
		return false
	}
	return r.deadline.Load().After(now) || b.overdue(r, now)
}

// hostBusy reports whether the host is busy: whether the slowest of this
// process's goroutines (hostBusyQuantile) waited a hostBusyShare-th of the
// timeout or more to run, by the runtime's count since the last look (at
// most one every timeout/hostBusyShare). A look that finds it busy holds
// for a timeout. Then the host's CPUs, not Redis, are what a late decision
// waited for. Called with mu held.
func (b *batcher) hostBusy(now time.Time) bool {
	share := b.timeout / hostBusyShare
	if now.Sub(b.lagAt) >= share {
		b.lagAt = now
		if b.waited() >= share {
			b.busyUntil.Store(now.Add(b.timeout))
		}
	}
	return now.Before(b.busyUntil.Load())
}

// batchWork is a flusher's buffers, kept from one batch to the next.
type batchWork struct {
	live  []*request
	calls []slotCall
	// args holds the calls' commands; retry the calls to send (again).
	args  []any
	retry []*slotCall
}

// send decides one batch. Requests already answered (their caller gave
// up) or past their deadline are not sent: a Redis that recovers from a
// freeze is not handed the backlog.
func (b *batcher) send(w *batchWork, batch []*request) {
	now := time.Now()
	w.live = w.live[:0]
	var latest time.Time
	for _, r := range batch {
		if r.state.Load() != pending {
			continue
		}
		deadline := r.deadline.Load()
		if !deadline.After(now) {
			if !b.sendLate(r, now) {
				continue
			}
			deadline = r.deadline.Load()
		}
		if deadline.After(latest) {
			latest = deadline
		}
		w.live = append(w.live, r)
	}
	if len(w.live) == 0 {
		return
	}
	w.calls = groupCalls(w.calls, w.live, b.cluster)
	// On a host found busy within the last busyMemory timeouts, the call
	// lasts as long as any of its requests may yet be graced (overdue): a
	// reply read in its graces decides it. Whether the host is busy is
	// known only when a deadline passes, often long after the call went
	// out (a timer that runs late is how the kernel's delays show): a
	// call that ended at the deadline would lose the reply the graces
	// wait for, and its requests would take the fail mode. Elsewhere it
	// ends at the deadline: a go-redis call cannot be cut short, and one
	// that waits for a slow Redis's reply holds its flusher and its
	// connection. A call that outlives its callers may record admissions
	// no one is told of: they count, and admit no one, and the call ends
	// as soon as none of its requests waits for it (callLife). A batch
	// whose oldest request waited a tenth of a timeout for a flusher is
	// how a host falling behind shows first, so the lag is looked at then.
	if oldest := w.live[0].deadline.Load().Add(-b.timeout); now.Sub(oldest) >= b.timeout/hostBusyShare {
		b.mu.Lock()
		b.hostBusy(now)
		b.mu.Unlock()
	}
	end := latest
	if now.Before(b.busyUntil.Load().Add(busyMemory * b.timeout)) {
		end = latest.Add(maxGraces * b.timeout)
	}
	ctx, cancel := context.WithDeadline(context.Background(), end)
	defer cancel()
	life := &callLife{cancel: cancel}
	life.waiting.Store(int32(len(w.live)))
	for _, r := range w.live {
		r.life.Store(life)
	}
	ended := b.calling(now)
	var redisTime time.Duration
	var ok bool
	if len(w.calls) == 1 {
		c := &w.calls[0]
		var load bool
		if c.via, load = b.firstVia(); load {
			// Loaded on the connection the call then takes, so that it
			// opens none of its own: once, before the first call.
			b.library.load(ctx, b.client)
			if b.library.loaded.Load() {
				c.via = viaFunction
			}
			now = time.Now()
		}
		c.cmd, w.args = c.command(ctx, w.args[:0], b.now)
		_ = b.client.Process(ctx, c.cmd)
		once, resent := true, false
		for {
			again, load := b.retry(c)
			if !again {
				// A lost reply is sent again once.
				if resent || !resendable(ctx, c) {
					break
				}
				resent = true
				b.interruptions.Add(1)
			}
			if load {
				c.via = b.loadScript(ctx)
			}
			c.cmd, w.args = c.command(ctx, w.args[:0], b.now)
			_ = b.client.Process(ctx, c.cmd)
			once = false
		}
		ended(c.cmd.Err())
		redisTime, ok = c.answer(c.cmd.Val(), b.callErr(c.cmd.Err()))
		// A call that went twice measured no one call.
		ok = ok && once
	} else {
		redisTime, ok = b.sendPipelined(ctx, w, ended)
	}
	clear(w.args)
	if ok {
		b.measured(now, redisTime)
	}
}

// sendPipelined runs w's calls, one per slot, in one pipeline (go-redis
// splits it by node), and again those that met a server without the library
// or the script (retry). It returns the time they spent in Redis, all
// told, and whether each had a reply.
func (b *batcher) sendPipelined(ctx context.Context, w *batchWork, ended func(error)) (redisTime time.Duration, ok bool) {
	w.args = w.args[:0]
	via, _ := b.firstVia() // a cluster's masters load the library apart
	w.retry = w.retry[:0]
	for i := range w.calls {
		w.calls[i].via = via
		w.retry = append(w.retry, &w.calls[i])
	}
	ok = true
	for round := 0; len(w.retry) > 0; round++ {
		pipe := b.client.Pipeline()
		for _, c := range w.retry {
			c.cmd, w.args = c.command(ctx, w.args, b.now)
			_ = pipe.Process(ctx, c.cmd)
		}
		execErr := exec(ctx, pipe)
		if round == 0 {
			ended(cmdErr(w.retry[0].cmd, execErr))
		}
		again := w.retry[:0]
		// One load a round serves every call that met a server without
		// the script.
		var loaded callVia
		tried := false
		for _, c := range w.retry {
			retry, load := b.retry(c)
			if load && !tried {
				loaded, tried = b.loadScript(ctx), true
			}
			if load {
				c.via = loaded
			}
			// A lost reply is sent again once: after the first round
			// only, so never twice for one call.
			if retry || round == 0 && resendable(ctx, c) {
				if !retry {
					b.interruptions.Add(1)
				}
				again = append(again, c)
				continue
			}
			t, answered := c.answer(c.cmd.Val(), b.callErr(cmdErr(c.cmd, execErr)))
			// Calls that went twice measured no one call.
			redisTime, ok = redisTime+t, ok && answered && round == 0
		}
		w.retry = again
	}
	if !ok {
		return 0, false
	}
	return redisTime, true
}

func exec(ctx context.Context, pipe redis.Pipeliner) error {
	_, err := pipe.Exec(ctx)
	return err
}

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
// A call out longer than handOffRedis times Redis's mean time per call is
// waiting for the network, not for Redis's CPU: it hands its turn on. So
// calls leave no closer together than Redis can run them, and batches stay
// large while its CPU is what they wait for (its calls grow with their
// batches, and calls queued in it make the round trips longer); and no
// further apart than a round trip spread over maxCalls calls, so that with
// Redis far away a request waits for its call a small part of a round trip,
// whatever the distance, and one that finds a turn free goes out at once.
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
	return max(handOffRedis*p.redis, p.rtt/maxCalls)
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
	b.replied.Store(now)
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

// firstVia is how a call goes first: through the library once it is
// loaded, else as a script. When a load is due, load says to load it
// before the call, in its flusher (a cluster's masters load it in the
// background, each on its own).
func (b *batcher) firstVia() (via callVia, load bool) {
	if b.library.loaded.Load() {
		return viaFunction, false
	}
	if !b.library.due() {
		return viaScript, false
	}
	if !b.cluster {
		return viaScript, true
	}
	b.loadEverywhere()
	return viaScript, false
}

// retry reports whether c is to be sent again, and sets how. A server
// without the library (restarted, flushed, a new cluster master) most
// likely lost the script too, and a server without the script (the same,
// or one that evicted it from its EVAL cache) is given it with SCRIPT LOAD,
// which no server evicts (Redis 7.4 and later and Valkey 8 keep EVAL's
// scripts in an LRU of 500): the call then goes by hash (load says to load it first), never as
// a 30 KB EVAL per request. A server out of memory refuses any function
// that may write before it runs; a script it runs, and refuses only its
// first write, so that a batch of denials is still decided: calls go as
// scripts until the library loads again, which a full Redis refuses.
func (b *batcher) retry(c *slotCall) (again, load bool) {
	err := c.cmd.Err()
	switch {
	case c.via == viaFunction && noFunction(err):
		b.library.loaded.Store(false)
		b.interruptions.Add(1)
		return true, true
	case c.via == viaFunction && OutOfMemory(err):
		c.via = viaScript
		b.library.loaded.Store(false)
	case c.via == viaScript && noScript(err):
		return true, true
	case c.via == viaLoadedScript && noScript(err):
		// Loaded, yet missing where the call went: a cluster whose
		// slot moved meanwhile, a server flushed again, restarted, or a
		// replica promoted.
		c.via = viaSource
		b.interruptions.Add(1)
	default:
		return false, false
	}
	return true, false
}

// loadScript loads the script on the server (every shard of a cluster) and
// returns how calls go next: by hash, or, where SCRIPT LOAD failed (an ACL
// without it), as the source.
func (b *batcher) loadScript(ctx context.Context) callVia {
	if limitScript.Load(ctx, b.client).Err() != nil {
		return viaSource
	}
	return viaLoadedScript
}

// resendable reports whether c, whose reply was lost with its connection,
// is to be sent again (once: the caller keeps count), on another
// connection, which go-redis takes from its pool or opens. Redis may have
// run it: then it counts twice, and its requests take the second reply
// only, so no one is admitted twice. A Peek changes nothing; an Allow
// sent again counts its admission twice, or is denied on account of its
// first (its leases are the same ids, added once); a settle or an extend
// records its cost again, since its reservation is gone. All fail safe for
// the limit, where the fail mode, with a reply lost on a connection killed
// before Redis ran the call (CLIENT KILL, a proxy or a failover closing
// connections), let the request through unrecorded. Not while none of its
// requests waits for it (the call's context ended).
func resendable(ctx context.Context, c *slotCall) bool {
	if ctx.Err() != nil || !lostReply(c.cmd.Err()) {
		return false
	}
	for _, r := range c.requests {
		if r.state.Load() == pending {
			return true
		}
	}
	return false
}

// lostReply reports whether err says a call's reply was lost with its
// connection (closed, reset, cut mid-reply): not Redis's own error reply,
// not a connection that was never made, nor a deadline, which another
// try would not meet either.
func lostReply(err error) bool {
	var reply redis.Error
	var netErr net.Error
	var op *net.OpError
	switch {
	case err == nil, errors.As(err, &reply), errors.Is(err, redis.ErrClosed),
		errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled),
		errors.As(err, &netErr) && netErr.Timeout(),
		errors.As(err, &op) && op.Op == "dial":
		return false
	}
	return true
}

// loadEverywhere loads the library on every master of a cluster, in the
// background.
func (b *batcher) loadEverywhere() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return
	}
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		ctx, cancel := context.WithTimeout(b.ctx, b.warmTimeout)
		defer cancel()
		b.library.load(ctx, b.client)
	}()
}
