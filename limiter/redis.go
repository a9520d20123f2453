package limiter

import (
	"context"
	_ "embed"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// DefaultKeyPrefix starts every Redis key the store writes.
const DefaultKeyPrefix = "srl:"

//go:embed sliding_log.lua
var slidingLogSource string

var slidingLog = redis.NewScript(slidingLogSource)

// RedisStore keeps each client's admissions in a Redis sorted set and decides
// with one Lua script call, so every process using the same Redis shares one
// exact limit. The script reads Redis's clock, so the hosts' clocks do not
// matter. It is safe for concurrent use.
type RedisStore struct {
	client redis.Scripter
	prefix string
}

// NewRedisStore returns a store on client (a *redis.Client, ClusterClient or
// any Scripter) whose keys start with prefix.
func NewRedisStore(client redis.Scripter, prefix string) *RedisStore {
	return &RedisStore{client: client, prefix: prefix}
}

// Key returns the Redis key of a client in a zone: prefix{client}:zone. The
// hash tag is the client key, never a constant, so Redis Cluster spreads
// clients over all slots while all zones of one client share a slot.
func (s *RedisStore) Key(zone, client string) string {
	return s.prefix + "{" + client + "}:" + zone
}

// Allow implements Store with one script call for all checks.
func (s *RedisStore) Allow(ctx context.Context, checks []Check, decisions []Decision) error {
	keys := make([]string, len(checks))
	args := make([]any, 0, 2*len(checks))
	for i, c := range checks {
		keys[i] = s.Key(c.Zone, c.Key)
		args = append(args, c.Limit.Window.Microseconds(), c.Limit.Max)
	}
	reply, err := slidingLog.Run(ctx, s.client, keys, args...).Slice()
	if err != nil {
		return fmt.Errorf("running sliding window script: %w", err)
	}
	if len(reply) != len(checks) {
		return fmt.Errorf("sliding window script: got %d replies for %d keys", len(reply), len(checks))
	}
	for i, r := range reply {
		d, err := parseDecision(r)
		if err != nil {
			return fmt.Errorf("sliding window script: key %d: %w", i, err)
		}
		decisions[i] = d
	}
	return nil
}

// parseDecision reads one {allowed, remaining, reset_us} reply.
func parseDecision(reply any) (Decision, error) {
	fields, ok := reply.([]any)
	if !ok || len(fields) != 3 {
		return Decision{}, fmt.Errorf("unexpected reply %v", reply)
	}
	var n [3]int64
	for i, f := range fields {
		if n[i], ok = f.(int64); !ok {
			return Decision{}, fmt.Errorf("unexpected reply field %v", f)
		}
	}
	d := Decision{
		Allowed:   n[0] == 1,
		Remaining: n[1],
		Reset:     time.Duration(n[2]) * time.Microsecond,
	}
	if !d.Allowed {
		d.RetryAfter = d.Reset
	}
	return d, nil
}
