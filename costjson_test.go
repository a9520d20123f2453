package slidingratelimit

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestCostJSONRead: the values at paths from the root, the largest of a
// repeated key, numbers however written; anything else is the default.
func TestCostJSONRead(t *testing.T) {
	c := &CostJSON{Paths: []string{"max_tokens", "generation_config.max_output_tokens"}, Default: 4096}
	c.provision()
	cases := []struct {
		doc   string
		want  int64
		found bool
		why   string
	}{
		{`{"max_tokens": 100, "messages": []}`, 100, true, ""},
		{`{"max_tokens": 100, "generation_config": {"max_output_tokens": 50}}`, 150, true, ""},
		{`{"max_tokens": 1, "max_tokens": 99999}`, 99999, true, ""},
		{`{"max_tokens": 99999, "max_tokens": 1}`, 99999, true, ""},
		{`{"messages": [{"max_tokens": 1}], "x": {"max_tokens": 2}}`, 0, false, ""},
		{`{"max_tokens": 1e3}`, 1000, true, ""},
		{`{"max_tokens": 1000.0}`, 1000, true, ""},
		{`{"max_tokens": 10.5}`, 11, true, ""},
		{`{"max_tokens": "500"}`, 500, true, ""},
		{`{"max_tokens": 1e300}`, maxCount, true, ""},
		{`{"max_tokens": 99999999999999999999999}`, maxCount, true, ""},
		{`{"max_tokens": null}`, 0, false, ""},
		{`{"max_tokens": 0}`, 0, true, ""},
		{`{"max_tokens": -5}`, 0, false, valueNotWhole},
		{`{"max_tokens": "lots"}`, 0, false, valueNotWhole},
		{`{"max_tokens": true}`, 0, false, valueNotWhole},
		{`{"max_tokens": [1, 2]}`, 0, false, ""},
		{`{"max_tokens": {"n": 5}}`, 0, false, ""},
		{`{"max_tokens": 5`, 0, false, costNotJSON},
		{`{"max_tokens": 5} {"max_tokens": 1}`, 0, false, costNotJSON},
		{`max_tokens=5`, 0, false, costNotJSON},
		{strings.Repeat("[", 100000), 0, false, costNotJSON},
		{``, 0, false, ""},
	}
	for _, tc := range cases {
		n, found, why := c.read([]byte(tc.doc))
		if n != tc.want || found != tc.found || why != tc.why {
			t.Errorf("%.60s: %d %v %q, want %d %v %q", tc.doc, n, found, why, tc.want, tc.found, tc.why)
		}
	}
}

// echoServer answers each request with the size and SHA-256 of the body it
// got.
func echoServer(t *testing.T) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := sha256.New()
		n, err := io.Copy(h, r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		fmt.Fprintf(w, "%d %s", n, hex.EncodeToString(h.Sum(nil)))
	}))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

func digest(body string) string {
	sum := sha256.Sum256([]byte(body))
	return fmt.Sprintf("%d %s", len(body), hex.EncodeToString(sum[:]))
}

