package slidingratelimit

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddytest"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/redis/go-redis/v9"
)

// The tests talk to one real Caddy, caddytest's, on fixed ports: startCaddy
// loads a config into it, send sends it a request. send also serves a
// request through a handler provisioned alone (newInstance), which stands
// for another Caddy instance.

// globalOptions points caddytest's Caddy at its admin port and keeps it off
// the ports a developer's own Caddy uses.
const globalOptions = `{
	skip_install_trust
	admin localhost:2999
	http_port 9080
	https_port 9443
	grace_period 1ns
}
`

// adminURL is the test Caddy's admin endpoint (globalOptions).
const adminURL = "http://localhost:2999"

// site is the test Caddy's port 9080, by address.
const site = "http://127.0.0.1:9080/"

// caddyOption changes what startCaddy loads.
type caddyOption func(*caddyConfig)

type caddyConfig struct {
	globals []string
	json    bool
}

// withGlobals adds global options (lines of the global options block) to
// those of globalOptions.
func withGlobals(options string) caddyOption {
	return func(c *caddyConfig) { c.globals = append(c.globals, options) }
}

// asJSON loads the config as a whole JSON config, which sets its own admin
// address, ports and logging.
func asJSON() caddyOption { return func(c *caddyConfig) { c.json = true } }

// logTail is how many lines of Caddy's log a failed test prints.
const logTail = 50

// startCaddy loads a config into the test Caddy, in place of the one it
// runs (a second call in a test is a reload), and returns the file it logs
// to at INFO and above ("" for a JSON config). The config is a Caddyfile's
// sites, given globalOptions, a log file and the options given; a test that
// fails prints the end of the log.
func startCaddy(t *testing.T, config string, opts ...caddyOption) (logFile string) {
	t.Helper()
	var c caddyConfig
	for _, o := range opts {
		o(&c)
	}
	adapter := "json"
	if !c.json {
		adapter = "caddyfile"
		logFile = filepath.Join(t.TempDir(), "caddy.log")
		globals := strings.TrimSuffix(globalOptions, "}\n") + "\tlog {\n\t\toutput file " + logFile + "\n\t\tlevel INFO\n\t}\n"
		for _, g := range c.globals {
			globals += "\t" + strings.ReplaceAll(strings.TrimSpace(g), "\n", "\n\t") + "\n"
		}
		config = globals + "}\n" + config
		t.Cleanup(func() {
			if !t.Failed() {
				return
			}
			if logs, err := os.ReadFile(logFile); err == nil {
				lines := strings.SplitAfter(string(logs), "\n")
				t.Logf("the end of Caddy's log:\n%s", strings.Join(lines[max(len(lines)-logTail, 0):], ""))
			}
		})
	}
	caddytest.NewTester(t).InitServer(config, adapter)
	if t.Failed() {
		t.FailNow()
	}
	return logFile
}

// logLines returns the lines of a log file that hold every one of parts.
func logLines(t *testing.T, logFile string, parts ...string) []string {
	t.Helper()
	logs, err := os.ReadFile(logFile)
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, line := range strings.Split(string(logs), "\n") {
		matches := true
		for _, p := range parts {
			matches = matches && strings.Contains(line, p)
		}
		if matches && line != "" {
			lines = append(lines, line)
		}
	}
	return lines
}

// uniquePrefix gives each test its own Redis keys on the shared server.
func uniquePrefix(t *testing.T) string {
	return "t" + strconv.FormatInt(time.Now().UnixNano(), 36) + ":"
}

// siteBlock writes a Caddyfile site for the test Caddy: body inside a site
// block of address (":9080" answers every host; "http://localhost:9080" only
// requests for localhost), where each sliding_ratelimit block that names no
// redis or no key_prefix of its own gets the shared Redis and prefix (most
// often uniquePrefix(t)) as its first lines. A test then writes only what its
// limit is about.
func siteBlock(address, prefix, body string) string {
	lines := strings.Split(body, "\n")
	// names holds, by the line that opens a sliding_ratelimit block, the
	// subdirectives the block names.
	names := make(map[int]map[string]bool)
	var open []int // the lines that open the blocks around a line
	for i, line := range lines {
		trimmed := strings.TrimSpace(line)
		if trimmed == "}" && len(open) > 0 {
			open = open[:len(open)-1]
			continue
		}
		if n := len(open); n > 0 && names[open[n-1]] != nil {
			word, _, _ := strings.Cut(trimmed, " ")
			names[open[n-1]][word] = true
		}
		if strings.HasSuffix(trimmed, "{") {
			open = append(open, i)
			if strings.HasPrefix(trimmed, "sliding_ratelimit") {
				names[i] = make(map[string]bool)
			}
		}
	}
	var out []string
	for i, line := range lines {
		out = append(out, line)
		if names[i] == nil {
			continue
		}
		indent := line[:len(line)-len(strings.TrimLeft(line, " \t"))] + "\t"
		if !names[i]["redis"] {
			out = append(out, indent+"redis "+sharedRedis.URL())
		}
		if !names[i]["key_prefix"] {
			out = append(out, indent+"key_prefix "+prefix)
		}
	}
	return "\n" + address + " {" + strings.Join(out, "\n") + "\n}"
}

