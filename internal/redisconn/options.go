package redisconn

import (
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// Topologies: what a URL names.
const (
	// Standalone is a single server, or a proxy in front of several.
	Standalone = "standalone"
	// Cluster is Redis Cluster: the URL is a seed, with further nodes as
	// addr query parameters (go-redis's ParseClusterURL).
	Cluster = "cluster"
	// Sentinel is a Sentinel-managed primary: the URL is a sentinel's, with
	// master_name (go-redis's ParseFailoverURL).
	Sentinel = "sentinel"
)

// Topologies are the topologies, in the order the docs list them.
var Topologies = []string{Standalone, Cluster, Sentinel}

// CheckURL parses rawURL as Open would, so that a bad URL is reported at
// configuration time. Its errors never quote the URL, which may hold a
// password.
func CheckURL(topology, rawURL string) error {
	_, err := parse(topology, rawURL)
	return err
}

// options is a URL parsed for its topology: how to make its clients, and
// the label of the Redis it names.
type options struct {
	// newClient makes a client; with sendOnce it never sends a command
	// again (see sendonce.go), without, it retries only as the URL's
	// max_retries says.
	newClient func(sendOnce bool) redis.UniversalClient
	// retries reports whether the URL asks for command retries.
	retries bool
	label   string
}

// clients makes the clients of a connection. A script call records
// admissions, and one whose reply was lost (a connection cut after Redis ran
// it) may have recorded them: sent again, it records them twice, and its
// client pays for a request it was never answered. So client sends every
// command once, whatever the URL says about retries, and a lost reply takes
// the fail mode. Only reset announcements, which are harmless twice (an
// instance forgets a key it has forgotten), are retried as the URL's
// max_retries says: through announcer, a client of their own when the URL
// sets it, client otherwise.
func (o options) clients() (client, announcer redis.UniversalClient) {
	client = o.newClient(true)
	if !o.retries {
		return client, client
	}
	return client, o.newClient(false)
}

// parse parses rawURL with go-redis's parser for the topology; this is the
// only place that tells topologies apart. Every client honours the context
// deadline of each decision: without that, go-redis ignores it and a frozen
// Redis holds each request for the read timeout. It fails fast: go-redis
// dials in the background, detached from the decision's deadline, and by
// default retries a refused dial five times 100ms apart while the decision
// waits, so a dial is tried once. A URL that sets pool_size keeps its own
// (see outageProofPoolSize). A new connection spends one round trip on its
// handshake, not three: no CLIENT SETINFO and no maintenance notifications (a
// Redis Enterprise feature) follow HELLO. With Redis 50ms away and a 100ms
// timeout, three would leave no time for the first decision.
func parse(topology, rawURL string) (options, error) {
	if topology == "" {
		topology = Standalone
	}
	if form, ok := urlForms[topology]; ok && !strings.Contains(rawURL, "://") {
		return options{}, noScheme(rawURL, form)
	}
	switch topology {
	case Standalone:
		opts, err := redis.ParseURL(rawURL)
		if err != nil {
			return options{}, urlError(err, urlForms[Standalone])
		}
		opts.ContextTimeoutEnabled = true
		opts.MaxRetries, opts.DialerRetries = failFast(opts.MaxRetries, opts.DialerRetries)
		opts.PoolSize = poolSize(opts.PoolSize)
		opts.DisableIdentity, opts.MaintNotificationsConfig = true, noMaintNotifications()
		gateDials(opts)
		return options{
			newClient: func(sendOnce bool) redis.UniversalClient {
				// Both clients keep the one dial gate: it stands for the
				// server.
				o := *opts
				if sendOnce {
					o.MaxRetries = -1
				}
				return redis.NewClient(&o)
			},
			retries: opts.MaxRetries > 0,
			label:   label(opts.Addr),
		}, nil
	case Cluster:
		opts, err := redis.ParseClusterURL(rawURL)
		if err != nil {
			return options{}, urlError(err, urlForms[Cluster])
		}
		opts.ContextTimeoutEnabled = true
		opts.MaxRetries, opts.DialerRetries = failFast(opts.MaxRetries, opts.DialerRetries)
		opts.PoolSize = poolSize(opts.PoolSize)
		opts.DisableIdentity, opts.MaintNotificationsConfig = true, noMaintNotifications()
		gateNodeDials(opts)
		return options{
			newClient: func(sendOnce bool) redis.UniversalClient {
				o := *opts
				if !sendOnce {
					return redis.NewClusterClient(&o)
				}
				o.MaxRetries = -1
				return sendOnceOnCluster(&o)
			},
			retries: opts.MaxRetries > 0,
			label:   label(opts.Addrs...),
		}, nil
	case Sentinel:
		opts, err := redis.ParseFailoverURL(rawURL)
		if err != nil {
			return options{}, urlError(err, urlForms[Sentinel])
		}
		opts.ContextTimeoutEnabled = true
		opts.MaxRetries, opts.DialerRetries = failFast(opts.MaxRetries, opts.DialerRetries)
		opts.PoolSize = poolSize(opts.PoolSize)
		opts.DisableIdentity = true // it sends no maintenance notifications handshake
		return options{
			newClient: func(sendOnce bool) redis.UniversalClient {
				o := *opts
				if sendOnce {
					o.MaxRetries = -1
				}
				return redis.NewFailoverClient(&o)
			},
			retries: opts.MaxRetries > 0,
			label:   label(opts.SentinelAddrs...),
		}, nil
	}
	return options{}, fmt.Errorf("unknown redis topology %q", topology)
}

// label names a Redis by the first of its addresses: host:port only, never
// credentials; "unknown" without one.
func label(addrs ...string) string {
	if len(addrs) == 0 || addrs[0] == "" {
		return "unknown"
	}
	return addrs[0]
}

// outageProofPoolSize is the connection pool size of a client, unless the
// URL sets pool_size. Even behind the dial gate each outage adds one failed
// dial to go-redis's count (see dialGate and go-redis #3062), so with go-redis's default (10 per
// CPU) the twentieth outage on two CPUs kept decisions in the fail mode for
// up to a second after Redis came back; without a gate (sentinel), a long
// outage adds up to ten a second. The batcher never holds more than a few
// connections, so the size is only that threshold here; at this one it costs
// 80 KB a pool.
const outageProofPoolSize = 10_000

// poolSize returns the pool size of a client: the URL's, or
// outageProofPoolSize.
func poolSize(fromURL int) int {
	if fromURL > 0 {
		return fromURL
	}
	return outageProofPoolSize
}

// failFast returns the retry counts of a client that fails fast (see
// parse): no command retries unless the URL sets max_retries, and one dial
// attempt (go-redis reads no dialer retries from a URL).
func failFast(maxRetries, dialerRetries int) (int, int) {
	if maxRetries == 0 {
		maxRetries = -1
	}
	if dialerRetries == 0 {
		dialerRetries = 1
	}
	return maxRetries, dialerRetries
}

// noMaintNotifications is the go-redis setting that skips the maintenance
// notifications handshake.
func noMaintNotifications() *maintnotifications.Config {
	return &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
}

// urlForms is the form of a URL of each topology, for errors.
var urlForms = map[string]string{
	Standalone: "redis://host:port or rediss://host:port",
	Cluster:    "redis://host:port?addr=host2:port2",
	Sentinel:   "redis://sentinel:26379?master_name=mymaster",
}

// noScheme describes a URL without a scheme, such as host:port, which
// go-redis's parsers refuse in the words of net/url ("first path segment
// in URL cannot contain colon") or take host for the scheme. It shows the
// URL with redis:// in front only when it is a bare address, which holds
// no password.
func noScheme(rawURL, form string) error {
	msg := fmt.Sprintf("invalid URL (want %s): it has no scheme; a Redis URL starts with redis://, or rediss:// for TLS", form)
	if rawURL != "" && strings.Trim(rawURL, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-:[]") == "" {
		msg += ": redis://" + rawURL
	}
	return errors.New(msg)
}

// urlError describes a URL that go-redis refused, without quoting the URL,
// which may hold a password.
func urlError(err error, want string) error {
	var urlErr *url.Error
	if errors.As(err, &urlErr) {
		err = urlErr.Err
	}
	return fmt.Errorf("invalid URL (want %s): %w", want, err)
}
