package slidingratelimit

import (
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestBandwidthRecipe is the recipe of docs/bandwidth.md with a budget of
// 10,000 bytes an hour instead of a gigabyte: file_server's responses are
// charged their bytes (served by sendfile, past Write), a request is
// admitted while the window has room for its reservation of 1 byte and
// then pays in full, a HEAD costs nothing, a range costs its bytes, and a
// file larger than the budget is charged the budget, which blocks the
// client for the hour.
func TestBandwidthRecipe(t *testing.T) {
	root := t.TempDir()
	for name, size := range map[string]int{"small.bin": 4000, "big.bin": 30000} {
		if err := os.WriteFile(filepath.Join(root, name), []byte(strings.Repeat("b", size)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	zone := uniqueZone("bandwidth")
	startCaddy(t, `
:9080 {
	sliding_ratelimit {
		zone `+zone+` 1h 10000 {
			settle bytes
		}
		redis `+sharedRedis.URL()+`
		key_prefix `+uniquePrefix(t)+`
	}
	root * `+root+`
	file_server
}`)
	small, big := site+"small.bin", site+"big.bin"
	a := from("127.0.0.2")
	res := send(t, small, a, withMethod(http.MethodHead))
	if got, want := res.header.Get("RateLimit-Policy"), `"`+zone+`";q=10000;qu="content-bytes";w=3600`; got != want {
		t.Errorf("RateLimit-Policy %q, want %q", got, want)
	}
	if got := unitsUsed(t, zone, "127.0.0.2", 0); got != 0 {
		t.Errorf("a HEAD request was charged %d bytes, want 0", got)
	}
	send(t, small, a, withHeader("Range", "bytes=0-99"))
	if got := unitsUsed(t, zone, "127.0.0.2", 100); got != 100 {
		t.Errorf("a range of 100 bytes was charged %d, want 100", got)
	}
	for i, want := range []struct {
		status int
		used   int64
	}{{200, 4100}, {200, 8100}, {200, 12100}, {429, 12100}} {
		res := send(t, small, a)
		if res.status != want.status {
			t.Errorf("download %d: status %d, want %d", i+1, res.status, want.status)
		}
		if res.status == http.StatusOK && len(res.body) != 4000 {
			t.Errorf("download %d: %d bytes, want the whole file", i+1, len(res.body))
		}
		if got := unitsUsed(t, zone, "127.0.0.2", want.used); got != want.used {
			t.Errorf("after download %d: %d bytes charged, want %d", i+1, got, want.used)
		}
	}

	b := from("127.0.0.3")
	if res := send(t, big, b); res.status != http.StatusOK || len(res.body) != 30000 {
		t.Errorf("a file larger than the budget: %d, %d bytes; want it whole (admitted on a reservation of 1)", res.status, len(res.body))
	}
	if got := unitsUsed(t, zone, "127.0.0.3", 10000); got != 10000 {
		t.Errorf("a 30,000-byte file was charged %d, want the budget, 10000", got)
	}
	res = send(t, small, b)
	if retry, _ := strconv.Atoi(res.header.Get("Retry-After")); res.status != http.StatusTooManyRequests || retry < 3500 {
		t.Errorf("after a charge of the whole budget: %d, Retry-After %q; want 429 for about the hour", res.status, res.header.Get("Retry-After"))
	}
	if s := adminState(t, zone, "127.0.0.3"); s.Unit != "content-bytes" || s.Identity != zone+":1h:10000:bytes" {
		t.Errorf("admin state %+v, want unit content-bytes and identity %s:1h:10000:bytes", s, zone)
	}
}
