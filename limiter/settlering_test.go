package limiter

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/redistest"
)

// TestSettleRing: settling an admission of a large ring changes that entry
// alone, keeps the ring well formed (readRing checks its sums, its newest
// time and its mirror against its entries), and keeps the mirror when the
// settled entry is not one it copies, so that the next decision reads one
// range as before. Settled: the newest (found by the header's newest time),
// one in the middle, the newest to zero (it goes), then one the mirror
// copies; on a units ring and, refunds only, on a large count ring. Each
// settle charges its cost anew at its time; times the ring does not hold
// take nothing back.
func TestSettleRing(t *testing.T) {
	const t0 = 1_700_000_000_000_000
	for _, tc := range []struct {
		name string
		max  int64
		cost int64
		// settles are the admissions settled, by index, and their real costs.
		settles [][2]int64
	}{
		{"units", 100_000, 10, [][2]int64{{99, 3}, {99, 25}, {50, 0}, {99, 0}, {98, 4}, {1, 7}}},
		{"count", 1000, 1, [][2]int64{{99, 0}, {50, 0}, {98, 0}, {1, 0}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Check{Zone: "z", Key: testKey(t), Cost: tc.cost, Limit: Limit{Window: time.Minute, Max: tc.max}}
			key := testPrefix(t) + "{" + c.Key + "}:z"
			var held []Decision
			times, units := []int64{}, []int64{}
			for i := range int64(100) {
				r := &scriptReq{op: opAllow, keys: []string{key}, checks: []Check{c}}
				runScript(t, testClient, t0+i, r)
				if !r.decisions[0].Allowed {
					t.Fatalf("admission %d: %+v", i, r.decisions[0])
				}
				held = append(held, r.decisions[0])
				times, units = append(times, t0+i), append(units, tc.cost)
			}
			at := int64(t0 + 100)
			for _, st := range tc.settles {
				i, cost := st[0], st[1]
				mirrored := readRing(t, testClient, key, at).mirrored
				if mirrored == 0 {
					t.Fatalf("before settling admission %d: the mirror holds nothing", i)
				}
				settled := c
				settled.Cost = cost
				r := &scriptReq{op: opSettle, keys: []string{key}, checks: []Check{settled}, decisions: []Decision{held[i]}}
				runScript(t, testClient, at, r)
				at++
				// The reservation is taken back (a count ring takes it out;
				// entries of no units go once newest), and the real cost
				// charged from the settle's time, or just after the newest.
				times, units = takenBack(times, units, t0+i, tc.cost)
				times, units = charged(times, units, at-1, cost)
				ring := readRing(t, testClient, key, at)
				if !slices.Equal(ring.times, times) || !slices.Equal(ring.units, units) {
					t.Fatalf("after settling admission %d to %d: times %v units %v, want %v %v", i, cost, ring.times, ring.units, times, units)
				}
				if i >= int64(mirrored) && ring.mirrored != min(mirrored, len(times)) {
					t.Errorf("after settling admission %d (the mirror holds %d): the mirror holds %d", i, mirrored, ring.mirrored)
				}
			}
			// Admissions the ring does not hold (the newest taken out
			// above, one before the oldest): a count ring takes nothing
			// back, a units ring what the entry of their span holds (as if
			// they had merged into it: Settle settles each admission once).
			// Their cost is charged all the same.
			gone := held[0]
			gone.held.at = t0 - 1
			for _, d := range []Decision{held[99], gone} {
				settled := c
				settled.Cost = 1
				runScript(t, testClient, at, &scriptReq{op: opSettle, keys: []string{key}, checks: []Check{settled}, decisions: []Decision{d}})
				times, units = takenBack(times, units, d.held.at, tc.cost)
				times, units = charged(times, units, at, 1)
				if ring := readRing(t, testClient, key, at); !slices.Equal(ring.times, times) || !slices.Equal(ring.units, units) {
					t.Fatalf("after settling an admission at %d the ring does not hold: times %v units %v, want %v %v", d.held.at, ring.times, ring.units, times, units)
				}
			}
		})
	}
}

