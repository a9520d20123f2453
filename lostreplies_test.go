package slidingratelimit

import (
	"net/http"
	"testing"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/redistest"
)

// TestLostScriptRepliesAreNotSentAgain: a proxy between Caddy and Redis closes
// the connection instead of delivering every third script reply. The script
// ran, so Redis recorded the admission; go-redis must not send it again,
// whatever the URL says about retries, or one request costs its client two
// slots. So every admission Redis holds was either served or answered with
// the fail mode, one each: with max_retries in the URL as without.
func TestLostScriptRepliesAreNotSentAgain(t *testing.T) {
	for _, query := range []string{"", "?max_retries=3"} {
		t.Run("url"+query, func(t *testing.T) {
			srv := redistest.Start(t)
			cutter := redistest.StartReplyCutter(t, srv.Addr())
			checkLostReplies(t, cutter.URL()+query, cutter)
		})
	}
}

// TestLostScriptRepliesOnClusterAreNotSentAgain: the same on Redis Cluster,
// whose client sends a call again by a loop of its own (max_redirects),
// whatever max_retries says.
func TestLostScriptRepliesOnClusterAreNotSentAgain(t *testing.T) {
	cluster := redistest.StartCluster(t, 3)
	var cutters []*redistest.ReplyCutter
	for _, c := range cluster.ThroughReplyCutters(t) {
		cutters = append(cutters, c)
	}
	for _, query := range []string{"", "&max_retries=3"} {
		t.Run("url"+query, func(t *testing.T) {
			checkLostReplies(t, "cluster "+cluster.URL()+query, cutters...)
		})
	}
}

// checkLostReplies sends requests from one client to a site on redis (the
// redis subdirective's arguments), while the cutters cut every third script
// reply, and checks that Redis holds one admission per request served or
// answered with the fail mode.
func checkLostReplies(t *testing.T, redis string, cutters ...*redistest.ReplyCutter) {
	t.Helper()
	// A timeout long enough for go-redis's retries to finish in it, as
	// they would with Redis close by.
	startCaddy(t, `
:9080 {
	sliding_ratelimit {
		zone lost 1m 1000
		redis `+redis+`
		key_prefix `+uniquePrefix(t)+`
		timeout 2s
		fail_mode closed
	}
	respond "ok"
}`)
	client := newFaultClient(t, 2)
	if a := client.get(""); a.status != http.StatusOK {
		t.Fatalf("before cutting: %+v", a)
	}
	var cutBefore, scriptsBefore int64
	for _, c := range cutters {
		cutBefore += c.Cut()
		scriptsBefore += c.Scripts()
		c.CutEvery(3)
	}
	served, failed := 1, 0
	for i := range 60 {
		switch a := client.get(""); {
		case a.err == nil && a.status == http.StatusOK && a.rateLimit != "":
			served++
		case a.err == nil && a.status == http.StatusServiceUnavailable:
			failed++
		default:
			t.Fatalf("request %d: %+v, want 200 decided by Redis or 503", i, a)
		}
	}
	var cut, scripts int64
	for _, c := range cutters {
		c.CutEvery(0)
		cut += c.Cut()
		scripts += c.Scripts()
	}
	cut -= cutBefore
	held := adminState(t, "lost", "127.0.0.2").Count
	t.Logf("%d script replies, %d cut; %d served, %d answered 503; Redis holds %d admissions", scripts-scriptsBefore, cut, served, failed, held)
	if cut == 0 {
		t.Fatal("no reply was cut")
	}
	if int64(failed) != cut {
		t.Errorf("%d requests answered with the fail mode for %d replies cut: want one each (a script call sent again got the reply the first lost)", failed, cut)
	}
	if held != int64(served+failed) {
		t.Errorf("Redis holds %d admissions for %d served and %d failed requests: want one each", held, served, failed)
	}
}
