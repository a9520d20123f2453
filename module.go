// Package slidingratelimit is a Caddy HTTP handler that limits how many
// requests each client may make in a sliding window, exactly, with the state
// kept in Redis so that every Caddy instance pointing at the same Redis shares
// one limit. Without Redis it keeps the state in process.
package slidingratelimit

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyevents"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
)

func init() {
	caddy.RegisterModule(Handler{})
}

// Defaults of optional fields; the words of enum fields are with the rules
// (zones.go).
const (
	defaultKey        = "{http.vars.client_ip}"
	defaultTimeout    = 100 * time.Millisecond
	defaultIPv4Prefix = 32
	defaultIPv6Prefix = 64
)

// Handler limits each client to a number of admitted requests in any span of
// a window, per zone. It decides before the next handler runs, with one
// atomic call to Redis (or to the in-process store when Redis is not
// configured). Denied requests get a 429 error with an exact Retry-After,
// which `handle_errors` can shape; every decision sets the RateLimit headers.
type Handler struct {
	// Window, with MaxRequests, defines the zone named "default": at most
	// MaxRequests requests of one client in any span of Window, counted back
	// from each request. Required unless Zones (or Period) are given;
	// greater than zero.
	// Handlers of one config whose "default" zones have the same window and
	// max_requests (and store) share one limit; since nobody chose that
	// name, provisioning warns about it, naming the handlers. Name the zone
	// (Zones) to share on purpose or to count apart.
	Window caddy.Duration `json:"window,omitempty"`

	// Period, instead of Window, makes the "default" zone count by the
	// calendar: "day", "week" (from Monday) or "month", each starting at
	// midnight in TimeZone (see the zone's field). Default "": Window.
	Period string `json:"period,omitempty"`

	// TimeZone is the IANA name of the time zone whose midnight starts the
	// periods of the "default" zone and of every zone with a period that
	// names none, such as "Europe/Berlin". Needs a period. Default "UTC".
	TimeZone string `json:"time_zone,omitempty"`

	// MaxRequests is how many requests one client may make in any Window of
	// the "default" zone, or with a Cost or Settle how many units. Denied
	// requests do not count. Required with Window; from 1 to 2^48-1. With
	// MaxRequestsFrom, the fallback.
	MaxRequests int64 `json:"max_requests,omitempty"`

	// MaxRequestsFrom is a placeholder alone, such as
	// "{http.request.header.X-Quota}", whose value is each request's
	// max_requests in the "default" zone: a tenant's own quota. When it is
	// missing or not a whole number from 1 to 2^48-1, MaxRequests applies,
	// and the request is counted and logged at most once a minute. Default:
	// none, MaxRequests holds for every client. See the zone's field.
	MaxRequestsFrom string `json:"max_requests_from,omitempty"`

	// Cost is what one request spends of max_requests, in the "default"
	// zone and in every zone that sets none: a whole number of at least 1,
	// or a placeholder alone read per request (see the zone's field).
	// Default: 1.
	Cost string `json:"cost,omitempty"`

	// Settle replaces, after the response, what a request reserved with
	// what it really cost, in the "default" zone and in every zone that
	// sets none (see Settle). Default: none, the reservation stands.
	Settle *Settle `json:"settle,omitempty"`

	// CostJSON reads what a request reserves from its JSON body, instead
	// of Cost, in the "default" zone and in each zone that sets no cost
	// (see CostJSON). Default: none.
	CostJSON *CostJSON `json:"cost_json,omitempty"`

	// CostLLM reads what a request reserves from its body as the LLM API
	// its path names reads it, instead of Cost, in the "default" zone and
	// in each zone that sets no cost (see CostLLM). Default: none.
	CostLLM *CostLLM `json:"cost_llm,omitempty"`

	// Key identifies the client, with placeholders expanded per request; it
	// is also the key of every zone that sets none. Default:
	// "{http.vars.client_ip}" (the Caddyfile's {client_ip}), the client
	// address as Caddy's trusted_proxies setting resolves it. A key that
	// expands to "" falls back to the client IP, so a client cannot escape its
	// limit by leaving out a header. Keys longer than 64 bytes are hashed.
	// Every '{' must be closed by a '}' before the next '{': a placeholder
	// left open would make the key the same text for every client, one
	// bucket for all, so it is a config error. A key without placeholders
	// is a constant on purpose: one limit shared by every client.
	Key string `json:"key,omitempty"`

	// Algorithm is the default algorithm of the zones: "log" (default; exact
	// sliding-window log, memory grows with max_requests) or "counter"
	// (sliding-window counter, O(1) memory per key, approximate).
	Algorithm string `json:"algorithm,omitempty"`

	// CountStatus lists the response statuses that count against the limit,
	// for every zone that sets none: codes such as 401, or a single digit n
	// for the class nxx (4 is 4xx). A request is still decided before it goes
	// on, and reserves its slot; when its response has a status not in the
	// list, the slot is given back. Default: empty, every admitted request
	// counts.
	CountStatus []int `json:"count_status,omitempty"`

	// Wait is how long a request that cannot be admitted now, but can be
	// within this time, is held for its slot and then passed on, instead of
	// denied (nginx's burst with delay, exact across instances): its
	// admission is recorded at that later time, so no other request takes
	// its slot. It is the default zone's, and that of every zone of
	// algorithm log that sets none; a request waits only if every zone that
	// applies to it has a wait, and at most the least of them. It may be
	// longer than the window, up to 16 windows of each zone it applies to:
	// a zone then holds a line of requests, each admitted at its own slot.
	// Never past the request's deadline or the server's
	// write timeout (or its read timeout, when a body is still to be read).
	// A held request whose client goes away gives its slot back. Default 0:
	// no wait, a request that cannot be admitted now is denied.
	Wait caddy.Duration `json:"wait,omitempty"`

	// MaxWaiting bounds how many requests this handler holds for their
	// slot at once, on this instance, over all its zones: a request that
	// finds it full is decided without a wait (so denied with 429 if it
	// cannot be admitted now), rather than promised a slot it might not
	// use. Each held request keeps its connection. Default 1000; at least 1.
	MaxWaiting int `json:"max_waiting,omitempty"`

	// Zones are further named limits. A request is admitted only if every
	// zone that applies to it admits it, and a denial by one zone consumes
	// nothing in the others.
	Zones []*Zone `json:"zones,omitempty"`

	// Mode is "enforce" (default) or "report": report decides, sets headers
	// and placeholders, logs and counts, but passes every request on. A
	// request that would have been denied is not recorded as admitted.
	Mode string `json:"mode,omitempty"`

	// IPv4Prefix groups IPv4 client keys by this many leading bits. Default
	// 32 (each address alone); 1 to 32.
	IPv4Prefix int `json:"ipv4_prefix,omitempty"`

	// IPv6Prefix groups IPv6 client keys by this many leading bits. Default
	// 64, since one IPv6 client usually owns a whole /64; 1 to 128.
	IPv6Prefix int `json:"ipv6_prefix,omitempty"`

	// FailMode says what happens when Redis does not answer within Timeout,
	// answers with an error, or the circuit breaker is open after repeated
	// failures: "open" (default) passes the request on unlimited, "closed"
	// answers 503 Service Unavailable with Retry-After: 1 (through
	// handle_errors when the server has such routes, written directly
	// otherwise, as a 429 is), "local" decides with the in-process
	// store and the same limits, per instance, until Redis is back.
	FailMode string `json:"fail_mode,omitempty"`

	// Redis is the URL of the Redis server that holds the limits:
	// redis://[user:password@]host:port[/db], or rediss:// for TLS, with query
	// options as go-redis's ParseURL reads them. A rate limit script call is
	// never retried, whatever the URL says: it records admissions, and one
	// whose reply was lost may have recorded them, so a lost reply takes the
	// fail mode; max_retries applies only to announcing resets to other
	// instances, which is harmless twice. Placeholders such as
	// {env.REDIS_URL} are expanded once at provision. Empty (the default, or
	// a placeholder that expands to ""): an in-process store, so the limit is
	// per Caddy instance; a placeholder that expands to "" is warned about,
	// since an unset variable is the likelier cause than a wish.
	Redis string `json:"redis,omitempty"`

	// RedisTopology says what Redis is: "standalone" (default, a single
	// server or a proxy), "cluster" (Redis Cluster; Redis is a seed URL with
	// further nodes as addr query parameters, as go-redis's ParseClusterURL
	// reads it) or "sentinel" (a Sentinel-managed primary; Redis is a
	// sentinel's URL with master_name, as go-redis's ParseFailoverURL reads
	// it).
	RedisTopology string `json:"redis_topology,omitempty"`

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

	zones []*Zone
	// backend is the door to the stores: deny cache, store, breaker,
	// fallback.
	backend *backend
	// afterResponse is set when a zone acts after the response
	// (count_status, settle, a lease to release) or counts units, so that
	// admitted requests are followed to it.
	afterResponse bool

	events *caddyevents.App
	ctx    caddy.Context
	logger *zap.Logger
	// warnings counts what Provision warned of (warnings.go).
	warnings *startupWarnings

	// waits holds requests admitted for a later time (nil: no zone waits),
	// and leases extends the leases of running requests (nil: no
	// concurrency zone).
	waits  *waitRoom
	leases *leaseKeeper
	// readsModel is set when a zone reads LLM calls or names the model
	// placeholder: requests then get its provider (llm.go).
	readsModel bool
}

