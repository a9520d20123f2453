package main

import (
	"context"
	"os"
	"testing"

	"github.com/redis/go-redis/v9"
)

// TestModesAdmitAsMeant runs every mode of every scenario, shrunk, against
// the script: the packing stays in step with limit.lua, the rings are filled
// so that every decision is admitted (measure fails otherwise), and the
// readings are taken.
func TestModesAdmitAsMeant(t *testing.T) {
	client, srl := start(t)
	ctx := context.Background()
	for _, sc := range scenarios {
		sc.clients = 40
		for _, mode := range []string{"srl", "floor", "redis_rate"} {
			c, err := measure(ctx, client, srl, sc, mode)
			if err != nil {
				t.Fatalf("%s %s: %v", sc.name, mode, err)
			}
			if c.cpu <= 0 || c.script <= 0 {
				t.Errorf("%s %s: cost %+v, want both readings above 0", sc.name, mode, c)
			}
		}
	}
}

// TestAdmittedCountsDenials: a client over its limit is counted as denied,
// so measure's check that every decision was admitted can fail.
func TestAdmittedCountsDenials(t *testing.T) {
	client, srl := start(t)
	ctx := context.Background()
	var args []byte
	for range 3 {
		args = appendAllow(args, 2, 1)
	}
	key := clientKey("srl", 0)
	reply, err := srl.Run(ctx, client, []string{key, key, key}, args).Text()
	if err != nil {
		t.Fatal(err)
	}
	if got := admitted(reply); got != 2 {
		t.Errorf("3 requests at max 2: %d admitted, want 2", got)
	}
}

func start(t *testing.T) (*redis.Client, *redis.Script) {
	t.Helper()
	src, err := os.ReadFile("../../../limiter/limit.lua")
	if err != nil {
		t.Fatal(err)
	}
	addr, stop, err := startRedis()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	client := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { client.Close() })
	return client, asScript(src)
}
