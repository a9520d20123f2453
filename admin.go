package slidingratelimit

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/adminapi"
	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/redisconn"
	"github.com/slidingratelimit/caddy-sliding-ratelimit/limiter"
)

func init() {
	caddy.RegisterModule(AdminAPI{})
}

// AdminAPI serves /sliding_ratelimit/ on Caddy's admin endpoint:
//
//	GET    /sliding_ratelimit/zones                     the zones of the running handlers
//	GET    /sliding_ratelimit/zones/{zone}/keys/{key}   a client's state, as JSON
//	DELETE /sliding_ratelimit/zones/{zone}/keys/{key}   reset the client, everywhere
//	GET    /sliding_ratelimit/blocked[?limit=N]         the clients held as blocked here
//
// The paths say {zone} and {key}, not <zone>: Caddy writes an error's
// message in JSON, which would show '<' as \u003c.
//
// {zone} is a zone's name, or its identity ("default@example.com",
// "login:401", see zoneIdentity), percent-encoded ('/' of a site's path is
// %2F, '#' of a hashed site %23), where handlers have zones of that name in
// different states: the unnamed zones of several sites, or zones of one name
// with another algorithm, count_status or settle. Then the name alone is
// ambiguous and answered with 409 Conflict, which lists the identities.
//
// {key} is the client key: everything after /keys/, so it may hold '/'.
// Percent-encode '%', '?', '#', and a '/' or '.' that would make "//", "/./"
// or "/../" (the admin server cleans such paths). An address is grouped as
// the handler's keys are, so 2001:db8::1 addresses 2001:db8::/64 with the
// default ipv6_prefix. In a zone keyed by request values, a key that is not
// an address is a value ("Bearer abc"); an address there means the client
// address a key fell back to, and "=" before a value addresses a value that
// looks like an address. A hashed key ("#...") is taken as it is. Every
// key this API prints is text that JSON carries as it is, so it can be
// passed back: a key that is not valid UTF-8 is stored, listed and answered
// as its hash (see limiter.BoundKey), and its raw bytes, percent-encoded,
// name it too.
//
// One zone may belong to several handlers (sites that share it, or the old
// and the new config during a reload). GET answers from the newest; DELETE
// resets the key in every store those handlers use, drops it from their deny
// caches, and announces it through Redis so that every other instance drops
// it from theirs (see internal/redisconn).
//
// The blocked list is what this instance's deny caches hold: the clients a
// store denied whose wait has not ended, the longest wait first, at most
// limit of them (default 100). It costs no store call, so it does not show
// clients blocked only on other instances, nor clients whose denial has not
// reached this instance yet.
type AdminAPI struct {
	logger *zap.Logger
}

// CaddyModule returns the Caddy module information.
func (AdminAPI) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "admin.api.sliding_ratelimit",
		New: func() caddy.Module { return new(AdminAPI) },
	}
}

// Provision sets up the logger.
func (a *AdminAPI) Provision(ctx caddy.Context) error {
	a.logger = ctx.Logger()
	return nil
}

// Routes returns the routes of the /sliding_ratelimit/ endpoint.
func (a *AdminAPI) Routes() []caddy.AdminRoute {
	return []caddy.AdminRoute{
		{Pattern: "/sliding_ratelimit/", Handler: caddy.AdminHandlerFunc(a.serveKey)},
		{Pattern: adminapi.BlockedPath, Handler: caddy.AdminHandlerFunc(a.serveBlocked)},
		{Pattern: adminapi.ZonesPath, Handler: caddy.AdminHandlerFunc(a.serveZones)},
	}
}