// CaddyModule returns the Caddy module information.
func (Handler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.sliding_ratelimit",
		New: func() caddy.Module { return new(Handler) },
	}
}

// Provision sets defaults, loads the zones and connects the store.
func (h *Handler) Provision(ctx caddy.Context) error {
	h.setDefaults()
	if err := initMetrics(ctx.GetMetricsRegistry()); err != nil {
		return fmt.Errorf("registering metrics: %w", err)
	}
	h.warnings = new(startupWarnings)
	h.logger = h.warnings.watch(ctx.Logger())
	defer h.warnings.done()
	if err := h.provisionZones(ctx); err != nil {
		return err
	}
	h.ctx = ctx
	// Only a configured events app can have subscribers; without one there
	// is no one to tell.
	if events, err := ctx.AppIfConfigured("events"); err == nil {
		h.events = events.(*caddyevents.App)
	}
	b, err := newBackend(h.backendConfig())
	if err != nil {
		return err
	}
	h.backend = b
	warnPersistence(h.logger, b.conn, h.windows(), time.Duration(h.Timeout))
	h.waits = newWaitRoom(h.zones, h.MaxWaiting, time.Duration(h.Timeout), h.Mode == modeReport, b)
	h.leases = newLeaseKeeper(h.zones, b, h.logger)
	h.readsModel = readsModel(h.zones)
	handlers.add(h)
	if h.Window != 0 {
		// The zone of the three-line form, which nobody named.
		warnImplicitSharing(ctx, h.logger, h.zones[0], b.state())
	}
	return nil
}

