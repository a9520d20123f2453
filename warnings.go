package slidingratelimit

import (
	"sync/atomic"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
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

// redisSilentAtStart is the warning of a Redis that does not answer at load:
// what each fail mode does meanwhile, since with open it is every limit off.
func redisSilentAtStart(failMode string) string {
	const msg = "redis not reachable at provision: "
	switch failMode {
	case failClosed:
		return msg + "requests are refused with 503 (fail_mode closed) until it answers"
	case failLocal:
		return msg + "each instance counts alone in process (fail_mode local) until it answers"
	}
	return msg + "requests pass unlimited (fail_mode open) until it answers; decisions_total counts them as failed_open"
}
