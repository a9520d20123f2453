package slidingratelimit

import (
	"context"
	"strconv"
	"strings"
	"sync"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
)

// Two handlers whose zones have the same identity share their clients'
// counts: that is how the instances of one site share a limit, and how sites
// share one on purpose (a zone of the same name and limit in each). But the
// zone of the three-line form (window and max_requests at the top) is named
// "default" without the user writing a name, so two sites of one config
// with the same three lines share a budget by surprise: a client's first
// request to the second site can be answered 429. Provision warns, once a
// second handler of a config joins the first one's state, naming them.

// implicitZones holds, per config being loaded or running, the handlers
// with an implicit zone, by the state that zone lives in.
var implicitZones = struct {
	mu       sync.Mutex
	byConfig map[any]map[implicitZoneState][]string
}{byConfig: make(map[any]map[implicitZoneState][]string)}

// implicitZoneState is where an implicit zone's counts live: the store's
// state (backend.state), the zone identity, and the namespace of its keys
// (address keys never meet value keys, so those zones share nothing).
type implicitZoneState struct {
	store    any
	identity string
	address  bool
}

// warnImplicitSharing records the implicit zone z of the handler being
// provisioned, whose counts live in store (backend.state), and warns when a
// handler of the same config already keeps its counts in the same state.
// Handlers provisioned outside a config with an http app (no config to
// share in) are not recorded.
func warnImplicitSharing(ctx caddy.Context, logger *zap.Logger, z *Zone, store any) {
	config, err := ctx.AppIfConfigured("http")
	if err != nil {
		return
	}
	state := implicitZoneState{store: store, identity: z.identity, address: z.key.address != ""}
	name := handlerPlace(ctx)

	implicitZones.mu.Lock()
	configZones, ok := implicitZones.byConfig[config]
	if !ok {
		configZones = make(map[implicitZoneState][]string)
		implicitZones.byConfig[config] = configZones
		// Provisioning is over when the config is, or failed.
		context.AfterFunc(ctx, func() {
			implicitZones.mu.Lock()
			delete(implicitZones.byConfig, config)
			implicitZones.mu.Unlock()
		})
	}
	names := configZones[state]
	if placeTaken(names, name) {
		name += " #" + strconv.Itoa(len(names)+1)
	}
	names = append(names, name)
	configZones[state] = names
	names = append([]string(nil), names...)
	implicitZones.mu.Unlock()

	if len(names) > 1 {
		logger.Warn("these handlers share one limit that none of them names: each has window and max_requests at the top, "+
			"which make a zone named \"default\" with the same limit, so a client's requests to any of them count together. "+
			"To share it on purpose, give the zone the same name in each (zone <name> <window> <max_requests>); "+
			"to count apart, give each zone a name of its own",
			zap.Strings("handlers", names), zap.String("zone", z.identity))
	}
}

// placeTaken reports whether a place is among names, numbered or not: two
// handlers in one route get the same place.
func placeTaken(names []string, place string) bool {
	for _, n := range names {
		if n == place || strings.HasPrefix(n, place+" #") {
			return true
		}
	}
	return false
}

// handlerPlace names the handler being provisioned by where it sits, as far
// as a handler can see it: its server, and the hosts and paths that the
// server's top-level route around it matches (a Caddyfile site's addresses).
// Caddy provisions a server's top-level routes in order, each with all the
// handlers and subroutes inside it before the next, and drops a route's
// handler JSON once they are done: the route being provisioned is the first
// that still holds it.
func handlerPlace(ctx caddy.Context) string {
	srv, ok := ctx.Value(caddyhttp.ServerCtxKey).(*caddyhttp.Server)
	if !ok || srv == nil {
		return "a sliding_ratelimit handler"
	}
	place := "server " + srv.Name()
	for _, route := range srv.Routes {
		if route.HandlersRaw == nil {
			continue
		}
		if m := describeMatchers(route.MatcherSets); m != "" {
			place += ", " + m
		}
		break
	}
	return place
}

// describeMatchers lists the host and path matchers of a route, as in
// "host a.example b.example, path /api/*".
func describeMatchers(sets caddyhttp.MatcherSets) string {
	var hosts, paths []string
	for _, set := range sets {
		for _, m := range set {
			switch m := m.(type) {
			case *caddyhttp.MatchHost:
				hosts = append(hosts, *m...)
			case caddyhttp.MatchHost:
				hosts = append(hosts, m...)
			case *caddyhttp.MatchPath:
				paths = append(paths, *m...)
			case caddyhttp.MatchPath:
				paths = append(paths, m...)
			}
		}
	}
	var parts []string
	if len(hosts) > 0 {
		parts = append(parts, "host "+strings.Join(hosts, " "))
	}
	if len(paths) > 0 {
		parts = append(parts, "path "+strings.Join(paths, " "))
	}
	return strings.Join(parts, ", ")
}
