package slidingratelimit

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/redisconn"
	"github.com/slidingratelimit/caddy-sliding-ratelimit/limiter"
)

// storeMode says where a handler's limits live.
type storeMode uint8

const (
	// inProcess: no Redis; the in-process store, so each instance counts
	// alone.
	inProcess storeMode = iota
	// redisShared: Redis, shared by every instance; fail_mode open or
	// closed.
	redisShared
	// redisWithLocal: Redis, and the in-process store decides while Redis
	// fails (fail_mode local).
	redisWithLocal
)

// backend is the store stack of one handler, built in one place (newBackend)
// and owned here, so that the request path and the admin API talk to it and
// never to its parts:
//
//	deny cache -> Redis client's breaker -> timing -> RedisStore
//	deny cache -> MemoryStore                (no Redis)
//	MemoryStore                              (fail_mode local, while Redis fails)
//
// The dial gate is inside the go-redis client (internal/redisconn).
type backend struct {
	mode storeMode
	// cache answers repeated denials in process, in front of the store.
	cache *limiter.DenyCache
	// store is the store that records admissions: Redis or in-process.
	store interface {
		limiter.Inspector
		limiter.Refunder
	}
	// local decides while Redis fails, with mode redisWithLocal.
	local *limiter.MemoryStore
	// redis and conn are set with Redis: the store (which knows the key
	// layout) and its connection (breaker, reset bus).
	redis    *limiter.RedisStore
	conn     *redisconn.Conn
	releases []func() error
}

// newBackend builds the stack for h's configuration; its pooled parts
// (clients, stores) are shared with other handlers and configs and kept
// across reloads.
func newBackend(h *Handler) (*backend, error) {
	b := new(backend)
	redisURL := caddy.NewReplacer().ReplaceKnown(h.Redis, "")
	if redisURL == "" || h.FailMode == failLocal {
		memory, release := loadMemoryStore()
		b.releases = append(b.releases, release)
		if redisURL == "" {
			if h.Redis != "" {
				// Placeholders only, all empty: an unset variable, most
				// likely, not a wish to count per instance.
				h.logger.Warn("redis expands to nothing: limits are kept in process, so each Caddy instance counts alone; set what the placeholder names, or remove the redis line to mean it",
					zap.String("placeholder", h.Redis))
			} else {
				h.logger.Info("no redis configured: limits are kept in process, so each Caddy instance counts alone")
			}
			b.mode, b.store = inProcess, memory
			b.cache = limiter.NewDenyCache(memory, limiter.DefaultDenyCacheEntries)
			return b, nil
		}
		b.local = memory
	}
	if err := b.connect(h, redisURL); err != nil {
		_ = b.close()
		return nil, err
	}
	return b, nil
}

// connect adds the Redis part of the stack.
func (b *backend) connect(h *Handler, redisURL string) error {
	b.mode = redisShared
	if b.local != nil {
		b.mode = redisWithLocal
	}
	conn, err := redisconn.Open(h.RedisTopology, redisURL)
	if err != nil {
		return fmt.Errorf("redis: %w", err)
	}
	b.releases = append(b.releases, conn.Close)
	b.conn = conn
	if err := conn.Check(time.Duration(h.Timeout)); errors.Is(err, redisconn.ErrUnreachable) {
		h.logger.Warn("redis not reachable at provision: applying the fail mode until it answers",
			zap.String("fail_mode", h.FailMode), zap.Error(err))
	} else if err != nil {
		return err
	}
	store, release, err := loadRedisStore(h.RedisTopology, redisURL, limiter.RedisOptions{
		KeyPrefix: h.KeyPrefix,
		Timeout:   time.Duration(h.Timeout),
	})
	if err != nil {
		return fmt.Errorf("redis: %w", err)
	}
	b.releases = append(b.releases, release)
	b.redis, b.store = store, store
	guarded := conn.Breaker().Guard(timedStore{store})
	b.cache = limiter.NewDenyCache(guarded, limiter.DefaultDenyCacheEntries)
	return nil
}

// allow decides checks: from the deny cache, or the store behind it. The
// Redis store ends each call at its own timeout, so a request creates no
// timer.
func (b *backend) allow(ctx context.Context, checks []limiter.Check, decisions []limiter.Decision) (source, error) {
	hit, err := b.cache.AllowCached(ctx, checks, decisions)
	if hit {
		return fromCache, err
	}
	return fromStore, err
}

// allowLocally decides checks with the in-process fallback, which never
// fails; it reports false unless the mode has one.
func (b *backend) allowLocally(ctx context.Context, checks []limiter.Check, decisions []limiter.Decision) bool {
	if b.mode != redisWithLocal {
		return false
	}
	_ = b.local.Allow(ctx, checks, decisions)
	return true
}

// refund takes back admissions that src recorded and forgets the denials
// they may have caused: here, and on every instance when an admission had
// taken a client's last slot (only then can another instance have cached a
// denial because of it).
func (b *backend) refund(ctx context.Context, checks []limiter.Check, decisions []limiter.Decision, src source) error {
	var store limiter.Refunder = b.store
	if src == fromLocal {
		store = b.local
	}
	if err := store.Refund(ctx, checks, decisions); err != nil {
		return err
	}
	for i, c := range checks {
		b.cache.Forget(c.Zone, c.Key)
		lastSlot := decisions[i].Remaining == 0
		if lastSlot && src == fromStore && b.redis != nil {
			if err := b.conn.AnnounceFreed(ctx, b.redis.Key(c.Zone, c.Key)); err != nil {
				return err
			}
		}
	}
	return nil
}

// close releases this use of the pooled parts.
func (b *backend) close() error {
	var first error
	for _, release := range b.releases {
		if err := release(); err != nil && first == nil {
			first = err
		}
	}
	b.releases = nil
	return first
}
