package slidingratelimit

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// instance is a Handler provisioned on its own, outside the caddytest Caddy:
// several of them in one test stand for several Caddy instances. Each gets
// its own Redis client when its URL differs (add a query such as
// ?client_name=b to the same server's URL).
type instance struct {
	*Handler
}

// newInstance provisions a handler from its JSON config.
func newInstance(t *testing.T, config string) *instance {
	t.Helper()
	h, err := provisioned(t, config)
	if err != nil {
		t.Fatal(err)
	}
	return &instance{h}
}

// provisionError provisions a handler from its JSON config and returns the
// error of Provision or Validate, nil if both pass.
func provisionError(t *testing.T, config string) error {
	t.Helper()
	_, err := provisioned(t, config)
	return err
}

// provisioned unmarshals, provisions and validates a handler as Caddy
// would; the test's end cleans it up.
func provisioned(t *testing.T, config string) (*Handler, error) {
	t.Helper()
	h := new(Handler)
	if err := json.Unmarshal([]byte(config), h); err != nil {
		t.Fatalf("config %s: %v", config, err)
	}
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	t.Cleanup(cancel)
	t.Cleanup(func() { h.Cleanup() })
	if err := h.Provision(ctx); err != nil {
		return h, fmt.Errorf("provision: %w", err)
	}
	if err := h.Validate(); err != nil {
		return h, fmt.Errorf("validate: %w", err)
	}
	return h, nil
}

// okHandler is the next handler: it answers 200.
var okHandler = caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
	w.WriteHeader(http.StatusOK)
	return nil
})

// serve runs one request through the handler and o's next handler, as
// Caddy's server would, and returns what Caddy would send: for an error, its
// status (a 429 or 503 that handle_errors would shape).
func (in *instance) serve(target string, o outgoing) answer {
	if strings.HasPrefix(target, "/") {
		target = "http://example.test" + target
	}
	r := httptest.NewRequest(o.method, target, o.body)
	r.Header = o.header
	if o.host != "" {
		r.Host = o.host
	}
	r.RemoteAddr = net.JoinHostPort(o.from, "40000")
	w := httptest.NewRecorder()
	// As Caddy's server does: the replacer with the http.* placeholders,
	// and the client IP.
	r = caddyhttp.PrepareRequest(r, caddy.NewReplacer(), w, nil)
	err := in.ServeHTTP(w, r, o.next)
	a := answer{status: w.Code, header: w.Header(), body: w.Body.String()}
	if err != nil {
		a.status = http.StatusInternalServerError
		if herr, ok := err.(caddyhttp.HandlerError); ok {
			a.status = herr.StatusCode
		}
	}
	return a
}