// sendOption sets a part of a request that send sends.
type sendOption func(*outgoing)

type outgoing struct {
	from, method, host string
	header             http.Header
	body               io.Reader
	to                 *instance
	next               caddyhttp.Handler
}

// from sends the request from ip: over the network, a real second (third,
// ...) client on the loopback network, not a header that pretends to be
// one; to an instance, the address Caddy would see. Default 127.0.0.1.
func from(ip string) sendOption { return func(o *outgoing) { o.from = ip } }

// to serves the request through in (its ServeHTTP, with the next handler
// of withNext), not over the network: of the URL, the path and query
// count.
func to(in *instance) sendOption { return func(o *outgoing) { o.to = in } }

// withNext is the handler after an instance's (see to). Default okHandler.
func withNext(next caddyhttp.Handler) sendOption { return func(o *outgoing) { o.next = next } }

// withMethod sends the request with method m instead of GET.
func withMethod(m string) sendOption { return func(o *outgoing) { o.method = m } }

// withHost sends the request for host, whatever its URL's host.
func withHost(host string) sendOption { return func(o *outgoing) { o.host = host } }

// withHeader adds a header: each value a line of its own; "" is a value.
func withHeader(name string, values ...string) sendOption {
	return func(o *outgoing) {
		for _, v := range values {
			o.header.Add(name, v)
		}
	}
}

// withHeaders adds every header of h, as withHeader does.
func withHeaders(h map[string][]string) sendOption {
	return func(o *outgoing) {
		for name, values := range h {
			withHeader(name, values...)(o)
		}
	}
}

// withBody sends body, of the content type.
func withBody(contentType, body string) sendOption {
	return func(o *outgoing) {
		o.header.Set("Content-Type", contentType)
		o.body = strings.NewReader(body)
	}
}

// answer is what a request got.
type answer struct {
	status int
	header http.Header
	body   string
}

// send sends one request to rawURL and returns the answer, body read. It is
// a GET from 127.0.0.1 without headers unless opts say otherwise; a request
// that gets no answer fails the test.
func send(t testing.TB, rawURL string, opts ...sendOption) answer {
	t.Helper()
	o := outgoing{from: "127.0.0.1", method: http.MethodGet, header: http.Header{}, next: okHandler}
	for _, opt := range opts {
		opt(&o)
	}
	if o.to != nil {
		return o.to.serve(rawURL, o)
	}
	req, err := http.NewRequest(o.method, rawURL, o.body)
	if err != nil {
		t.Fatal(err)
	}
	req.Header = o.header
	if o.host != "" {
		req.Host = o.host
	}
	res, err := clientAt(t, o.from).Do(req)
	if err != nil {
		t.Fatalf("%s %s from %s: %v", o.method, rawURL, o.from, err)
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatalf("%s %s from %s: reading the answer: %v", o.method, rawURL, o.from, err)
	}
	return answer{status: res.StatusCode, header: res.Header, body: string(body)}
}

// expect sends one request per status in want, as send does, and checks the
// status of each answer.
func expect(t testing.TB, what, rawURL string, want []int, opts ...sendOption) {
	t.Helper()
	for i, w := range want {
		if got := send(t, rawURL, opts...).status; got != w {
			t.Errorf("%s, request %d: status %d, want %d", what, i+1, got, w)
		}
	}
}

// clients holds send's HTTP clients, one per test and address, so that a
// test's requests from one address reuse its connections.
var clients sync.Map // clientOf -> *http.Client

type clientOf struct {
	t  testing.TB
	ip string
}

