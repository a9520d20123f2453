package limiter

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Pipeliner is a go-redis client that runs scripts and pipelines: a
// *redis.Client, *redis.ClusterClient or failover client.
type Pipeliner interface {
	redis.Scripter
	Pipeline() redis.Pipeliner
}

const (
	// batchFlushers is how many pipelines may be in flight at once. One would
	// leave Redis idle while its replies travel back and the next batch is
	// written; two keep it busy, and more only split batches smaller.
	batchFlushers = 2
	// maxBatch bounds one pipeline, so that one slow batch holds few calls.
	maxBatch = 128
	// batchQueue is how many calls may wait for a flusher.
	batchQueue = 4096
)

// ErrBatcherClosed is the error of a call made after Close.
var ErrBatcherClosed = errors.New("redis batcher closed")

// A Batcher sends the script calls of concurrent decisions to Redis together,
// one pipeline per batch: a flood of decisions then costs Caddy and Redis one
// write and one read per batch instead of per decision. It never waits to fill
// a batch: a flusher takes whatever calls are queued when it is free, so a
// lone call goes out at once and batches grow only while Redis is busy.
//
// It implements redis.Scripter for EVAL and EVALSHA, so a RedisStore uses it
// in place of its client (RedisStore.Batched). Each call returns at its
// context's deadline even while its batch waits on a frozen Redis.
type Batcher struct {
	client Pipeliner
	queue  chan *batchCall
	// mu orders queueing against Close: calls queue under the read lock,
	// and Close sets closed under the write lock, so every call queued is
	// one the flushers see before they stop.
	mu     sync.RWMutex
	closed bool
	done   chan struct{}
	wg     sync.WaitGroup
}

// batchCall is one EVAL or EVALSHA waiting for its batch.
type batchCall struct {
	ctx     context.Context
	sha     bool // EVALSHA of payload; else EVAL of the source in payload
	payload string
	keys    []string
	args    []any
	reply   *redis.Cmd
	ready   chan struct{}
}

// NewBatcher starts a batcher on client; Close stops it.
func NewBatcher(client Pipeliner) *Batcher {
	b := &Batcher{
		client: client,
		queue:  make(chan *batchCall, batchQueue),
		done:   make(chan struct{}),
	}
	b.wg.Add(batchFlushers)
	for range batchFlushers {
		go b.flush()
	}
	return b
}

// Close stops the flushers once the calls they hold are answered. Calls made
// after it fail with ErrBatcherClosed. It does not close the client.
func (b *Batcher) Close() error {
	b.mu.Lock()
	if !b.closed {
		b.closed = true
		close(b.done)
	}
	b.mu.Unlock()
	b.wg.Wait()
	return nil
}

// EvalSha implements redis.Scripter.
func (b *Batcher) EvalSha(ctx context.Context, sha1 string, keys []string, args ...any) *redis.Cmd {
	return b.call(ctx, true, sha1, keys, args)
}

// Eval implements redis.Scripter.
func (b *Batcher) Eval(ctx context.Context, script string, keys []string, args ...any) *redis.Cmd {
	return b.call(ctx, false, script, keys, args)
}

// EvalShaRO implements redis.Scripter without batching: the store never
// calls it.
func (b *Batcher) EvalShaRO(ctx context.Context, sha1 string, keys []string, args ...any) *redis.Cmd {
	return b.client.EvalShaRO(ctx, sha1, keys, args...)
}

// EvalRO implements redis.Scripter without batching: the store never calls
// it.
func (b *Batcher) EvalRO(ctx context.Context, script string, keys []string, args ...any) *redis.Cmd {
	return b.client.EvalRO(ctx, script, keys, args...)
}

// ScriptExists implements redis.Scripter.
func (b *Batcher) ScriptExists(ctx context.Context, hashes ...string) *redis.BoolSliceCmd {
	return b.client.ScriptExists(ctx, hashes...)
}

