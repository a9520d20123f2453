package slidingratelimit

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/limiter"
)

// errRateLimited is the error a denied request carries to handle_errors.
var errRateLimited = errors.New("rate limit exceeded")

// ServeHTTP decides the request with one store call and either passes it on
// or answers 429 (or, when the store fails, applies the fail mode).
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	repl := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	checks := [1]limiter.Check{{
		Zone:  h.zone.name,
		Key:   clientKey(r, repl, h.zone.key),
		Limit: h.zone.limit,
	}}
	var decisions [1]limiter.Decision

	ctx, cancel := context.WithTimeout(r.Context(), time.Duration(h.Timeout))
	err := h.store.Allow(ctx, checks[:], decisions[:])
	cancel()
	if err != nil {
		return h.failed(w, r, next, err)
	}

	d := decisions[0]
	writeHeaders(w.Header(), h.Headers, &h.zone, d)
	setPlaceholders(repl, &h.zone, d)
	if !d.Allowed {
		w.Header().Set("Retry-After", formatSeconds(d.RetryAfter))
		if ce := h.logger.Check(zap.DebugLevel, "rate limited"); ce != nil {
			fields := []zap.Field{zap.String("zone", h.zone.name), zap.Duration("retry_after", d.RetryAfter)}
			if h.LogKeys {
				fields = append(fields, zap.String("key", checks[0].Key))
			}
			ce.Write(fields...)
		}
		return caddyhttp.Error(http.StatusTooManyRequests, errRateLimited)
	}
	return next.ServeHTTP(w, r)
}

// failed applies the fail mode to a request the store could not decide.
func (h *Handler) failed(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, err error) error {
	h.failures.record(h.FailMode, err)
	if h.FailMode == failClosed {
		return caddyhttp.Error(http.StatusServiceUnavailable, err)
	}
	return next.ServeHTTP(w, r)
}