// clientAt returns the test's HTTP client whose connections come from ip,
// closed when the test ends.
func clientAt(t testing.TB, ip string) *http.Client {
	key := clientOf{t, ip}
	if c, ok := clients.Load(key); ok {
		return c.(*http.Client)
	}
	dialer := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 5 * time.Second}
	transport := &http.Transport{DialContext: dialer.DialContext}
	c := &http.Client{Transport: transport, Timeout: 10 * time.Second}
	if other, loaded := clients.LoadOrStore(key, c); loaded {
		return other.(*http.Client)
	}
	t.Cleanup(func() {
		clients.Delete(key)
		transport.CloseIdleConnections()
	})
	return c
}

// instance is a Handler provisioned on its own, outside the caddytest Caddy:
// several of them in one test stand for several Caddy instances. Each gets
// its own Redis client when its URL differs (add a query such as
// ?client_name=b to the same server's URL).
type instance struct {
	*Handler
}

// settled waits for the settles the instance queued to be answered.
func (in *instance) settled() { in.backend.settling.Wait() }

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

// usageUpstream starts a real HTTP upstream for reverse_proxy that answers
// as each request's headers ask, as an LLM API reports token usage:
//
//	X-Test-Status        the status (default 200)
//	X-Test-Usage         a header X-Usage, once per value
//	X-Test-Trailer       a trailer X-Usage announced in the Trailer header
//	X-Test-Late-Trailer  a trailer X-Usage not announced
//	X-Test-Bytes         a body of this many bytes (default "ok")
//	X-Test-Chunk         the body in chunks of this many bytes, each flushed
//	X-Test-Chunk-Delay   a pause before each chunk
//
// It returns the upstream's host:port.
func usageUpstream(t *testing.T) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		if r.Header.Get("X-Test-Trailer") != "" {
			h.Set("Trailer", "X-Usage")
		}
		for _, v := range r.Header.Values("X-Test-Usage") {
			h.Add("X-Usage", v)
		}
		status := http.StatusOK
		if s, err := strconv.Atoi(r.Header.Get("X-Test-Status")); err == nil {
			status = s
		}
		w.WriteHeader(status)
		body := []byte("ok")
		if n, err := strconv.Atoi(r.Header.Get("X-Test-Bytes")); err == nil {
			body = []byte(strings.Repeat("x", n))
		}
		chunk, _ := strconv.Atoi(r.Header.Get("X-Test-Chunk"))
		delay, _ := time.ParseDuration(r.Header.Get("X-Test-Chunk-Delay"))
		if chunk <= 0 {
			chunk = len(body)
		}
		for len(body) > 0 {
			time.Sleep(delay)
			n := min(chunk, len(body))
			if _, err := w.Write(body[:n]); err != nil {
				return
			}
			body = body[n:]
			w.(http.Flusher).Flush()
		}
		if v := r.Header.Get("X-Test-Trailer"); v != "" {
			h.Set("X-Usage", v)
		}
		if v := r.Header.Get("X-Test-Late-Trailer"); v != "" {
			h.Set(http.TrailerPrefix+"X-Usage", v)
		}
	}))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

// unitsUsed polls the admin API until the client's units in the zone are
// want, or a second passes, and returns the last count: the settle step runs
// once the response is done, which a client may see a moment before.
func unitsUsed(t *testing.T, zone, key string, want int64) int64 {
	t.Helper()
	deadline := time.Now().Add(time.Second)
	for {
		got := adminState(t, zone, key).Count
		if got == want || time.Now().After(deadline) {
			return got
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// admissionsKept returns how many admission times a sliding-log key holds:
// the count in the header of its ring (limiter/limit.lua: a layout tag
// byte, then cap, head and count, big-endian uint32s; the small count ring
// that keeps the last max, tag 8, holds the count in byte 9 alone); 0 when
// there is no key.
func admissionsKept(ctx context.Context, c redis.Cmdable, key string) (int64, error) {
	v, err := c.GetRange(ctx, key, 0, 12).Result()
	if err != nil {
		return 0, err
	}
	if v == "" {
		return 0, nil
	}
	if len(v) != 13 {
		return 0, fmt.Errorf("%s: not a ring", key)
	}
	if v[0] == 8 {
		return int64(v[9]), nil
	}
	return int64(binary.BigEndian.Uint32([]byte(v[9:]))), nil
}
