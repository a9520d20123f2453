package limiter

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// DefaultKeyPrefix starts every Redis key the store writes, unless
// RedisOptions say otherwise.
const DefaultKeyPrefix = "srl:"

// DefaultTimeout is how long a RedisStore call waits for Redis, unless
// RedisOptions say otherwise.
const DefaultTimeout = 100 * time.Millisecond

// RedisClient is what a RedisStore needs of a go-redis client: scripts,
// pipelines and DEL. *redis.Client, *redis.ClusterClient, the failover
// client of redis.NewFailoverClient and redis.UniversalClient all have it.
type RedisClient interface {
	redis.Scripter
	Pipeline() redis.Pipeliner
	Del(ctx context.Context, keys ...string) *redis.IntCmd
}

// RedisOptions configure a RedisStore. The zero value is the defaults.
type RedisOptions struct {
	// KeyPrefix starts every Redis key the store writes. Empty means
	// DefaultKeyPrefix. A '{' or '}' in it changes the Redis Cluster hash
	// tag, putting every client in one slot.
	KeyPrefix string
	// Timeout bounds every call: it ends at its context's deadline or
	// Timeout after it started, whichever is sooner, even while Redis does
	// not answer. Zero means DefaultTimeout.
	Timeout time.Duration
}

// RedisStore keeps each client's state in Redis, so every process using the
// same Redis shares one exact limit. It batches the calls of concurrent
// callers: one Lua script call decides all the requests queued while Redis
// was busy with the previous one (one call per hash slot on Redis Cluster).
// The script reads Redis's clock, so the hosts' clocks do not matter. It is
// safe for concurrent use; Close stops the batching, not the client.
type RedisStore struct {
	client  RedisClient
	prefix  string
	timeout time.Duration
	cluster bool
	batch   *batcher
}

// NewRedisStore returns a store on client and starts its batching.
func NewRedisStore(client RedisClient, opts RedisOptions) *RedisStore {
	if opts.KeyPrefix == "" {
		opts.KeyPrefix = DefaultKeyPrefix
	}
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultTimeout
	}
	_, cluster := client.(*redis.ClusterClient)
	return &RedisStore{
		client:  client,
		prefix:  opts.KeyPrefix,
		timeout: opts.Timeout,
		cluster: cluster,
		batch:   newBatcher(client, cluster, opts.Timeout),
	}
}

// Close stops the store's batching once the calls in flight return. Calls
// waiting, and calls made after it, fail with ErrClosed. It does not close
// the client.
func (s *RedisStore) Close() error {
	s.batch.close()
	return nil
}

// Key returns the Redis key of a client in a zone: prefix{client}:zone. The
// hash tag is the client key, never a constant, so Redis Cluster spreads
// clients over all slots while all zones of one client share a slot.
func (s *RedisStore) Key(zone, client string) string {
	return s.prefix + "{" + client + "}:" + zone
}

// Allow implements Store. A request whose keys share a slot (always, on a
// single server) is decided by one script call, batched with others. On a
// cluster, a request over several slots is decided slot by slot: admissions
// recorded in earlier slots are refunded when a later one denies, and slots
// after a denial are only inspected.
func (s *RedisStore) Allow(ctx context.Context, checks []Check, decisions []Decision) error {
	keys := s.keys(checks)
	groups := s.slotGroups(keys)
	if groups == nil {
		return s.do(ctx, opAllow, keys, checks, decisions)
	}
	admitted := true
	for g, idx := range groups {
		o := opPeek
		if admitted {
			o = opAllow
		}
		if err := s.doGroup(ctx, o, keys, checks, decisions, idx); err != nil {
			if admitted && g > 0 {
				// Best effort: the request fails either way.
				_ = s.refundGroups(ctx, keys, checks, decisions, groups[:g])
			}
			return err
		}
		if admitted && !admittedAt(decisions, idx) {
			admitted = false
			if err := s.refundGroups(ctx, keys, checks, decisions, groups[:g]); err != nil {
				return err
			}
		}
	}
	return nil
}

// Peek implements Inspector.
func (s *RedisStore) Peek(ctx context.Context, checks []Check, decisions []Decision) error {
	keys := s.keys(checks)
	groups := s.slotGroups(keys)
	if groups == nil {
		return s.do(ctx, opPeek, keys, checks, decisions)
	}
	for _, idx := range groups {
		if err := s.doGroup(ctx, opPeek, keys, checks, decisions, idx); err != nil {
			return err
		}
	}
	return nil
}

// Refund implements Refunder: it takes back exactly the admissions that
// the Allow which filled decisions recorded, even when later admissions
// were recorded after them.
func (s *RedisStore) Refund(ctx context.Context, checks []Check, decisions []Decision) error {
	keys := s.keys(checks)
	groups := s.slotGroups(keys)
	if groups == nil {
		return s.do(ctx, opRefund, keys, checks, decisions)
	}
	for _, idx := range groups {
		if err := s.doGroup(ctx, opRefund, keys, checks, decisions, idx); err != nil {
			return err
		}
	}
	return nil
}

