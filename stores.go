package slidingratelimit

import (
	"context"
	"fmt"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/redisconn"
	"github.com/slidingratelimit/caddy-sliding-ratelimit/limiter"
)

// stores holds the Redis stores and the in-process store, one per distinct
// configuration, shared by every handler that names it and kept across config
// reloads: a reload neither reconnects nor forgets in-process limits.
var stores = caddy.NewUsagePool()

// memoryStoreKey is the pool key of the single in-process store.
const memoryStoreKey = "memory"

type memoryStore struct{ *limiter.MemoryStore }

func (m memoryStore) Destruct() error { return m.Close() }

// loadMemoryStore returns the process's in-process store and the function
// that releases this use of it.
func loadMemoryStore() (*limiter.MemoryStore, func() error) {
	v, _, _ := stores.LoadOrNew(memoryStoreKey, func() (caddy.Destructor, error) {
		return memoryStore{limiter.NewMemoryStore()}, nil
	})
	return v.(memoryStore).MemoryStore, func() error {
		_, err := stores.Delete(memoryStoreKey)
		return err
	}
}

// redisStore is a pooled store with the use of the connection it holds.
type redisStore struct {
	*limiter.RedisStore
	conn *redisconn.Conn
}

func (s redisStore) Destruct() error {
	s.RedisStore.Close()
	return s.conn.Close()
}

// loadRedisStore returns the shared store for a topology, URL, key prefix
// and timeout, and the function that releases this use of it. Handlers that
// agree on all four share one store, and so one batch of decisions per
// script call; the store lives as long as the handlers that use it, and
// holds its connection that long.
func loadRedisStore(topology, rawURL string, opts limiter.RedisOptions) (*limiter.RedisStore, func() error, error) {
	poolKey := fmt.Sprintf("redis store %s %s %q %d", topology, rawURL, opts.KeyPrefix, opts.Timeout)
	v, _, err := stores.LoadOrNew(poolKey, func() (caddy.Destructor, error) {
		conn, err := redisconn.Open(topology, rawURL)
		if err != nil {
			return nil, err
		}
		return redisStore{limiter.NewRedisStore(conn.Client(), opts), conn}, nil
	})
	if err != nil {
		return nil, nil, err
	}
	return v.(redisStore).RedisStore, func() error {
		_, err := stores.Delete(poolKey)
		return err
	}, nil
}

// timedStore observes how long each Redis decision takes, errors included.
type timedStore struct{ *limiter.RedisStore }

func (s timedStore) Allow(ctx context.Context, checks []limiter.Check, decisions []limiter.Decision) error {
	start := time.Now()
	err := s.RedisStore.Allow(ctx, checks, decisions)
	limiterMetrics.redisDuration.Observe(time.Since(start).Seconds())
	return err
}
