package limiter

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/redistest"
)

// model is the package's semantics written as plainly as they can be: every
// admission of a log zone kept in a list, sums recomputed each time, the room
// found by walking back from the newest admission; a counter zone's units
// kept by fixed window, what it counts reckoned from the counter's
// definition. It decides one request at
// a time at a time the test gives; with cluster set, a request whose zones
// are in different Redis Cluster slots is decided slot by slot, as
// RedisStore does there.
type model struct {
	state   map[memoryKey]*modelState
	leases  uint64
	cluster bool
	// exact keeps every admission apart (no merging): the reference that
	// merged rings are held to.
	exact bool
}

type modelState struct {
	// log is a log zone's admissions; units says it is a units log, whose
	// admissions merge (mergeEntries) and whose entries settled to zero
	// stay until they are the newest.
	log   []admission
	units bool
	// fixed holds a counter zone's units by fixed window (the time in
	// microseconds divided by Window), every window it ever recorded in;
	// latest is the latest of them.
	fixed  map[int64]int64
	latest int64
	leases map[uint64]int64
	// lastMax is the Max of a log's newest record, until the log empties.
	lastMax int64
}

func newModel(cluster bool) *model {
	return &model{state: make(map[memoryKey]*modelState), cluster: cluster}
}

func (m *model) get(c Check) *modelState {
	k := memoryKey{c.Zone, c.Key}
	if m.state[k] == nil {
		m.state[k] = &modelState{fixed: make(map[int64]int64), leases: make(map[uint64]int64)}
	}
	return m.state[k]
}

// allow decides checks at now (meth is methodAllow or methodPeek).
func (m *model) allow(now int64, meth method, checks []Check, ds []Decision) {
	groups := [][]int{all(len(checks))}
	if m.cluster {
		groups = (&RedisStore{cluster: true}).slotGroups(clientTags(checks), all(len(checks)))
	}
	if len(groups) == 1 {
		m.decide(now, meth, checks, ds, all(len(checks)), requestWait(checks))
		return
	}
	admitted := true
	for g, idx := range groups {
		if meth == methodPeek || !admitted {
			m.decide(now, methodPeek, checks, ds, idx, 0)
			continue
		}
		m.decide(now, methodAllow, checks, ds, idx, 0)
		if !admittedAt(ds, idx) {
			admitted = false
			for _, earlier := range groups[:g] {
				for _, i := range earlier {
					m.settleOne(now, checks[i], ds[i].held, 0)
					ds[i].held = holding{}
					ds[i].Remaining += reserved(checks[i])
				}
			}
		}
	}
	if !Admitted(ds) {
		for i := range ds {
			ds[i].Delay, ds[i].held = 0, holding{}
		}
	}
}

// clientTags returns keys that hash to the Redis Cluster slots of checks.
func clientTags(checks []Check) []string {
	keys := make([]string, len(checks))
	for i, c := range checks {
		keys[i] = "{" + c.Key + "}"
	}
	return keys
}

// modelZone is one zone's part of a decision.
type modelZone struct {
	room, reset int64
	held        float64
	ok          bool
}

