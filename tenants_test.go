package slidingratelimit

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/adminapi"
)

// authService is a real HTTP auth service for forward_auth: it knows each
// bearer token's tenant and quota, answers 200 with X-Tenant and X-Quota
// (none for a tenant without a quota), and 401 to any other token.
type authService struct {
	mu     sync.Mutex
	quotas map[string]string // token -> quota; "" for none
	url    string
}

func newAuthService(t *testing.T, quotas map[string]string) *authService {
	a := &authService{quotas: quotas}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		token, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		a.mu.Lock()
		quota, ok := a.quotas[token]
		a.mu.Unlock()
		if !ok {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		w.Header().Set("X-Tenant", token)
		if quota != "" {
			w.Header().Set("X-Quota", quota)
		}
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(srv.Close)
	a.url = strings.TrimPrefix(srv.URL, "http://")
	return a
}

func (a *authService) setQuota(token, quota string) {
	a.mu.Lock()
	a.quotas[token] = quota
	a.mu.Unlock()
}

// TestTenantsRecipe is the recipe of docs/tenants.md, with smaller quotas:
// forward_auth asks a real auth service for each tenant's quota, copies it
// into X-Quota (deleting the client's own first), and the zone holds each
// tenant to it. A client's own X-Quota changes nothing; a tenant without a
// quota gets the fallback, never "unlimited", counted in the metric; a quota
// that changes keeps the tenant's window.
func TestTenantsRecipe(t *testing.T) {
	auth := newAuthService(t, map[string]string{"gold": "5", "free": "2", "new": ""})
	app := usageUpstream(t)
	zone := uniqueZone("tenants")
	startCaddy(t, `
:9080 {
	route /api/* {
		forward_auth `+auth.url+` {
			uri /check
			copy_headers X-Tenant X-Quota
		}
		sliding_ratelimit {
			zone `+zone+` 1h {http.reverse_proxy.header.X-Quota} 3 {
				key {http.reverse_proxy.header.X-Tenant}
			}
			redis `+sharedRedis.URL()+`
			key_prefix `+uniquePrefix(t)+`
		}
		reverse_proxy `+app+`
	}
}`)
	api := site + "api/report"
	forged := withHeader("X-Quota", "1000")
	for _, c := range []struct {
		token    string
		admitted int
		quota    string
	}{
		{"gold", 5, "5"},
		{"free", 2, "2"},
		// No quota from the auth service: the client's own is deleted, and
		// the fallback applies.
		{"new", 3, "3"},
	} {
		bearer := withHeader("Authorization", "Bearer "+c.token)
		for i := 1; i <= c.admitted+1; i++ {
			res := send(t, api, from("127.0.0.2"), bearer, forged)
			want := http.StatusOK
			if i > c.admitted {
				want = http.StatusTooManyRequests
			}
			if res.status != want {
				t.Errorf("%s, request %d: status %d, want %d", c.token, i, res.status, want)
			}
			if policy, want := res.header.Get("RateLimit-Policy"), fmt.Sprintf(`"%s";q=%s;w=3600`, zone, c.quota); policy != want {
				t.Errorf("%s: RateLimit-Policy %q, want %q", c.token, policy, want)
			}
		}
	}
	if got := testutil.ToFloat64(limiterMetrics.quotaFallbacks.WithLabelValues(zone)); got != 4 {
		t.Errorf("max_requests_fallbacks_total %v, want 4: the requests of the tenant without a quota", got)
	}
	expect(t, "a token the auth service refuses", api, []int{401}, from("127.0.0.2"), withHeader("Authorization", "Bearer forged"), forged)

	// A raised quota keeps the window: gold has used 5, so 7 leaves 2.
	auth.setQuota("gold", "7")
	expect(t, "gold with its quota raised to 7", api, []int{200, 200, 429}, from("127.0.0.3"), withHeader("Authorization", "Bearer gold"))
	if s := adminState(t, zone, "gold"); s.Identity != zone+":1h:per-tenant" || s.Count != 7 || s.Limit != 7 || s.Remaining != 0 ||
		s.LimitFrom != "{http.reverse_proxy.header.X-Quota}" || s.LimitSource != "last_decision" {
		t.Errorf("admin state of gold %+v, want identity %s:1h:per-tenant, count 7, limit 7 (its last admission's) from the placeholder, remaining 0", s, zone)
	}
}

// TestAdminShowsTenantQuota: through Caddy and Redis, the admin API and
// `status` count a tenant's state against its own quota (from forward_auth),
// the max its last admission was decided with, not the zone's fallback; a
// client never admitted shows the fallback and says so.
func TestAdminShowsTenantQuota(t *testing.T) {
	auth := newAuthService(t, map[string]string{"small": "3"})
	zone := uniqueZone("tenantquota")
	startCaddy(t, `
:9080 {
	route /api/* {
		forward_auth `+auth.url+` {
			uri /check
			copy_headers X-Tenant X-Quota
		}
		sliding_ratelimit {
			zone `+zone+` 1h {http.reverse_proxy.header.X-Quota} 1000 {
				key {http.reverse_proxy.header.X-Tenant}
			}
			redis `+sharedRedis.URL()+`
			key_prefix `+uniquePrefix(t)+`
		}
		respond "ok"
	}
}`)
	expect(t, "small, quota 3", site+"api/x", []int{200, 200, 200, 429}, from("127.0.0.2"), withHeader("Authorization", "Bearer small"))
	s := adminState(t, zone, "small")
	if s.Limit != 3 || s.LimitSource != "last_decision" || s.Count != 3 || s.Remaining != 0 || s.RetryAfterSeconds < 3000 || s.RetryAfterSeconds > 3600 {
		t.Errorf("admin state of small %+v, want limit 3 from its last decision, count 3, remaining 0, retry after about 3600s", s)
	}
	out, err := runCommand(t, "status", "--zone", zone, "--key", "small", "--address", "localhost:2999")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 5 || !strings.Contains(strings.Join(strings.Fields(lines[1]), " "), " =small 3 0 requests ") ||
		strings.HasSuffix(lines[1], " 0s") || strings.Join(strings.Fields(lines[3]), " ") != "LIMIT FROM SOURCE" ||
		strings.Join(strings.Fields(lines[4]), " ") != "3 {http.reverse_proxy.header.X-Quota} last_decision" {
		t.Errorf("status of small printed:\n%s", out)
	}
	if b := commandJSON[adminapi.BlockedAnswer](t, "blocked"); b.Count != 1 || b.Blocked[0].Key != "=small" {
		t.Errorf("blocked: %+v, want small", b)
	}

	s = adminState(t, zone, "nobody")
	if s.Limit != 1000 || s.LimitSource != "fallback" || s.Count != 0 || s.Remaining != 1000 || s.RetryAfterSeconds != 0 {
		t.Errorf("admin state of a client never admitted %+v, want limit 1000, the fallback, remaining 1000", s)
	}
	out, err = runCommand(t, "status", "--zone", zone, "--key", "nobody", "--address", "localhost:2999")
	if err != nil {
		t.Fatal(err)
	}
	if lines := strings.Split(strings.TrimSpace(out), "\n"); len(lines) != 5 ||
		strings.Join(strings.Fields(lines[4]), " ") != "1000 {http.reverse_proxy.header.X-Quota} fallback" {
		t.Errorf("status of nobody printed:\n%s", out)
	}
}

// TestQuotaValues: through Caddy and Redis, a max_requests placeholder's
// values that are no whole number from 1 to 2^48-1 get the fallback, each
// counted; a repeated header counts by its first value. (Here the client
// sets the header itself, which is why docs/tenants.md takes it from
// forward_auth.)
func TestQuotaValues(t *testing.T) {
	zone := uniqueZone("quota")
	startCaddy(t, `
:9080 {
	sliding_ratelimit {
		zone `+zone+` 1m {http.request.header.X-Quota} 2 {
			key {http.request.header.X-Client}
		}
		redis `+sharedRedis.URL()+`
		key_prefix `+uniquePrefix(t)+`
	}
	respond "ok"
}`)
	fallbacks := 0
	for _, c := range []struct {
		name   string
		values []string
		q      string
	}{
		{"missing", nil, "2"},
		{"empty", []string{""}, "2"},
		{"zero", []string{"0"}, "2"},
		{"negative", []string{"-10"}, "2"},
		{"word", []string{"unlimited"}, "2"},
		{"exponent", []string{"1e3"}, "2"},
		{"beyond the engine", []string{"281474976710656"}, "2"},
		{"enormous", []string{"99999999999999999999"}, "2"},
		{"ten", []string{"10"}, "10"},
		{"repeated", []string{"4", "1000"}, "4"},
	} {
		res := send(t, site, withHeader("X-Client", c.name), withHeader("X-Quota", c.values...))
		if got, want := res.header.Get("RateLimit-Policy"), `"`+zone+`";q=`+c.q+";w=60"; got != want {
			t.Errorf("%s %q: RateLimit-Policy %q, want %q", c.name, c.values, got, want)
		}
		if c.q == "2" {
			fallbacks++
		}
	}
	if got := testutil.ToFloat64(limiterMetrics.quotaFallbacks.WithLabelValues(zone)); got != float64(fallbacks) {
		t.Errorf("max_requests_fallbacks_total %v, want %d", got, fallbacks)
	}
}