func (a *AdminAPI) serveKey(w http.ResponseWriter, r *http.Request) error {
	zoneName, rawKey, err := parseKeyPath(r.URL.EscapedPath())
	if err != nil {
		return caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: err}
	}
	if r.Method != http.MethodGet && r.Method != http.MethodDelete {
		w.Header().Set("Allow", "GET, DELETE")
		return caddy.APIError{
			HTTPStatus: http.StatusMethodNotAllowed,
			Err:        fmt.Errorf("method %s not allowed: use GET or DELETE", r.Method),
		}
	}
	hs, zones := withZone(zoneName)
	if len(hs) == 0 {
		return caddy.APIError{
			HTTPStatus: http.StatusNotFound,
			Err:        fmt.Errorf("unknown zone %.64q: no sliding_ratelimit handler has a zone of that name; %s", zoneName, zoneNamesHint()),
		}
	}
	if ids := identities(zones); len(ids) > 1 {
		return caddy.APIError{
			HTTPStatus: http.StatusConflict,
			Err: fmt.Errorf("zone %s is ambiguous: handlers have zones of that name that count apart (other sites, or another algorithm, count_status or settle): %s; name one of them in the path instead of %s",
				zoneName, strings.Join(ids, ", "), zoneName),
		}
	}
	if r.Method == http.MethodGet {
		return a.peek(w, r, hs, zones, rawKey)
	}
	return a.reset(w, r, hs, zones, rawKey)
}

// withZone returns the handlers that have a zone of that name or identity,
// newest first, with the zone of each.
func withZone(name string) ([]*Handler, []*Zone) {
	var hs []*Handler
	var zones []*Zone
	for _, h := range handlers.newestFirst() {
		for _, z := range h.zones {
			if z.Name == name || z.identity == name {
				hs = append(hs, h)
				zones = append(zones, z)
			}
		}
	}
	return hs, zones
}

// identities returns the distinct identities of zones, in order.
func identities(zones []*Zone) []string {
	var ids []string
	for _, z := range zones {
		if !slices.Contains(ids, z.identity) {
			ids = append(ids, z.identity)
		}
	}
	return ids
}

// parseKeyPath returns the zone and the client key of an escaped path of the
// form adminapi.KeyPath. The key is everything after /keys/, so it may hold '/'.
func parseKeyPath(escaped string) (zone, key string, err error) {
	rest, ok := strings.CutPrefix(escaped, "/sliding_ratelimit/zones/")
	rawZone, rawKey, found := strings.Cut(rest, "/keys/")
	if !ok || !found || rawZone == "" || strings.Contains(rawZone, "/") || rawKey == "" {
		return "", "", fmt.Errorf("malformed path: want %s, %s or %s", adminapi.KeyPath, adminapi.ZonesPath, adminapi.BlockedPath)
	}
	if zone, err = url.PathUnescape(rawZone); err != nil {
		return "", "", fmt.Errorf("malformed zone in path: %v", err)
	}
	if key, err = url.PathUnescape(rawKey); err != nil {
		return "", "", fmt.Errorf("malformed key in path: %v", err)
	}
	return zone, key, nil
}

