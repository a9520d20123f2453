package limiter

import "context"

// A Redis that fails over to a replica, or restarts, may come back without
// its last writes: replication is asynchronous, and a restart keeps at most
// what it had persisted. Each client whose admissions were lost would get a
// fresh limit (a client at 30 of 40 would get 40 more), on every instance at
// once. What the shared store last said of each client an instance saw is in
// its Fallback's sightings, so when the store answers again under a new
// identity, Repair charges it, for each client still in its window, what it
// holds below what it last said: a floor, so that the instances that saw the
// same client charge it once between them, not once each.
//
// What remains: a client no instance saw since its window began is not
// known to any; the sightings are what the store said, not when each of its
// admissions was, so a repaired client is charged its lost units from the
// repair on, a window at most longer than they would have counted; and the
// admissions the new store decided before the repair ran (a round trip or
// two) were decided on what it held.

// Lost marks that the shared store failed: it may come back without what it
// held. Until Repair or Kept, the store's answers are not taken as
// sightings, so that the first answers of a store that lost writes do not
// overwrite what it said before.
func (f *Fallback) Lost() { f.lost.Store(true) }

// Losing reports whether Lost was called since the last Repair or Kept.
func (f *Fallback) Losing() bool { return f.lost.Load() }

// Kept ends what Lost began when the store came back as it was (the same
// server, which kept its data): its answers are sightings again.
func (f *Fallback) Kept() { f.lost.Store(false) }

// Repair charges shared, for each client sighted before Lost whose window
// still holds what the store last said of it, what shared holds below that
// (a floor: what it holds at least stays; see holding.floor), then ends what
// Lost began. It returns how many clients of log zones it charged (a
// counter's charge is not reported). Concurrency zones are not sighted:
// their leases come back by themselves.
func (f *Fallback) Repair(ctx context.Context, shared Store) (clients int, err error) {
	defer f.lost.Store(false)
	now := f.local.now()
	var checks []Check
	for i := range f.shards {
		sh := &f.shards[i]
		sh.mu.Lock()
		for k, s := range sh.seen {
			if s.used > 0 && s.expires > now {
				checks = append(checks, Check{Zone: k.zone, Key: k.client, Limit: s.limit, Cost: s.used})
			}
		}
		sh.mu.Unlock()
	}
	for len(checks) > 0 {
		batch := checks[:min(len(checks), replayBatch)]
		checks = checks[len(batch):]
		decisions := make([]Decision, len(batch))
		for i := range decisions {
			decisions[i].held = holding{recorded: true, at: -1, floor: true}
		}
		if err := shared.Settle(ctx, batch, decisions); err != nil {
			return clients, err
		}
		for _, d := range decisions {
			if d.charged > 0 {
				clients++
			}
		}
	}
	return clients, nil
}
