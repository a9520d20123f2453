package redisconn

import (
	"context"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/redistest"
	"github.com/slidingratelimit/caddy-sliding-ratelimit/limiter"
)

// leastRights is the least-privilege ACL of docs/redis.md, for the key
// prefix srl:.
var leastRights = strings.Fields("~srl:* &sliding_ratelimit:* -@all +ping +evalsha +script|load +script|exists " +
	"+fcall +function|load +publish +subscribe +info " +
	"+bitop +del +getrange +hmget +hset +pexpire +rename +set +setrange +time +zadd +zcount +zrange +zrangebyscore +zrem +zremrangebyscore +zscore")

// TestRights: each user's rights are read from what Redis lets it do; what
// cannot work is a refusal naming the ACL rule to add, what works worse a
// warning naming what it costs and the rule.
func TestRights(t *testing.T) {
	srv := redistest.Start(t)
	for _, c := range []struct {
		name  string
		rules []string // nil: the default user
		// refused and warned are what the refusal and the warnings must
		// say; "" and nil: none.
		refused string
		warned  []string
	}{
		{name: "default"},
		{name: "least", rules: leastRights},
		{name: "nochannels", rules: []string{"~*", "+@all", "-function"},
			warned: []string{"may not publish or subscribe to the channels sliding_ratelimit:*: an admin reset",
				"with fail_mode local each hands out the whole limit", "ACL SETUSER nochannels +publish +subscribe &sliding_ratelimit:*"}},
		{name: "evalshaonly", rules: []string{"~*", "&*", "-@all", "+ping", "+evalsha"},
			refused: "redis user evalshaonly may not run the rate limit script: it needs EVALSHA and SCRIPT LOAD (or FCALL and FUNCTION LOAD), so every decision would fail; add them: ACL SETUSER evalshaonly +evalsha +script|load"},
		{name: "notime", rules: []string{"~*", "&*", "+@all", "-time", "-zadd"},
			refused: "redis user notime may not run TIME, ZADD, which the rate limit script calls (a script runs with its caller's rights), so every decision would fail; add them: ACL SETUSER notime +time +zadd"},
		{name: "otherkeys", rules: []string{"~app:*", "&*", "+@all"},
			refused: "redis user otherkeys may not use the limiter's keys (key_prefix srl:), so every decision would fail; add them: ACL SETUSER otherkeys ~srl:*"},
		{name: "libraryonly", rules: []string{"~*", "&*", "+@all", "-evalsha", "-script", "-eval"},
			warned: []string{"may not run the rate limit script by its hash", "ACL SETUSER libraryonly +evalsha +script|load", "may not run SCRIPT EXISTS"}},
		{name: "evalnoload", rules: []string{"~*", "&*", "+@all", "-function", "-script|load"},
			warned: []string{"may run neither FUNCTION nor SCRIPT LOAD: the 30 KB script is sent whole", "ACL SETUSER evalnoload +script|load"}},
		{name: "noinfo", rules: []string{"~*", "&*", "+@all", "-info"},
			warned: []string{"may not run INFO: evictions", "ACL SETUSER noinfo +info"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			url := srv.URL()
			if c.rules != nil {
				url = srv.UserURL(t, c.name, c.rules...)
			}
			conn, err := Open(Standalone, url)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			r, err := conn.Rights(time.Second, "srl:")
			if err != nil {
				t.Fatal(err)
			}
			if got := r.Refusal("srl:"); !strings.Contains(got, c.refused) || (c.refused == "") != (got == "") {
				t.Errorf("refusal %q, want %q", got, c.refused)
			}
			if c.refused != "" {
				return // whatever else it may not do
			}
			decides(t, conn)
			warnings := strings.Join(r.Warnings(), "\n")
			if (len(c.warned) == 0) != (warnings == "") {
				t.Errorf("warnings %q, want them to say %q", warnings, c.warned)
			}
			for _, want := range c.warned {
				if !strings.Contains(warnings, want) {
					t.Errorf("warnings %q do not say %q", warnings, want)
				}
			}
		})
	}
}

// decides fails the test unless a store on conn decides under the key
// prefix srl:, and again after Redis lost its scripts and functions.
func decides(t *testing.T, conn *Conn) {
	t.Helper()
	store := limiter.NewRedisStore(conn.Client(), limiter.RedisOptions{KeyPrefix: "srl:" + t.Name() + ":", Timeout: 5 * time.Second})
	defer store.Close()
	limit := limiter.Limit{Window: time.Minute, Max: 2}
	for i, want := range []bool{true, true, false} {
		d := make([]limiter.Decision, 1)
		if err := store.Allow(context.Background(), []limiter.Check{{Zone: "z", Key: "k", Limit: limit, Cost: 1}}, d); err != nil {
			t.Fatalf("decision %d with rights the check accepts: %v", i+1, err)
		}
		if d[0].Allowed != want {
			t.Errorf("decision %d: allowed %v, want %v", i+1, d[0].Allowed, want)
		}
	}
}

// TestScriptCommandsAreLimitLuas: the rights check tries every command
// limit.lua calls, and no other.
func TestScriptCommandsAreLimitLuas(t *testing.T) {
	src, err := os.ReadFile("../../limiter/limit.lua")
	if err != nil {
		t.Fatal(err)
	}
	var calls []string
	for _, m := range regexp.MustCompile(`call\('([A-Z]+)'`).FindAllStringSubmatch(string(src), -1) {
		calls = append(calls, strings.ToLower(m[1]))
	}
	slices.Sort(calls)
	calls = slices.Compact(calls)
	if !slices.Equal(calls, scriptCommands) {
		t.Errorf("limit.lua calls %v, the rights check knows %v", calls, scriptCommands)
	}
	var tried []string
	for _, p := range scriptProbes("k") {
		tried = append(tried, p[0].(string))
	}
	slices.Sort(tried)
	tried = slices.Compact(tried)
	if !slices.Equal(tried, scriptCommands) {
		t.Errorf("the rights check tries %v, want %v", tried, scriptCommands)
	}
}