// peek answers GET from the store of the newest of the handlers with the
// zone, recording nothing.
func (a *AdminAPI) peek(w http.ResponseWriter, r *http.Request, hs []*Handler, zones []*Zone, rawKey string) error {
	h, z := hs[0], zones[0]
	key := z.key.StoredKey(rawKey, h.IPv4Prefix, h.IPv6Prefix)
	now := periodNow()
	check := limiter.Check{Zone: z.state(now), Key: key, Limit: z.limit, Wait: z.wait}
	if z.units != nil {
		// The times say when a request of the zone's fixed cost goes.
		check.Cost = z.units.cost.fixed
	}
	d, used, err := h.backend.peek(r.Context(), check)
	limit, source := z.limit.Max, ""
	if z.MaxRequestsFrom != "" && err == nil {
		// Each tenant has its own max: count against the one its last
		// admission was decided with, when the store knows it.
		source = "fallback"
		if d.LastMax > 0 {
			limit, source = d.LastMax, "last_decision"
			if d.LastMax != check.Limit.Max {
				check.Limit.Max = d.LastMax
				d, used, err = h.backend.peek(r.Context(), check)
			}
		}
	}
	if err != nil {
		return caddy.APIError{
			HTTPStatus: http.StatusServiceUnavailable,
			Err:        fmt.Errorf("zone %s: reading the client's state: %w", z.Name, err),
		}
	}
	decisions := []limiter.Decision{d}
	leaseAnswers([]*Zone{z}, decisions)
	d = decisions[0]
	state := adminapi.KeyState{
		Zone:              z.Name,
		Identity:          z.identity,
		Key:               key,
		Limit:             limit,
		LimitFrom:         z.MaxRequestsFrom,
		LimitSource:       source,
		WindowSeconds:     milliseconds(z.limit.Window),
		Algorithm:         z.limit.Algorithm.String(),
		Unit:              z.unit(),
		Count:             used,
		Remaining:         d.Remaining,
		Tokens:            z.countsTokens(),
		ResetSeconds:      milliseconds(d.Reset),
		RetryAfterSeconds: milliseconds(d.RetryAfter),
		Period:            z.periodInfo(now),
	}
	if state.Period != nil {
		state.WindowSeconds = state.Period.Seconds
	}
	if z.keepsReservations() {
		// Read after the count: a call that ends meanwhile counts as
		// spent, one that starts is not in the count, hence the min.
		reserved := min(reservedHere(hs, zones, rawKey, check.Zone, key), max(used, 0))
		spent := used - reserved
		state.Reserved, state.Spent = &reserved, &spent
	}
	if state.Unit == unitUSDMicros {
		state.UsedUSD, state.LeftUSD, state.LimitUSD = formatMicros(used), formatMicros(d.Remaining), formatMicros(limit)
		if state.Reserved != nil {
			state.ReservedUSD, state.SpentUSD = formatMicros(*state.Reserved), formatMicros(*state.Spent)
		}
	}
	if z.wait > 0 {
		wait := milliseconds(d.Delay)
		state.WaitSeconds = &wait
	}
	if z.limit.Algorithm == limiter.Concurrency {
		held, here := state.Count, h.leases.held(z.identity, key)
		state.LeasesHeld, state.LeasesHeldHere = &held, &here
	}
	return writeJSON(w, http.StatusOK, state)
}

// reservedHere sums the reservations that the calls running through the
// handlers hold in the zone's state (state: its identity, or its period's)
// for the client key hs[0] stores rawKey as: of every handler with the zone
// that keeps it in the same store under the same key (sites that share the
// zone, the old config during a reload).
func reservedHere(hs []*Handler, zones []*Zone, rawKey, state, key string) int64 {
	var n int64
	for i, h := range hs {
		if h.backend.state() == hs[0].backend.state() && zones[i].key.StoredKey(rawKey, h.IPv4Prefix, h.IPv6Prefix) == key {
			n += h.leases.reserved(state, key)
		}
	}
	return n
}

// countsTokens reports whether the zone's units are the tokens of LLM API
// calls: it reads them (cost llm, settle llm) and has no prices.
func (z *Zone) countsTokens() bool {
	u := z.units
	return z.unit() == unitUnits && (u.cost.llm != nil || u.settle != nil && u.settle.LLM)
}

// milliseconds is d in seconds, rounded to the millisecond, so that JSON
// shows 59.9 rather than 59.899483000000004.
func milliseconds(d time.Duration) float64 {
	return float64(d.Round(time.Millisecond).Milliseconds()) / 1000
}

