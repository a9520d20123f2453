package redisconn

import (
	"testing"
	"time"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/redistest"
)

type quietListener struct{}

func (quietListener) Announced(string, Announcement) {}
func (quietListener) Subscribed()                    {}

// TestInstancesCounted: connections to one Redis hear each other's
// heartbeats, whichever URL each uses; one that closes stops being counted
// once three intervals pass without it.
func TestInstancesCounted(t *testing.T) {
	srv := redistest.Start(t)
	open := func(name string) *Conn {
		c, err := Open(Standalone, srv.URL()+"?client_name="+name)
		if err != nil {
			t.Fatal(err)
		}
		c.Listen(quietListener{})
		return c
	}
	a, b := open("a"), open("b")
	defer a.Close()
	waitInstances(t, a, 2, 5*time.Second)
	waitInstances(t, b, 2, 5*time.Second)
	c := open("c")
	waitInstances(t, a, 3, 2*heartbeatInterval+time.Second)
	b.Close()
	c.Close()
	waitInstances(t, a, 1, (heartbeatsMissed+2)*heartbeatInterval)
}

func waitInstances(t *testing.T, c *Conn, want int, limit time.Duration) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for c.Instances() != want {
		if time.Now().After(deadline) {
			t.Fatalf("%s counts %d instances after %v, want %d", c.Label(), c.Instances(), limit, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestRollCallStandsStillWithoutEcho: while this connection hears nothing
// (Redis away), the count stays what it was when it last heard itself, however
// long that lasts; once it hears itself again, the instances that stayed
// silent are no longer counted.
func TestRollCallStandsStillWithoutEcho(t *testing.T) {
	now := time.Unix(1000, 0)
	r := newRollCall()
	r.now = func() time.Time { return now }
	if got := r.count(); got != 1 {
		t.Fatalf("count before any heartbeat: %d, want 1", got)
	}
	r.heard("other")
	if got := r.count(); got != 1 {
		t.Fatalf("count before this connection heard itself: %d, want 1", got)
	}
	r.heard(r.id)
	r.heard("third")
	if got := r.count(); got != 3 {
		t.Fatalf("count: %d, want 3", got)
	}
	now = now.Add(time.Hour) // Redis away: nobody heard
	if got := r.count(); got != 3 {
		t.Fatalf("count after an hour without heartbeats: %d, want 3 (as when Redis went)", got)
	}
	r.heard(r.id) // back: only this one beats on
	if got := r.count(); got != 1 {
		t.Fatalf("count after Redis came back and the others stayed silent: %d, want 1", got)
	}
	for i := range 100 {
		now = now.Add(time.Second)
		r.heard(r.id)
		r.heard(string(rune('A' + i)))
	}
	if n := len(r.seen); n > 64+heartbeatsMissed*int(heartbeatInterval/time.Second)+1 {
		t.Errorf("roll call holds %d ids after 100 came and went, want it bounded", n)
	}
}
