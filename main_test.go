package slidingratelimit

import (
	"os"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/redistest"
)

// sharedRedis is a redis-server for the tests of this binary, started by the
// first test that asks for it: the Caddyfile, rule and key-builder tests run
// without one. Tests that stop or restart Redis start their own.
var sharedRedis lazyRedis

type lazyRedis struct {
	once sync.Once
	srv  *redistest.Server
}

func (l *lazyRedis) server() *redistest.Server {
	l.once.Do(func() {
		srv, err := redistest.New()
		if err != nil {
			panic("starting the shared redis-server: " + err.Error())
		}
		l.srv = srv
	})
	return l.srv
}

func (l *lazyRedis) URL() string                        { return l.server().URL() }
func (l *lazyRedis) Addr() string                       { return l.server().Addr() }
func (l *lazyRedis) Client(tb testing.TB) *redis.Client { return l.server().Client(tb) }

func TestMain(m *testing.M) {
	code := m.Run()
	if sharedRedis.srv != nil {
		sharedRedis.srv.Close()
	}
	os.Exit(code)
}
