package slidingratelimit

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
)

// An unnamed zone, the one window and max_requests at the top define, is
// named "default" without the user writing a name, so its identity names
// its site instead of its numbers: the hosts and paths of the top-level
// route around the handler, as in "default@example.com" or
// "default@example.com/api/*". That route is the site's (its addresses),
// or, for the only site of a port that answers every host, whose
// directives the Caddyfile puts at the top of the server, the handler's own
// ("default@/api/*" for sliding_ratelimit /api/*). The same site keeps
// its clients' counts through a reload that changes its numbers, and every
// instance of a fleet, which runs the same config, names it alike, while the
// three lines of another site count apart. A site that answers every host
// (":8080", "http://") has no host to be named by: where the config has
// several servers, the port is what tells it from another such site, and it
// is named by its server ("default@server=srv1"), the one name of a server
// that instances listening on different ports share; where it has one, it
// is "default" alone. A second handler of the three-line form of the same
// site name on a server, a third, ... are other limits
// ("default@example.com~2"). A handler provisioned outside a server has no
// site: "default". Long names, or names holding what a key or the admin
// API's path should not (placeholders, IPv6 brackets, ports), are hashed
// (boundSite).

// implicitZones holds, per config being loaded or running, what its handlers
// with an unnamed zone need of each other: how many of them each top-level
// route holds so far, and the handlers by the state their zone lives in.
var implicitZones = struct {
	mu       sync.Mutex
	byConfig map[any]*configZones
}{byConfig: make(map[any]*configZones)}

// configZones is what implicitZones holds of one config.
type configZones struct {
	// onServer counts the handlers with an unnamed zone provisioned so
	// far for each site name on each server.
	onServer map[serverSite]int
	// byState names the handlers by the state of their unnamed zone.
	byState map[implicitZoneState][]string
}

// serverSite is a site name on a server.
type serverSite struct {
	server *caddyhttp.Server
	site   string
}

// implicitZonesOf returns what implicitZones holds of config, which the end
// of ctx drops. The caller holds implicitZones.mu.
func implicitZonesOf(ctx caddy.Context, config any) *configZones {
	zones, ok := implicitZones.byConfig[config]
	if !ok {
		zones = &configZones{onServer: make(map[serverSite]int), byState: make(map[implicitZoneState][]string)}
		implicitZones.byConfig[config] = zones
		// Provisioning is over when the config is, or failed.
		context.AfterFunc(ctx, func() {
			implicitZones.mu.Lock()
			delete(implicitZones.byConfig, config)
			implicitZones.mu.Unlock()
		})
	}
	return zones
}

// implicitSite names the site of the handler being provisioned for the
// identity of its unnamed zone, and counts the handler in its site: call it
// once per handler with an unnamed zone. Caddy provisions a server's
// top-level routes in order, each with all the handlers and subroutes inside
// it before the next, and drops a route's handler JSON once they are done:
// the route being provisioned is the first that still holds it, and the
// handlers of a server come in the config's order, the same on every
// instance and after a reload of the same config.
func implicitSite(ctx caddy.Context) string {
	app, err := ctx.AppIfConfigured("http")
	srv, ok := ctx.Value(caddyhttp.ServerCtxKey).(*caddyhttp.Server)
	if err != nil || !ok || srv == nil {
		return ""
	}
	route := slices.IndexFunc(srv.Routes, func(r caddyhttp.Route) bool { return r.HandlersRaw != nil })
	var hosts, paths []string
	if route >= 0 {
		hosts, paths = matchedHostsPaths(srv.Routes[route].MatcherSets)
	}
	var site strings.Builder
	switch httpApp, _ := app.(*caddyhttp.App); {
	case len(hosts) > 0:
		for i, h := range hosts {
			hosts[i] = strings.ToLower(h)
		}
		slices.Sort(hosts)
		site.WriteString(strings.Join(slices.Compact(hosts), ","))
	case httpApp != nil && len(httpApp.Servers) > 1:
		site.WriteString("server=" + srv.Name())
	}
	slices.Sort(paths)
	site.WriteString(strings.Join(slices.Compact(paths), ","))

	implicitZones.mu.Lock()
	zones := implicitZonesOf(ctx, app)
	at := serverSite{srv, site.String()}
	zones.onServer[at]++
	n := zones.onServer[at]
	implicitZones.mu.Unlock()
	if n > 1 {
		site.WriteString("~" + strconv.Itoa(n))
	}
	return boundSite(site.String())
}

