package redistest

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// proxyClient returns a client of srv through a new fault proxy. It never
// retries, so that each fault shows in the call that meets it.
func proxyClient(t *testing.T) (*FaultProxy, *redis.Client) {
	t.Helper()
	srv := Start(t)
	p := StartFaultProxy(t, srv.Addr())
	c := redis.NewClient(&redis.Options{Addr: p.Addr(), MaxRetries: -1, PoolSize: 1, ContextTimeoutEnabled: true})
	t.Cleanup(func() { c.Close() })
	return p, c
}

// ping sends a PING with a deadline and returns its error and duration.
func ping(c *redis.Client, deadline time.Duration) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	start := time.Now()
	err := c.Ping(ctx).Err()
	return time.Since(start), err
}

// isTimeout reports whether err is a deadline or a network timeout.
func isTimeout(err error) bool {
	var te interface{ Timeout() bool }
	return errors.Is(err, context.DeadlineExceeded) || errors.As(err, &te) && te.Timeout()
}

func TestFaultProxyPassesThrough(t *testing.T) {
	p, c := proxyClient(t)
	if !strings.HasPrefix(p.Addr(), "127.0.0.1:") || p.URL() != "redis://"+p.Addr()+"/0" {
		t.Fatalf("addr %q, url %q: want a loopback address", p.Addr(), p.URL())
	}
	ctx := context.Background()
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if got, err := c.Get(ctx, "k").Result(); err != nil || got != "v" {
		t.Fatalf("GET through the proxy = %q, %v; want v", got, err)
	}
}

func TestFaultProxyLatency(t *testing.T) {
	p, c := proxyClient(t)
	if _, err := ping(c, time.Second); err != nil {
		t.Fatal(err)
	}
	f := p.Latency(t, Downstream, 150*time.Millisecond, 0)
	took, err := ping(c, 2*time.Second)
	if err != nil || took < 150*time.Millisecond {
		t.Fatalf("PING with 150ms latency: %v after %v, want success after at least 150ms", err, took)
	}
	if _, err := ping(c, 50*time.Millisecond); !isTimeout(err) {
		t.Fatalf("PING with a 50ms deadline and 150ms latency: err = %v, want the deadline", err)
	}
	if got := p.Faults(); len(got) != 1 || got[0] != f {
		t.Fatalf("faults = %q, want [%s]", got, f)
	}
	p.RemoveFault(t, f)
	if got := p.Faults(); len(got) != 0 {
		t.Fatalf("faults after removal = %q, want none", got)
	}
	// The connection that timed out was dropped; a new one is fast.
	took, err = ping(c, time.Second)
	if err != nil || took > 100*time.Millisecond {
		t.Fatalf("PING after removing the latency: %v after %v, want a quick answer", err, took)
	}
}

func TestFaultProxyLimitData(t *testing.T) {
	p, c := proxyClient(t)
	ctx := context.Background()
	if err := c.Set(ctx, "big", strings.Repeat("x", 1000), 0).Err(); err != nil {
		t.Fatal(err)
	}
	p.LimitData(t, Downstream, 100)
	err := c.Get(ctx, "big").Err()
	if err == nil {
		t.Fatal("GET of a 1000-byte value through a 100-byte limit succeeded")
	}
	t.Logf("cut reply: %v", err)
}

func TestFaultProxySlicer(t *testing.T) {
	p, c := proxyClient(t)
	ctx := context.Background()
	want := strings.Repeat("0123456789", 500)
	if err := c.Set(ctx, "big", want, 0).Err(); err != nil {
		t.Fatal(err)
	}
	p.Slicer(t, Downstream, 7, 5, 10*time.Microsecond)
	for range 3 {
		if got, err := c.Get(ctx, "big").Result(); err != nil || got != want {
			t.Fatalf("GET through the slicer: %d bytes, %v; want the %d bytes set", len(got), err, len(want))
		}
	}
}

func TestFaultProxyResetPeer(t *testing.T) {
	p, c := proxyClient(t)
	if _, err := ping(c, time.Second); err != nil {
		t.Fatal(err)
	}
	p.ResetPeer(t, Upstream, 0)
	_, err := ping(c, time.Second)
	if err == nil {
		t.Fatal("PING through reset_peer succeeded")
	}
	t.Logf("reset: %v", err)
}

func TestFaultProxyBandwidth(t *testing.T) {
	p, c := proxyClient(t)
	ctx := context.Background()
	if err := c.Set(ctx, "big", strings.Repeat("x", 50_000), 0).Err(); err != nil {
		t.Fatal(err)
	}
	p.Bandwidth(t, Downstream, 100) // 50 KB at 100 KB/s: about 0.5s
	start := time.Now()
	if err := c.Get(ctx, "big").Err(); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < 300*time.Millisecond {
		t.Fatalf("50 KB at 100 KB/s took %v, want about 0.5s", took)
	}
}

func TestFaultProxyTimeout(t *testing.T) {
	p, c := proxyClient(t)
	f := p.Timeout(t, Upstream, 0)
	if _, err := ping(c, 100*time.Millisecond); !isTimeout(err) {
		t.Fatalf("PING through a timeout fault: err = %v, want a timeout", err)
	}
	p.RemoveFault(t, f)
	if _, err := ping(c, time.Second); err != nil {
		t.Fatalf("PING after removing the timeout fault: %v", err)
	}
}

func TestFaultProxyDisable(t *testing.T) {
	p, c := proxyClient(t)
	if _, err := ping(c, time.Second); err != nil {
		t.Fatal(err)
	}
	p.Disable()
	_, err := ping(c, time.Second)
	var op *net.OpError
	if err == nil {
		t.Fatal("PING through a disabled proxy succeeded")
	}
	// The open connection is closed first; the redial is refused.
	_, err = ping(c, time.Second)
	if !errors.As(err, &op) || op.Op != "dial" {
		t.Fatalf("PING through a disabled proxy: err = %v, want a refused dial", err)
	}
	p.Enable(t)
	// A new client: the old one's pool, having failed to dial, waits a
	// second before it dials again.
	c = redis.NewClient(&redis.Options{Addr: p.Addr(), MaxRetries: -1})
	defer c.Close()
	if _, err := ping(c, time.Second); err != nil {
		t.Fatalf("PING after Enable: %v", err)
	}
}