// decide decides the checks at idx together, all or nothing, with wait.
func (m *model) decide(now int64, meth method, checks []Check, ds []Decision, idx []int, wait time.Duration) {
	zs := make([]modelZone, len(checks))
	at, admit := now, true
	for _, i := range idx {
		c, z := checks[i], &zs[i]
		w, cost := microseconds(c.Limit.Window), reserved(c)
		st := m.get(c)
		z.room = now
		switch c.Limit.Algorithm {
		case SlidingLog:
			first := int64(-1)
			var held int64
			for _, a := range st.log {
				if a.at > now-w {
					held += a.units
					if first < 0 && a.units > 0 {
						first = a.at
					}
				}
			}
			z.held = float64(held)
			if first >= 0 {
				z.reset = first + w - now
			}
			if held+cost > c.Limit.Max && cost <= c.Limit.Max {
				// Walk back from the newest: the first that does not fit
				// with everything after it must age out.
				var after int64
				for j := len(st.log) - 1; j >= 0; j-- {
					if after+st.log[j].units > c.Limit.Max-cost {
						z.room = st.log[j].at + w
						break
					}
					after += st.log[j].units
				}
			}
		case SlidingCounter:
			if st.latest > now/w {
				panic("model: the clock stepped back across the start of a counter's fixed window")
			}
			z.held = float64(st.counted(now, w)) / float64(w)
			if need := c.Limit.Max - cost; need >= 0 {
				z.room = st.counterFits(now, w, need*w)
			}
			z.reset = st.counterReset(now, w)
		case Concurrency:
			first := int64(math.MaxInt64)
			for _, exp := range st.leases {
				if exp > now {
					z.held++
					first = min(first, exp)
				}
			}
			if z.held > 0 {
				z.reset = first - now
			}
			if z.held+1 > float64(c.Limit.Max) {
				z.room = now + z.reset
			}
		}
		zoneWait := int64(0)
		if c.Limit.Algorithm == SlidingLog {
			zoneWait = microseconds(wait)
		}
		z.ok = cost <= c.Limit.Max && z.room-now <= zoneWait
		if z.ok {
			at = max(at, z.room)
		} else {
			admit = false
		}
	}
	for _, i := range idx {
		c, z := checks[i], &zs[i]
		w, cost := microseconds(c.Limit.Window), reserved(c)
		st := m.get(c)
		d := Decision{Allowed: z.ok, Never: cost > c.Limit.Max}
		if meth == methodPeek && c.Limit.Algorithm == SlidingLog {
			d.LastMax = st.lastMax
		}
		if admit {
			d.Delay = time.Duration(at-now) * time.Microsecond
		}
		if admit && meth == methodAllow {
			z.held += float64(cost)
			switch c.Limit.Algorithm {
			case SlidingLog:
				t := m.recordLog(now, st, w, c.Limit.Max, at, cost)
				if z.reset == 0 {
					z.reset = t + w - now
				}
				d.held = holding{recorded: true, at: t, units: cost}
			case SlidingCounter:
				st.fixed[now/w] += cost
				st.latest = max(st.latest, now/w)
				z.reset = st.counterReset(now, w)
				d.held = holding{recorded: true, at: now / w, units: cost}
			case Concurrency:
				for id, exp := range st.leases {
					if exp <= now {
						delete(st.leases, id)
					}
				}
				m.leases++
				st.leases[m.leases] = at + w
				if z.reset == 0 || at+w-now < z.reset {
					z.reset = at + w - now
				}
				d.held = holding{recorded: true, units: 1, lease: m.leases}
			}
		}
		switch {
		case d.Never:
			z.reset = 0
		case !z.ok:
			z.reset = z.room - now
			d.RetryAfter = time.Duration(z.reset) * time.Microsecond
			if c.Limit.Algorithm == SlidingLog {
				d.RetryAfter -= wait.Truncate(time.Microsecond)
			}
		}
		d.Remaining = max(0, int64(math.Floor(float64(c.Limit.Max)-z.held)))
		d.Reset = time.Duration(z.reset) * time.Microsecond
		ds[i] = d
	}
}

// The sliding counter, written from its definition (see SlidingCounter)
// rather than from the stores' code: time is cut into fixed windows of w;
// at t, in fixed window i = t/w and e = t-i*w into it, the counter counts
// the units of window i plus those of window i-1 weighted by the part of
// it the last w still covers, (w-e)/w. The model keeps the units of every
// fixed window and reckons in integers scaled by w, and finds times by
// searching them, where the stores keep two sums and solve for times in
// floating point. A clock that steps back into an earlier fixed window
// than one recorded in is left out (the model panics): the stores then go
// on counting in the later window, which the definition does not speak
// of, and the schedule's steps back, of a few milliseconds, cross no
// window's start.

// counted is w times what the counter counts at t.
func (st *modelState) counted(t, w int64) int64 {
	i, e := t/w, t%w
	return st.fixed[i]*w + st.fixed[i-1]*(w-e)
}

