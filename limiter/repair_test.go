package limiter

import (
	"context"
	"testing"
	"time"
)

// TestRepairFloorsWhatTheStoreLost: two instances saw a client at 30 and 29
// of 40 in a store that then lost it (a replica promoted before it had the
// writes, a restart: here another, empty store) and admitted 5 more before
// the repair ran. The answers of the new store meanwhile are no sightings;
// the repair charges it up to the most either instance saw, once between
// them: 10 more are admitted, not 35, nor 0.
func TestRepairFloorsWhatTheStoreLost(t *testing.T) {
	stores := map[string]func(t *testing.T) Store{
		"redis": func(t *testing.T) Store { return newRedisStore(t, testClient, testPrefix(t)) },
		"memory": func(t *testing.T) Store {
			s := NewMemoryStore()
			t.Cleanup(func() { s.Close() })
			return s
		},
	}
	for name, newStore := range stores {
		for _, alg := range []Algorithm{SlidingLog, SlidingCounter} {
			t.Run(name+"/"+alg.String(), func(t *testing.T) {
				before, fleet := fallbackFleet(t, 2)
				c := Check{Zone: "z", Key: testKey(t), Limit: Limit{Window: time.Hour, Max: 40, Algorithm: alg}}
				for i := range 30 {
					d := make([]Decision, 1)
					if err := before.Allow(context.Background(), []Check{c}, d); err != nil || !d[0].Allowed {
						t.Fatalf("Allow: %+v, %v", d, err)
					}
					if i >= 28 {
						// The last answer each instance had: 29 and 30.
						fleet[i-28].Observe([]Check{c}, d)
					}
				}
				for _, f := range fleet {
					f.Lost()
				}
				after := newStore(t)
				for range 5 {
					d := make([]Decision, 1)
					if err := after.Allow(context.Background(), []Check{c}, d); err != nil || !d[0].Allowed {
						t.Fatalf("Allow on the new store: %+v, %v", d, err)
					}
					for _, f := range fleet {
						f.Observe([]Check{c}, d)
					}
				}
				charged := 0
				for _, f := range []*Fallback{fleet[1], fleet[0]} { // the one that saw 30 first
					clients, err := f.Repair(context.Background(), after)
					if err != nil {
						t.Fatal(err)
					}
					charged += clients
					if f.Losing() {
						t.Error("an instance still takes the store as losing after its repair")
					}
				}
				if alg == SlidingLog && charged != 1 {
					t.Errorf("the repairs charged %d clients, want 1: the second instance's floor is below what the first charged", charged)
				}
				if n := admitted(t, after, c, 40); n != 10 {
					t.Errorf("the new store admitted %d after the repair, want 10 (40 less the 30 the old one said)", n)
				}
			})
		}
	}
}

// TestRepairSightingsOnlyOutsideLosses: the answers of a store marked
// losing are no sightings, so a repair then charges nothing; after Kept (it
// came back as it was), they are again.
func TestRepairSightingsOnlyOutsideLosses(t *testing.T) {
	redis, fleet := fallbackFleet(t, 1)
	f := fleet[0]
	c := Check{Zone: "z", Key: testKey(t), Limit: Limit{Window: time.Hour, Max: 40}}
	d := make([]Decision, 1)
	if err := redis.Allow(context.Background(), []Check{c}, d); err != nil {
		t.Fatal(err)
	}
	f.Lost()
	f.Observe([]Check{c}, d)
	if clients, err := f.Repair(context.Background(), newRedisStore(t, testClient, testPrefix(t))); err != nil || clients != 0 {
		t.Fatalf("a repair after an answer taken while losing charged %d clients (%v), want 0", clients, err)
	}
	f.Lost()
	f.Kept()
	f.Observe([]Check{c}, d)
	if clients, err := f.Repair(context.Background(), newRedisStore(t, testClient, testPrefix(t))); err != nil || clients != 1 {
		t.Fatalf("a repair after an answer taken once kept charged %d clients (%v), want 1", clients, err)
	}
}
