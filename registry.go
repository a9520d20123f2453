package slidingratelimit

import (
	"slices"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/redisconn"
	"github.com/slidingratelimit/caddy-sliding-ratelimit/limiter"
)

// handlerRegistry holds every provisioned Handler of the process, so that
// the admin API can find a zone by name. Several handlers may have a zone of
// the same name: one per site, and the old and the new config during a
// reload.
var handlerRegistry registry

// registry is a list of provisioned handlers, safe for concurrent use.
type registry struct {
	mu sync.RWMutex
	// regs is in order of registration, oldest first.
	regs []*registration
}

// registration is one provisioned handler and the stores that hold its
// clients' state.
type registration struct {
	h      *Handler
	stores []storeRef
	// conn carries resets between instances, and listener applies them
	// to h; both nil without Redis.
	conn     *redisconn.Conn
	listener *resetListener
}

// storeRef is one store of a handler: the primary one (Redis or in-process)
// and, with fail_mode local, the in-process fallback.
type storeRef struct {
	// id identifies the state, so that a reset touches each store once
	// however many handlers share it: the *limiter.MemoryStore, or a
	// redisStoreID.
	id    any
	store limiter.Inspector
	// redis is set for a Redis store: it names the keys announced to other
	// instances.
	redis *limiter.RedisStore
}

// redisStoreID identifies the state of a Redis store: handlers with the same
// connection and key prefix read and write the same keys.
type redisStoreID struct {
	client redis.UniversalClient
	prefix string
}

// stateID identifies the state that the backend's store keeps, with key
// prefix prefix (see storeRef.id): handlers whose stores have the same one
// share the state of zones of the same identity.
func (b *backend) stateID(prefix string) any {
	if b.redis != nil {
		return redisStoreID{b.conn.Client(), prefix}
	}
	return b.store
}

// register adds the provisioned handler to the registry and, with Redis,
// subscribes it to resets made on other instances through its connection.
// Cleanup calls unregister.
func (h *Handler) register() {
	b := h.backend
	reg := &registration{h: h}
	if b.redis != nil {
		reg.stores = append(reg.stores, storeRef{id: b.stateID(h.KeyPrefix), store: b.redis, redis: b.redis})
		reg.conn = b.conn
		reg.listener = &resetListener{h: h, store: b.redis, keyStart: h.KeyPrefix + "{"}
	} else {
		reg.stores = append(reg.stores, storeRef{id: b.stateID(h.KeyPrefix), store: b.store})
	}
	if b.local != nil {
		reg.stores = append(reg.stores, storeRef{id: b.local, store: b.local})
	}
	handlerRegistry.add(reg)
	if reg.conn != nil {
		reg.conn.Listen(reg.listener)
	}
}

// unregister undoes register; it is safe to call more than once.
func (h *Handler) unregister() {
	if reg := handlerRegistry.remove(h); reg != nil && reg.conn != nil {
		reg.conn.Unlisten(reg.listener)
	}
}

func (r *registry) add(reg *registration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.regs = append(r.regs, reg)
}

// remove drops h from the registry and returns its registration, or nil if
// it was not registered. It does not unsubscribe h from resets.
func (r *registry) remove(h *Handler) *registration {
	r.mu.Lock()
	defer r.mu.Unlock()
	i := slices.IndexFunc(r.regs, func(reg *registration) bool { return reg.h == h })
	if i < 0 {
		return nil
	}
	reg := r.regs[i]
	r.regs = slices.Delete(r.regs, i, i+1)
	return reg
}

// handlers returns the provisioned handlers, newest first.
func (r *registry) handlers() []*Handler {
	r.mu.RLock()
	defer r.mu.RUnlock()
	handlers := make([]*Handler, 0, len(r.regs))
	for i := len(r.regs) - 1; i >= 0; i-- {
		handlers = append(handlers, r.regs[i].h)
	}
	return handlers
}

// withZone returns the registrations of the handlers that have a zone of
// that name or identity, newest first, with the zone of each.
func (r *registry) withZone(name string) ([]*registration, []*Zone) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	var regs []*registration
	var zones []*Zone
	for i := len(r.regs) - 1; i >= 0; i-- {
		for _, z := range r.regs[i].h.zones {
			if z.Name == name || z.identity == name {
				regs = append(regs, r.regs[i])
				zones = append(zones, z)
			}
		}
	}
	return regs, zones
}

// zoneByIdentity returns the handler's zone of that identity, or nil.
func (h *Handler) zoneByIdentity(identity string) *Zone {
	for _, z := range h.zones {
		if z.identity == identity {
			return z
		}
	}
	return nil
}