// backendConfig is what the backend needs to know of the configuration.
func (h *Handler) backendConfig() backendConfig {
	identities := make([]string, len(h.zones))
	for i, z := range h.zones {
		identities[i] = z.identity
	}
	return backendConfig{
		redis:     h.redisURL(),
		topology:  h.RedisTopology,
		keyPrefix: h.KeyPrefix,
		timeout:   time.Duration(h.Timeout),
		failMode:  h.FailMode,
		zones:     identities,
		periods:   periodsOf(h.zones),
		logger:    h.logger,
	}
}

// windows are the windows of the zones that count in one, by name.
func (h *Handler) windows() map[string]time.Duration {
	w := make(map[string]time.Duration, len(h.zones))
	for _, z := range h.zones {
		if !z.concurrency() {
			w[z.Name] = z.limit.Window
		}
	}
	return w
}

// handlers are the provisioned handlers of the process, for the admin API to
// find a zone by name. Several may have a zone of the same name: one per
// site, and the old and the new config during a reload.
var handlers registry[*Handler]

// redisURL is the Redis URL with its placeholders ({env.*}) expanded. ""
// keeps the limits in process, which it logs: with placeholders that all
// expand to nothing, as a warning.
func (h *Handler) redisURL() string {
	url := caddy.NewReplacer().ReplaceKnown(h.Redis, "")
	switch {
	case url != "":
	case h.Redis != "":
		// An unset variable, most likely, not a wish to count per
		// instance.
		h.logger.Warn("redis expands to nothing: limits are kept in process, so each Caddy instance counts alone; set what the placeholder names, or remove the redis line to mean it",
			zap.String("placeholder", h.Redis))
	default:
		h.logger.Info("no redis configured: limits are kept in process, so each Caddy instance counts alone")
	}
	return url
}