// reset answers DELETE: it resets the key through the backend of every
// handler with the zone, each distinct store once, then announces it to the
// other instances.
func (a *AdminAPI) reset(w http.ResponseWriter, r *http.Request, hs []*Handler, zones []*Zone, rawKey string) error {
	// A period zone's client is reset in the period that holds now.
	zone, identity := zones[0].Name, zones[0].state(periodNow())
	var keys []string
	var announce []*announcement
	var errs []error
	done := make(resetDone)
	for i, h := range hs {
		key := zones[i].key.StoredKey(rawKey, h.IPv4Prefix, h.IPv6Prefix)
		keys = append(keys, key)
		an, err := h.backend.reset(r.Context(), identity, key, done)
		if err != nil {
			errs = append(errs, fmt.Errorf("zone %s: resetting the client: %w", zone, err))
		}
		if an != nil {
			announce = append(announce, an)
		}
	}
	if len(errs) > 0 {
		return caddy.APIError{HTTPStatus: http.StatusServiceUnavailable, Err: errors.Join(errs...)}
	}
	answer := adminapi.ResetAnswer{Reset: true, Zone: zone, Key: keys[0]}
	if failed := a.announce(r.Context(), zone, announce); len(failed) > 0 {
		// The reset is applied: only the other instances' deny caches
		// were not told (a user without the channel's right, say).
		answer.Unannounced = errors.Join(failed...).Error()
		a.log().Warn("client reset, but announcing it to the other instances failed: their deny caches may refuse the client until its wait ends",
			zap.String("zone", zone), zap.Error(errors.Join(failed...)))
	}
	a.log().Info("client reset", zap.String("zone", zone), zap.Int("handlers", len(hs)), zap.Int("announced", len(announce)))
	return writeJSON(w, http.StatusOK, answer)
}

// announce tells the other instances of the resets, warning when this
// instance's own subscriber does not hear one.
func (a *AdminAPI) announce(ctx context.Context, zone string, announce []*announcement) []error {
	var errs []error
	for _, an := range announce {
		echoed, err := an.send(ctx)
		if err != nil {
			errs = append(errs, fmt.Errorf("zone %s: %w", zone, err))
			continue
		}
		if !echoed {
			a.log().Warn("reset announced, but this instance's subscriber did not receive it in time: other instances may be disconnected from redis pub/sub too, and keep denying the client from their caches until its retry time",
				zap.String("zone", zone), zap.Duration("waited", redisconn.EchoTimeout))
		}
	}
	return errs
}

// serveBlocked answers GET /sliding_ratelimit/blocked from the deny caches
// of every handler, without a store call.
func (a *AdminAPI) serveBlocked(w http.ResponseWriter, r *http.Request) error {
	if r.Method != http.MethodGet {
		w.Header().Set("Allow", "GET")
		return caddy.APIError{
			HTTPStatus: http.StatusMethodNotAllowed,
			Err:        fmt.Errorf("method %s not allowed: use GET", r.Method),
		}
	}
	limit := adminapi.BlockedDefaultLimit
	if raw := r.URL.Query().Get("limit"); raw != "" {
		n, err := strconv.Atoi(raw)
		if err != nil || n < 0 {
			return caddy.APIError{
				HTTPStatus: http.StatusBadRequest,
				Err:        fmt.Errorf("limit must be a whole number of at least 0, not %.32q", raw),
			}
		}
		limit = n
	}
	return writeJSON(w, http.StatusOK, blockedClients(handlers.newestFirst(), limit))
}

// blockedClients lists the clients the handlers' deny caches hold, the
// longest wait first, at most limit. A client that several handlers hold in
// zones of the same identity (sites that share a zone, or the old and the
// new config during a reload) is listed once, with its longest wait, and
// counted once if it is among the first limit of each of those handlers;
// otherwise it may be counted once per handler.
func blockedClients(handlers []*Handler, limit int) adminapi.BlockedAnswer {
	answer := adminapi.BlockedAnswer{Blocked: []adminapi.BlockedClient{}}
	type clientInZone struct{ identity, key string }
	seen := make(map[clientInZone]int) // index in answer.Blocked
	for _, h := range handlers {
		denied, total := h.backend.blocked(limit)
		answer.Count += total
		for _, d := range denied {
			id := clientInZone{d.Zone, d.Key}
			wait := milliseconds(d.RetryAfter)
			if i, ok := seen[id]; ok {
				answer.Count--
				answer.Blocked[i].RetryAfterSeconds = max(answer.Blocked[i].RetryAfterSeconds, wait)
				continue
			}
			name := d.Zone
			identity := h.backend.periods.base(d.Zone)
			if i := slices.IndexFunc(h.zones, func(z *Zone) bool { return z.identity == identity }); i >= 0 {
				name = h.zones[i].Name
			}
			seen[id] = len(answer.Blocked)
			answer.Blocked = append(answer.Blocked, adminapi.BlockedClient{Zone: name, Identity: identity, Key: d.Key, RetryAfterSeconds: wait})
		}
	}
	slices.SortStableFunc(answer.Blocked, func(a, b adminapi.BlockedClient) int {
		if c := cmp.Compare(b.RetryAfterSeconds, a.RetryAfterSeconds); c != 0 {
			return c
		}
		return cmp.Or(strings.Compare(a.Identity, b.Identity), strings.Compare(a.Key, b.Key))
	})
	answer.Blocked = answer.Blocked[:min(len(answer.Blocked), limit)]
	return answer
}

