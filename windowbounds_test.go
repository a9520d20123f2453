package slidingratelimit

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/redisconn"
	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/redistest"
	"github.com/slidingratelimit/caddy-sliding-ratelimit/limiter"
)

// A window, a lease or a wait that the engine cannot keep must fail the
// config, not every request: such a request errs in the store, fail_mode
// open then lets it through unlimited, and the errors would trip the breaker
// that every handler on that Redis shares.

// TestWindowBoundsAreTheEngines: the bounds the config rules check are
// those the engine takes, one past either end refused by both.
func TestWindowBoundsAreTheEngines(t *testing.T) {
	store := limiter.NewMemoryStore()
	defer store.Close()
	engine := func(c limiter.Check) error {
		return store.Peek(context.Background(), []limiter.Check{c}, make([]limiter.Decision, 1))
	}
	log := func(window, wait time.Duration) limiter.Check {
		return limiter.Check{Zone: "z", Key: "k", Limit: limiter.Limit{Window: window, Max: 1}, Wait: wait}
	}
	for _, c := range []struct {
		name   string
		check  limiter.Check
		config error
	}{
		{"shortest window", log(minWindow, 0), checkWindow("window", minWindow)},
		{"longest window", log(maxWindow, 0), checkWindow("window", maxWindow)},
		{"longest wait of a short window", log(time.Second, limiter.MaxWaitWindows*time.Second), checkWait(limiter.MaxWaitWindows*time.Second, time.Second, algorithmLog)},
		{"longest wait of a long window", log(maxWindow, maxWindow), checkWait(maxWindow, maxWindow, algorithmLog)},
		{"shortest lease", limiter.Check{Zone: "c", Key: "k", Limit: limiter.Limit{Window: minWindow, Max: 1, Algorithm: limiter.Concurrency}},
			checkConcurrencyZone(1, minWindow, "", "", 0)},
		{"longest lease", limiter.Check{Zone: "c", Key: "k", Limit: limiter.Limit{Window: maxWindow, Max: 1, Algorithm: limiter.Concurrency}},
			checkConcurrencyZone(1, maxWindow, "", "", 0)},
	} {
		if err := engine(c.check); err != nil {
			t.Errorf("%s: the engine refuses it: %v", c.name, err)
		}
		if c.config != nil {
			t.Errorf("%s: the config refuses it: %v", c.name, c.config)
		}
	}
	for _, c := range []struct {
		name   string
		check  limiter.Check
		config error
	}{
		{"window under a microsecond", log(minWindow-1, 0), checkWindow("window", minWindow-1)},
		{"window over two years", log(maxWindow+1, 0), checkWindow("window", maxWindow+1)},
		{"wait over 16 windows", log(time.Second, limiter.MaxWaitWindows*time.Second+1), checkWait(limiter.MaxWaitWindows*time.Second+1, time.Second, algorithmLog)},
		{"wait over two years", log(maxWindow, maxWindow+1), checkWait(maxWindow+1, maxWindow, algorithmLog)},
		{"lease under a microsecond", limiter.Check{Zone: "c", Key: "k", Limit: limiter.Limit{Window: minWindow - 1, Max: 1, Algorithm: limiter.Concurrency}},
			checkConcurrencyZone(1, minWindow-1, "", "", 0)},
		{"lease over two years", limiter.Check{Zone: "c", Key: "k", Limit: limiter.Limit{Window: maxWindow + 1, Max: 1, Algorithm: limiter.Concurrency}},
			checkConcurrencyZone(1, maxWindow+1, "", "", 0)},
	} {
		if err := engine(c.check); err == nil {
			t.Errorf("%s: the engine takes it", c.name)
		} else if !errors.Is(err, limiter.ErrInvalidCheck) {
			t.Errorf("%s: the engine's error %v is not ErrInvalidCheck: the breaker would count it", c.name, err)
		}
		if c.config == nil {
			t.Errorf("%s: the config takes it; the engine refuses it", c.name)
		}
	}
}

