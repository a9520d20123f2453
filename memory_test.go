package slidingratelimit

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"testing"
)

// TestBandwidthKeyStaysSmall: through Caddy and Redis, one client of a
// bandwidth budget of 10^9 bytes an hour requesting a 1-byte file 3,000
// times keeps a Redis key of a few KB, not one entry per request (36 KB and
// growing before): admissions close in time merge, and the budget is still
// charged in full.
func TestBandwidthKeyStaysSmall(t *testing.T) {
	root := t.TempDir()
	if err := os.WriteFile(filepath.Join(root, "one.bin"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	zone, prefix := uniqueZone("tiny"), uniquePrefix(t)
	startCaddy(t, `
:9080 {
	sliding_ratelimit {
		zone `+zone+` 1h 1000000000 {
			settle bytes
		}
		redis `+sharedRedis.URL()+`
		key_prefix `+prefix+`
	}
	root * `+root+`
	file_server
}`)
	const requests = 3000
	for i := range requests {
		if res := send(t, site+"one.bin", from("127.0.0.9")); res.status != http.StatusOK {
			t.Fatalf("request %d: %d", i+1, res.status)
		}
	}
	key := prefix + "{127.0.0.9}:" + zone + ":1h:1000000000:bytes"
	size, err := sharedRedis.Client(t).MemoryUsage(context.Background(), key).Result()
	if err != nil {
		t.Fatalf("MEMORY USAGE %s: %v", key, err)
	}
	t.Logf("%d admissions of 1 byte: MEMORY USAGE %d bytes", requests, size)
	if size > 16<<10 {
		t.Errorf("one client's key takes %d bytes after %d admissions, want at most 16 KB", size, requests)
	}
	if used := unitsUsed(t, zone, "127.0.0.9", requests); used != requests {
		t.Errorf("%d bytes charged, want %d", used, requests)
	}
}
