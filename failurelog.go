package slidingratelimit

import (
	"sync"
	"time"

	"go.uber.org/zap"
)

// failureLog logs store failures at most once per interval, with the count of
// failures since the last line: a Redis outage under load must not write one
// line per request.
type failureLog struct {
	logger   *zap.Logger
	interval time.Duration

	mu      sync.Mutex
	last    time.Time
	pending int64
}

func newFailureLog(logger *zap.Logger, interval time.Duration) *failureLog {
	return &failureLog{logger: logger, interval: interval}
}

// record counts one failure decided by failMode and logs when due.
func (f *failureLog) record(failMode string, err error) {
	now := time.Now()
	f.mu.Lock()
	f.pending++
	if now.Sub(f.last) < f.interval {
		f.mu.Unlock()
		return
	}
	count := f.pending
	f.pending = 0
	f.last = now
	f.mu.Unlock()
	f.logger.Error("rate limit store unavailable; applying fail mode",
		zap.String("fail_mode", failMode),
		zap.Int64("failures", count),
		zap.Error(err))
}