// maxSiteLen is the longest site name an identity holds as it is.
const maxSiteLen = 64

// boundSite returns a site name fit for an identity: the name itself when it
// is at most maxSiteLen bytes of letters, digits and ".-_*,/=~" (hosts,
// paths, a server's name), so that the Redis key stays short and the admin
// API's path carries it with at most '/' escaped; otherwise '#' and a hash
// of it, as limiter.BoundKey marks a hashed client key.
func boundSite(site string) string {
	plain := len(site) <= maxSiteLen && !strings.ContainsFunc(site, func(c rune) bool {
		return !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.ContainsRune(".-_*,/=~", c))
	})
	if plain {
		return site
	}
	sum := sha256.Sum256([]byte(site))
	return "#" + base64.RawURLEncoding.EncodeToString(sum[:12])
}

// Two handlers of one config share the counts of their unnamed zones when
// their sites have the same name: the same hosts and paths on several
// servers (a site on http:// and https://, or on two ports). That may be
// meant, but nobody said so: Provision warns, once a second handler of a
// config joins the first one's state, naming them.

// implicitZoneState is where an unnamed zone's counts live: the store's
// state (backend.state), the zone identity, and the namespace of its keys
// (address keys never meet value keys, so those zones share nothing).
type implicitZoneState struct {
	store    any
	identity string
	address  bool
}

// warnImplicitSharing records the unnamed zone z of the handler being
// provisioned, whose counts live in store (backend.state), and warns when a
// handler of the same config already keeps its counts in the same state.
// Handlers provisioned outside a config with an http app (no config to
// share in) are not recorded.
func warnImplicitSharing(ctx caddy.Context, logger *zap.Logger, z *Zone, store any) {
	config, err := ctx.AppIfConfigured("http")
	if err != nil {
		return
	}
	state := implicitZoneState{store: store, identity: z.identity, address: z.key.Address != ""}

	implicitZones.mu.Lock()
	zones := implicitZonesOf(ctx, config)
	names := append(zones.byState[state], handlerPlace(ctx))
	zones.byState[state] = names
	names = append([]string(nil), names...)
	implicitZones.mu.Unlock()

	if len(names) > 1 {
		logger.Warn("these handlers share one limit that none of them names: each has window and max_requests at the top, "+
			"which make a zone named \"default\" after its site, and their sites have the same hosts and paths (on several servers), "+
			"so a client's requests to any of them count together. "+
			"To share it on purpose, give the zone the same name in each (zone <name> <window> <max_requests>); "+
			"to count apart, give each zone a name of its own",
			zap.Strings("handlers", names), zap.String("zone", z.identity))
	}
}

// handlerPlace names the handler being provisioned for a person, as far as
// a handler can see where it sits: its server, and the hosts and paths that
// the server's top-level route around it matches (see implicitSite).
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
	hosts, paths := matchedHostsPaths(sets)
	var parts []string
	if len(hosts) > 0 {
		parts = append(parts, "host "+strings.Join(hosts, " "))
	}
	if len(paths) > 0 {
		parts = append(parts, "path "+strings.Join(paths, " "))
	}
	return strings.Join(parts, ", ")
}

// matchedHostsPaths returns the hosts and paths that a route's host and path
// matchers match, as they are written.
func matchedHostsPaths(sets caddyhttp.MatcherSets) (hosts, paths []string) {
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
	return hosts, paths
}
