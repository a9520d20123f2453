package redistest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// sentinelMaster is the name the sentinel monitors the primary under.
const sentinelMaster = "mymaster"

// Sentinel is a primary, one replica and one sentinel monitoring them, each a
// process started by this package. A single sentinel with quorum 1 is enough
// to fail over on request, which is what tests need.
type Sentinel struct {
	primary, replica *Server
	sentinel         *Server
	admin            *redis.SentinelClient
}

// SentinelBinary returns the program to run a sentinel with and the
// arguments that go before its config file: redis-sentinel, or redis-server
// --sentinel where only that is installed.
func SentinelBinary() (string, []string, error) {
	if path, err := exec.LookPath("redis-sentinel"); err == nil {
		return path, nil, nil
	}
	if path, err := exec.LookPath("redis-server"); err == nil {
		return path, []string{"--sentinel"}, nil
	}
	return "", nil, errors.New("redis-sentinel not found in PATH: install it (Debian/Ubuntu: apt-get install redis-server redis-tools redis-sentinel) or run 'make test', which does")
}

// StartSentinel starts a primary, a replica and a sentinel, and stops all
// three when tb's test ends, also when the test fails half-way.
func StartSentinel(tb testing.TB) *Sentinel {
	tb.Helper()
	s, err := NewSentinel()
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(s.Close)
	return s
}

// NewSentinel starts a primary, a replica and a sentinel and returns once
// the replica is in sync and the sentinel knows both; Close stops them. For
// TestMain, where there is no testing.TB. A start that loses a port to
// another process is torn down and retried on fresh ports.
func NewSentinel() (*Sentinel, error) {
	if _, err := Binary(); err != nil {
		return nil, err
	}
	if _, _, err := SentinelBinary(); err != nil {
		return nil, err
	}
	var errs []error
	for attempt := 1; attempt <= 3; attempt++ {
		s, err := trySentinel()
		if err == nil {
			return s, nil
		}
		errs = append(errs, fmt.Errorf("attempt %d: %w", attempt, err))
	}
	return nil, fmt.Errorf("redistest: starting a sentinel setup: %w", errors.Join(errs...))
}

func trySentinel() (st *Sentinel, err error) {
	st = &Sentinel{}
	defer func() {
		if err != nil {
			st.Close()
		}
	}()

	// Without a zero diskless-sync delay every full sync, the first one and
	// the one after each failover, waits 5s for more replicas to join. The
	// replication backlog counts in used_memory: Redis's default of 1 MB
	// on every server (Valkey 8 keeps 10), so that a test that fills a
	// primary to its maxmemory leaves the same margin on each.
	fast := []string{"--repl-diskless-sync-delay", "0", "--repl-backlog-size", "1mb"}
	if st.primary, err = newServerOnFreePort("redistest-primary", "", nil, fast); err != nil {
		return st, err
	}
	if err = startOwned(st.primary); err != nil {
		return st, err
	}
	// The replica keeps its --replicaof across Restart; after a failover
	// the sentinel reconfigures whatever comes back.
	if st.replica, err = newServerOnFreePort("redistest-replica", "", nil,
		append(fast, "--replicaof", "127.0.0.1", strconv.Itoa(st.primary.Port))); err != nil {
		return st, err
	}
	if err = startOwned(st.replica); err != nil {
		return st, err
	}
	if err = waitReplicaSynced(st.replica.Addr(), 10*time.Second); err != nil {
		return st, err
	}

	// Started after the replica is in sync: the sentinel's first INFO to the
	// primary then lists the replica, instead of its next one 10s later.
	bin, pre, err := SentinelBinary()
	if err != nil {
		return st, err
	}
	if st.sentinel, err = newServerOnFreePort("redistest-sentinel", bin, nil, nil); err != nil {
		return st, err
	}
	conf := filepath.Join(st.sentinel.dir, "sentinel.conf")
	if err = os.WriteFile(conf, []byte(sentinelConf(st.sentinel.Port, st.primary.Port)), 0o644); err != nil {
		return st, err
	}
	// The config file must be the first argument; the sentinel rewrites it.
	st.sentinel.pre = append([]string{conf}, pre...)
	if err = startOwned(st.sentinel); err != nil {
		return st, err
	}
	st.admin = redis.NewSentinelClient(&redis.Options{
		Addr:        st.sentinel.Addr(),
		MaxRetries:  -1,
		DialTimeout: time.Second,
		ReadTimeout: 2 * time.Second,
		PoolSize:    2,
	})
	if err = st.waitGoodReplica(st.primary.Addr(), 10*time.Second); err != nil {
		return st, err
	}
	return st, nil
}

