package slidingratelimit

import (
	"context"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/redistest"
)

// TestNewConnectionHandshakeIsHelloAlone: a new connection sends HELLO and
// nothing more before its first command, so that a Redis far away still
// gets the first decision within the timeout. go-redis's default adds a
// round trip for CLIENT SETINFO and one for maintenance notifications; Redis
// before 7.2 answers both with an error, later ones count them.
func TestNewConnectionHandshakeIsHelloAlone(t *testing.T) {
	t.Run(topologyStandalone, func(t *testing.T) {
		srv := redistest.Start(t)
		checkHelloAlone(t, topologyStandalone, srv.URL(), srv)
	})
	t.Run(topologyCluster, func(t *testing.T) {
		cluster := redistest.StartCluster(t, 3)
		var nodes []*redistest.Server
		for _, addr := range cluster.Addrs() {
			nodes = append(nodes, cluster.Node(addr))
		}
		checkHelloAlone(t, topologyCluster, cluster.URL(), nodes...)
	})
}

// checkHelloAlone connects to url with the module's client options, PINGs
// every node, and reads what the nodes counted.
func checkHelloAlone(t *testing.T, topology, url string, nodes ...*redistest.Server) {
	t.Helper()
	ctx := context.Background()
	admins := make([]*redis.Client, len(nodes))
	for i, node := range nodes {
		admins[i] = node.Client(t)
		if err := admins[i].ConfigResetStat(ctx).Err(); err != nil {
			t.Fatal(err)
		}
	}
	client, err := newRedisClient(topology, url)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	ping := func(ctx context.Context, c *redis.Client) error { return c.Ping(ctx).Err() }
	if cluster, ok := client.(*redis.ClusterClient); ok {
		err = cluster.ForEachShard(ctx, ping)
	} else {
		err = ping(ctx, client.(*redis.Client))
	}
	if err != nil {
		t.Fatal(err)
	}
	for i, node := range nodes {
		info, err := admins[i].Info(ctx, "commandstats", "errorstats").Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(info, "\n") {
			line = strings.TrimSpace(line)
			if strings.HasPrefix(line, "errorstat_") || strings.HasPrefix(line, "cmdstat_client|") {
				t.Errorf("%s: the handshake sent more than HELLO: %s", node.Addr(), line)
			}
		}
		if !strings.Contains(info, "cmdstat_hello:") || !strings.Contains(info, "cmdstat_ping:") {
			t.Errorf("%s: no HELLO and PING counted:\n%s", node.Addr(), info)
		}
	}
}
