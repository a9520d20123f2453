package slidingratelimit

import (
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/redisconn"
)

// startupWarnings counts the warnings a handler logs while it is provisioned,
// for the config_warnings gauge: an operator's alert that the running config
// said something at load that nobody read. The count stays in the gauge
// while the handler runs, and leaves it at Cleanup, so a reload that fixes
// the config clears it. Warnings logged later (a fallback at run time) are
// not the config's and are not counted.
type startupWarnings struct {
	provisioning atomic.Bool
	logged       atomic.Int64
	// inGauge is what this handler added to the gauge.
	inGauge int64
}

// watch returns logger with a hook that counts its warnings until done.
func (w *startupWarnings) watch(logger *zap.Logger) *zap.Logger {
	w.provisioning.Store(true)
	return logger.WithOptions(zap.Hooks(func(e zapcore.Entry) error {
		if e.Level == zapcore.WarnLevel && w.provisioning.Load() {
			w.logged.Add(1)
		}
		return nil
	}))
}

// done ends the count and adds it to the gauge.
func (w *startupWarnings) done() {
	if !w.provisioning.Swap(false) || limiterMetrics.configWarnings == nil {
		return
	}
	w.inGauge = w.logged.Load()
	limiterMetrics.configWarnings.Add(float64(w.inGauge))
}

// release takes the handler's count out of the gauge.
func (w *startupWarnings) release() {
	if w.inGauge != 0 {
		limiterMetrics.configWarnings.Sub(float64(w.inGauge))
		w.inGauge = 0
	}
}

// throttle counts events and says when one is due to be logged: at most once
// per interval, with the count of events since the last line. A Redis outage
// or a misconfigured key under load must not write one line per request.
type throttle struct {
	interval time.Duration

	mu      sync.Mutex
	last    time.Time
	pending int64
}

// event counts one event and, when a line is due, returns the count since the
// last one and true.
func (t *throttle) event() (int64, bool) {
	now := time.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	t.pending++
	if !t.last.IsZero() && now.Sub(t.last) < t.interval {
		return 0, false
	}
	count := t.pending
	t.pending = 0
	t.last = now
	return count, true
}

// failureLog logs store failures, throttled.
type failureLog struct {
	logger *zap.Logger
	msg    string
	throttle
}

func newFailureLog(logger *zap.Logger, msg string, interval time.Duration) *failureLog {
	return &failureLog{logger: logger, msg: msg, throttle: throttle{interval: interval}}
}

// record counts one failure under failMode and logs when due.
func (f *failureLog) record(failMode string, err error) {
	if count, due := f.event(); due {
		f.logger.Error(f.msg,
			zap.String("fail_mode", failMode),
			zap.Int64("failures", count),
			zap.Error(err))
	}
}

// fallbackLog counts and logs, throttled, the requests of a zone whose key
// template expanded to nothing, so that they were keyed by client address: a
// header that never comes, or a placeholder with a typo, shows up.
type fallbackLog struct {
	logger  *zap.Logger
	zone    string
	counter prometheus.Counter
	throttle
}

func newFallbackLog(logger *zap.Logger, zone string, interval time.Duration) *fallbackLog {
	return &fallbackLog{logger: logger, zone: zone, throttle: throttle{interval: interval}}
}

// record counts one fallback and logs when due.
func (f *fallbackLog) record(template string) {
	if f.counter != nil {
		f.counter.Inc()
	}
	if count, due := f.event(); due {
		f.logger.Info("rate limit key expanded to nothing: keyed by client address",
			zap.String("zone", f.zone),
			zap.String("key", template),
			zap.Int64("requests", count))
	}
}

// longWindow is the window from which a zone's state is a budget that
// must outlive a restart of Redis: a restart of a Redis that keeps nothing
// gives every client of such a zone its whole budget back, and an hour or
// a day is too long a window to shrug that off.
const longWindow = time.Hour

// warnPersistence warns at start-up when Redis (conn; nil: the in-process
// store) keeps neither an append-only file nor RDB snapshots and a zone
// has a window (windows, by zone name; none for a concurrency zone) of
// longWindow or more, naming those zones. A Redis that does
// not answer CONFIG GET (managed services, which persist by their own
// means) is noted at debug level only.
func warnPersistence(logger *zap.Logger, conn *redisconn.Conn, windows map[string]time.Duration, timeout time.Duration) {
	var long []string
	for name, w := range windows {
		if w >= longWindow {
			long = append(long, name)
		}
	}
	slices.Sort(long)
	if conn == nil || len(long) == 0 {
		return
	}
	appendonly, save, err := conn.Persistence(timeout)
	if err != nil {
		logger.Debug("could not read redis's persistence settings", zap.String("redis", conn.Label()), zap.Error(err))
		return
	}
	if appendonly || save != "" {
		return
	}
	logger.Warn("redis keeps neither an append-only file nor snapshots (appendonly no, save \"\"), and these zones have windows of an hour or more: "+
		"a restart of redis gives every client of them its whole budget back; turn on appendonly yes with appendfsync everysec (docs/redis.md, long budgets)",
		zap.String("redis", conn.Label()), zap.String("zones", strings.Join(long, ", ")))
}