// setDefaults fills the optional fields left empty.
func (h *Handler) setDefaults() {
	if h.Key == "" {
		h.Key = defaultKey
	}
	if h.Algorithm == "" {
		h.Algorithm = algorithmLog
	}
	if h.Mode == "" {
		h.Mode = modeEnforce
	}
	if h.IPv4Prefix == 0 {
		h.IPv4Prefix = defaultIPv4Prefix
	}
	if h.IPv6Prefix == 0 {
		h.IPv6Prefix = defaultIPv6Prefix
	}
	if h.FailMode == "" {
		h.FailMode = failOpen
	}
	if h.KeyPrefix == "" {
		h.KeyPrefix = "srl:"
	}
	if h.Timeout == 0 {
		h.Timeout = caddy.Duration(defaultTimeout)
	}
	if h.Headers == "" {
		h.Headers = headersDraft
	}
	if h.MaxWaiting == 0 {
		h.MaxWaiting = defaultMaxWaiting
	}
}

// provisionZones builds the zone list: the "default" zone of the top-level
// window and max_requests, then the named zones, each with its header parts
// and metrics.
func (h *Handler) provisionZones(ctx caddy.Context) error {
	h.zones = h.zones[:0]
	if h.Window != 0 || h.MaxRequests != 0 || h.Period != "" {
		h.zones = append(h.zones, &Zone{Name: defaultZone, site: implicitSite(ctx), Window: h.Window, Period: h.Period, MaxRequests: h.MaxRequests, MaxRequestsFrom: h.MaxRequestsFrom, CountStatus: h.CountStatus})
	}
	h.zones = append(h.zones, h.Zones...)
	h.afterResponse = false
	defaults := Zone{Key: h.Key, Algorithm: h.Algorithm, CountStatus: h.CountStatus, Cost: h.Cost, CostJSON: h.CostJSON, CostLLM: h.CostLLM, Settle: h.Settle, Wait: h.Wait, TimeZone: h.TimeZone}
	for _, z := range h.zones {
		if err := z.provision(ctx, h.logger, defaults); err != nil {
			return err
		}
		z.prepareHeaders()
		z.bindMetrics()
		h.afterResponse = h.afterResponse || z.followsResponse() || z.units != nil
	}
	return nil
}