// TestWindowOutsideTheEngineFailsJSON: in JSON, where a bare number is
// nanoseconds, the error says how to write the seconds it surely meant.
func TestWindowOutsideTheEngineFailsJSON(t *testing.T) {
	for _, c := range []struct{ config, want string }{
		{`{"window": 60, "max_requests": 5}`, `window 60ns is shorter than a microsecond, the least the limiter keeps (a bare JSON number is nanoseconds: "window": 60 is 60ns; for seconds write "60s")`},
		{`{"window": "100000h", "max_requests": 5}`, "window 100000h0m0s is longer than two years (17520h), the most the limiter keeps"},
		{`{"zones": [{"name": "z", "window": 30, "max_requests": 5}]}`, `zone z: window 30ns is shorter than a microsecond, the least the limiter keeps (a bare JSON number is nanoseconds: "window": 30 is 30ns; for seconds write "30s")`},
		{`{"zones": [{"name": "z", "window": "100000h", "max_requests": 5, "algorithm": "counter"}]}`, "zone z: window 100000h0m0s is longer than two years"},
		{`{"zones": [{"name": "c", "concurrent": 2, "lease": 60}]}`, `zone c: lease 60ns is shorter than a microsecond, the least the limiter keeps (a bare JSON number is nanoseconds: "lease": 60 is 60ns; for seconds write "60s")`},
		{`{"zones": [{"name": "c", "concurrent": 2, "lease": "20000h"}]}`, "zone c: lease 20000h0m0s is longer than two years"},
		{`{"window": "17520h", "max_requests": 5, "wait": "17521h"}`, "wait 17521h0m0s is longer than two years, the most a request may wait"},
	} {
		err := provisionError(t, c.config)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want one containing %q", c.config, err, c.want)
		}
	}
	// The bounds themselves are kept.
	for _, config := range []string{
		`{"window": 1000, "max_requests": 5}`,
		`{"window": "17520h", "max_requests": 5, "wait": "17520h"}`,
		`{"zones": [{"name": "c", "concurrent": 2, "lease": "17520h"}]}`,
	} {
		if err := provisionError(t, config); err != nil {
			t.Errorf("%s: %v", config, err)
		}
	}
}

// TestWindowOutsideTheEngineFailsCaddyValidate: what `caddy validate` runs
// refuses such a window, with the Caddyfile line (the adapter refuses it
// already; testdata/caddyfile_adapt/err_*_two_years and *_nanoseconds show
// the messages).
func TestWindowOutsideTheEngineFailsCaddyValidate(t *testing.T) {
	for _, c := range []struct{ block, want string }{
		{"window 60ns\n\t\tmax_requests 5", "window 60ns is shorter than a microsecond"},
		{"zone z 30ns 5", "window 30ns is shorter than a microsecond"},
		{"window 100000h\n\t\tmax_requests 5", "window 100000h0m0s is longer than two years"},
		{"zone c {\n\t\t\tconcurrent 2\n\t\t\tlease 100000h\n\t\t}", "lease 100000h0m0s is longer than two years"},
	} {
		caddyfile := ":8080 {\n\tsliding_ratelimit {\n\t\t" + c.block + "\n\t}\n}\n"
		if err := validateCaddyfileErr(caddyfile); err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "Caddyfile:") {
			t.Errorf("%q: %v, want an error with %q and the Caddyfile line", c.block, err, c.want)
		}
	}
}

// TestWindowOutsideTheEngineRefusedByLoad: a running Caddy refuses a JSON
// config with such a window at /load, and keeps the config it runs.
func TestWindowOutsideTheEngineRefusedByLoad(t *testing.T) {
	startCaddy(t, siteBlock(":9080", uniquePrefix(t), `
	sliding_ratelimit {
		window 1m
		max_requests 2
	}
	respond "ok"`))
	client := from("127.0.0.2")
	expect(t, "before the refused load", site, []int{200}, client)
	res := loadHandler(t, `{"handler": "sliding_ratelimit", "window": 60, "max_requests": 5}`)
	if want := `\"window\": 60 is 60ns; for seconds write \"60s\"`; res.status != http.StatusBadRequest || !strings.Contains(res.body, want) {
		t.Errorf("/load of a window of 60ns: %d %s, want 400 with %s", res.status, res.body, want)
	}
	expect(t, "after the refused load: the running limit", site, []int{200, 429}, client)
}

