package limiter

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// limit.lua's chunk returns the call that decides a batch; it is run two
// ways. As a Redis Functions library (Redis 7 and later), loaded once per
// server with FUNCTION LOAD: its chunk runs at the first FCALL, and the
// closures it makes serve every later call, where a script makes them all
// at every call (an empty call costs Redis a third of a script's: 3.0
// against 8.8 µs in INFO commandstats, redis-benchmark on Redis 7.0). As a
// script, loaded with SCRIPT LOAD and called with EVALSHA, where FUNCTION
// is missing (Redis 6) or refused (an ACL without it); EVAL only where
// SCRIPT LOAD fails.
//
// The library's name holds a hash of the script, so that instances of two
// versions of the module share one Redis during an upgrade, each calling
// its own.
var (
	libraryName = "srl_" + sourceHash(limitSource)
	// functionName decides a batch. It has no flags, so that a Redis out
	// of memory refuses it (see retry).
	functionName  = libraryName + "_decide"
	librarySource = "#!lua name=" + libraryName + "\n" +
		// Redis runs a library's chunk where only the registration
		// API exists: make, which reads struct, string and redis.call,
		// waits for the first call.
		"local decide = nil\n" +
		"local function make()\n" + limitSource + "\nend\n" +
		"redis.register_function('" + functionName + "', function(keys, args)\n" +
		"  if not decide then decide = make() end\n" +
		"  return decide(keys, args)\n" +
		"end)\n"
	// scriptSource is the script EVALSHA runs. The wrapper opens on the
	// source's first line, so Redis's line numbers are limit.lua's.
	scriptSource = "return (function() " + limitSource + "\nend)()(KEYS, ARGV)\n"
	limitScript  = redis.NewScript(scriptSource)
)

// sourceHash is a short hash of a script's source: 12 hex digits of its
// SHA-1.
func sourceHash(source string) string {
	sum := sha1.Sum([]byte(source))
	return hex.EncodeToString(sum[:6])
}

// processor runs a command: any go-redis client.
type processor interface {
	Process(ctx context.Context, cmd redis.Cmder) error
}

// loadLibrary loads the library on client's server, on every master of a
// cluster (a replica takes it from its master, a new master once a call
// there found it missing), replacing one of the same name (the same code).
func loadLibrary(ctx context.Context, client processor) error {
	if c, ok := client.(*redis.ClusterClient); ok {
		return c.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return loadLibrary(ctx, c) })
	}
	cmd := redis.NewCmd(ctx, "function", "load", "replace", librarySource)
	_ = client.Process(ctx, cmd)
	return cmd.Err()
}

// noFunction reports an error that says Redis lacks the library: it was
// never loaded on this server, or flushed (FUNCTION FLUSH; a restart without
// persistence).
func noFunction(err error) bool {
	return err != nil && strings.Contains(err.Error(), "Function not found")
}

// functionsRefused reports an error that says this Redis will not run
// FUNCTION LOAD: it has no such command (before Redis 7), the user's ACL
// does not allow it, a managed service turned it off. Script calls then go
// through EVALSHA for good. A refusal for now (out of memory, a replica, a
// server loading its data or busy with a script, a cluster without a
// quorum) and a network error are not: the load is tried again.
func functionsRefused(err error) bool {
	var reply redis.Error
	if !errors.As(err, &reply) {
		return false
	}
	for _, now := range []string{"OOM ", "READONLY ", "LOADING ", "BUSY ", "MASTERDOWN ", "CLUSTERDOWN ", "TRYAGAIN ", "MOVED ", "ASK "} {
		if strings.HasPrefix(reply.Error(), now) {
			return false
		}
	}
	return true
}

// loadEvery bounds how often a batcher tries to load the library: at its
// start, then while its calls go as scripts (Redis was away or full, or
// lost the library).
const loadEvery = 5 * time.Second

// library is a batcher's view of the library on its Redis.
type library struct {
	// loaded says that calls go through it; refused that this Redis will
	// not run FUNCTION, so that they never will.
	loaded, refused atomic.Bool
	// tried is when a load was last started (Unix ns).
	tried atomic.Int64
}

// due reports whether a load is to start now, and takes note of it: not
// when the library is loaded or refused, nor within loadEvery of the last.
func (l *library) due() bool {
	if l.loaded.Load() || l.refused.Load() {
		return false
	}
	now, last := time.Now().UnixNano(), l.tried.Load()
	return (last == 0 || now-last >= int64(loadEvery)) && l.tried.CompareAndSwap(last, now)
}

// load loads the library and takes note of the outcome.
func (l *library) load(ctx context.Context, client processor) {
	l.took(loadLibrary(ctx, client))
}

// took takes note of a load's outcome, err.
func (l *library) took(err error) {
	switch {
	case err == nil:
		l.loaded.Store(true)
	case functionsRefused(err):
		l.refused.Store(true)
	}
}

// OutOfMemory reports whether err is Redis refusing a command for lack of
// memory: maxmemory reached with maxmemory-policy noeviction (or nothing
// left to evict).
func OutOfMemory(err error) bool {
	var reply redis.Error
	return errors.As(err, &reply) && strings.HasPrefix(reply.Error(), "OOM ")
}
