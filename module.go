// Package slidingratelimit is a Caddy HTTP handler that limits how many
// requests each client may make in a sliding window, exactly, with the state
// kept in Redis so that every Caddy instance pointing at the same Redis shares
// one limit. Without Redis it keeps the state in process.
package slidingratelimit

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/limiter"
)

func init() {
	caddy.RegisterModule(Handler{})
}

// Defaults of optional fields.
const (
	defaultKey     = "{http.vars.client_ip}"
	defaultZone    = "default"
	defaultTimeout = 100 * time.Millisecond
)

// Fail modes: what a request gets when Redis cannot decide in time.
const (
	failOpen   = "open"
	failClosed = "closed"
)

// Header modes.
const (
	headersDraft  = "draft"
	headersLegacy = "legacy"
	headersOff    = "off"
)

// Handler limits each client to MaxRequests admitted requests in any span of
// Window. It decides before the next handler runs, with one atomic call to
// Redis (or to the in-process store when Redis is not configured). Denied
// requests get a 429 error with an exact Retry-After, which `handle_errors`
// can shape; every decision sets the RateLimit headers.
type Handler struct {
	// Window is the span in which at most MaxRequests requests of one client
	// are admitted, counted back from each request (a sliding window, not a
	// fixed one). Required; must be greater than zero.
	Window caddy.Duration `json:"window,omitempty"`

	// MaxRequests is how many requests one client may make in any Window.
	// Denied requests do not count. Required; at least 1.
	MaxRequests int64 `json:"max_requests,omitempty"`

	// Key identifies the client, with placeholders expanded per request.
	// Default: "{http.vars.client_ip}" (the Caddyfile's {client_ip}), the
	// client address as Caddy's trusted_proxies setting resolves it. A key that
	// expands to "" falls back to the client IP, so a client cannot escape its
	// limit by leaving out a header. Keys longer than 64 bytes are hashed.
	Key string `json:"key,omitempty"`

	// FailMode says what happens when Redis does not answer within Timeout or
	// answers with an error: "open" (default) passes the request on unlimited,
	// "closed" answers 503 Service Unavailable.
	FailMode string `json:"fail_mode,omitempty"`

	// Redis is the URL of the Redis server that holds the limits:
	// redis://[user:password@]host:port[/db], or rediss:// for TLS, with query
	// options as go-redis's ParseURL reads them. Placeholders such as
	// {env.REDIS_URL} are expanded once at provision. Empty (the default, or
	// a placeholder that expands to ""): an in-process store, so the limit is
	// per Caddy instance.
	Redis string `json:"redis,omitempty"`

	// KeyPrefix starts every Redis key the handler writes. Default "srl:".
	// Must not contain '{' or '}', which would change the Redis Cluster hash
	// tag.
	KeyPrefix string `json:"key_prefix,omitempty"`

	// Timeout is the deadline for one decision by Redis; past it the fail mode
	// applies. Default 100ms; must be greater than zero when set.
	Timeout caddy.Duration `json:"timeout,omitempty"`

	// Headers selects the rate-limit response headers: "draft" (default) sends
	// the IETF draft-11 RateLimit-Policy and RateLimit headers, "legacy" adds
	// X-RateLimit-Limit, X-RateLimit-Remaining and X-RateLimit-Reset, "off"
	// sends none (Retry-After is still sent on a 429).
	Headers string `json:"headers,omitempty"`

	// LogKeys adds the client key to the debug log line of each denial. Off by
	// default: keys are often addresses or credentials.
	LogKeys bool `json:"log_keys,omitempty"`

	zone     zone
	store    limiter.Store
	release  func() error
	failures *failureLog
	logger   *zap.Logger
}

// CaddyModule returns the Caddy module information.
func (Handler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.sliding_ratelimit",
		New: func() caddy.Module { return new(Handler) },
	}
}

// Provision sets defaults and connects the store.
func (h *Handler) Provision(ctx caddy.Context) error {
	h.logger = ctx.Logger()
	if h.Key == "" {
		h.Key = defaultKey
	}
	if h.FailMode == "" {
		h.FailMode = failOpen
	}
	if h.KeyPrefix == "" {
		h.KeyPrefix = limiter.DefaultKeyPrefix
	}
	if h.Timeout == 0 {
		h.Timeout = caddy.Duration(defaultTimeout)
	}
	if h.Headers == "" {
		h.Headers = headersDraft
	}
	if err := h.checkFields(); err != nil {
		return err
	}
	h.zone = newZone(defaultZone, h.Key, limiter.Limit{Window: time.Duration(h.Window), Max: h.MaxRequests})
	h.failures = newFailureLog(h.logger, time.Second)

	redisURL := caddy.NewReplacer().ReplaceKnown(h.Redis, "")
	if redisURL == "" {
		h.logger.Info("no redis configured: limits are kept in process, so each Caddy instance counts alone")
		store, release := loadMemoryStore()
		h.store, h.release = store, release
		return nil
	}
	client, release, err := loadRedisClient(redisURL)
	if err != nil {
		return fmt.Errorf("redis: %w", err)
	}
	h.store = limiter.NewRedisStore(client, h.KeyPrefix)
	h.release = release
	return nil
}

// Validate checks the provisioned configuration.
func (h *Handler) Validate() error {
	return h.checkFields()
}

// checkFields reports the first field whose value is out of range. Zero
// values of optional fields are accepted: they mean the default.
func (h *Handler) checkFields() error {
	switch {
	case h.Window <= 0:
		return errors.New("window must be greater than zero")
	case h.MaxRequests < 1:
		return fmt.Errorf("max_requests must be at least 1, got %d", h.MaxRequests)
	case h.Timeout < 0:
		return errors.New("timeout must be greater than zero")
	case strings.ContainsAny(h.KeyPrefix, "{}"):
		return fmt.Errorf("key_prefix must not contain '{' or '}', got %q", h.KeyPrefix)
	}
	switch h.FailMode {
	case "", failOpen, failClosed:
	default:
		return fmt.Errorf("fail_mode must be open or closed, got %q", h.FailMode)
	}
	switch h.Headers {
	case "", headersDraft, headersLegacy, headersOff:
	default:
		return fmt.Errorf("headers must be draft, legacy or off, got %q", h.Headers)
	}
	return nil
}

// Cleanup releases the store, closing the Redis client when no other handler
// or config uses it.
func (h *Handler) Cleanup() error {
	if h.release == nil {
		return nil
	}
	return h.release()
}

// Interface guards
var (
	_ caddy.Provisioner           = (*Handler)(nil)
	_ caddy.Validator             = (*Handler)(nil)
	_ caddy.CleanerUpper          = (*Handler)(nil)
	_ caddyhttp.MiddlewareHandler = (*Handler)(nil)
)
