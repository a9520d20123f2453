package redisconn

import (
	"context"
	"strings"
	"testing"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/redistest"
)

// TestServersNamesWhoHoldsTheData: the same server is named the same until
// it restarts; a cluster is named by each of its primaries.
func TestServersNamesWhoHoldsTheData(t *testing.T) {
	servers := func(t *testing.T, topology, url string) string {
		t.Helper()
		conn, err := Open(topology, url)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		named, err := conn.Servers(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return named
	}
	srv := redistest.Start(t)
	first := servers(t, "", srv.URL())
	if len(first) != 40 {
		t.Fatalf("a server is named %q, want its 40-character run_id", first)
	}
	if again := servers(t, "", srv.URL()); again != first {
		t.Errorf("the same server is named %q, then %q", first, again)
	}
	srv.Restart(t)
	if restarted := servers(t, "", srv.URL()); restarted == first || restarted == "" {
		t.Errorf("a restarted server is named %q, as before it restarted (%q)", restarted, first)
	}

	cluster := redistest.StartCluster(t, 3)
	if named := servers(t, Cluster, cluster.URL()); strings.Count(named, ",") != 2 {
		t.Errorf("a cluster of 3 primaries is named %q, want 3 run_ids", named)
	}
}