// ScriptLoad implements redis.Scripter.
func (b *Batcher) ScriptLoad(ctx context.Context, script string) *redis.StringCmd {
	return b.client.ScriptLoad(ctx, script)
}

// call queues one script call and waits for its reply or its deadline.
func (b *Batcher) call(ctx context.Context, sha bool, payload string, keys []string, args []any) *redis.Cmd {
	c := &batchCall{ctx: ctx, sha: sha, payload: payload, keys: keys, args: args, ready: make(chan struct{})}
	if err := b.enqueue(c); err != nil {
		return failedCmd(ctx, err)
	}
	select {
	case <-c.ready:
		return c.reply
	case <-ctx.Done():
		// The flusher still answers c; nobody reads it.
		return failedCmd(ctx, ctx.Err())
	}
}

// enqueue hands c to the flushers, waiting for room in the queue until c's
// deadline.
func (b *Batcher) enqueue(c *batchCall) error {
	b.mu.RLock()
	defer b.mu.RUnlock()
	if b.closed {
		return ErrBatcherClosed
	}
	select {
	case b.queue <- c:
		return nil
	case <-c.ctx.Done():
		return c.ctx.Err()
	}
}

func failedCmd(ctx context.Context, err error) *redis.Cmd {
	cmd := redis.NewCmd(ctx)
	cmd.SetErr(err)
	return cmd
}

// flush sends batches until Close, then answers what is left in the queue.
func (b *Batcher) flush() {
	defer b.wg.Done()
	batch := make([]*batchCall, 0, maxBatch)
	for {
		select {
		case c := <-b.queue:
			batch = append(batch[:0], c)
		case <-b.done:
			b.drain()
			return
		}
	more:
		for len(batch) < maxBatch {
			select {
			case c := <-b.queue:
				batch = append(batch, c)
			default:
				break more
			}
		}
		b.send(batch)
		clear(batch)
	}
}

// drain answers the calls queued when Close was called.
func (b *Batcher) drain() {
	for {
		select {
		case c := <-b.queue:
			c.reply = failedCmd(c.ctx, ErrBatcherClosed)
			close(c.ready)
		default:
			return
		}
	}
}

// send runs one batch as a pipeline and answers each of its calls. Calls
// whose deadline has passed are answered without being sent: their callers
// have gone, and a Redis that recovers from a freeze should not be handed the
// backlog.
func (b *Batcher) send(batch []*batchCall) {
	live := make([]*batchCall, 0, len(batch))
	for _, c := range batch {
		if err := c.ctx.Err(); err != nil {
			c.reply = failedCmd(c.ctx, err)
			continue
		}
		live = append(live, c)
	}
	if len(live) > 0 {
		b.exec(live)
	}
	for _, c := range batch {
		close(c.ready)
	}
}

// exec runs calls as one pipeline and sets each call's reply; each command
// carries its own error.
func (b *Batcher) exec(calls []*batchCall) {
	pipe := b.client.Pipeline()
	ctx, cancel := batchContext(calls)
	defer cancel()
	for _, c := range calls {
		if c.sha {
			c.reply = pipe.EvalSha(ctx, c.payload, c.keys, c.args...)
		} else {
			c.reply = pipe.Eval(ctx, c.payload, c.keys, c.args...)
		}
	}
	// Exec's error is the first command's; every caller reads its own.
	_, _ = pipe.Exec(ctx)
}

// batchContext returns the context of one pipeline: it ends at the latest
// deadline of its calls, so that a frozen Redis releases the
// connection once every caller has given up, and never sooner. It carries no
// values and no cancellation of any one caller.
func batchContext(calls []*batchCall) (context.Context, context.CancelFunc) {
	var latest time.Time
	for _, c := range calls {
		d, ok := c.ctx.Deadline()
		if !ok {
			return context.WithCancel(context.Background())
		}
		if d.After(latest) {
			latest = d
		}
	}
	return context.WithDeadline(context.Background(), latest)
}
