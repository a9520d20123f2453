package slidingratelimit

import (
	"context"
	"net/http"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/limiter"
)

// followsResponse reports whether the zone acts once the response is done:
// it counts by status, settles, or releases a lease.
func (z *Zone) followsResponse() bool {
	return len(z.CountStatus) > 0 || z.units != nil && z.units.settle != nil || z.concurrency()
}

// serveSettled passes an admitted request on and then settles, in one store
// call, what each zone's admission really cost: zero when the response's
// status is one that the zone's count_status does not list, the usage or
// the bytes that settle reads, and otherwise the reservation, which stands
// and needs no call. It settles in the store that recorded the admissions;
// the backend also forgets the denials that a lower cost may undo.
//
// The step is deferred, so that it runs when a later handler panics too:
// reverse_proxy aborts a stream that breaks mid-way with
// http.ErrAbortHandler, and the bytes sent until then are paid for.
func serveSettled(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, b *backend, req *request, src source) (err error) {
	if !req.followsResponse() {
		req.spent()
		return next.ServeHTTP(w, r)
	}
	m := newResponseMeter(w)
	for _, z := range req.zones {
		if z.units != nil && z.units.settle != nil {
			z.units.settle.follow(m)
		}
	}
	defer func() {
		if s := req.settlement(m, m.finalStatus(err)); s != nil {
			// The client may be gone; the request is settled all the same.
			b.settle(context.WithoutCancel(r.Context()), s.checks, s.decisions, s.lowered, src)
		}
	}()
	err = next.ServeHTTP(m, r)
	m.served(r, err)
	return err
}

// followsResponse reports whether any of the request's zones acts once the
// response is done.
func (req *request) followsResponse() bool {
	for _, z := range req.zones {
		if z.followsResponse() {
			return true
		}
	}
	return false
}

// settlement is what the settle step changes: the checks whose cost is not
// what they reserved, with the real cost, and their decisions; lowered says
// which denials each may undo. Its buffers hold the common case in one
// allocation.
type settlement struct {
	checks    []limiter.Check
	decisions []limiter.Decision
	lowered   []lowering

	checksBuf    [maxInlineZones]limiter.Check
	decisionsBuf [maxInlineZones]limiter.Decision
	loweredBuf   [maxInlineZones]lowering
}

// settlement returns what the response that m metered, with status, really
// cost in each zone whose cost changed, nil when none did, and counts the
// units each zone admitted.
func (req *request) settlement(m *responseMeter, status int) *settlement {
	var s *settlement
	for i, z := range req.zones {
		c := req.checks[i]
		cost := max(c.Cost, 1)
		switch {
		case !z.counts(status):
			cost = 0
		case z.units != nil && z.units.settle != nil:
			if n, ok, why := z.units.settle.cost(m, c.Limit.Max); ok {
				cost = n
			} else {
				z.units.settleFallbacks.record(z.units.settleSource, why)
			}
		}
		if z.units != nil {
			z.units.admitted.Add(float64(cost))
		}
		s = s.add(z, c, req.decisions[i], cost)
	}
	return s
}

// givenBack is the settlement of a request that was admitted but never
// served (its client went away while it waited): every admission settled
// to zero, so that its slots go to other requests.
func (req *request) givenBack() *settlement {
	var s *settlement
	for i, z := range req.zones {
		s = s.add(z, req.checks[i], req.decisions[i], 0)
	}
	return s
}

// add adds the admission that decision d recorded for check c of zone z,
// settled to cost, unless that is what it reserved in a zone that does not
// settle; s may be nil, and add returns the settlement, created on the first
// change. A zone that settles settles always: its cost counts from when the
// response ended, even when it is what it reserved.
func (s *settlement) add(z *Zone, c limiter.Check, d limiter.Decision, cost int64) *settlement {
	reserved := max(c.Cost, 1)
	if cost == reserved && (z.units == nil || z.units.settle == nil) {
		return s
	}
	if s == nil {
		s = new(settlement)
		s.checks, s.decisions, s.lowered = s.checksBuf[:0], s.decisionsBuf[:0], s.loweredBuf[:0]
	}
	lowered := notLowered
	if cost < reserved {
		lowered = loweredHere
		switch {
		case z.sameReservations():
			// The store tells whether a denial may rest on it, whichever
			// admission of the full window settles first.
			lowered = loweredIfNoRoom
		case z.denialMayRestOn(c, d):
			lowered = loweredEverywhere
		}
	}
	c.Cost = cost
	s.checks = append(s.checks, c)
	s.decisions = append(s.decisions, d)
	s.lowered = append(s.lowered, lowered)
	return s
}

// spent counts the units each zone admitted with the request, when they are
// known as it goes on: its reservations.
func (req *request) spent() {
	for i, z := range req.zones {
		if z.units != nil {
			z.units.admitted.Add(float64(max(req.checks[i].Cost, 1)))
		}
	}
}

// denialMayRestOn reports whether a denial that another instance caches may
// rest on the admission of check c that decision d recorded, so that taking
// some of it back must be announced (backend.settle): when the room it left
// (d.Remaining) was less than what a request of the zone may reserve, or
// when the zone settles, since another request's charge above its
// reservation can take the room left afterwards.
func (z *Zone) denialMayRestOn(c limiter.Check, d limiter.Decision) bool {
	if z.limit.Algorithm == limiter.Concurrency {
		// No instance caches a denial by a concurrency zone: a released
		// lease has no one to tell.
		return false
	}
	if z.units == nil {
		return d.Remaining < max(c.Cost, 1)
	}
	return z.units.settle != nil || d.Remaining < z.units.cost.largest(c.Limit.Max)
}

// sameReservations reports whether every request of the zone reserves the
// same under the same max (no cost or max from a placeholder): a denial of
// one of them can then rest on an admission only when the zone had no room
// for that reservation, which the store reports when it settles
// (limiter.Decision.Lifts), so a settle down is announced only then.
func (z *Zone) sameReservations() bool {
	return z.limit.Algorithm != limiter.Concurrency && z.MaxRequestsFrom == "" && (z.units == nil || z.units.cost.from == nil)
}
