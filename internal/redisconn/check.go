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
// limits when it is full, and what to do about it; "" when nothing.
//
// Only noeviction keeps every limit: a full Redis then refuses writes,
// which is not an outage (Redis answers; see OutOfMemory), and a Redis
// given the memory of every client active in a window is never full. Every
// other policy evicts limit keys, and each eviction restarts a client's
// limit. Every key of the limiter has a TTL, so the volatile-* policies
// evict them as the allkeys-* ones do (and first, on a Redis shared with
// keys that have none). Which clients go first is what makes it worse: a
// client at its limit writes nothing while it is denied, and the deny
// cache answers it without touching Redis, so its key is the oldest
// written (nearest to expiry: volatile-ttl), the least recently and the
// least frequently used (LRU, LFU): blocked clients are let through first.
func MemoryWarning(maxmemory int64, policy string) string {
	if maxmemory == 0 {
		// No limit: Redis neither evicts nor refuses for lack of memory.
		return ""
	}
	var why string
	switch policy {
	case "noeviction":
		return ""
	case "volatile-ttl":
		why = "it evicts the keys nearest to expiry first, and a client at its limit has one of them: denied requests write nothing, so its last admission is the oldest"
	case "allkeys-lru", "volatile-lru":
		why = "it evicts the least recently used keys first, and a client at its limit has one of them: the deny cache answers it without touching redis"
	case "allkeys-lfu", "volatile-lfu":
		why = "it evicts the least frequently used keys first: those of clients seldom seen, and of clients at their limit, which the deny cache answers without touching redis"
	case "allkeys-random", "volatile-random":
		why = "it evicts keys at random, any client's"
	default:
		return ""
	}
	return "redis evicts the limiter's keys when it is full (maxmemory-policy " + policy + "): " + why +
		"; each eviction restarts a client's limit, letting a client at its limit through again. " +
		"To keep limits, set maxmemory-policy noeviction and give redis the memory of every client active in a window, with room to spare " +
		"(docs/redis.md, When Redis is full)"
}
