package limiter

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// DefaultKeyPrefix starts every Redis key the store writes.
const DefaultKeyPrefix = "srl:"

var (
	//go:embed limit.lua
	limitSource string
	//go:embed refund.lua
	refundSource string

	limitScript  = redis.NewScript(limitSource)
	refundScript = redis.NewScript(refundSource)
)

// RedisStore keeps each client's state in Redis and decides with one Lua
// script call per Redis Cluster slot (one call in all on a single server), so
// every process using the same Redis shares one exact limit. The script reads
// Redis's clock, so the hosts' clocks do not matter. It is safe for concurrent
// use.
type RedisStore struct {
	client redis.Scripter
	// scripts runs the scripts: the client itself, or a batcher or
	// pipeliner in front of it.
	scripts redis.Scripter
	prefix  string
	cluster bool
	// guarded calls return at the context's deadline even if the client
	// would wait longer: go-redis's AutoPipeliner does not stop waiting for
	// a reply that a frozen Redis never sends.
	guarded bool
}

// NewRedisStore returns a store on client (a *redis.Client, *ClusterClient,
// failover client or any Scripter) whose keys start with prefix.
func NewRedisStore(client redis.Scripter, prefix string) *RedisStore {
	_, cluster := client.(*redis.ClusterClient)
	return &RedisStore{client: client, scripts: client, prefix: prefix, cluster: cluster}
}

// Through returns a copy of the store that sends its commands through
// scripter, such as go-redis's AutoPipeliner on the same client, which
// batches concurrent calls into pipelines. The topology stays the client's.
//
// Calls through it still end at the context's deadline: the command goes on
// in the background, and its answer, when it comes, is dropped.
func (s *RedisStore) Through(scripter redis.Scripter) *RedisStore {
	c := *s
	c.scripts = scripter
	c.guarded = true
	return &c
}

// Batched returns a copy of the store that runs its scripts through b, which
// sends the calls of concurrent decisions to Redis in pipelines. b must be on
// the store's client.
func (s *RedisStore) Batched(b *Batcher) *RedisStore {
	c := *s
	c.scripts = b
	c.guarded = false
	return &c
}

// Key returns the Redis key of a client in a zone: prefix{client}:zone. The
// hash tag is the client key, never a constant, so Redis Cluster spreads
// clients over all slots while all zones of one client share a slot.
func (s *RedisStore) Key(zone, client string) string {
	return s.prefix + "{" + client + "}:" + zone
}

// Allow implements Store. Checks whose keys share a slot are decided by one
// script call. On a cluster, checks in several slots are decided slot by
// slot: admissions recorded in earlier slots are refunded when a later one
// denies, and slots after a denial are only inspected.
func (s *RedisStore) Allow(ctx context.Context, checks []Check, decisions []Decision) error {
	if !s.cluster || sameClient(checks) {
		return s.run(ctx, true, checks, decisions)
	}
	groups := groupByClient(checks)
	admitted := true
	for g, idx := range groups {
		sub, subDecisions := pick(checks, idx), make([]Decision, len(idx))
		if err := s.run(ctx, admitted, sub, subDecisions); err != nil {
			if admitted && g > 0 {
				// Best effort: the request fails either way.
				_ = s.refund(ctx, checks, decisions, groups[:g])
			}
			return err
		}
		for j, i := range idx {
			decisions[i] = subDecisions[j]
		}
		if admitted && !Admitted(subDecisions) {
			admitted = false
			if err := s.refund(ctx, checks, decisions, groups[:g]); err != nil {
				return err
			}
		}
	}
	return nil
}

// Peek implements Inspector.
func (s *RedisStore) Peek(ctx context.Context, checks []Check, decisions []Decision) error {
	if !s.cluster || sameClient(checks) {
		return s.run(ctx, false, checks, decisions)
	}
	for _, idx := range groupByClient(checks) {
		sub, subDecisions := pick(checks, idx), make([]Decision, len(idx))
		if err := s.run(ctx, false, sub, subDecisions); err != nil {
			return err
		}
		for j, i := range idx {
			decisions[i] = subDecisions[j]
		}
	}
	return nil
}

