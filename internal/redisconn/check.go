package redisconn

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// ErrUnreachable is wrapped by Check's error when Redis did not answer (yet).
var ErrUnreachable = errors.New("redis not reachable")

// checkTimeout bounds the start-up check, unless the caller's timeout is
// longer: a Redis that is down must not hold a config load for long, since
// the fail mode covers it.
const checkTimeout = 500 * time.Millisecond

// Check asks Redis once, at start-up, whether it takes this connection's
// configuration, waiting up to timeout or checkTimeout, the longer. An
// answer that no retry can fix (a database index Redis refuses, a wrong
// password, a server that does not speak Redis) is an error in Redis's own
// words, since every request would fail the same way. A Redis that cannot
// be reached yields an error that wraps ErrUnreachable: it may come up
// later, and until then the fail mode applies.
func (c *Conn) Check(timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), max(timeout, checkTimeout))
	defer cancel()
	err := c.s.client.Ping(ctx).Err()
	switch {
	case err == nil:
		return nil
	case unreachable(err):
		return fmt.Errorf("%w: %w", ErrUnreachable, err)
	}
	return fmt.Errorf("redis refuses this configuration: %w", err)
}

// transientReplies start Redis error replies that go away by themselves.
var transientReplies = []string{"LOADING", "BUSY", "MASTERDOWN", "CLUSTERDOWN", "TRYAGAIN", "READONLY"}

// unreachable reports whether err says that Redis did not answer (yet), as
// opposed to answering that it refuses.
func unreachable(err error) bool {
	var netErr net.Error
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, redis.ErrClosed), errors.As(err, &netErr):
		return true
	}
	var reply redis.Error
	if errors.As(err, &reply) {
		for _, prefix := range transientReplies {
			if strings.HasPrefix(reply.Error(), prefix) {
				return true
			}
		}
	}
	return false
}
