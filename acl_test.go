package slidingratelimit

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/redistest"
)

// TestRedisACLUser: an ACL user and password from the URL, taken from an
// environment placeholder, work; a wrong password fails the config with
// Redis's own answer, which does not carry the password.
func TestRedisACLUser(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client(t)
	ctx := context.Background()
	if err := admin.Do(ctx, "ACL", "SETUSER", "limiter", "on", ">s3cret-pw", "~srl:*", "+@all").Err(); err != nil {
		t.Fatal(err)
	}
	if err := admin.Do(ctx, "ACL", "SETUSER", "default", "off").Err(); err != nil {
		t.Fatal(err)
	}

	t.Setenv("SRL_TEST_REDIS_URL", "redis://limiter:s3cret-pw@"+srv.Addr()+"/0")
	good := newInstance(t, `{"window": "1m", "max_requests": 2, "redis": "{env.SRL_TEST_REDIS_URL}", "fail_mode": "closed"}`)
	for i, want := range []int{http.StatusOK, http.StatusOK, http.StatusTooManyRequests} {
		if status := send(t, "/", to(good), from("192.0.2.5")).status; status != want {
			t.Fatalf("request %d as the ACL user: %d, want %d", i+1, status, want)
		}
	}

	err := provisionError(t, `{"window": "1m", "max_requests": 2, "redis": "redis://limiter:wrong-pw@`+srv.Addr()+`/0", "fail_mode": "closed"}`)
	if err == nil || !strings.Contains(err.Error(), "WRONGPASS") {
		t.Fatalf("wrong password: provision error %v, want one with Redis's WRONGPASS", err)
	}
	if strings.Contains(err.Error(), "wrong-pw") {
		t.Errorf("error carries the password: %v", err)
	}
}
