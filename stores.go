package slidingratelimit

import (
	"errors"
	"fmt"
	"net/url"

	"github.com/caddyserver/caddy/v2"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

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

// redisClient is a pooled client with what lives as long as it: the circuit
// breaker that guards every handler on it (clientbreaker.go) and the
// subscriber to the resets that instances announce (resets.go).
type redisClient struct {
	// UniversalClient sends every command once, whatever the URL says
	// about retries (see newRedisClients): the stores' script calls, the
	// start-up check, the reset subscriber.
	redis.UniversalClient
	// announcer publishes resets: the same client, or, when the URL sets
	// max_retries, one that retries as it says.
	announcer redis.UniversalClient
	breaker   *limiter.Breaker
	// label names the Redis in metrics and logs: host:port.
	label  string
	resets *resetBus
}

func (c redisClient) Destruct() error {
	c.resets.stop()
	limiterMetrics.circuitState.DeleteLabelValues(c.label)
	if c.announcer != c.UniversalClient {
		return errors.Join(c.announcer.Close(), c.Close())
	}
	return c.Close()
}

// loadRedisClient returns the shared client for a topology and URL, and the
// function that releases this use of it.
func loadRedisClient(topology, rawURL string) (redisClient, func() error, error) {
	poolKey := "redis " + topology + " " + rawURL
	v, _, err := stores.LoadOrNew(poolKey, func() (caddy.Destructor, error) {
		client, announcer, err := newRedisClients(topology, rawURL)
		if err != nil {
			return nil, err
		}
		label := redisLabel(topology, rawURL)
		return redisClient{
			UniversalClient: client,
			announcer:       announcer,
			breaker:         newClientBreaker(label),
			label:           label,
			resets:          newResetBus(client, announcer),
		}, nil
	})
	if err != nil {
		return redisClient{}, nil, err
	}
	return v.(redisClient), func() error {
		_, err := stores.Delete(poolKey)
		return err
	}, nil
}

// redisStore is a pooled store with the use of the client it holds.
type redisStore struct {
	*limiter.RedisStore
	releaseClient func() error
}

func (s redisStore) Destruct() error {
	s.RedisStore.Close()
	return s.releaseClient()
}

// loadRedisStore returns the shared store for a topology, URL, key prefix
// and timeout, and the function that releases this use of it. Handlers that
// agree on all four share one store, and so one batch of decisions per
// script call; the store lives as long as the handlers that use it, and
// holds its client that long.
func loadRedisStore(topology, rawURL string, opts limiter.RedisOptions) (*limiter.RedisStore, func() error, error) {
	poolKey := fmt.Sprintf("redis store %s %s %q %d", topology, rawURL, opts.KeyPrefix, opts.Timeout)
	v, _, err := stores.LoadOrNew(poolKey, func() (caddy.Destructor, error) {
		client, release, err := loadRedisClient(topology, rawURL)
		if err != nil {
			return nil, err
		}
		return redisStore{limiter.NewRedisStore(client.UniversalClient, opts), release}, nil
	})
	if err != nil {
		return nil, nil, err
	}
	return v.(redisStore).RedisStore, func() error {
		_, err := stores.Delete(poolKey)
		return err
	}, nil
}

// newRedisClients makes the go-redis clients of a topology and URL. A script
// call records admissions, and one whose reply was lost (a connection cut
// after Redis ran it) may have recorded them: sent again, it records them
// twice, and its client pays for a request it was never answered. So client
// sends every command once, whatever the URL says about retries, and a lost
// reply takes the fail mode. Only reset announcements, which are harmless
// twice (an instance forgets a key it has forgotten), are retried as the
// URL's max_retries says: through announcer, a client of their own when the
// URL sets it, client otherwise.
func newRedisClients(topology, rawURL string) (client, announcer redis.UniversalClient, err error) {
	newClient, retries, err := parseTopologyURL(topology, rawURL)
	if err != nil {
		return nil, nil, err
	}
	client = newClient(true)
	if !retries {
		return client, client, nil
	}
	return client, newClient(false), nil
}

// checkRedisURL parses rawURL as the topology would, to report a bad URL at
// configuration time.
func checkRedisURL(topology, rawURL string) error {
	_, _, err := parseTopologyURL(topology, rawURL)
	return err
}

// parseTopologyURL parses rawURL with go-redis's parser for the topology and
// returns the constructor of its clients, and whether the URL asks for
// command retries. With sendOnce the client never sends a command again (see
// newRedisClients and sendonce.go); without, it retries only as the URL's
// max_retries says. Every client honours the context deadline of each
// decision: without that, go-redis ignores it and a frozen Redis holds each
// request for the read timeout. It fails fast: go-redis dials in the
// background, detached from the decision's deadline, and by default retries
// a refused dial five times 100ms apart while the decision waits, so a dial
// is tried once. A URL that sets pool_size keeps its own (see
// outageProofPoolSize). A new connection spends one round trip on its
// handshake, not three: no CLIENT SETINFO and no maintenance notifications (a
// Redis Enterprise feature) follow HELLO. With Redis 50ms away and a 100ms
// timeout, three would leave no time for the first decision. Errors never
// quote the URL, which may hold a password.
func parseTopologyURL(topology, rawURL string) (newClient func(sendOnce bool) redis.UniversalClient, retries bool, err error) {
	switch topology {
	case "", topologyStandalone:
		opts, err := redis.ParseURL(rawURL)
		if err != nil {
			return nil, false, urlError(err, "redis://host:port or rediss://host:port")
		}
		opts.ContextTimeoutEnabled = true
		opts.MaxRetries, opts.DialerRetries = failFast(opts.MaxRetries, opts.DialerRetries)
		opts.PoolSize = poolSize(opts.PoolSize)
		opts.DisableIdentity, opts.MaintNotificationsConfig = true, noMaintNotifications()
		gateDials(opts)
		return func(sendOnce bool) redis.UniversalClient {
			// Both clients keep the one dial gate: it stands for the server.
			o := *opts
			if sendOnce {
				o.MaxRetries = -1
			}
			return redis.NewClient(&o)
		}, opts.MaxRetries > 0, nil
	case topologyCluster:
		opts, err := redis.ParseClusterURL(rawURL)
		if err != nil {
			return nil, false, urlError(err, "redis://host:port?addr=host2:port2")
		}
		opts.ContextTimeoutEnabled = true
		opts.MaxRetries, opts.DialerRetries = failFast(opts.MaxRetries, opts.DialerRetries)
		opts.PoolSize = poolSize(opts.PoolSize)
		opts.DisableIdentity, opts.MaintNotificationsConfig = true, noMaintNotifications()
		gateNodeDials(opts)
		return func(sendOnce bool) redis.UniversalClient {
			o := *opts
			if !sendOnce {
				return redis.NewClusterClient(&o)
			}
			o.MaxRetries = -1
			return sendOnceOnCluster(&o)
		}, opts.MaxRetries > 0, nil
	case topologySentinel:
		opts, err := redis.ParseFailoverURL(rawURL)
		if err != nil {
			return nil, false, urlError(err, "redis://sentinel:26379?master_name=mymaster")
		}
		opts.ContextTimeoutEnabled = true
		opts.MaxRetries, opts.DialerRetries = failFast(opts.MaxRetries, opts.DialerRetries)
		opts.PoolSize = poolSize(opts.PoolSize)
		opts.DisableIdentity = true // it sends no maintenance notifications handshake
		return func(sendOnce bool) redis.UniversalClient {
			o := *opts
			if sendOnce {
				o.MaxRetries = -1
			}
			return redis.NewFailoverClient(&o)
		}, opts.MaxRetries > 0, nil
	}
	return nil, false, fmt.Errorf("unknown redis topology %q", topology)
}

// noMaintNotifications is the go-redis setting that skips the maintenance
// notifications handshake.
func noMaintNotifications() *maintnotifications.Config {
	return &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
}

// urlError describes a URL that go-redis refused, without quoting the URL,
// which may hold a password.
func urlError(err error, want string) error {
	var urlErr *url.Error
	if errors.As(err, &urlErr) {
		err = urlErr.Err
	}
	return fmt.Errorf("invalid URL (want %s): %w", want, err)
}
