package slidingratelimit

import (
	"slices"
	"sync"
)

// registry is a list of provisioned values, safe for concurrent use. It
// holds the handlers (see handlers) and nothing of theirs: what the admin API
// needs of a handler, it asks the handler and its backend.
type registry[T comparable] struct {
	mu sync.RWMutex
	// items is in order of registration, oldest first.
	items []T
}

func (r *registry[T]) add(v T) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.items = append(r.items, v)
}

// remove drops v and reports whether it was there; it is safe to call more
// than once.
func (r *registry[T]) remove(v T) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	i := slices.Index(r.items, v)
	if i < 0 {
		return false
	}
	r.items = slices.Delete(r.items, i, i+1)
	return true
}

// newestFirst returns the values, the newest first.
func (r *registry[T]) newestFirst() []T {
	r.mu.RLock()
	defer r.mu.RUnlock()
	out := slices.Clone(r.items)
	slices.Reverse(out)
	return out
}
