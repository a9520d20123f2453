package slidingratelimit

import (
	"context"
	"strings"
	"testing"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/redistest"
)

// TestRedisOverTLS: a rediss:// URL reaches Redis over TLS (the server's TLS
// port speaks nothing else), and the server's certificate is verified unless
// the URL says skip_verify=true: a certificate the system does not trust
// fails the config.
func TestRedisOverTLS(t *testing.T) {
	srv := redistest.StartTLS(t)
	config := func(url, prefix string) string {
		return `{"window": "1m", "max_requests": 3, "fail_mode": "closed", "timeout": "1s",
			"redis": "` + url + `", "key_prefix": "` + prefix + `"}`
	}

	t.Run("certificate verified", func(t *testing.T) {
		// The server's CA is its own, not one the system trusts: no retry
		// can fix the handshake, so the config fails with the reason.
		err := provisionError(t, config(srv.TLSURL(), uniquePrefix(t)))
		if err == nil || !strings.Contains(err.Error(), "certificate signed by unknown authority") {
			t.Errorf("untrusted certificate: provision error %v, want the certificate error", err)
		}
	})

	t.Run("skip_verify", func(t *testing.T) {
		prefix := uniquePrefix(t)
		in := newInstance(t, config(srv.TLSURL()+"?skip_verify=true", prefix))
		for i, want := range []int{200, 200, 200, 429} {
			if code := send(t, "/", to(in), from("192.0.2.11")).status; code != want {
				t.Errorf("request %d over TLS: status %d, want %d", i+1, code, want)
			}
		}
		// The admissions are in Redis: read them over the plain port.
		n, err := admissionsKept(context.Background(), srv.Client(t), prefix+"{192.0.2.11}:default:1m:3")
		if err != nil {
			t.Fatal(err)
		}
		if n != 3 {
			t.Errorf("Redis holds %d admissions for the client, want 3", n)
		}
	})
}