// charged is times and units after a charge of cost at now: an admission
// then, or just after the newest, which drops the entries of no units
// before the first that holds some; nothing for no cost.
func charged(times, units []int64, now, cost int64) ([]int64, []int64) {
	if cost == 0 {
		return times, units
	}
	for len(units) > 0 && units[0] == 0 {
		times, units = times[1:], units[1:]
	}
	if n := len(times); n > 0 && times[n-1] >= now {
		now = times[n-1] + 1
	}
	return append(times, now), append(units, cost)
}

// takenBack is times and units after the admission at token, which reserved
// reserved, is taken back: a count ring (reserved 1) takes its own entry
// out; a units ring takes it from the first entry at or after it in its
// span (it may have merged into it), up to what that entry holds, and drops
// entries of no units once newest.
func takenBack(times, units []int64, token, reserved int64) ([]int64, []int64) {
	span := mergeSpan(time.Minute.Microseconds())
	j := slices.IndexFunc(times, func(x int64) bool { return x >= token })
	switch {
	case j < 0:
	case reserved == 1 && times[j] == token:
		times, units = slices.Delete(times, j, j+1), slices.Delete(units, j, j+1)
	case reserved != 1 && times[j]/span == token/span:
		units[j] -= min(units[j], reserved)
		for len(units) > 0 && units[len(units)-1] == 0 {
			times, units = times[:len(times)-1], units[:len(units)-1]
		}
	}
	return times, units
}

// TestSettleReadsAndWritesTheRingOnce: settling the newest admission of a
// large units ring to another cost takes one read of the header and one of
// the entries near the newest, and writes one entry and the header once:
// the reservation's slot takes the real cost (no second decision, no
// second header). The ring then holds the cost at the settle's time.
func TestSettleReadsAndWritesTheRingOnce(t *testing.T) {
	srv := redistest.Start(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer client.Close()
	ctx := context.Background()
	now := redisNow(t, client)
	lim := Limit{Window: time.Minute, Max: 1_000_000}
	times, units := make([]int64, 36), make([]int64, 36)
	for i := range times {
		times[i], units[i] = now-50_000_000+int64(i)*1_000_000, 1+int64(i)%50
	}
	c := Check{Zone: "z", Key: "client", Limit: lim}
	key := "{client}:z"
	if err := client.Set(ctx, key, encodeUnitsRing(64, times, units, lim.Max, now/1000+120_000), 2*time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	r := &scriptReq{op: opAllow, keys: []string{key}, checks: []Check{c}}
	runScript(t, client, 0, r)
	if !r.decisions[0].Allowed {
		t.Fatalf("allow: %+v", r.decisions[0])
	}
	if err := client.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	settled := c
	settled.Cost = 7
	runScript(t, client, 0, &scriptReq{op: opSettle, keys: []string{key}, checks: []Check{settled}, decisions: r.decisions})
	stats := infoFields(t, client, "commandstats", "cmdstat_getrange.calls", "cmdstat_setrange.calls", "cmdstat_set.calls")
	if stats["cmdstat_getrange.calls"] > 2 || stats["cmdstat_setrange.calls"] > 2 || stats["cmdstat_set.calls"] > 0 {
		t.Errorf("a settle of the newest: %v GETRANGE, %v SETRANGE, %v SET; want at most 2, 2, 0", stats["cmdstat_getrange.calls"], stats["cmdstat_setrange.calls"], stats["cmdstat_set.calls"])
	}
	ring := readRing(t, client, key, redisNow(t, client))
	n := len(ring.times)
	if n != 37 || ring.units[n-1] != 7 || ring.times[n-1] <= r.decisions[0].held.at || !slices.Equal(ring.units[:36], units) {
		t.Fatalf("after the settle: %d entries, the newest %d units at %d (the admission's at %d); want 37, the newest 7 units after it", n, ring.units[n-1], ring.times[n-1], r.decisions[0].held.at)
	}
}
