package slidingratelimit

import (
	"net/http"
	"strconv"
	"sync"
	"testing"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// TestUnitsExactAcrossInstances: two real clients (127.0.0.2, 127.0.0.3)
// each send 40 requests at once with costs of 1 to 9, half to the Caddy and
// half to a second instance on the same Redis. Whatever the interleaving,
// the units admitted to each client never exceed its budget of 60, and are
// exactly what Redis holds for it; the other client's spending changes
// nothing.
func TestUnitsExactAcrossInstances(t *testing.T) {
	prefix := uniquePrefix(t)
	zone := uniqueZone("exact")
	startCaddy(t, `
:9080 {
	sliding_ratelimit {
		zone `+zone+` 10m 60 {
			cost {http.request.header.X-Cost}
		}
		redis `+sharedRedis.URL()+`
		key_prefix `+prefix+`
		timeout 1s
	}
	respond "ok"
}`)
	other := newInstance(t, `{"zones": [{"name": "`+zone+`", "window": "10m", "max_requests": 60, "cost": "{http.request.header.X-Cost}"}],
		"redis": "`+sharedRedis.URL()+`?client_name=other", "key_prefix": "`+prefix+`", "timeout": "1s"}`)
	type result struct{ admitted, denied int64 }
	// Every entry is made before any request goes: the map is only read
	// while they run.
	results := map[string]*result{"127.0.0.2": new(result), "127.0.0.3": new(result)}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for ip := range results {
		for i := range 40 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				cost := 1 + i%9
				opts := []sendOption{from(ip), withHeader("X-Cost", strconv.Itoa(cost))}
				if i%2 == 1 {
					opts = append(opts, to(other))
				}
				status := send(t, site, opts...).status
				mu.Lock()
				defer mu.Unlock()
				switch status {
				case http.StatusOK:
					results[ip].admitted += int64(cost)
				case http.StatusTooManyRequests:
					results[ip].denied++
				default:
					t.Errorf("%s, cost %d: status %d", ip, cost, status)
				}
			}()
		}
	}
	wg.Wait()
	for ip, r := range results {
		if r.admitted > 60 || r.denied == 0 {
			t.Errorf("%s: %d units admitted with %d denials, want at most 60, and denials (200 units asked)", ip, r.admitted, r.denied)
		}
		if held := unitsHeld(t, other, zone, ip); held != r.admitted {
			t.Errorf("%s: Redis holds %d units, the answers admitted %d", ip, held, r.admitted)
		}
	}
}

// TestSettledUnitsAcrossInstances: a client alternates between two
// instances on one Redis, each request reserving 1 unit and settled to the
// 7 units its response reports. It is admitted while its window holds less
// than the budget of 60, so it pays for 63 (the last request's overrun is
// all it gets past the budget), and both instances then deny it.
func TestSettledUnitsAcrossInstances(t *testing.T) {
	prefix := uniquePrefix(t)
	zone := uniqueZone("settled")
	config := `{"zones": [{"name": "` + zone + `", "window": "10m", "max_requests": 60, "settle": {"header": "X-Usage"}}],
		"redis": "` + sharedRedis.URL() + `", "key_prefix": "` + prefix + `", "timeout": "1s"}`
	instances := []*instance{newInstance(t, config), newInstance(t, config[:len(config)-1]+`, "redis": "`+sharedRedis.URL()+`?client_name=b"}`)}
	usage := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		w.Header().Set("X-Usage", "7")
		w.WriteHeader(http.StatusOK)
		return nil
	})
	admitted := 0
	for i := range 12 {
		if send(t, "/", to(instances[i%2]), from("192.0.2.70"), withNext(usage)).status == http.StatusOK {
			admitted++
		}
	}
	if admitted != 9 {
		t.Errorf("%d requests admitted, want 9: 8 leave 56 units, under 60; the 9th makes 63", admitted)
	}
	if held := unitsHeld(t, instances[0], zone, "192.0.2.70"); held != 63 {
		t.Errorf("Redis holds %d units, want 63", held)
	}
}
