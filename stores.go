package slidingratelimit

import (
	"errors"
	"fmt"
	"net/url"

	"github.com/caddyserver/caddy/v2"
	"github.com/redis/go-redis/v9"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/limiter"
)

// stores holds the Redis clients and the in-process store, one per distinct
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

type redisClient struct{ redis.UniversalClient }

func (c redisClient) Destruct() error { return c.Close() }

// loadRedisClient returns the shared client for rawURL and the function that
// releases this use of it.
func loadRedisClient(rawURL string) (redis.UniversalClient, func() error, error) {
	poolKey := "redis " + rawURL
	v, _, err := stores.LoadOrNew(poolKey, func() (caddy.Destructor, error) {
		opts, err := parseRedisURL(rawURL)
		if err != nil {
			return nil, err
		}
		return redisClient{redis.NewClient(opts)}, nil
	})
	if err != nil {
		return nil, nil, err
	}
	return v.(redisClient).UniversalClient, func() error {
		_, err := stores.Delete(poolKey)
		return err
	}, nil
}

// parseRedisURL parses a redis:// or rediss:// URL with go-redis. Its errors
// never quote the URL, which may hold a password.
func parseRedisURL(rawURL string) (*redis.Options, error) {
	opts, err := redis.ParseURL(rawURL)
	if err != nil {
		var urlErr *url.Error
		if errors.As(err, &urlErr) {
			err = urlErr.Err
		}
		return nil, fmt.Errorf("invalid URL (want redis://host:port or rediss://host:port): %w", err)
	}
	// Without this, go-redis ignores the per-decision deadline and a frozen
	// Redis holds each request for the read timeout.
	opts.ContextTimeoutEnabled = true
	return opts, nil
}
