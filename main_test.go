package slidingratelimit

import (
	"fmt"
	"os"
	"testing"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/redistest"
)

// sharedRedis is a redis-server started for this test binary. Tests that stop
// or restart Redis start their own.
var sharedRedis *redistest.Server

func TestMain(m *testing.M) {
	srv, err := redistest.New()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	sharedRedis = srv
	code := m.Run()
	srv.Close()
	os.Exit(code)
}