// Validate checks the configuration: every rule of zones.go and units.go, on the JSON
// fields. Zero values of optional fields mean their defaults.
func (h *Handler) Validate() error {
	hasDefault := h.Window != 0 || h.MaxRequests != 0 || h.Period != ""
	if !hasDefault && len(h.Zones) == 0 {
		return errors.New("no limit: set window and max_requests, or at least one zone")
	}
	var errs []error
	if hasDefault {
		errs = append(errs, checkWindowOrPeriod(time.Duration(h.Window), h.Period), checkMaxRequests(h.MaxRequests),
			checkPeriod(h.Period, "", time.Duration(h.Window), h.Algorithm, time.Duration(h.Wait)),
			checkCostFits(h.Cost, h.MaxRequests, h.MaxRequestsFrom), checkWait(time.Duration(h.Wait), time.Duration(h.Window), h.Algorithm),
			checkCostJSONFits(h.CostJSON, h.MaxRequests, h.MaxRequestsFrom),
			checkCostLLMFits(h.CostLLM, h.MaxRequests, h.MaxRequestsFrom))
	}
	// Provision has set the defaults of the optional fields.
	errs = append(errs,
		checkPositive("timeout", time.Duration(h.Timeout)),
		checkPrefixBits("ipv4_prefix", h.IPv4Prefix, maxIPv4Prefix),
		checkPrefixBits("ipv6_prefix", h.IPv6Prefix, maxIPv6Prefix),
		checkKeyTemplate(h.Key),
		checkKeyPrefix(h.KeyPrefix),
		failModeEnum.check(h.FailMode),
		headersEnum.check(h.Headers),
		modeEnum.check(h.Mode),
		algorithmEnum.check(h.Algorithm),
		topologyEnum.check(h.RedisTopology),
		checkZoneNames(hasDefault, h.Zones),
		checkCountStatus(h.CountStatus),
		checkCost(h.Cost),
		checkCostJSON(h.CostJSON, h.Cost),
		checkCostLLM(h.CostLLM, h.Cost, h.CostJSON != nil),
		checkSettle(h.Settle),
		checkMaxRequestsFrom(h.MaxRequestsFrom),
		checkWait(time.Duration(h.Wait), 0, ""),
		checkMaxWaiting(h.MaxWaiting),
		checkTimeZoneUsed(h.TimeZone, h.Period, h.Zones),
	)
	if h.MaxRequestsFrom != "" && !hasDefault {
		errs = append(errs, errors.New("max_requests_from needs window and max_requests (its fallback); a zone has its own"))
	}
	for _, z := range h.Zones {
		errs = append(errs, z.validate())
	}
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// Cleanup releases the stores, closing the Redis client when no other
// handler or config uses it.
func (h *Handler) Cleanup() error {
	handlers.remove(h)
	if h.warnings != nil {
		h.warnings.release()
	}
	// Before the stores go: leases of requests still running then expire
	// after their lease time.
	h.leases.stop()
	if h.backend == nil {
		return nil
	}
	return h.backend.close()
}

// Interface guards
var (
	_ caddy.Provisioner           = (*Handler)(nil)
	_ caddy.Validator             = (*Handler)(nil)
	_ caddy.CleanerUpper          = (*Handler)(nil)
	_ caddyhttp.MiddlewareHandler = (*Handler)(nil)
)

// registry is a list of provisioned values, safe for concurrent use. It
// holds the handlers (see handlers) and nothing of theirs: what the admin API
// needs of a handler, it asks the handler and its backend.
type registry[T comparable] struct {
	mu sync.RWMutex
	// items is in order of registration, oldest first.
	items []T
}

func (r *registry[T]) add(v T) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.items = append(r.items, v)
}

// remove drops v and reports whether it was there; it is safe to call more
// than once.
func (r *registry[T]) remove(v T) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	i := slices.Index(r.items, v)
	if i < 0 {
		return false
	}
	r.items = slices.Delete(r.items, i, i+1)
	return true
}

// newestFirst returns the values, the newest first.
func (r *registry[T]) newestFirst() []T {
	r.mu.RLock()
	defer r.mu.RUnlock()
	out := slices.Clone(r.items)
	slices.Reverse(out)
	return out
}
