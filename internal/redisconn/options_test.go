package redisconn

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
	t.Run(Standalone, func(t *testing.T) {
		srv := redistest.Start(t)
		checkHelloAlone(t, Standalone, srv.URL(), srv)
	})
	t.Run(Cluster, func(t *testing.T) {
		cluster := redistest.StartCluster(t, 3)
		var nodes []*redistest.Server
		for _, addr := range cluster.Addrs() {
			nodes = append(nodes, cluster.Node(addr))
		}
		checkHelloAlone(t, Cluster, cluster.URL(), nodes...)
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
	client := storesClient(t, topology, url)
	ping := func(ctx context.Context, c *redis.Client) error { return c.Ping(ctx).Err() }
	var err error
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

// TestClientOptions: every topology's client fails fast, never retries a
// command (a script call whose reply was lost may have recorded admissions),
// keeps a pool too large for go-redis's failed-dial count to stall recovery,
// and skips the handshake's extra round trips; what the URL sets itself is
// kept, and its max_retries applies to a client of its own that only
// announces resets.
func TestClientOptions(t *testing.T) {
	type options struct{ poolSize, maxRetries, dialerRetries int }
	// go-redis reads a MaxRetries of -1 as no retries; a single server's
	// client then keeps 0, a cluster's -1.
	const noRetries = -1
	retries := func(n int) int {
		if n <= 0 {
			return noRetries
		}
		return n
	}
	read := func(c redis.UniversalClient) (options, bool) {
		switch c := c.(type) {
		case *redis.ClusterClient:
			o := c.Options()
			return options{o.PoolSize, retries(o.MaxRetries), o.DialerRetries}, o.DisableIdentity
		case *redis.Client:
			o := c.Options()
			return options{o.PoolSize, retries(o.MaxRetries), o.DialerRetries}, o.DisableIdentity
		}
		t.Fatalf("client of type %T", c)
		return options{}, false
	}
	for _, tc := range []struct{ topology, url string }{
		{Standalone, "redis://127.0.0.1:6379/0"},
		{Cluster, "redis://127.0.0.1:7000?addr=127.0.0.1:7001"},
		{Sentinel, "redis://127.0.0.1:26379?master_name=mymaster"},
	} {
		t.Run(tc.topology, func(t *testing.T) {
			for _, c := range []struct {
				query           string
				want, announcer options
			}{
				{"", options{outageProofPoolSize, noRetries, 1}, options{}},
				{"pool_size=7&max_retries=2", options{7, noRetries, 1}, options{7, 2, 1}},
			} {
				url := tc.url
				if c.query != "" {
					sep := "?"
					if strings.Contains(url, "?") {
						sep = "&"
					}
					url += sep + c.query
				}
				client, announcer, err := newClients(tc.topology, url)
				if err != nil {
					t.Fatal(err)
				}
				got, noIdentity := read(client)
				client.Close()
				if got != c.want || !noIdentity {
					t.Errorf("%q: %+v, CLIENT SETINFO skipped %v; want %+v, skipped", c.query, got, noIdentity, c.want)
				}
				if announcer == client {
					if c.announcer != (options{}) {
						t.Errorf("%q: announcements share the client that never retries, want one that retries", c.query)
					}
					continue
				}
				got, _ = read(announcer)
				announcer.Close()
				if got != c.announcer {
					t.Errorf("%q, the announcer: %+v, want %+v", c.query, got, c.announcer)
				}
			}
		})
	}
}

func TestRedisURLErrorsHideThePassword(t *testing.T) {
	for _, topology := range []string{Standalone, Cluster, Sentinel} {
		for _, raw := range []string{
			"redis://user:s3cret@[::1",
			"redis://user:s3cret@host:6379/notadb",
			"http://user:s3cret@host:6379",
			"redis://user:s3cret@host:6379?pool_size=many",
		} {
			err := CheckURL(topology, raw)
			if err == nil {
				if topology == Standalone {
					t.Errorf("%s %s: parsed, want an error", topology, raw)
				}
				continue
			}
			if strings.Contains(err.Error(), "s3cret") {
				t.Errorf("%s: error quotes the password: %v", topology, err)
			}
		}
	}
}

// TestRedisURLWithoutScheme: host:port alone, the commonest slip, is told to
// need redis:// (or rediss://), not what net/url makes of it ("first path
// segment in URL cannot contain colon"); only a bare address is shown back.
func TestRedisURLWithoutScheme(t *testing.T) {
	for _, topology := range []string{"", Standalone, Cluster, Sentinel} {
		for _, c := range []struct{ raw, want string }{
			{"127.0.0.5:16379", "it has no scheme; a Redis URL starts with redis://, or rediss:// for TLS: redis://127.0.0.5:16379"},
			{"redis.internal:6379", "it has no scheme; a Redis URL starts with redis://, or rediss:// for TLS: redis://redis.internal:6379"},
			{"[::1]:6379", "redis://[::1]:6379"},
			{"user:s3cret@host:6379", "it has no scheme; a Redis URL starts with redis://, or rediss:// for TLS"},
		} {
			err := CheckURL(topology, c.raw)
			if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "s3cret") || strings.Contains(err.Error(), "colon") {
				t.Errorf("%q %s: %v, want an error with %q (and no password)", topology, c.raw, err, c.want)
			}
		}
	}
}