// TestCostJSONThroughCaddy: real Caddy reserves max_tokens and the body's
// size from each request's JSON body, and passes the body on intact,
// chunked, large or not JSON; what no path gives, or gives badly, reserves
// the default; a body that never comes reserves the default and its
// Content-Length once its time is up.
func TestCostJSONThroughCaddy(t *testing.T) {
	defer func(d time.Duration) { costJSONReadTime = d }(costJSONReadTime)
	costJSONReadTime = 500 * time.Millisecond
	upstream := echoServer(t)
	startCaddy(t, `
:9080 {
	sliding_ratelimit {
		key {http.request.header.Authorization}
		zone cjtokens 1m 10000000 {
			cost json max_tokens 4096 +body
		}
		zone cjplain 1m 1000000 {
			cost json max_tokens 4096
		}
		redis `+sharedRedis.URL()+`
		key_prefix `+uniquePrefix(t)+`
	}
	reverse_proxy `+upstream+`
}`, withGlobals(`
servers {
	metrics
}`))
	fallbacks := func() float64 {
		return scrape(t, `caddy_sliding_ratelimit_cost_fallbacks_total{zone="cjtokens"}`)
	}
	big := `{"max_tokens": 7, "messages": [{"content": "` + strings.Repeat("x", 2<<20) + `"}]}`
	cases := []struct {
		name, body string
		chunked    bool
		tokens     int64 // what the paths give, or the default
		fallback   bool
	}{
		{"max_tokens", `{"model": "m", "max_tokens": 100, "messages": [{"role": "user", "content": "hi"}]}`, false, 100, false},
		{"chunked", `{"model": "m", "max_tokens": 100}`, true, 100, false},
		{"a repeated key", `{"max_tokens": 1, "max_tokens": 90000}`, false, 90000, false},
		{"nested only", `{"messages": [{"max_tokens": 1}], "options": {"max_tokens": 1}}`, false, 4096, false},
		{"none", `{"model": "m"}`, false, 4096, false},
		{"negative", `{"max_tokens": -100000}`, false, 4096, true},
		{"a word", `{"max_tokens": "few"}`, false, 4096, true},
		{"not JSON", `max_tokens=1`, false, 4096, true},
		{"above 1 MiB", big, false, 4096, true},
		{"above 1 MiB, chunked", big, true, 4096, true},
	}
	for i, c := range cases {
		key := "cj-" + strconv.Itoa(i)
		before := fallbacks()
		var body io.Reader = strings.NewReader(c.body)
		if c.chunked {
			body = io.MultiReader(body) // no length: sent chunked
		}
		req, _ := http.NewRequest(http.MethodPost, site, body)
		req.Header.Set("Authorization", key)
		req.Header.Set("Content-Type", "application/json")
		res, err := clientAt(t, "127.0.0.1").Do(req)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		got, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != http.StatusOK || string(got) != digest(c.body) {
			t.Errorf("%s: status %d, the upstream got %q, want the body intact (%s)", c.name, res.StatusCode, got, digest(c.body))
		}
		size := int64(len(c.body))
		if c.chunked && size > costJSONMaxBody {
			size = costJSONMaxBody + 1 // no Content-Length: what was read
		}
		if used := adminState(t, "cjtokens", key).Count; used != c.tokens+size {
			t.Errorf("%s: %d reserved with +body, want %d", c.name, used, c.tokens+size)
		}
		if used := adminState(t, "cjplain", key).Count; used != c.tokens {
			t.Errorf("%s: %d reserved, want %d", c.name, used, c.tokens)
		}
		if got, want := fallbacks()-before, map[bool]float64{true: 1}[c.fallback]; got != want {
			t.Errorf("%s: cost_fallbacks_total rose by %v, want %v", c.name, got, want)
		}
	}

	// A body that never comes: 10 of the 5000 bytes its Content-Length
	// says. The request reserves the default and the 5000 once its time is
	// up, and goes on.
	conn, err := net.Dial("tcp", "127.0.0.1:9080")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "POST / HTTP/1.1\r\nHost: x\r\nAuthorization: cj-slow\r\nContent-Type: application/json\r\nContent-Length: 5000\r\n\r\n{\"max_tok")
	deadline := time.Now().Add(10 * time.Second)
	for adminState(t, "cjtokens", "cj-slow").Count != 4096+5000 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if used := adminState(t, "cjtokens", "cj-slow").Count; used != 4096+5000 {
		t.Errorf("a body that never comes: %d reserved, want the default and its Content-Length, %d", used, 4096+5000)
	}
	conn.Close()

	// A chunked body sent slowly, but within the time: read whole.
	pr, pw := io.Pipe()
	go func() {
		for _, part := range []string{`{"max_tokens"`, `: 300, "x": `, `"y"}`} {
			time.Sleep(50 * time.Millisecond)
			pw.Write([]byte(part))
		}
		pw.Close()
	}()
	req, _ := http.NewRequest(http.MethodPost, site, pr)
	req.Header.Set("Authorization", "cj-trickle")
	res, err := clientAt(t, "127.0.0.1").Do(req)
	if err != nil {
		t.Fatal(err)
	}
	line, _ := bufio.NewReader(res.Body).ReadString('\n')
	res.Body.Close()
	if want := digest(`{"max_tokens": 300, "x": "y"}`); line != want {
		t.Errorf("a trickled body: the upstream got %q, want %q", line, want)
	}
	if used := adminState(t, "cjplain", "cj-trickle").Count; used != 300 {
		t.Errorf("a trickled body: %d reserved, want 300", used)
	}
}