func (a *AdminAPI) log() *zap.Logger {
	if a.logger == nil {
		return caddy.Log().Named("admin.api.sliding_ratelimit")
	}
	return a.logger
}

func writeJSON(w http.ResponseWriter, status int, v any) error {
	body, err := json.Marshal(v)
	if err != nil {
		return caddy.APIError{HTTPStatus: http.StatusInternalServerError, Err: err}
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	// An error here means the client is gone; there is nobody to tell.
	_, _ = w.Write(append(body, '\n'))
	return nil
}

// serveZones answers GET adminapi.ZonesPath.
func (a *AdminAPI) serveZones(w http.ResponseWriter, r *http.Request) error {
	if r.Method != http.MethodGet {
		w.Header().Set("Allow", "GET")
		return caddy.APIError{
			HTTPStatus: http.StatusMethodNotAllowed,
			Err:        fmt.Errorf("method %s not allowed: use GET", r.Method),
		}
	}
	return writeJSON(w, http.StatusOK, adminapi.ZonesAnswer{Zones: listZones(handlers.newestFirst())})
}

// listZones returns the zones of the handlers, one per identity, by name.
func listZones(hs []*Handler) []adminapi.ZoneInfo {
	zones := []adminapi.ZoneInfo{}
	for _, h := range hs {
		for _, z := range h.zones {
			if i := slices.IndexFunc(zones, func(info adminapi.ZoneInfo) bool { return info.Identity == z.identity }); i >= 0 {
				zones[i].Handlers++
				continue
			}
			info := adminapi.ZoneInfo{
				Name:      z.Name,
				Identity:  z.identity,
				Limit:     z.limit.Max,
				LimitFrom: z.MaxRequestsFrom,
				Algorithm: z.limit.Algorithm.String(),
				Unit:      z.unit(),
				Key:       z.key.Raw,
				Handlers:  1,
			}
			if z.limit.Algorithm != limiter.Concurrency {
				info.WindowSeconds = milliseconds(z.limit.Window)
			}
			if info.Period = z.periodInfo(periodNow()); info.Period != nil {
				info.WindowSeconds = info.Period.Seconds
			}
			if z.wait > 0 {
				info.WaitSeconds = milliseconds(z.wait)
			}
			if info.Unit == unitUSDMicros {
				info.LimitUSD = formatMicros(info.Limit)
			}
			zones = append(zones, info)
		}
	}
	slices.SortStableFunc(zones, func(a, b adminapi.ZoneInfo) int {
		return cmp.Or(strings.Compare(a.Name, b.Name), strings.Compare(a.Identity, b.Identity))
	})
	return zones
}

// zoneNamesHint lists the names of the running zones for an error about
// one that is not among them.
func zoneNamesHint() string {
	var names []string
	for _, info := range listZones(handlers.newestFirst()) {
		if !slices.Contains(names, info.Name) {
			names = append(names, info.Name)
		}
	}
	if len(names) == 0 {
		return "no sliding_ratelimit handler is running"
	}
	return "the zones are " + strings.Join(names, ", ")
}

// Interface guards
var (
	_ caddy.AdminRouter = (*AdminAPI)(nil)
	_ caddy.Provisioner = (*AdminAPI)(nil)
)
