package limiter

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

const (
	// maxBatch and maxBatchZones bound one script call: a full batch is about
	// a millisecond of Redis's time, a small part of any sensible timeout,
	// so one slow call holds few decisions.
	maxBatch      = 128
	maxBatchZones = 512
	// batchQueue is how many requests may wait for a flusher.
	batchQueue = 4096
)

// ErrClosed is the error of a RedisStore call made after Close.
var ErrClosed = errors.New("redis store closed")

// errTimeout answers a request that Redis did not decide within its
// deadline.
var errTimeout = fmt.Errorf("redis did not answer in time: %w", context.DeadlineExceeded)

// Request states: a request is answered once, by whoever moves it out of
// pending first.
const (
	pending int32 = iota
	answering
	abandoned
)

// request is one Allow, Peek, Settle or Extend waiting for its batch.
type request struct {
	ctx  context.Context
	op   op
	keys []string
	// args are the request's packed arguments, made by the caller. The
	// flushers read checks and write decisions only for a request they
	// answer, whose caller still waits: never one it gave up and may be
	// reusing.
	args      []byte
	checks    []Check
	decisions []Decision
	wait      time.Duration
	// leases are the ids of the leases an Allow takes; nil without any.
	leases   []uint64
	deadline time.Time
	// slot is the Redis Cluster slot of every key; 0 on a single server.
	slot  uint16
	state atomic.Int32
	err   error
	done  chan struct{}
	// key and arg hold the key and the arguments of a request of one
	// check, the most common, which then allocates neither.
	key [1]string
	arg [requestArgLen + zoneArgLen]byte
}

// abandon answers r with err unless it was answered already.
func (r *request) abandon(err error) {
	if r.state.CompareAndSwap(pending, abandoned) {
		r.err = err
		close(r.done)
	}
}

// batcher sends the requests of concurrent callers to Redis together: one
// limit.lua call per batch (per slot on a cluster), so a flood of decisions
// costs one round trip and one script call per batch. It never waits to fill
// a batch: a flusher takes whatever is queued when it has a turn, so a lone
// request goes out at once and batches grow only while Redis is busy. Two
// calls are in flight while Redis's CPU is what they wait for, more while it
// is the network: how long a call holds its turn follows what the calls
// measure (pace, in flusher.go).
//
// Deadlines cost no timer per request: every request waits in a FIFO, and
// one watcher, with one timer, answers those whose deadline passes. The
// FIFO is in deadline order but for requests whose context ends sooner, and
// those wake up by their context.
type batcher struct {
	client  RedisClient
	cluster bool
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
	done      chan struct{}
	wg        sync.WaitGroup

	// mu guards closed and watch. Requests join watch under it and Close
	// sets closed under it, so Close answers every request it missed.
	mu     sync.Mutex
	closed bool
	watch  []*request
	wake   chan struct{}
}

// newBatcher starts a batcher for a store whose calls end after timeout.
func newBatcher(client RedisClient, cluster bool, timeout time.Duration) *batcher {
	b := &batcher{
		client:  client,
		cluster: cluster,
		// A connection whose handshake and first command take longer
		// than two timeouts could not decide anything in time anyway.
		warmTimeout: 2 * timeout,
		queue:       make(chan *request, batchQueue),
		turns:       make(chan struct{}, batchTurns),
		done:        make(chan struct{}),
		wake:        make(chan struct{}, 1),
	}
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
// request still waiting with ErrClosed.
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
		r.abandon(ErrClosed)
	}
	b.watch = nil
}

