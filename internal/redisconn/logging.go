package redisconn

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
)

// go-redis writes its own lines ("redis: 2026/12/02 ... pool.go:770: redis:
// connection pool: failed to dial ...") to stderr through the standard log
// package, past Caddy's logger: not JSON, not in Caddy's log file, one per
// failed dial in an outage. The first Open routes them through Caddy's
// default logger, named goRedisLogger, each line at most once every
// goRedisLogInterval, with the count of the same line held back since
// ("suppressed"). Lines are told apart by their text, which names the
// Redis: an outage of one Redis does not hide another's.

// goRedisLogger names go-redis's lines in Caddy's log.
const goRedisLogger = "go-redis"

// goRedisLogInterval is the least time between two same lines: the
// breaker and the module's failure log already say an outage every second.
const goRedisLogInterval = 10 * time.Second

var routeGoRedisLog sync.Once

// goRedisLog is go-redis's logger (redis.SetLogger). It is process-wide,
// as go-redis's logger is.
type goRedisLog struct {
	mu sync.Mutex
	// lines holds, per line, when it was last written and how many times it
	// was held back since.
	lines map[string]*heldLines
}

type heldLines struct {
	last time.Time
	held int64
}

func (g *goRedisLog) Printf(_ context.Context, format string, v ...any) {
	msg := strings.TrimPrefix(fmt.Sprintf(format, v...), "redis: ")
	now := time.Now()
	g.mu.Lock()
	k := g.lines[msg]
	if k == nil {
		if len(g.lines) >= 1000 {
			// Bounds the map against lines that differ each time (a
			// count in the text): they are then throttled less, not kept.
			clear(g.lines)
		}
		k = &heldLines{}
		g.lines[msg] = k
	}
	if !k.last.IsZero() && now.Sub(k.last) < goRedisLogInterval {
		k.held++
		g.mu.Unlock()
		return
	}
	held := k.held
	k.last, k.held = now, 0
	g.mu.Unlock()

	logger := caddy.Log().Named(goRedisLogger)
	fields := []zap.Field{zap.Int64("suppressed", held)}
	// Sentinel lines say what go-redis found (a master, a replica); the
	// others, what failed.
	if strings.HasPrefix(msg, "sentinel: ") {
		logger.Info(msg, fields...)
		return
	}
	logger.Warn(msg, fields...)
}

// routeLog makes go-redis log through Caddy's logger; see goRedisLog.
func routeLog() {
	routeGoRedisLog.Do(func() {
		redis.SetLogger(&goRedisLog{lines: make(map[string]*heldLines)})
	})
}
