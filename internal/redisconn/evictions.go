package redisconn

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
)

// A Redis at its maxmemory with an evicting policy drops keys without a
// word to its clients, and each limit key it drops restarts a client's
// limit: a blocked client is admitted again at once. Redis counts its
// evictions (evicted_keys in INFO stats), so each connection reads that
// count every evictionPollInterval, off the request path: on Redis Cluster
// from every primary, through a sentinel from the current primary. The
// increases go to the evicted_keys_total series of that Redis and, at most
// once every evictionLogInterval, to a warning that says what they cost and
// what to do.
//
// The count is Redis's: every key of that Redis, the limiter's and any
// other's (a cache sharing it counts too). It starts over when the server
// restarts, when CONFIG RESETSTAT clears it, and it is another server's
// after a failover, so the count of each server is kept by its run_id
// (INFO server): a server seen for the first time is a baseline, unless it
// started since the last reading, when all its evictions are new; a count
// that goes down was reset, and all of it is new. The series never goes
// down and never jumps by a count from before it watched.

const (
	// evictionPollInterval is how often each connection reads evicted_keys:
	// often enough that an alert follows an eviction storm within a scrape
	// or two; a pipeline of two INFO sections is nothing to Redis at that
	// rate.
	evictionPollInterval = 5 * time.Second
	// evictionLogInterval is the least time between two eviction warnings
	// of one Redis: a Redis that evicts does so all the time, and a line a
	// minute says so with its count.
	evictionLogInterval = time.Minute
	// evictionPollTimeout bounds one reading: a Redis slower than that is
	// read next time.
	evictionPollTimeout = time.Second
	// evictionServerTTL is how long the count of a server no reading
	// reaches is kept: a restarted server comes back under a new run_id, so
	// an old one only takes room.
	evictionServerTTL = time.Hour
)

// evictedKeys is one series per Redis, labelled as circuit_state is.
var evictedKeys = prometheus.NewCounterVec(prometheus.CounterOpts{
	Namespace: "caddy", Subsystem: "sliding_ratelimit", Name: "redis_evicted_keys_total",
	Help: "Keys each Redis evicted for lack of memory (its evicted_keys, read every 5 seconds; on Redis Cluster summed over the primaries), counted since this Caddy watches it. The count is of every key of that Redis, not only the limiter's; each evicted limit key restarted a client's limit.",
}, []string{"redis"})

// EvictedKeys is the redis_evicted_keys_total metric of every connection,
// for the caller to register on each config's metrics registry.
func EvictedKeys() *prometheus.CounterVec { return evictedKeys }

// evictionTallies holds the tally of each Redis, by label, shared by the
// connections that name it (two URLs may name one server: a database index
// apart), so that the evictions of one server count once.
var evictionTallies = struct {
	sync.Mutex
	byLabel map[string]*evictionTally
}{byLabel: make(map[string]*evictionTally)}

// evictionTally is what the readings of one Redis have counted.
type evictionTally struct {
	label   string
	counter prometheus.Counter
	// uses is the number of watches that read into it; under
	// evictionTallies' lock.
	uses int

	// reading serializes the readings of the watches that share the tally,
	// from the INFO call to the count, so that a count read earlier is
	// never taken for a reset by one read later.
	reading sync.Mutex
	// servers is the last count of each server, by run_id.
	servers map[string]*serverEvictions
	// lastReading is when a reading last reached a server of this Redis.
	lastReading time.Time
	// The warning's throttle: evictions counted since the last line, and
	// since when.
	lastLine     time.Time
	pending      int64
	pendingSince time.Time
}

type serverEvictions struct {
	evicted int64
	seen    time.Time
}

// acquireTally returns the tally of the Redis named label, making it and
// its series at 0 if no connection holds it.
func acquireTally(label string) *evictionTally {
	evictionTallies.Lock()
	defer evictionTallies.Unlock()
	t := evictionTallies.byLabel[label]
	if t == nil {
		t = &evictionTally{label: label, counter: evictedKeys.WithLabelValues(label),
			servers: make(map[string]*serverEvictions)}
		evictionTallies.byLabel[label] = t
	}
	t.uses++
	return t
}

// release gives the tally back; the last use removes it and its series.
func (t *evictionTally) release() {
	evictionTallies.Lock()
	defer evictionTallies.Unlock()
	if t.uses--; t.uses == 0 {
		delete(evictionTallies.byLabel, t.label)
		evictedKeys.DeleteLabelValues(t.label)
	}
}

// serverReading is what one server said of its evictions.
type serverReading struct {
	// id names the server: its run_id, or its address when it does not
	// tell (some managed services hide run_id).
	id      string
	evicted int64
	// uptime is the server's uptime_in_seconds; -1 when it does not tell.
	uptime int64
}

// count adds what readings, taken at now, say was evicted since the last
// reading of each server, and returns it.
func (t *evictionTally) count(now time.Time, readings []serverReading) int64 {
	var evicted int64
	for _, r := range readings {
		s, known := t.servers[r.id]
		switch {
		case known && r.evicted >= s.evicted:
			evicted += r.evicted - s.evicted
		case known:
			// The count went down without a restart: CONFIG RESETSTAT.
			evicted += r.evicted
		case !t.lastReading.IsZero() && r.uptime >= 0 &&
			time.Duration(r.uptime)*time.Second <= now.Sub(t.lastReading)+time.Second:
			// A server that started since the last reading (a restart):
			// all its evictions are new. uptime is in whole seconds.
			evicted += r.evicted
		}
		if !known {
			s = &serverEvictions{}
			t.servers[r.id] = s
		}
		s.evicted, s.seen = r.evicted, now
	}
	if len(readings) > 0 {
		t.lastReading = now
	}
	for id, s := range t.servers {
		if now.Sub(s.seen) > evictionServerTTL {
			delete(t.servers, id)
		}
	}
	t.counter.Add(float64(evicted))
	return evicted
}