// do queues r and waits for its answer, its deadline or its context.
func (b *batcher) do(r *request) error {
	r.done = make(chan struct{})
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return ErrClosed
	}
	b.watch = append(b.watch, r)
	if len(b.watch) == 1 {
		select {
		case b.wake <- struct{}{}:
		default:
		}
	}
	b.mu.Unlock()

	select {
	case b.queue <- r:
		select {
		case <-r.done:
		case <-r.ctx.Done():
			r.abandon(r.ctx.Err())
			<-r.done
		}
	case <-r.done:
	case <-r.ctx.Done():
		r.abandon(r.ctx.Err())
		<-r.done
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
	for {
		select {
		case <-b.done:
			return
		case <-b.wake:
		case <-timer.C:
		}
		now := time.Now()
		b.mu.Lock()
		i := 0
		for ; i < len(b.watch); i++ {
			r := b.watch[i]
			if r.state.Load() != pending {
				continue
			}
			if r.deadline.After(now) {
				break
			}
			r.abandon(errTimeout)
		}
		n := copy(b.watch, b.watch[i:])
		clear(b.watch[n:])
		b.watch = b.watch[:n]
		next := time.Duration(-1)
		if n > 0 {
			next = b.watch[0].deadline.Sub(now)
		}
		b.mu.Unlock()
		if next >= 0 {
			timer.Reset(next)
		}
	}
}

// batchWork is a flusher's buffers, kept from one batch to the next.
type batchWork struct {
	live  []*request
	calls []slotCall
	// args holds the calls' commands.
	args []any
}

// slotCall is one limit.lua call: the requests of one slot.
type slotCall struct {
	requests []*request
	keys     []string
	nkeys    int
	args     packedArgs
	zones    int
	cmd      *redis.Cmd
}

// packedArgs is a call's packed requests, ARGV[1]. go-redis writes a
// pointer to it through MarshalBinary, and boxes a pointer without
// allocating, as it does the keys' (*string).
type packedArgs []byte

// MarshalBinary implements encoding.BinaryMarshaler.
func (a *packedArgs) MarshalBinary() ([]byte, error) { return *a, nil }

// The script's command words, boxed once.
var (
	evalSha, evalShaHash any = "evalsha", limitScript.Hash()
	eval, evalSource     any = "eval", limitSource
)

// command appends c's EVALSHA (EVAL with the source, when source) to args
// and returns it.
func (b *batcher) command(ctx context.Context, args []any, c *slotCall, source bool) (*redis.Cmd, []any) {
	from := len(args)
	if source {
		args = append(args, eval, evalSource)
	} else {
		args = append(args, evalSha, evalShaHash)
	}
	c.nkeys = len(c.keys)
	args = append(args, &c.nkeys)
	for i := range c.keys {
		args = append(args, &c.keys[i])
	}
	args = append(args, &c.args)
	if b.now != nil {
		args = append(args, b.now())
	}
	cmd := redis.NewCmd(ctx, args[from:len(args):len(args)]...)
	cmd.SetFirstKeyPos(3)
	return cmd, args
}

// noScript reports an error that says Redis lacks the script.
func noScript(err error) bool {
	return err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT")
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
		if !r.deadline.After(now) {
			r.abandon(errTimeout)
			continue
		}
		if r.deadline.After(latest) {
			latest = r.deadline
		}
		w.live = append(w.live, r)
	}
	if len(w.live) == 0 {
		return
	}
	w.calls = groupCalls(w.calls, w.live, b.cluster)
	// The call ends when every caller has given up, and never sooner.
	ctx, cancel := context.WithDeadline(context.Background(), latest)
	defer cancel()
	var redisTime time.Duration
	var ok bool
	if len(w.calls) == 1 {
		c := &w.calls[0]
		c.cmd, w.args = b.command(ctx, w.args[:0], c, false)
		_ = b.client.Process(ctx, c.cmd)
		again := noScript(c.cmd.Err())
		if again {
			c.cmd, w.args = b.command(ctx, w.args[:0], c, true)
			_ = b.client.Process(ctx, c.cmd)
		}
		redisTime, ok = c.answer(c.cmd.Val(), c.cmd.Err())
		// A call that went twice measured no one call.
		ok = ok && !again
	} else {
		redisTime, ok = b.sendPipelined(ctx, w)
	}
	clear(w.args)
	if ok {
		b.measured(now, redisTime)
	}
}

