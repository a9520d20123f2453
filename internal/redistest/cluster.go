package redistest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// clusterBusOffset is how far above its client port a cluster node listens
// for the cluster bus; Redis hard-codes it.
const clusterBusOffset = 10000

// Cluster is a Redis Cluster of masters only (no replicas), each node a
// redis-server process started by this package.
type Cluster struct {
	nodes []*Server

	mu    sync.Mutex
	admin map[string]*redis.Client // per-node clients for MasterOf and health checks
}

// CLIBinary returns the path of redis-cli, or an error that says how to get it;
// redis-cli --cluster create is what joins the nodes into a cluster.
func CLIBinary() (string, error) {
	path, err := exec.LookPath("redis-cli")
	if err != nil {
		return "", errors.New("redis-cli not found in PATH: install it (Debian/Ubuntu: apt-get install redis-server redis-tools redis-sentinel) or run 'make test', which does")
	}
	return path, nil
}

// StartCluster starts a cluster of the given number of masters and stops
// every node when tb's test ends, also when the test fails half-way.
func StartCluster(tb testing.TB, masters int) *Cluster {
	tb.Helper()
	c, err := NewCluster(masters)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(c.Close)
	return c
}

// NewCluster starts a cluster of the given number of masters and returns once
// every node reports cluster_state:ok and a cluster client can write to every
// master; Close stops it. For TestMain, where there is no testing.TB.
//
// Ports are only free "a moment ago", so a start that loses a port to another
// process is torn down and retried on fresh ports.
func NewCluster(masters int) (*Cluster, error) {
	if masters < 3 {
		// redis-cli --cluster create refuses fewer.
		return nil, fmt.Errorf("redistest: a cluster needs at least 3 masters, got %d", masters)
	}
	if _, err := Binary(); err != nil {
		return nil, err
	}
	cli, err := CLIBinary()
	if err != nil {
		return nil, err
	}
	var errs []error
	for attempt := 1; attempt <= 3; attempt++ {
		c, err := tryCluster(cli, masters)
		if err == nil {
			return c, nil
		}
		errs = append(errs, fmt.Errorf("attempt %d: %w", attempt, err))
	}
	return nil, fmt.Errorf("redistest: starting a %d-master cluster: %w", masters, errors.Join(errs...))
}

func tryCluster(cli string, masters int) (c *Cluster, err error) {
	ports, err := clusterPorts(masters)
	if err != nil {
		return nil, err
	}
	c = &Cluster{nodes: make([]*Server, masters), admin: map[string]*redis.Client{}}
	defer func() {
		if err != nil {
			c.Close()
		}
	}()

	for i, port := range ports {
		// A short node timeout so a stopped node is noticed within seconds.
		c.nodes[i], err = newServer(port, "redistest-cluster", "", nil, []string{
			"--cluster-enabled", "yes",
			"--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", "2000",
		})
		if err != nil {
			return c, err
		}
	}
	// Start the nodes in parallel: each start waits for its own PING.
	var wg sync.WaitGroup
	startErrs := make([]error, masters)
	for i, s := range c.nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			startErrs[i] = startOwned(s)
		}()
	}
	wg.Wait()
	if err := errors.Join(startErrs...); err != nil {
		return c, err
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	args := append([]string{"--cluster", "create"}, c.Addrs()...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	out, err := exec.CommandContext(ctx, cli, args...).CombinedOutput()
	if err != nil {
		return c, fmt.Errorf("redis-cli --cluster create: %w\n%s", err, out)
	}
	if err := c.WaitHealthy(15 * time.Second); err != nil {
		return c, err
	}
	return c, nil
}

// clusterPorts picks n distinct client ports whose bus ports (port+10000) are
// free too. It draws from below the kernel's ephemeral range so that neither
// port collides with outgoing connections or with FreePort's picks.
func clusterPorts(n int) ([]int, error) {
	lo, hi := 20000, 45000
	// With the usual range (32768-60999) that is 10000-22767, buses 20000-32767.
	if top := ephemeralLow() - clusterBusOffset - 1; top-10000 >= 2000 {
		lo, hi = 10000, top
	}
	var ports []int
	for tries := 0; len(ports) < n; tries++ {
		if tries > 1000 {
			return nil, fmt.Errorf("no free port pair (p, p+%d) in %d-%d", clusterBusOffset, lo, hi)
		}
		p := lo + rand.IntN(hi-lo+1)
		if slices.Contains(ports, p) || slices.Contains(ports, p+clusterBusOffset) ||
			slices.Contains(ports, p-clusterBusOffset) {
			continue
		}
		if portFree(p) && portFree(p+clusterBusOffset) {
			ports = append(ports, p)
		}
	}
	return ports, nil
}

// ephemeralLow is the lowest port the kernel hands out to outgoing
// connections and to listens on port 0 (32768 when it cannot be read).
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 32768
	}
	n, err := strconv.Atoi(f[0])
	if err != nil {
		return 32768
	}
	return n
}

