package slidingratelimit

import (
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddytest"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
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