// Reset implements Inspector.
func (s *RedisStore) Reset(ctx context.Context, zone, key string) error {
	return s.client.Del(ctx, s.Key(zone, key)).Err()
}

// do runs one request through the batcher: it ends at ctx's deadline or the
// store's timeout, whichever is sooner, with one clock read.
func (s *RedisStore) do(ctx context.Context, o op, keys []string, checks []Check, decisions []Decision) error {
	if len(checks) == 0 || o == opRefund && !recorded(decisions) {
		return nil
	}
	if len(checks) > 255 {
		return fmt.Errorf("%d checks in one request, want at most 255", len(checks))
	}
	r := &request{
		ctx:       ctx,
		op:        o,
		keys:      keys,
		args:      appendRequest(make([]byte, 0, 2+zoneArgLen*len(checks)), o, checks, decisions),
		decisions: decisions,
		deadline:  time.Now().Add(s.timeout),
	}
	if d, ok := ctx.Deadline(); ok && d.Before(r.deadline) {
		r.deadline = d
	}
	if s.cluster {
		r.slot = hashSlot(keys[0])
	}
	return s.batch.do(r)
}

// doGroup runs o for the checks of one slot group (indexes idx), with their
// decisions as o's input and, after it, its output.
func (s *RedisStore) doGroup(ctx context.Context, o op, keys []string, checks []Check, decisions []Decision, idx []int) error {
	subKeys, sub, subDecisions := pickGroup(keys, checks, idx)
	for j, i := range idx {
		subDecisions[j] = decisions[i]
	}
	if err := s.do(ctx, o, subKeys, sub, subDecisions); err != nil {
		return err
	}
	for j, i := range idx {
		decisions[i] = subDecisions[j]
	}
	return nil
}

// admittedAt reports whether the decisions at idx all admit.
func admittedAt(decisions []Decision, idx []int) bool {
	for _, i := range idx {
		if !decisions[i].Allowed {
			return false
		}
	}
	return true
}

// refundGroups takes back the admissions recorded for the checks of groups,
// and reports their zones as not consumed.
func (s *RedisStore) refundGroups(ctx context.Context, keys []string, checks []Check, decisions []Decision, groups [][]int) error {
	for _, idx := range groups {
		subKeys, sub, subDecisions := pickGroup(keys, checks, idx)
		for j, i := range idx {
			subDecisions[j] = decisions[i]
		}
		if err := s.do(ctx, opRefund, subKeys, sub, subDecisions); err != nil {
			return fmt.Errorf("refunding admissions: %w", err)
		}
		for _, i := range idx {
			if decisions[i].token >= 0 {
				decisions[i].Remaining++
				decisions[i].token = -1
			}
		}
	}
	return nil
}

// recorded reports whether any decision recorded an admission.
func recorded(decisions []Decision) bool {
	for _, d := range decisions {
		if d.token >= 0 {
			return true
		}
	}
	return false
}

func (s *RedisStore) keys(checks []Check) []string {
	keys := make([]string, len(checks))
	for i, c := range checks {
		keys[i] = s.Key(c.Zone, c.Key)
	}
	return keys
}

// slotGroups returns the indexes of keys grouped by Redis Cluster slot, in
// the order the slots first appear; nil when all share one slot, as they
// always do on a single server.
func (s *RedisStore) slotGroups(keys []string) [][]int {
	if !s.cluster || len(keys) < 2 {
		return nil
	}
	slots := make([]uint16, len(keys))
	same := true
	for i, k := range keys {
		slots[i] = hashSlot(k)
		same = same && slots[i] == slots[0]
	}
	if same {
		return nil
	}
	var groups [][]int
	seen := make(map[uint16]int)
	for i, slot := range slots {
		g, ok := seen[slot]
		if !ok {
			g = len(groups)
			seen[slot] = g
			groups = append(groups, nil)
		}
		groups[g] = append(groups[g], i)
	}
	return groups
}

func pickGroup(keys []string, checks []Check, idx []int) ([]string, []Check, []Decision) {
	subKeys, sub := make([]string, len(idx)), make([]Check, len(idx))
	for j, i := range idx {
		subKeys[j], sub[j] = keys[i], checks[i]
	}
	return subKeys, sub, make([]Decision, len(idx))
}

// Interface guards
var (
	_ Store       = (*RedisStore)(nil)
	_ Inspector   = (*RedisStore)(nil)
	_ Refunder    = (*RedisStore)(nil)
	_ RedisClient = (*redis.Client)(nil)
	_ RedisClient = (*redis.ClusterClient)(nil)
	_ RedisClient = redis.UniversalClient(nil)
)
