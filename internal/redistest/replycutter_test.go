package redistest

import (
	"context"
	"errors"
	"io"
	"testing"

	"github.com/redis/go-redis/v9"
)

// TestReplyCutter: through the proxy every command works until it is told to
// cut; then exactly every n-th script reply is cut, after the script ran,
// and other replies pass, in RESP2 and RESP3.
func TestReplyCutter(t *testing.T) {
	for _, protocol := range []int{2, 3} {
		srv := Start(t)
		p := StartReplyCutter(t, srv.Addr())
		c := redis.NewClient(&redis.Options{Addr: p.Addr(), Protocol: protocol, MaxRetries: -1})
		t.Cleanup(func() { c.Close() })
		ctx := context.Background()
		incr := redis.NewScript(`return redis.call("INCR", KEYS[1])`)

		// Loaded, so that each call is one EVALSHA, not also an EVAL.
		if err := incr.Load(ctx, c).Err(); err != nil {
			t.Fatal(err)
		}
		if err := c.HSet(ctx, "h", "a", "1", "b", "2").Err(); err != nil {
			t.Fatal(err)
		}
		if m, err := c.HGetAll(ctx, "h").Result(); err != nil || len(m) != 2 {
			t.Fatalf("RESP%d: HGETALL through the proxy: %v, %v", protocol, m, err)
		}
		p.CutEvery(3)
		for i := 1; i <= 9; i++ {
			err := incr.Run(ctx, c, []string{"n"}).Err()
			if lost := i%3 == 0; lost != errors.Is(err, io.EOF) {
				t.Errorf("RESP%d: script call %d: %v, want EOF %v", protocol, i, err, lost)
			}
			// Not a script: never cut.
			if err := c.Ping(ctx).Err(); err != nil {
				t.Fatalf("RESP%d: PING after script call %d: %v", protocol, i, err)
			}
		}
		if got, err := srv.Client(t).Get(ctx, "n").Int(); err != nil || got != 9 {
			t.Errorf("RESP%d: the script ran %d times (%v), want 9: cut replies are of scripts that ran", protocol, got, err)
		}
		if p.Cut() != 3 || p.Scripts() != 9 {
			t.Errorf("RESP%d: %d of %d script replies cut, want 3 of 9", protocol, p.Cut(), p.Scripts())
		}
	}
}
