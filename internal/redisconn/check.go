package redisconn

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
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

// Memory reads how Redis behaves when full, from INFO memory (which managed
// Redis services answer, unlike CONFIG GET): its maxmemory in bytes (0:
// none) and its maxmemory-policy. On Redis Cluster it asks one node.
func (c *Conn) Memory(timeout time.Duration) (maxmemory int64, policy string, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), max(timeout, checkTimeout))
	defer cancel()
	info, err := c.s.client.Info(ctx, "memory").Result()
	if err != nil {
		return 0, "", fmt.Errorf("reading redis's memory settings: %w", err)
	}
	for _, line := range strings.Split(info, "\n") {
		name, value, _ := strings.Cut(strings.TrimSpace(line), ":")
		switch name {
		case "maxmemory":
			if maxmemory, err = strconv.ParseInt(value, 10, 64); err != nil {
				return 0, "", fmt.Errorf("reading redis's maxmemory %q: %w", value, err)
			}
		case "maxmemory_policy":
			policy = value
		}
	}
	if policy == "" {
		return 0, "", errors.New("reading redis's memory settings: INFO memory has no maxmemory_policy")
	}
	return maxmemory, policy, nil
}

// Persistence reads whether Redis keeps its data across a restart, from
// CONFIG GET: appendonly (an append-only file) and save (the RDB snapshot
// points, "" for none). On Redis Cluster it asks one node. Managed Redis
// services often refuse CONFIG (and persist by their own means): an error.
func (c *Conn) Persistence(timeout time.Duration) (appendonly bool, save string, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), max(timeout, checkTimeout))
	defer cancel()
	aof, err := c.s.client.ConfigGet(ctx, "appendonly").Result()
	if err != nil {
		return false, "", fmt.Errorf("reading redis's appendonly: %w", err)
	}
	points, err := c.s.client.ConfigGet(ctx, "save").Result()
	if err != nil {
		return false, "", fmt.Errorf("reading redis's save points: %w", err)
	}
	v, ok := aof["appendonly"]
	if _, saveOK := points["save"]; !ok || !saveOK {
		return false, "", errors.New("reading redis's persistence: CONFIG GET answered no appendonly or save")
	}
	return v == "yes", strings.TrimSpace(points["save"]), nil
}

// MemoryWarning says what a Redis with maxmemory and policy does to the
// limits when it is full, and what to do about it; "" when nothing. Every
// key the limiter writes has a TTL (its window, or its lease time), so
// volatile-ttl evicts only limit state, the state closest to its end
// first, and only when memory runs out.
func MemoryWarning(maxmemory int64, policy string) string {
	switch {
	case maxmemory == 0:
		// No limit: Redis neither evicts nor refuses for lack of memory.
		return ""
	case strings.HasPrefix(policy, "allkeys-"):
		return "redis evicts any key when it is full (maxmemory-policy " + policy + "): a client whose window it evicts has its limit reset without a word; " +
			"set maxmemory-policy volatile-ttl (every key of the limiter has a TTL, the closest to expiry go first) or give redis more memory"
	case policy == "noeviction":
		return "redis refuses writes once it reaches maxmemory (maxmemory-policy noeviction): every limit decision then fails and the fail mode applies to every request; " +
			"set maxmemory-policy volatile-ttl (every key of the limiter has a TTL, the closest to expiry go first) or give redis more memory"
	}
	return ""
}