// sendPipelined runs w's calls, one per slot, in one pipeline (go-redis
// splits it by node), and again with EVAL those that met NOSCRIPT. It
// returns the time they spent in Redis, all told, and whether each had a
// reply.
func (b *batcher) sendPipelined(ctx context.Context, w *batchWork) (redisTime time.Duration, ok bool) {
	calls := w.calls
	pipe := b.client.Pipeline()
	w.args = w.args[:0]
	for i := range calls {
		c := &calls[i]
		c.cmd, w.args = b.command(ctx, w.args, c, false)
		_ = pipe.Process(ctx, c.cmd)
	}
	execErr := exec(ctx, pipe)
	var retry []*slotCall
	ok = true
	for i := range calls {
		c := &calls[i]
		if noScript(c.cmd.Err()) {
			retry = append(retry, c)
			continue
		}
		t, answered := c.answer(c.cmd.Val(), cmdErr(c.cmd, execErr))
		redisTime, ok = redisTime+t, ok && answered
	}
	if len(retry) == 0 {
		return redisTime, ok
	}
	pipe = b.client.Pipeline()
	for _, c := range retry {
		c.cmd, w.args = b.command(ctx, w.args, c, true)
		_ = pipe.Process(ctx, c.cmd)
	}
	execErr = exec(ctx, pipe)
	for _, c := range retry {
		c.answer(c.cmd.Val(), cmdErr(c.cmd, execErr))
	}
	// The calls went twice: what they measured is not one call's.
	return 0, false
}

func exec(ctx context.Context, pipe redis.Pipeliner) error {
	_, err := pipe.Exec(ctx)
	return err
}

// cmdErr is the error of one command of a pipeline. A pipeline that failed
// before its commands ran (a refused connection setup: wrong password, bad
// database index) leaves them without an error of their own: then the
// pipeline's error is theirs.
func cmdErr(cmd *redis.Cmd, execErr error) error {
	if err := cmd.Err(); err != nil {
		return err
	}
	if _, ok := cmd.Val().(string); !ok && execErr != nil {
		return execErr
	}
	return nil
}

// answer decodes a call's reply into its requests' decisions, or gives them
// its error. It returns the call's time in Redis, and whether the call ran
// there.
func (c *slotCall) answer(reply any, err error) (time.Duration, bool) {
	var s string
	if err == nil {
		s, err = checkReply(reply, replyLen(len(c.requests), c.zones))
	}
	if err != nil {
		err = fmt.Errorf("running rate limit script: %w", err)
	}
	for _, r := range c.requests {
		n := replyLen(1, len(r.keys))
		if r.state.CompareAndSwap(pending, answering) {
			if err != nil {
				r.err = err
			} else if decodeReply(s[:n], r.op, r.checks, r.decisions, r.wait, r.leases) {
				r.err = fmt.Errorf("extending leases: %w", ErrLeaseLost)
			}
			close(r.done)
		}
		if err == nil {
			s = s[n:]
		}
	}
	if err != nil {
		return 0, false
	}
	return callTime(reply.(string)), true
}

// groupCalls splits requests into one call per slot, keeping their order
// within each slot.
func groupCalls(calls []slotCall, requests []*request, cluster bool) []slotCall {
	for i := range calls {
		calls[i].requests = calls[i].requests[:0]
		calls[i].keys = calls[i].keys[:0]
		calls[i].args = calls[i].args[:0]
		calls[i].zones, calls[i].nkeys = 0, 0
		calls[i].cmd = nil
	}
	n := 0
	for _, r := range requests {
		i := 0
		if cluster {
			for i < n && calls[i].requests[0].slot != r.slot {
				i++
			}
		}
		if i == n {
			if n == len(calls) {
				calls = append(calls, slotCall{})
			}
			n++
		}
		c := &calls[i]
		c.requests = append(c.requests, r)
		c.keys = append(c.keys, r.keys...)
		c.args = append(c.args, r.args...)
		c.zones += len(r.keys)
	}
	return calls[:n]
}
