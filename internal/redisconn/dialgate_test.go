package redisconn

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/redistest"
)

// dialCounter is a go-redis hook that counts the dials of a client's pools.
type dialCounter struct{ dials atomic.Int64 }

func (h *dialCounter) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		h.dials.Add(1)
		return next(ctx, network, addr)
	}
}
func (*dialCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (*dialCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// newClients makes the clients of a connection to topology and url, as
// Open would, outside the pool.
func newClients(topology, url string) (client, announcer redis.UniversalClient, err error) {
	o, err := parse(topology, url)
	if err != nil {
		return nil, nil, err
	}
	client, announcer = o.clients()
	return client, announcer, nil
}

// storesClient returns the client that the stores of a topology and URL
// use, closed when the test ends.
func storesClient(t *testing.T, topology, url string) redis.UniversalClient {
	t.Helper()
	client, announcer, err := newClients(topology, url)
	if err != nil {
		t.Fatal(err)
	}
	if announcer != client {
		announcer.Close()
	}
	t.Cleanup(func() { client.Close() })
	return client
}

// TestDialGateSparesThePool: while the server refuses connections, the
// client's pool dials once, not once a command, and the first command after
// the server is back succeeds.
func TestDialGateSparesThePool(t *testing.T) {
	srv := redistest.Start(t)
	client := storesClient(t, Standalone, srv.URL())
	counter := new(dialCounter)
	client.AddHook(counter)
	ctx := context.Background()
	if err := client.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}

	srv.Stop()
	before := counter.dials.Load()
	for i := range 20 {
		if err := client.Ping(ctx).Err(); err == nil {
			t.Fatalf("PING %d with the server stopped: no error", i)
		}
	}
	if dials := counter.dials.Load() - before; dials != 1 {
		t.Errorf("the pool dialed %d times for 20 commands while the server refused, want once", dials)
	}
	srv.Restart(t)
	if err := client.Ping(ctx).Err(); err != nil {
		t.Errorf("first PING after the restart: %v", err)
	}
}

// TestDialGateOnEveryClusterNode: on a cluster each node's client has a gate
// of its own, for its own address; a sentinel-managed client has none (see
// dialGate).
func TestDialGateOnEveryClusterNode(t *testing.T) {
	cluster := redistest.StartCluster(t, 3)
	client := storesClient(t, Cluster, cluster.URL())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var nodes atomic.Int64 // ForEachShard calls for all nodes at once
	err := client.(*redis.ClusterClient).ForEachShard(ctx, func(ctx context.Context, node *redis.Client) error {
		nodes.Add(1)
		opts := node.Options()
		if g, ok := opts.Limiter.(*dialGate); !ok || g.addr != opts.Addr {
			t.Errorf("node %s: limiter %#v, want a dial gate for its address", opts.Addr, opts.Limiter)
		}
		return nil
	})
	if err != nil || nodes.Load() != 3 {
		t.Fatalf("%d nodes, %v", nodes.Load(), err)
	}
	sentinel := storesClient(t, Sentinel, "redis://127.0.0.1:26379?master_name=mymaster")
	if l := sentinel.(*redis.Client).Options().Limiter; l != nil {
		t.Errorf("sentinel-managed client: limiter %#v, want none", l)
	}
}
