package slidingratelimit

import (
	"context"
	"strings"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/redisconn"
	"github.com/slidingratelimit/caddy-sliding-ratelimit/limiter"
)

// resetListener applies announced resets to one handler.
type resetListener struct {
	h     *Handler
	store *limiter.RedisStore
	// keyStart is how the handler's Redis keys start: the key prefix and '{'.
	keyStart string
}

// Announced drops key from the handler's deny cache, and for a reset from its
// in-process fallback store too, if key is one of the handler's Redis keys.
func (l *resetListener) Announced(key string, what redisconn.Announcement) {
	reset := what == redisconn.Reset
	rest, ok := strings.CutPrefix(key, l.keyStart)
	if !ok {
		// Another key prefix: another handler's keys. Prefixes hold no
		// '{', so no prefix is a proper prefix of another's key start.
		return
	}
	// Client keys never hold '}' (limiter.BoundKey hashes such keys), so
	// the first "}:" ends the client key.
	client, zone, ok := strings.Cut(rest, "}:")
	if ok && l.h.zoneByIdentity(zone) == nil {
		return
	}
	if !ok || l.store.Key(zone, client) != key {
		// A key of this prefix in a layout this version does not know,
		// from another version during an upgrade: forgetting everything is
		// exact, forgetting nothing may not be.
		l.h.backend.cache.Clear()
		return
	}
	l.h.backend.cache.Forget(zone, client)
	if local := l.h.backend.local; local != nil && reset {
		// The in-process store never fails.
		_ = local.Reset(context.Background(), zone, client)
	}
}

// Subscribed drops the handler's whole deny cache: announcements may have
// been missed.
func (l *resetListener) Subscribed() {
	l.h.backend.cache.Clear()
}