// portFree reports whether 127.0.0.1:port can be listened on right now.
func portFree(port int) bool {
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		return false
	}
	l.Close()
	return true
}

// newServer prepares (does not start) a Server in its own temp dir.
func newServer(port int, dirPattern, bin string, pre, extra []string) (*Server, error) {
	dir, err := os.MkdirTemp("", dirPattern)
	if err != nil {
		return nil, err
	}
	return &Server{Port: port, dir: dir, bin: bin, pre: pre, extra: extra}, nil
}

// startOwned starts s and checks that the process answering on its port is
// the one just started: if another process took the port in the meantime,
// PING would succeed against a stranger.
func startOwned(s *Server) error {
	if err := s.start(); err != nil {
		return err
	}
	c := redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	info, err := c.Info(ctx, "server").Result()
	if err != nil {
		s.kill()
		return fmt.Errorf("INFO server on %s: %w", s.Addr(), err)
	}
	if pid := infoField(info, "process_id"); pid != strconv.Itoa(s.cmd.Process.Pid) {
		s.kill()
		return fmt.Errorf("port %d is answered by pid %s, not by the redis started (pid %d)", s.Port, pid, s.cmd.Process.Pid)
	}
	return nil
}

// infoField returns a field of an INFO reply ("" when absent).
func infoField(info, name string) string {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
			return v
		}
	}
	return ""
}

// Addrs are the host:port of every node, in start order.
func (c *Cluster) Addrs() []string {
	addrs := make([]string, 0, len(c.nodes))
	for _, s := range c.nodes {
		if s != nil {
			addrs = append(addrs, s.Addr())
		}
	}
	return addrs
}

// URL is the cluster's redis:// URL as redis.ParseClusterURL reads it: the
// first node in the host part, the others as addr parameters.
func (c *Cluster) URL() string {
	addrs := c.Addrs()
	var b strings.Builder
	b.WriteString("redis://" + addrs[0])
	for i, a := range addrs[1:] {
		if i == 0 {
			b.WriteString("?")
		} else {
			b.WriteString("&")
		}
		b.WriteString("addr=" + a)
	}
	return b.String()
}

// Client returns a cluster client seeded with every node, closed when tb's
// test ends.
func (c *Cluster) Client(tb testing.TB) *redis.ClusterClient {
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs()})
	tb.Cleanup(func() { cc.Close() })
	return cc
}

// Node returns the process behind addr (as in Addrs or MasterOf), so a test
// can Stop, Restart, Freeze or Thaw it; nil if addr is not a node. A
// restarted node keeps its nodes.conf and so rejoins with its slots, empty.
func (c *Cluster) Node(addr string) *Server {
	for _, s := range c.nodes {
		if s != nil && s.Addr() == addr {
			return s
		}
	}
	return nil
}

// MasterOf returns the address of the master that owns key's slot, as the
// servers see it (CLUSTER KEYSLOT + CLUSTER SLOTS), not as a client caches
// it. It asks the first node that answers and returns "" if none does.
func (c *Cluster) MasterOf(key string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, s := range c.nodes {
		a := c.adminClient(s.Addr())
		slot, err := a.ClusterKeySlot(ctx, key).Result()
		if err != nil {
			continue
		}
		slots, err := a.ClusterSlots(ctx).Result()
		if err != nil {
			continue
		}
		for _, r := range slots {
			if int64(r.Start) <= slot && slot <= int64(r.End) && len(r.Nodes) > 0 {
				return c.fixAddr(r.Nodes[0].Addr, s.Addr())
			}
		}
	}
	return ""
}