// evictionWatch reads the evictions of one connection's Redis until stop.
type evictionWatch struct {
	client      redis.UniversalClient
	tally       *evictionTally
	interval    time.Duration
	logInterval time.Duration
	// logger is Caddy's default logger of the moment, as the breaker's:
	// the connection outlives the configs whose handlers use it.
	logger func() *zap.Logger

	cancel context.CancelFunc
	done   chan struct{}
}

// watchEvictions starts reading the evictions of the Redis that client
// reaches, named label, every evictionPollInterval, the first time at once.
func watchEvictions(client redis.UniversalClient, label string) *evictionWatch {
	w := &evictionWatch{client: client, interval: evictionPollInterval, logInterval: evictionLogInterval,
		logger: func() *zap.Logger { return caddy.Log().Named("http.handlers.sliding_ratelimit") }}
	w.start(label)
	return w
}

// start starts the goroutine; w's settings are set.
func (w *evictionWatch) start(label string) {
	w.tally = acquireTally(label)
	ctx, cancel := context.WithCancel(context.Background())
	w.cancel, w.done = cancel, make(chan struct{})
	go w.run(ctx)
}

func (w *evictionWatch) run(ctx context.Context) {
	defer close(w.done)
	ticker := time.NewTicker(w.interval)
	defer ticker.Stop()
	for {
		w.poll(ctx)
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
	}
}

// stop ends the readings and waits for the goroutine to return.
func (w *evictionWatch) stop() {
	w.cancel()
	<-w.done
	w.tally.release()
}

// poll reads every server once and counts what they evicted. A server that
// does not answer is read next time: an outage is the breaker's to report.
func (w *evictionWatch) poll(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, min(evictionPollTimeout, w.interval))
	defer cancel()
	t := w.tally
	t.reading.Lock()
	defer t.reading.Unlock()
	var readings []serverReading
	if cluster, ok := w.client.(*redis.ClusterClient); ok {
		var mu sync.Mutex
		_ = cluster.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error {
			r, err := readEvictions(ctx, node, node.Options().Addr)
			if err == nil {
				mu.Lock()
				readings = append(readings, r)
				mu.Unlock()
			}
			return err
		})
	} else if r, err := readEvictions(ctx, w.client, t.label); err == nil {
		readings = append(readings, r)
	}
	if ctx.Err() != nil && len(readings) == 0 {
		return
	}
	now := time.Now()
	since := t.lastReading
	if evicted := t.count(now, readings); evicted > 0 && t.pending == 0 {
		t.pendingSince = since
		if since.IsZero() {
			t.pendingSince = now
		}
		t.pending = evicted
	} else {
		t.pending += evicted
	}
	if t.pending > 0 && (t.lastLine.IsZero() || now.Sub(t.lastLine) >= w.logInterval) {
		w.logger().Warn("redis evicted keys for lack of memory: each evicted key of the limiter restarted a client's limit, "+
			"letting a client at its limit through again; the count is of every key of that redis, another user's too. "+
			"To keep limits, set maxmemory-policy noeviction and give redis the memory of every client active in a window "+
			"(docs/redis.md, When Redis is full)",
			zap.String("redis", t.label),
			zap.Int64("evicted_keys", t.pending),
			zap.Duration("interval", now.Sub(t.pendingSince).Round(time.Second)))
		t.lastLine, t.pending = now, 0
	}
}

// readEvictions reads one server's evicted_keys, run_id and uptime in one
// round trip (two INFO sections, as every Redis version takes them);
// fallbackID names the server if it hides its run_id.
func readEvictions(ctx context.Context, c redis.Cmdable, fallbackID string) (serverReading, error) {
	var server, stats *redis.StringCmd
	if _, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
		server = p.Info(ctx, "server")
		stats = p.Info(ctx, "stats")
		return nil
	}); err != nil {
		return serverReading{}, err
	}
	r := serverReading{id: fallbackID, uptime: -1}
	evicted, ok := infoValue(stats.Val(), "evicted_keys")
	if !ok {
		return serverReading{}, errNoEvictedKeys
	}
	var err error
	if r.evicted, err = strconv.ParseInt(evicted, 10, 64); err != nil {
		return serverReading{}, errNoEvictedKeys
	}
	if id, ok := infoValue(server.Val(), "run_id"); ok && id != "" {
		r.id = id
	}
	if uptime, ok := infoValue(server.Val(), "uptime_in_seconds"); ok {
		if n, err := strconv.ParseInt(uptime, 10, 64); err == nil {
			r.uptime = n
		}
	}
	return r, nil
}

// errNoEvictedKeys: INFO stats without a readable evicted_keys (a proxy
// that answers INFO its own way); the reading is skipped.
var errNoEvictedKeys = errors.New("INFO stats has no evicted_keys")

// infoValue returns the value of field in an INFO reply.
func infoValue(info, field string) (string, bool) {
	for line := range strings.SplitSeq(info, "\n") {
		if name, value, ok := strings.Cut(strings.TrimSpace(line), ":"); ok && name == field {
			return value, true
		}
	}
	return "", false
}
