package slidingratelimit

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/redistest"
)

// TestRedisOverTLS: a rediss:// URL reaches Redis over TLS (the server's TLS
// port speaks nothing else), and the server's certificate is verified unless
// the URL says skip_verify=true.
func TestRedisOverTLS(t *testing.T) {
	srv := redistest.StartTLS(t)
	config := func(url, prefix string) string {
		return `{"window": "1m", "max_requests": 3, "fail_mode": "closed", "timeout": "1s",
			"redis": "` + url + `", "key_prefix": "` + prefix + `"}`
	}

	t.Run("certificate verified", func(t *testing.T) {
		// The server's CA is its own, not one the system trusts: the
		// handshake fails, and fail_mode closed answers 503.
		in := newInstance(t, config(srv.TLSURL(), uniquePrefix(t)))
		if code, _ := in.serve("192.0.2.10", nil); code != http.StatusServiceUnavailable {
			t.Errorf("untrusted certificate: status %d, want 503 (the decision must fail)", code)
		}
		// And it fails for that reason, not a timeout: the client the
		// handler makes from the URL refuses the certificate.
		client, err := newRedisClient("", srv.TLSURL())
		if err != nil {
			t.Fatal(err)
		}
		defer client.Close()
		if err := client.Ping(context.Background()).Err(); err == nil || !strings.Contains(err.Error(), "certificate signed by unknown authority") {
			t.Errorf("PING over TLS with an untrusted certificate: got %v, want a certificate error", err)
		}
	})

	t.Run("skip_verify", func(t *testing.T) {
		prefix := uniquePrefix(t)
		in := newInstance(t, config(srv.TLSURL()+"?skip_verify=true", prefix))
		for i, want := range []int{200, 200, 200, 429} {
			if code, _ := in.serve("192.0.2.11", nil); code != want {
				t.Errorf("request %d over TLS: status %d, want %d", i+1, code, want)
			}
		}
		// The admissions are in Redis: read them over the plain port.
		n, err := admissionsKept(context.Background(), srv.Client(t), prefix+"{192.0.2.11}:default")
		if err != nil {
			t.Fatal(err)
		}
		if n != 3 {
			t.Errorf("Redis holds %d admissions for the client, want 3", n)
		}
	})
}
