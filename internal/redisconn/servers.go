package redisconn

import (
	"context"
	"slices"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
)

// Servers names the servers that hold the connection's data: the run_id of
// each primary (INFO server), sorted and joined. A failover or a restart
// changes it (a restarted server takes a new run_id), so a caller that
// compares it before and after an outage tells a Redis that came back as it
// was from one that may have lost writes. A server that hides its run_id
// (some managed services do) is named by nothing, and the result is "":
// its identity is unknown.
func (c *Conn) Servers(ctx context.Context) (string, error) {
	var ids []string
	if cluster, ok := c.s.client.(*redis.ClusterClient); ok {
		var mu sync.Mutex
		err := cluster.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error {
			id, err := runID(ctx, node)
			mu.Lock()
			ids = append(ids, id)
			mu.Unlock()
			return err
		})
		if err != nil {
			return "", err
		}
	} else {
		id, err := runID(ctx, c.s.client)
		if err != nil {
			return "", err
		}
		ids = append(ids, id)
	}
	if slices.Contains(ids, "") {
		return "", nil
	}
	slices.Sort(ids)
	return strings.Join(ids, ","), nil
}

// runID reads one server's run_id; "" if it does not tell.
func runID(ctx context.Context, c redis.Cmdable) (string, error) {
	info, err := c.Info(ctx, "server").Result()
	if err != nil {
		return "", err
	}
	id, _ := infoValue(info, "run_id")
	return id, nil
}