// sentinelConf is a sentinel config with short timeouts, so a failover takes
// seconds, not the default minutes.
func sentinelConf(port, primaryPort int) string {
	return fmt.Sprintf(`port %d
bind 127.0.0.1
sentinel monitor %s 127.0.0.1 %d 1
sentinel down-after-milliseconds %[2]s 1000
sentinel failover-timeout %[2]s 5000
sentinel parallel-syncs %[2]s 1
`, port, sentinelMaster, primaryPort)
}

// newServerOnFreePort prepares (does not start) a Server on a free port.
func newServerOnFreePort(dirPattern, bin string, pre, extra []string) (*Server, error) {
	port, err := FreePort()
	if err != nil {
		return nil, err
	}
	return newServer(port, dirPattern, bin, pre, extra)
}

// waitReplicaSynced waits until the replica at addr has its link to the
// primary up, i.e. the initial sync is done.
func waitReplicaSynced(addr string, limit time.Duration) error {
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer c.Close()
	deadline := time.Now().Add(limit)
	var last string
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		info, err := c.Info(ctx, "replication").Result()
		cancel()
		if err == nil {
			if last = infoField(info, "master_link_status"); last == "up" {
				return nil
			}
		} else {
			last = err.Error()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("replica %s not in sync after %s: master_link_status %q", addr, limit, last)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitGoodReplica waits until the sentinel sees master at the given address
// and a replica it would promote: flags exactly "slave" (not down or
// disconnected) and its link to the master ok. Without one, SENTINEL
// FAILOVER answers NOGOODSLAVE.
func (st *Sentinel) waitGoodReplica(master string, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	var last error
	for {
		if last = st.goodReplica(master); last == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("sentinel %s: %w (after %s)", st.sentinel.Addr(), last, limit)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (st *Sentinel) goodReplica(master string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	addr, err := st.admin.GetMasterAddrByName(ctx, sentinelMaster).Result()
	if err != nil {
		return fmt.Errorf("SENTINEL GET-MASTER-ADDR-BY-NAME: %w", err)
	}
	if len(addr) != 2 {
		return fmt.Errorf("SENTINEL GET-MASTER-ADDR-BY-NAME: %v", addr)
	}
	if got := net.JoinHostPort(addr[0], addr[1]); got != master {
		return fmt.Errorf("sentinel says master is %s, want %s", got, master)
	}
	replicas, err := st.admin.Replicas(ctx, sentinelMaster).Result()
	if err != nil {
		return fmt.Errorf("SENTINEL REPLICAS: %w", err)
	}
	var seen []string
	for _, f := range replicas {
		seen = append(seen, fmt.Sprintf("%s:%s flags=%s link=%s", f["ip"], f["port"], f["flags"], f["master-link-status"]))
		if f["flags"] == "slave" && f["master-link-status"] == "ok" {
			return nil
		}
	}
	return fmt.Errorf("no replica of %s ready to promote; sentinel sees %v", master, seen)
}

// URL is the sentinel's redis:// URL as redis.ParseFailoverURL reads it.
func (st *Sentinel) URL() string {
	return "redis://" + st.sentinel.Addr() + "?master_name=" + sentinelMaster
}

// MasterName is the name the sentinel monitors the primary under.
func (st *Sentinel) MasterName() string { return sentinelMaster }

// SentinelAddr is host:port of the sentinel process.
func (st *Sentinel) SentinelAddr() string { return st.sentinel.Addr() }

// Addrs are host:port of the two data servers, first-started primary first.
func (st *Sentinel) Addrs() []string { return []string{st.primary.Addr(), st.replica.Addr()} }

// Node returns the process behind addr (one of Addrs, or SentinelAddr), so a
// test can Stop, Freeze or Thaw it; nil if addr is none of them. Restart
// brings a data server back empty in its start-up role (the replica with
// --replicaof the first primary), whatever failovers happened since; the
// sentinel then reconfigures it, after some seconds.
func (st *Sentinel) Node(addr string) *Server {
	for _, s := range []*Server{st.primary, st.replica, st.sentinel} {
		if s != nil && s.Addr() == addr {
			return s
		}
	}
	return nil
}

// Master returns the current master's address as the sentinel reports it
// (SENTINEL GET-MASTER-ADDR-BY-NAME), or "" if the sentinel does not answer.
func (st *Sentinel) Master() string {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	addr, err := st.admin.GetMasterAddrByName(ctx, sentinelMaster).Result()
	if err != nil || len(addr) != 2 {
		return ""
	}
	return net.JoinHostPort(addr[0], addr[1])
}

// Failover makes the sentinel promote the replica (SENTINEL FAILOVER) and
// waits, up to 15s, until the failover is complete: the sentinel names the
// replica master and has switched to it, the replica answers ROLE master,
// and the old master (if running) is its replica, so a client that still
// writes to the old one gets READONLY instead of silently losing data.
// It can be called again to fail back. It needs the current master running;
// a stopped master is failed over by the sentinel itself within ~2s.
func (st *Sentinel) Failover(tb testing.TB) {
	tb.Helper()
	if err := st.failover(15 * time.Second); err != nil {
		tb.Fatal(err)
	}
}

func (st *Sentinel) failover(limit time.Duration) error {
	deadline := time.Now().Add(limit)
	old := st.Master()
	if old == "" {
		return errors.New("redistest: failover: the sentinel does not name a master")
	}
	var next string
	for _, a := range st.Addrs() {
		if a != old {
			next = a
		}
	}
	if err := st.waitGoodReplica(old, time.Until(deadline)); err != nil {
		return fmt.Errorf("redistest: failover: %w", err)
	}
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		err := st.admin.Failover(ctx, sentinelMaster).Err()
		cancel()
		if err == nil {
			break
		}
		// NOGOODSLAVE or INPROG clear up by themselves; retry until the deadline.
		if time.Now().After(deadline) {
			return fmt.Errorf("redistest: SENTINEL FAILOVER %s: %w", sentinelMaster, err)
		}
		time.Sleep(100 * time.Millisecond)
	}

	var last error
	for {
		if last = st.failedOver(old, next); last == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redistest: failover from %s to %s not done after %s: %w", old, next, limit, last)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// failedOver reports whether a failover from old to next is complete: next
// answers ROLE master, old is a replica of next, and the sentinel has
// switched to next with no failover in progress.
//
// Once next is promoted it demotes old itself (REPLICAOF next), which the
// sentinel would only do some 8s later (+convert-to-slave): until then old
// still takes writes that are lost when it resyncs, and its stale INFO would
// delay the next failover by the sentinel's 10s INFO period. An old master
// that is stopped or frozen is left alone; the sentinel converts it once it
// is back, as it would in production.
func (st *Sentinel) failedOver(old, next string) error {
	if role, err := roleOf(next, time.Second); err != nil || role[0] != "master" {
		return fmt.Errorf("ROLE on %s: %v %v", next, role, err)
	}
	if s := st.Node(old); s != nil && s.cmd != nil {
		host, port, _ := net.SplitHostPort(next)
		role, err := roleOf(old, 500*time.Millisecond)
		var ne net.Error
		switch {
		case errors.As(err, &ne) && ne.Timeout():
			// Frozen: leave it to the sentinel.
		case err != nil:
			return fmt.Errorf("ROLE on %s: %w", old, err)
		case role[0] == "master":
			c := redis.NewClient(&redis.Options{Addr: old, MaxRetries: -1})
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			err := c.SlaveOf(ctx, host, port).Err()
			cancel()
			c.Close()
			return fmt.Errorf("demoting %s to a replica of %s: %v", old, next, err)
		case len(role) < 3 || role[0] != "slave" || fmt.Sprint(role[2]) != port:
			return fmt.Errorf("ROLE on %s: %v", old, role)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	m, err := st.admin.Master(ctx, sentinelMaster).Result()
	if err != nil {
		return fmt.Errorf("SENTINEL MASTER: %w", err)
	}
	if got := net.JoinHostPort(m["ip"], m["port"]); got != next || m["flags"] != "master" {
		return fmt.Errorf("sentinel has master %s flags %q", got, m["flags"])
	}
	return nil
}

// roleOf returns the ROLE reply of the server at addr; never empty without an error.
func roleOf(addr string, timeout time.Duration) ([]any, error) {
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: timeout, ReadTimeout: timeout})
	defer c.Close()
	role, err := c.Do(context.Background(), "ROLE").Slice()
	if err == nil && len(role) == 0 {
		err = errors.New("empty ROLE reply")
	}
	return role, err
}

// Close stops the sentinel, the replica and the primary and removes their
// files. It is safe to call on a half-started setup and more than once.
func (st *Sentinel) Close() {
	if st.admin != nil {
		st.admin.Close()
	}
	// The sentinel first, so it does not react to the others going away.
	for _, s := range []*Server{st.sentinel, st.replica, st.primary} {
		if s != nil {
			s.Close()
		}
	}
}