// counterFits returns the first time from now on at which what the
// counter counts (times w) is at most scaled, with nothing recorded
// meanwhile. What it counts never grows as time passes: the previous
// window's weight falls to zero as the current window ends, when the
// current one becomes the previous one at full weight. So the first such
// time is found by bisection, and it has come two windows after now's
// began, when both have left.
func (st *modelState) counterFits(now, w, scaled int64) int64 {
	lo, hi := now, (now/w+2)*w
	for lo < hi {
		if mid := lo + (hi-lo)/2; st.counted(mid, w) <= scaled {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	return lo
}

// counterReset is the time from now until units next leave the counter's
// window: a whole unit's worth, or, when the previous window holds units,
// the last of them, as it leaves the window at the current window's end;
// zero when the counter counts nothing.
func (st *modelState) counterReset(now, w int64) int64 {
	counted := st.counted(now, w)
	if counted == 0 {
		return 0
	}
	reset := int64(math.MaxInt64)
	if counted >= w {
		reset = st.counterFits(now, w, counted-w) - now
	}
	if st.fixed[now/w-1] > 0 {
		reset = min(reset, (now/w+1)*w-now)
	}
	return reset
}

// recordLog records an admission of cost in a log of window w at at (or
// just after the newest), as Allow does, and returns its time.
func (m *model) recordLog(now int64, st *modelState, w, max, at, cost int64) int64 {
	t := at
	if n := len(st.log); n > 0 && st.log[n-1].at >= t {
		t = st.log[n-1].at + 1
	}
	// What aged out goes, and entries of no units before the
	// first that holds some.
	var kept []admission
	for _, a := range st.log {
		if a.at > now-w && (len(kept) > 0 || a.units > 0) {
			kept = append(kept, a)
		}
	}
	if len(kept) == 0 && cost == 1 {
		st.units = false // all aged out: a count log again
	}
	n, span := len(kept), mergeSpan(w)
	if !m.exact && st.units && n > 0 && (n >= mergeEntries && t/span == kept[n-1].at/span || n >= maxEntries) {
		kept[n-1] = admission{t, kept[n-1].units + cost}
	} else {
		kept = append(kept, admission{t, cost})
		st.units = st.units || cost != 1 || countToUnits(n, max)
	}
	st.log, st.lastMax = kept, max
	return t
}

func (m *model) settle(now int64, checks []Check, ds []Decision) {
	for i, c := range checks {
		if h := ds[i].held; h.recorded {
			// Lifts: a request of the same reservation did not fit before.
			before := make([]Decision, 1)
			m.decide(now, methodPeek, []Check{c}, before, []int{0}, 0)
			ds[i].Lifts = c.Limit.Algorithm != Concurrency && before[0].Remaining < h.units
			m.settleOne(now, c, h, c.Cost)
		}
		ds[i].held = holding{}
	}
}

// settleOne takes back what h reserved and charges cost from now, when the
// response ended: in a log, an admission then (or just after the newest),
// whose time it returns (0 for none).
func (m *model) settleOne(now int64, c Check, h holding, cost int64) (charged int64) {
	st := m.get(c)
	w := microseconds(c.Limit.Window)
	switch c.Limit.Algorithm {
	case SlidingLog:
		// The reservation is in the first entry at or after it: its own,
		// or, in a units log, one of its span that it merged into.
		span := mergeSpan(w)
		for i, a := range st.log {
			if a.at < h.at {
				continue
			}
			if a.at == h.at && !st.units {
				st.log = append(st.log[:i], st.log[i+1:]...)
			} else if a.at == h.at || st.units && h.at > now-w && a.at/span == h.at/span {
				st.log[i].units -= min(a.units, h.units)
				for len(st.log) > 0 && st.log[len(st.log)-1].units == 0 {
					st.log = st.log[:len(st.log)-1]
				}
			}
			break
		}
		if len(st.log) == 0 {
			st.units, st.lastMax = false, 0
		}
		if cost > 0 {
			// Charged as an admission at its room from now, as Allow
			// records one that waits as long as it needs.
			var held int64
			for _, a := range st.log {
				if a.at > now-w {
					held += a.units
				}
			}
			room := make([]Decision, 1)
			m.decide(now, methodPeek, []Check{{Zone: c.Zone, Key: c.Key, Limit: c.Limit, Cost: cost}}, room, []int{0}, 0)
			charged = m.recordLog(now, st, w, c.Limit.Max, now+room[0].RetryAfter.Microseconds(), min(cost, maxUnits-held))
		}
	case SlidingCounter:
		// The reservation leaves the fixed window it was recorded in; the
		// real cost is charged to the current one.
		st.fixed[h.at] = max(0, st.fixed[h.at]-h.units)
		st.fixed[now/w] += cost
		st.latest = max(st.latest, now/w)
	case Concurrency:
		delete(st.leases, h.lease)
	}
	return charged
}

// extend restarts the leases that ds hold, and moves their reservations in
// log zones to now: each is settled to the units it reserved, and its
// decision holds the record that made. A counter's reservation stays.
func (m *model) extend(now int64, checks []Check, ds []Decision) error {
	var err error
	for i, c := range checks {
		if h := ds[i].held; h.recorded && c.Limit.Algorithm == SlidingLog {
			ds[i].held.at = m.settleOne(now, c, h, h.units)
			continue
		}
		id := ds[i].held.lease
		if id == 0 {
			continue
		}
		st := m.get(c)
		if exp, ok := st.leases[id]; !ok || exp <= now {
			ds[i].held = holding{}
			err = ErrLeaseLost
			continue
		}
		st.leases[id] = now + microseconds(c.Limit.Window)
	}
	return err
}

// modelStep is one call of a schedule.
type modelStep struct {
	// advance moves the clock before the call, in microseconds; it may be
	// zero (two calls in one microsecond) or negative (the clock stepped
	// back).
	advance int64
	method  method
	checks  []Check
	// of is, for a settle or an extend, the step whose decisions it uses.
	of int
	// want is the model's answer.
	want    []Decision
	wantErr bool
}

// The zones of the schedule: a count log whose max changes from call to call
// (a tenant's quota), a log priced in units, a sliding counter priced in
// units, and a cap on requests in flight.
var (
	modelCount   = Limit{Window: 10 * time.Second, Algorithm: SlidingLog}
	modelUnits   = Limit{Window: 10 * time.Second, Max: 1000, Algorithm: SlidingLog}
	modelCounter = Limit{Window: 10 * time.Second, Max: 40, Algorithm: SlidingCounter}
	modelLeases  = Limit{Window: 2 * time.Second, Max: 3, Algorithm: Concurrency}
	// modelBulk's ring outgrows what is read whole: it is read by ranges,
	// grows, and turns into a units ring of many buckets when settled.
	modelBulk = Limit{Window: time.Minute, Max: 100_000, Algorithm: SlidingLog}
)

// modelSchedule makes steps random calls with the model's answers.
func modelSchedule(seed uint64, steps int) []modelStep {
	rng := rand.New(rand.NewPCG(seed, 7))
	m := newModel(false)
	now := int64(1_700_000_000_000_000)
	var schedule []modelStep
	var admitted []int // allow steps that recorded something not yet settled
	decisions := map[int][]Decision{}
	clients := []string{"c0", "c1", "c2", "c3"}
	var advance int64 // since the last step made
	for len(schedule) < steps {
		st := modelStep{}
		switch r := rng.IntN(1000); {
		case r < 30:
			advance += -1 - rng.Int64N(3000)
		case r < 130:
		case r < 140:
			advance += 5_000_000
		default:
			advance += rng.Int64N(10_000)
		}
		if rng.IntN(4) == 0 {
			// Decide later, at the same time or after another step.
			continue
		}
		now += advance
		st.advance, advance = advance, 0
		switch r := rng.IntN(100); {
		case r < 15 && len(admitted) > 0:
			st.method, st.of = methodSettle, admitted[rng.IntN(len(admitted))]
		case r < 20 && len(admitted) > 0:
			st.method, st.of = methodExtend, admitted[rng.IntN(len(admitted))]
		case r < 30:
			st.method = methodPeek
		default:
			st.method = methodAllow
		}
		if st.method >= methodSettle {
			// The same checks, with the real costs.
			from := schedule[st.of]
			for _, c := range from.checks {
				switch rng.IntN(4) {
				case 0:
					c.Cost = 0
				case 1:
					c.Cost = max(0, reserved(c)-1-rng.Int64N(5))
				case 2:
					c.Cost = reserved(c) + rng.Int64N(300)
				}
				if c.Limit.Algorithm == Concurrency {
					c.Cost = 0
				}
				if c.Zone == "bulk" && len(schedule) < steps*2/3 {
					// A count ring until late: refunds take entries out.
					c.Cost = min(c.Cost, 1)
				}
				st.checks = append(st.checks, c)
			}
			ds := decisions[st.of]
			if st.method == methodSettle {
				m.settle(now, st.checks, ds)
				admitted = deleteValue(admitted, st.of)
			} else {
				st.wantErr = m.extend(now, st.checks, ds) != nil
			}
			schedule = append(schedule, st)
			continue
		}
		client := clients[rng.IntN(len(clients))]
		for _, zone := range []string{"count", "units", "counter", "leases", "bulk"} {
			if zone == "bulk" && rng.IntN(3) != 0 {
				// Mostly one client: its ring grows.
				st.checks = append(st.checks, Check{Zone: zone, Key: "c0", Limit: modelBulk})
				continue
			}
			if rng.IntN(3) != 0 {
				continue
			}
			c := Check{Zone: zone, Key: client}
			if rng.IntN(8) == 0 {
				// Another client's zone: another slot on a cluster.
				c.Key = clients[rng.IntN(len(clients))]
			}
			switch zone {
			case "count":
				c.Limit = modelCount
				c.Limit.Max = []int64{3, 5, 8, 0}[rng.IntN(31)%4]
			case "units":
				c.Limit, c.Cost = modelUnits, 1+rng.Int64N(400)
				if rng.IntN(20) == 0 {
					c.Cost += c.Limit.Max // above max: never admitted
				}
			case "counter":
				c.Limit, c.Cost = modelCounter, rng.Int64N(6)
			case "leases":
				c.Limit = modelLeases
			case "bulk":
				c.Limit = modelBulk
			}
			if c.Limit.Algorithm == SlidingLog && rng.IntN(2) == 0 {
				c.Wait = time.Duration(rng.Int64N(12_000_000)) * time.Microsecond
				if rng.IntN(6) == 0 {
					c.Wait *= 4 // several windows: a line of promised slots
				}
			}
			st.checks = append(st.checks, c)
		}
		if len(st.checks) == 0 {
			st.checks = append(st.checks, Check{Zone: "count", Key: client, Limit: modelCount})
			st.checks[0].Limit.Max = 5
		}
		ds := make([]Decision, len(st.checks))
		m.allow(now, st.method, st.checks, ds)
		st.want = make([]Decision, len(ds))
		for i, d := range ds {
			st.want[i] = exported(d)
		}
		if st.method == methodAllow && Admitted(ds) {
			decisions[len(schedule)] = ds
			admitted = append(admitted, len(schedule))
		}
		schedule = append(schedule, st)
	}
	return schedule
}

func deleteValue(s []int, v int) []int {
	for i, x := range s {
		if x == v {
			return append(s[:i], s[i+1:]...)
		}
	}
	return s
}

// TestStoresMatchModel runs random schedules on every store and compares
// every answer with the model's: requests over several zones (count and
// units logs, counters, leases; of one client or of several, so of several
// Redis Cluster slots), costs, settling up, down and to zero, waits, leases
// taken, extended, released and expiring, a max that changes between calls,
// the clock standing still, creeping, jumping and stepping back. A cluster's
// answers are those of the model deciding slot by slot.
func TestStoresMatchModel(t *testing.T) {
	steps := 3000
	if testing.Short() {
		steps = 500
	}
	stores := []struct {
		name    string
		cluster bool
		make    func(t *testing.T, now func() int64) Store
	}{
		{"memory", false, func(t *testing.T, now func() int64) Store {
			s := NewMemoryStore()
			t.Cleanup(func() { s.Close() })
			s.now = now
			return s
		}},
		{"redis", false, func(t *testing.T, now func() int64) Store {
			s := newRedisStore(t, testClient, testPrefix(t))
			s.batch.now = now
			return s
		}},
	}
	if !testing.Short() {
		cluster := redistest.StartCluster(t, 3)
		stores = append(stores, struct {
			name    string
			cluster bool
			make    func(t *testing.T, now func() int64) Store
		}{"redis-cluster", true, func(t *testing.T, now func() int64) Store {
			s := newRedisStore(t, cluster.Client(t), testPrefix(t))
			s.batch.now = now
			return s
		}})
	}
	for _, seed := range []uint64{1, 2} {
		schedule := modelSchedule(seed, steps)
		for _, st := range stores {
			t.Run(fmt.Sprintf("seed%d/%s", seed, st.name), func(t *testing.T) {
				runSchedule(t, schedule, st.cluster, st.make)
			})
		}
	}
}

func runSchedule(t *testing.T, schedule []modelStep, cluster bool, makeStore func(*testing.T, func() int64) Store) {
	now := int64(1_700_000_000_000_000)
	s := makeStore(t, func() int64 { return now })
	m := newModel(cluster)
	got := make([][]Decision, len(schedule))
	mine := make([][]Decision, len(schedule))
	ctx := context.Background()
	var denied, delayed, never, lost, lifts, long, moved int
	for i, st := range schedule {
		now += st.advance
		ds := make([]Decision, len(st.checks))
		want := st.want
		var err error
		switch st.method {
		case methodAllow, methodPeek:
			md := make([]Decision, len(st.checks))
			m.allow(now, st.method, st.checks, md)
			if cluster {
				want = make([]Decision, len(md))
				for j, d := range md {
					want[j] = exported(d)
				}
			}
			mine[i] = md
			if st.method == methodAllow {
				err = s.Allow(ctx, st.checks, ds)
			} else {
				err = s.Peek(ctx, st.checks, ds)
			}
		case methodSettle:
			for j, c := range st.checks {
				if h := got[st.of][j].held; h.recorded && c.Limit.Algorithm == SlidingLog && now-h.at >= microseconds(c.Limit.Window) {
					long++ // a call longer than the window: settled after its admission aged out
				}
			}
			m.settle(now, st.checks, mine[st.of])
			err = s.Settle(ctx, st.checks, got[st.of])
			for j, d := range got[st.of] {
				if d.Lifts != mine[st.of][j].Lifts {
					t.Fatalf("step %d at %d, settle of %+v: check %d lifts %v, want %v", i, now, st.checks, j, d.Lifts, mine[st.of][j].Lifts)
				}
				if d.Lifts {
					lifts++
				}
			}
		case methodExtend:
			for j, c := range st.checks {
				if got[st.of][j].held.recorded && c.Limit.Algorithm == SlidingLog {
					moved++ // a reservation moved to now, to be settled (or moved) again
				}
			}
			wantErr := m.extend(now, st.checks, mine[st.of]) != nil
			err = s.Extend(ctx, st.checks, got[st.of])
			if errors.Is(err, ErrLeaseLost) != wantErr {
				t.Fatalf("step %d: extend: %v, want lost %v", i, err, wantErr)
			}
			if errors.Is(err, ErrLeaseLost) {
				lost++
				err = nil
			}
			for j, d := range got[st.of] {
				if d.held != mine[st.of][j].held && d.held.lease == 0 {
					t.Fatalf("step %d at %d, extend of %+v: check %d holds %+v, want %+v", i, now, st.checks, j, d.held, mine[st.of][j].held)
				}
			}
		}
		if err != nil {
			t.Fatalf("step %d (%+v): %v", i, st, err)
		}
		got[i] = ds
		for j := range want {
			if exported(ds[j]) != want[j] {
				t.Fatalf("step %d at %d, %s of %+v:\ncheck %d: got  %+v\n         want %+v",
					i, now, []string{"peek", "allow"}[st.method], st.checks, j, exported(ds[j]), want[j])
			}
			switch {
			case ds[j].Never:
				never++
			case !ds[j].Allowed:
				denied++
			case ds[j].Delay > 0:
				delayed++
			}
		}
	}
	if r, ok := s.(*RedisStore); ok && !cluster {
		ring := readRing(t, testClient, r.Key("bulk", "c0"), now)
		t.Logf("bulk ring: version %d, cap %d, %d admissions, %d bytes", ring.version, ring.cap, len(ring.times), ring.bytes)
		// A short schedule may end before the ring has grown.
		if !testing.Short() && (ring.bytes <= ringSmall || ring.version != 2) {
			t.Errorf("bulk ring: version %d of %d bytes, want a units ring of more than %d", ring.version, ring.bytes, ringSmall)
		}
	}
	// The schedule must reach every case, or it tests little.
	t.Logf("%d steps: %d denials, %d delayed, %d never, %d leases lost, %d settles that may lift a denial, %d settles of calls longer than the window, %d reservations moved by an extend",
		len(schedule), denied, delayed, never, lost, lifts, long, moved)
	if denied == 0 || delayed == 0 || never == 0 || lost == 0 || lifts == 0 || long == 0 || moved == 0 {
		t.Errorf("the schedule missed a case: %d denials, %d delayed, %d never, %d leases lost, %d lifts, %d long calls, %d reservations moved", denied, delayed, never, lost, lifts, long, moved)
	}
}