// Reset implements Inspector.
func (s *RedisStore) Reset(ctx context.Context, zone, key string) error {
	del, ok := s.client.(interface {
		Del(ctx context.Context, keys ...string) *redis.IntCmd
	})
	if !ok {
		return errors.New("redis client cannot delete keys")
	}
	return del.Del(ctx, s.Key(zone, key)).Err()
}

// run calls limit.lua once for checks, which must share a slot.
func (s *RedisStore) run(ctx context.Context, record bool, checks []Check, decisions []Decision) error {
	keys := make([]string, len(checks))
	args := make([]any, 1, 1+3*len(checks))
	args[0] = 0
	if record {
		args[0] = 1
	}
	for i, c := range checks {
		keys[i] = s.Key(c.Zone, c.Key)
		args = append(args, c.Limit.Algorithm.String(), c.Limit.Window.Microseconds(), c.Limit.Max)
	}
	reply, err := s.runScript(ctx, keys, args)
	if err != nil {
		return fmt.Errorf("running rate limit script: %w", err)
	}
	if len(reply) != len(checks) {
		return fmt.Errorf("rate limit script: got %d replies for %d keys", len(reply), len(checks))
	}
	for i, r := range reply {
		d, err := parseDecision(r)
		if err != nil {
			return fmt.Errorf("rate limit script: key %d: %w", i, err)
		}
		decisions[i] = d
	}
	return nil
}

// runScript runs limit.lua, within ctx's deadline when guarded.
func (s *RedisStore) runScript(ctx context.Context, keys []string, args []any) ([]any, error) {
	if !s.guarded {
		return limitScript.Run(ctx, s.scripts, keys, args...).Slice()
	}
	type result struct {
		reply []any
		err   error
	}
	done := make(chan result, 1)
	go func() {
		reply, err := limitScript.Run(ctx, s.scripts, keys, args...).Slice()
		done <- result{reply, err}
	}()
	select {
	case r := <-done:
		return r.reply, r.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// refund takes back the admissions recorded for the checks of groups, and
// reports their zones as not consumed.
func (s *RedisStore) refund(ctx context.Context, checks []Check, decisions []Decision, groups [][]int) error {
	for _, idx := range groups {
		keys := make([]string, 0, len(idx))
		args := make([]any, 0, 2*len(idx))
		for _, i := range idx {
			if decisions[i].token < 0 {
				continue
			}
			keys = append(keys, s.Key(checks[i].Zone, checks[i].Key))
			args = append(args, checks[i].Limit.Algorithm.String(), decisions[i].token)
			decisions[i].Remaining++
			decisions[i].token = -1
		}
		if len(keys) == 0 {
			continue
		}
		if err := refundScript.Run(ctx, s.scripts, keys, args...).Err(); err != nil {
			return fmt.Errorf("refunding admissions: %w", err)
		}
	}
	return nil
}

// sameClient reports whether all checks share a client key, and so a slot.
func sameClient(checks []Check) bool {
	for _, c := range checks[1:] {
		if c.Key != checks[0].Key {
			return false
		}
	}
	return true
}

// groupByClient returns the indexes of checks grouped by client key, in the
// order the keys first appear.
func groupByClient(checks []Check) [][]int {
	var groups [][]int
	seen := make(map[string]int)
	for i, c := range checks {
		g, ok := seen[c.Key]
		if !ok {
			g = len(groups)
			seen[c.Key] = g
			groups = append(groups, nil)
		}
		groups[g] = append(groups[g], i)
	}
	return groups
}

func pick(checks []Check, idx []int) []Check {
	out := make([]Check, len(idx))
	for j, i := range idx {
		out[j] = checks[i]
	}
	return out
}

// parseDecision reads one {allowed, remaining, reset_us, token} reply.
func parseDecision(reply any) (Decision, error) {
	fields, ok := reply.([]any)
	if !ok || len(fields) != 4 {
		return Decision{}, fmt.Errorf("unexpected reply %v", reply)
	}
	var n [4]int64
	for i, f := range fields {
		if n[i], ok = f.(int64); !ok {
			return Decision{}, fmt.Errorf("unexpected reply field %v", f)
		}
	}
	d := Decision{
		Allowed:   n[0] == 1,
		Remaining: n[1],
		Reset:     time.Duration(n[2]) * time.Microsecond,
		token:     n[3],
	}
	if !d.Allowed {
		d.RetryAfter = d.Reset
	}
	return d, nil
}
