package redisconn

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/redis/go-redis/v9"
)

// A cluster client sends a call again by a loop of its own, besides its node
// clients' MaxRetries: up to max_redirects more times, on the same node first,
// after an error it takes for a network fault, a lost reply included. The same
// loop follows MOVED and ASK, which a resharding needs and which are safe
// (Redis ran nothing). So the stores' cluster client keeps the loop and gets
// two hooks: one on the cluster client gives each call a record, and one on
// each node's client, around every attempt there, marks the call when an
// attempt ends without a reply from Redis, and turns away the attempts that
// follow. A MOVED or ASK reply is a reply: the redirect goes ahead.

// sendOnceOnCluster returns a cluster client of opts that never sends a call
// again after an attempt that may have reached Redis without its reply
// coming back.
func sendOnceOnCluster(opts *redis.ClusterOptions) *redis.ClusterClient {
	newNode := opts.NewClient
	if newNode == nil {
		newNode = redis.NewClient
	}
	opts.NewClient = func(node *redis.Options) *redis.Client {
		c := newNode(node)
		c.AddHook(sendOnceAttempts{})
		return c
	}
	c := redis.NewClusterClient(opts)
	c.AddHook(sendOnceCalls{})
	return c
}

// sendOnceCall is one call of a cluster client (a command or a pipeline).
type sendOnceCall struct {
	mu sync.Mutex
	// unanswered is the error of an attempt that may have reached Redis
	// and got no reply; nil while none has.
	unanswered error
}

type sendOnceKey struct{}

// sendOnceCalls is the cluster client's hook: it gives each call a record.
type sendOnceCalls struct{}

func (sendOnceCalls) DialHook(next redis.DialHook) redis.DialHook { return next }

func (sendOnceCalls) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		return next(context.WithValue(ctx, sendOnceKey{}, new(sendOnceCall)), cmd)
	}
}

func (sendOnceCalls) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		return next(context.WithValue(ctx, sendOnceKey{}, new(sendOnceCall)), cmds)
	}
}

// sendOnceAttempts is a node client's hook, around each attempt of a call.
type sendOnceAttempts struct{}

func (sendOnceAttempts) DialHook(next redis.DialHook) redis.DialHook { return next }

func (sendOnceAttempts) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		return attemptOnce(ctx, func(ctx context.Context) error { return next(ctx, cmd) })
	}
}

func (sendOnceAttempts) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		return attemptOnce(ctx, func(ctx context.Context) error { return next(ctx, cmds) })
	}
}

// attemptOnce runs one attempt of the call in ctx, unless an earlier one may
// have reached Redis unanswered.
func attemptOnce(ctx context.Context, attempt func(context.Context) error) error {
	call, ok := ctx.Value(sendOnceKey{}).(*sendOnceCall)
	if !ok {
		return attempt(ctx)
	}
	call.mu.Lock()
	unanswered := call.unanswered
	call.mu.Unlock()
	if unanswered != nil {
		// Not wrapped: go-redis must not take this for a network error
		// and try yet again.
		return fmt.Errorf("redis: not sent again after %v: Redis may have run it", unanswered)
	}
	err := attempt(ctx)
	if err != nil && mayHaveRun(err) {
		call.mu.Lock()
		if call.unanswered == nil {
			call.unanswered = err
		}
		call.mu.Unlock()
	}
	return err
}

// mayHaveRun reports whether a failed attempt may have reached Redis: any
// error but Redis's own reply and a connection that was never made.
func mayHaveRun(err error) bool {
	var reply redis.Error
	return !errors.As(err, &reply) && !IsDialError(err)
}