// loadHandler posts to the running Caddy's /load a config whose one site on
// :9080 runs handler, then answers "ok", and returns the answer.
func loadHandler(t *testing.T, handler string) answer {
	t.Helper()
	config := `{"admin": {"listen": "localhost:2999"}, "apps": {"http": {"servers": {"s": {"listen": [":9080"], "routes": [{"handle": [
		` + handler + `,
		{"handler": "static_response", "body": "ok"}]}]}}}}}`
	return send(t, adminURL+"/load", withMethod(http.MethodPost), withBody("application/json", config))
}

// TestInputErrorsDoNotOpenTheSharedBreaker: a request whose own figures the
// engine refuses (here a window no rule lets through, set behind the
// rules' back) is no Redis failure: however many such requests a handler
// gets, the breaker that the handlers on that Redis share stays closed, and
// a good handler on it is still decided by Redis.
func TestInputErrorsDoNotOpenTheSharedBreaker(t *testing.T) {
	srv := redistest.Start(t)
	prefix := uniquePrefix(t)
	bad := newInstance(t, `{"window": "1m", "max_requests": 5, "fail_mode": "closed", "redis": "`+srv.URL()+`", "key_prefix": "`+prefix+`bad:"}`)
	good := newInstance(t, `{"window": "1m", "max_requests": 5, "fail_mode": "closed", "redis": "`+srv.URL()+`", "key_prefix": "`+prefix+`good:"}`)
	if bad.backend.conn.Breaker() != good.backend.conn.Breaker() {
		t.Fatal("the handlers on one Redis do not share a breaker")
	}
	bad.zones[0].limit.Window = 60 // nanoseconds
	for i := range 20 {
		if res := send(t, "/", to(bad), from("192.0.2.1")); res.status == http.StatusOK {
			t.Fatalf("request %d to the handler the engine cannot decide: 200, want the fail mode (503)", i)
		}
	}
	if state := good.backend.conn.Breaker().State(); state != redisconn.BreakerClosed {
		t.Errorf("after 20 requests the engine refuses: breaker %s, want closed", state)
	}
	res := send(t, "/", to(good), from("192.0.2.1"))
	if want := `"default";r=4;t=60`; res.status != http.StatusOK || res.header.Get("RateLimit") != want {
		t.Errorf("the good handler: %d, RateLimit %q; want 200 and %s (decided by Redis)", res.status, res.header.Get("RateLimit"), want)
	}
}

// validateCaddyfileErr is what `caddy validate` does with a Caddyfile:
// adapt, then provision and validate; it returns the first error.
func validateCaddyfileErr(caddyfile string) error {
	cfgJSON, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(caddyfile), nil)
	if err != nil {
		return err
	}
	cfg := new(caddy.Config)
	if err := caddy.StrictUnmarshalJSON(cfgJSON, cfg); err != nil {
		return err
	}
	return caddy.Validate(cfg)
}

// TestWindowUnderAMillisecondWarns: a window the engine keeps but no one
// means (500us: a bare JSON 500000, meant as seconds) loads with a warning
// that says how to write seconds.
func TestWindowUnderAMillisecondWarns(t *testing.T) {
	logFile := startCaddy(t, siteBlock(":9080", uniquePrefix(t), `
	sliding_ratelimit {
		zone short 500us 5
	}
	respond "ok"`))
	lines := logLines(t, logFile, "a window or lease under a millisecond", `"zone":"short"`, `"for_seconds_write":"500000s"`)
	if len(lines) != 1 {
		t.Errorf("%d warnings of the window of 500us, want 1", len(lines))
	}
}