// ThroughReplyCutters puts a ReplyCutter in front of every node and has each
// node announce its cutter's port as its own, so that a cluster client,
// which connects to the addresses CLUSTER SLOTS reports whatever its seeds,
// reaches every node through its cutter. It returns the cutters by node
// address once every node reports every cutter. Afterwards WaitHealthy no
// longer applies: the nodes report addresses that Addrs does not hold.
func (c *Cluster) ThroughReplyCutters(tb testing.TB) map[string]*ReplyCutter {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cutters := make(map[string]*ReplyCutter)
	for _, s := range c.nodes {
		cutter := StartReplyCutter(tb, s.Addr())
		_, port, _ := net.SplitHostPort(cutter.Addr())
		a := c.adminClient(s.Addr())
		// The bus stays where it is: only clients go through the cutter.
		if err := a.ConfigSet(ctx, "cluster-announce-bus-port", strconv.Itoa(s.Port+clusterBusOffset)).Err(); err != nil {
			tb.Fatalf("%s: %v", s.Addr(), err)
		}
		if err := a.ConfigSet(ctx, "cluster-announce-port", port).Err(); err != nil {
			tb.Fatalf("%s: %v", s.Addr(), err)
		}
		cutters[s.Addr()] = cutter
	}
	for {
		reported := 0
		for _, s := range c.nodes {
			slots, err := c.adminClient(s.Addr()).ClusterSlots(ctx).Result()
			if err != nil {
				tb.Fatalf("CLUSTER SLOTS on %s: %v", s.Addr(), err)
			}
			for _, r := range slots {
				for _, cutter := range cutters {
					if len(r.Nodes) > 0 && c.fixAddr(r.Nodes[0].Addr, s.Addr()) == cutter.Addr() {
						reported++
					}
				}
			}
		}
		// Every node reports the slot ranges of every master at its cutter.
		if reported >= len(c.nodes)*len(c.nodes) {
			return cutters
		}
		select {
		case <-ctx.Done():
			tb.Fatalf("the nodes do not report their cutters after 10s: %d of %d", reported, len(c.nodes)*len(c.nodes))
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// fixAddr fills in the host a node leaves empty when it reports itself
// before it has learnt its own IP (":port").
func (c *Cluster) fixAddr(addr, asked string) string {
	if strings.HasPrefix(addr, ":") {
		host, _, _ := net.SplitHostPort(asked)
		return host + addr
	}
	return addr
}

func (c *Cluster) adminClient(addr string) *redis.Client {
	c.mu.Lock()
	defer c.mu.Unlock()
	if a, ok := c.admin[addr]; ok {
		return a
	}
	a := redis.NewClient(&redis.Options{
		Addr:        addr,
		MaxRetries:  -1,
		DialTimeout: 500 * time.Millisecond,
		ReadTimeout: 500 * time.Millisecond,
		PoolSize:    2,
	})
	c.admin[addr] = a
	return a
}

// WaitHealthy waits until every node says cluster_state:ok, every node
// agrees on which of the cluster's nodes serve all 16384 slots, and a fresh
// cluster client can SET and GET a key on every master. A test that stopped
// or froze a node can call it to wait for the cluster to be whole again.
func (c *Cluster) WaitHealthy(limit time.Duration) error {
	deadline := time.Now().Add(limit)
	var last error
	for {
		if last = c.checkNodes(); last == nil {
			if last = c.checkClient(); last == nil {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cluster %v not healthy after %s: %w", c.Addrs(), limit, last)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (c *Cluster) checkNodes() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	addrs := c.Addrs()
	for _, addr := range addrs {
		a := c.adminClient(addr)
		info, err := a.ClusterInfo(ctx).Result()
		if err != nil {
			return fmt.Errorf("CLUSTER INFO on %s: %w", addr, err)
		}
		if st := infoField(info, "cluster_state"); st != "ok" {
			return fmt.Errorf("%s: cluster_state:%s", addr, st)
		}
		slots, err := a.ClusterSlots(ctx).Result()
		if err != nil {
			return fmt.Errorf("CLUSTER SLOTS on %s: %w", addr, err)
		}
		covered := 0
		masters := map[string]bool{}
		for _, r := range slots {
			if len(r.Nodes) == 0 {
				continue
			}
			m := c.fixAddr(r.Nodes[0].Addr, addr)
			if !slices.Contains(addrs, m) {
				return fmt.Errorf("%s: slots %d-%d served by unknown node %q", addr, r.Start, r.End, m)
			}
			masters[m] = true
			covered += int(r.End - r.Start + 1)
		}
		if covered != 16384 || len(masters) != len(addrs) {
			return fmt.Errorf("%s: sees %d slots on %d masters, want 16384 on %d", addr, covered, len(masters), len(addrs))
		}
	}
	return nil
}

// checkClient writes through a new cluster client to one key per master, so
// a caller's own client will not start on a half-made cluster.
func (c *Cluster) checkClient() error {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs(), MaxRedirects: 3})
	defer cc.Close()
	want := len(c.Addrs())
	seen := map[string]bool{}
	for i := 0; len(seen) < want; i++ {
		if i > 10000 {
			return fmt.Errorf("cluster client routes keys to %d masters, want %d", len(seen), want)
		}
		key := fmt.Sprintf("redistest:ready:{%d}", i)
		m, err := cc.MasterForKey(ctx, key)
		if err != nil {
			return err
		}
		addr := m.Options().Addr
		if seen[addr] {
			continue
		}
		seen[addr] = true
		if err := cc.Set(ctx, key, addr, time.Minute).Err(); err != nil {
			return fmt.Errorf("SET %s: %w", key, err)
		}
		got, err := cc.Get(ctx, key).Result()
		if err != nil {
			return fmt.Errorf("GET %s: %w", key, err)
		}
		if got != addr {
			return fmt.Errorf("GET %s = %q, want %q", key, got, addr)
		}
		if err := cc.Del(ctx, key).Err(); err != nil {
			return fmt.Errorf("DEL %s: %w", key, err)
		}
	}
	return nil
}

// Close stops every node and removes their files. It is safe to call on a
// half-started cluster and more than once.
func (c *Cluster) Close() {
	c.mu.Lock()
	for _, a := range c.admin {
		a.Close()
	}
	c.admin = map[string]*redis.Client{}
	c.mu.Unlock()
	for _, s := range c.nodes {
		if s != nil {
			s.Close()
		}
	}
}
