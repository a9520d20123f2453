package slidingratelimit

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
)

// provisionPingTimeout bounds the check of Redis at provision, unless the
// handler's timeout is longer: a Redis that is down must not hold a config
// load for long, since the fail mode covers it.
const provisionPingTimeout = 500 * time.Millisecond

// checkRedis asks Redis once, at provision, whether it takes this
// configuration. An answer that no retry can fix (a database index Redis
// refuses, a wrong password, a server that does not speak Redis) fails the
// config with Redis's own words, since every request would fail the same way.
// A Redis that cannot be reached is only a warning: it may come up later, and
// until then the fail mode applies.
func (h *Handler) checkRedis(client redis.UniversalClient) error {
	ctx, cancel := context.WithTimeout(context.Background(), max(time.Duration(h.Timeout), provisionPingTimeout))
	defer cancel()
	err := client.Ping(ctx).Err()
	if err == nil {
		return nil
	}
	if unreachable(err) {
		h.logger.Warn("redis not reachable at provision: applying the fail mode until it answers",
			zap.String("fail_mode", h.FailMode), zap.Error(err))
		return nil
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
