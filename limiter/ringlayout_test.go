package limiter

import (
	"context"
	"encoding/binary"
	"math"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// The ring's layout, as limit.lua writes it, tagged by its first byte.
// ringSmallCount, a count ring of at most 80 entries: tag, cap and head (u8
// each), the newest time (u48), count (u32) and expiry (u40, milliseconds
// modulo 2^40). ringCount (a larger count ring) and ringUnits: tag (u8), cap,
// head and count (u32 each), expiry (u40); for ringUnits then the sequence
// number of the head (double), the sum before it and the sum up to the newest
// (u48 each); then the newest time (u48), the mirror's head and count (u8
// each), and the mirror: 96 bytes holding copies of the oldest entries, from
// its head. Then cap entries: a time (6 bytes, microseconds modulo 2^48) and,
// for ringUnits, its units (6 bytes); for ringUnits then the buckets' base
// sums (6 bytes each). The count is at bytes 9 to 12 in all three. A tag plus
// ringWithLastMax (7, 6) is ringCount or ringUnits with the max of the newest
// record (u48) after the header, before the mirror; ringSmallCount plus it (8)
// has the count a u8 (byte 9) and that max a u24 (0 when larger) after the
// expiry, in the same 18 bytes.
const (
	ringUnits       = 2
	ringCount       = 3
	ringSmallCount  = 4
	ringWithLastMax = 4
	ringSmall       = 512 // bytes read whole
	ringBucket      = 64
	ringMerge       = 256 // entries from which a units ring merges admissions
	mod48           = 1 << 48
)

// ringState is a log key's ring, decoded.
type ringState struct {
	version, cap, head int
	// times and units are the kept admissions' times in microseconds and
	// units, oldest first.
	times, units []int64
	// bytes is the value's length.
	bytes int
	// mirrored is how many of the oldest entries the mirror holds.
	mirrored int
	// lastMax is the max of the newest record; -1 in a layout without it.
	lastMax int64
}

func readU48(b []byte) int64 {
	var buf [8]byte
	copy(buf[2:], b[:6])
	return int64(binary.BigEndian.Uint64(buf[:]))
}

func putU48(b []byte, x int64) {
	var buf [8]byte
	binary.BigEndian.PutUint64(buf[:], uint64(x)%mod48)
	copy(b, buf[2:])
}

// decodeTime is the time kept modulo 2^48 as o, read as limit.lua reads it
// at now: the one in (now - 0.75*2^48, now + 0.25*2^48].
func decodeTime(o, now int64) int64 {
	base := now - mod48/4*3
	return base + ((o-base)%mod48+mod48)%mod48
}

// readRing decodes the ring at key as the script would at now (microseconds),
// failing the test when the value is not a well-formed ring: its length,
// strictly increasing times, and for a units ring sums that add up: each
// kept bucket's base and the newest sum agree with the units.
func readRing(tb testing.TB, client redis.Cmdable, key string, now int64) ringState {
	tb.Helper()
	v, err := client.Get(context.Background(), key).Bytes()
	if err != nil {
		tb.Fatalf("GET %s: %v", key, err)
	}
	if len(v) < 18 {
		tb.Fatalf("ring %s: %d bytes, shorter than a header", key, len(v))
	}
	r := ringState{version: int(v[0]), bytes: len(v)}
	n := int(binary.BigEndian.Uint32(v[9:]))
	mirror, hdr, entry, ext := 26, 122, 6, 0
	r.lastMax = -1
	switch r.version {
	case ringSmallCount + ringWithLastMax:
		r.version, n, r.lastMax = ringSmallCount, int(v[9]), readU48(append([]byte{0, 0, 0}, v[15:18]...))
	case ringUnits + ringWithLastMax, ringCount + ringWithLastMax:
		r.version, ext = r.version-ringWithLastMax, 6
	}
	switch r.version {
	case ringSmallCount:
		r.cap, r.head, mirror, hdr = int(v[1]), int(v[2]), 18, 18
	case ringUnits, ringCount:
		r.cap, r.head = int(binary.BigEndian.Uint32(v[1:])), int(binary.BigEndian.Uint32(v[5:]))
		if r.version == ringUnits {
			mirror, hdr, entry = 46, 142, 12
		}
	}
	mirror, hdr = mirror+ext, hdr+ext
	if ext > 0 {
		r.lastMax = readU48(v[mirror-6:])
	}
	B := r.cap/ringBucket + 2
	want := hdr + entry*r.cap
	if r.version == ringUnits {
		want += 6 * B
	}
	if r.version < ringUnits || r.version > ringSmallCount || r.version == ringSmallCount && r.cap > 80 || r.version == ringCount && r.cap <= 80 || len(v) != want || n > r.cap || r.cap > 0 && r.head >= r.cap {
		tb.Fatalf("ring %s: version %d, %d bytes (want %d), cap %d, head %d, count %d", key, r.version, len(v), want, r.cap, r.head, n)
	}
	for i := range n {
		e := v[hdr+entry*((r.head+i)%r.cap):]
		r.times = append(r.times, decodeTime(readU48(e), now))
		r.units = append(r.units, 1)
		if r.version == ringUnits {
			r.units[i] = readU48(e[6:])
		}
		if i > 0 && r.times[i] <= r.times[i-1] {
			tb.Fatalf("ring %s: time %d (%d) not after time %d (%d)", key, i, r.times[i], i-1, r.times[i-1])
		}
	}
	if n > 0 {
		at := mirror - 8 - ext
		if r.version == ringSmallCount {
			at = 3
		}
		if newest := decodeTime(readU48(v[at:]), now); newest != r.times[n-1] {
			tb.Fatalf("ring %s: the header's newest time %d, the newest entry's %d", key, newest, r.times[n-1])
		}
	}
	if r.version != ringSmallCount {
		// The mirror holds copies of the oldest entries, from its head.
		mh, mc := int(v[mirror-2-ext]), int(v[mirror-1-ext])
		r.mirrored = mc
		if mc > n || (mh+mc)*entry > 96 {
			tb.Fatalf("ring %s: mirror of %d entries from %d, %d entries kept", key, mc, mh, n)
		}
		for i := range mc {
			if m, e := v[mirror+entry*(mh+i):][:entry], v[hdr+entry*((r.head+i)%r.cap):][:entry]; string(m) != string(e) {
				tb.Fatalf("ring %s: mirror entry %d is %x, the ring's %x", key, i, m, e)
			}
		}
	}
	if r.version == ringUnits {
		seq := int64(math.Float64frombits(binary.BigEndian.Uint64(v[18:])))
		floor, total := readU48(v[26:]), readU48(v[32:])
		sum := floor
		for i, u := range r.units {
			if q := seq + int64(i); q%ringBucket == 0 && i > 0 {
				if base := readU48(v[hdr+entry*r.cap+6*int((q/ringBucket)%int64(B)):]); base != sum%mod48 {
					tb.Fatalf("ring %s: base of bucket %d = %d, want %d", key, q/ringBucket, base, sum%mod48)
				}
			}
			sum += u
		}
		if sum%mod48 != total {
			tb.Fatalf("ring %s: units add up to %d, header says %d", key, sum%mod48, total)
		}
	}
	return r
}

// encodeRing returns the value of a count ring of cap holding times (oldest
// first, at most cap of them), head at slot 0, as limit.lua writes it (with
// an empty mirror, and the max of the newest record unknown).
func encodeRing(cap int, times []int64) []byte { return encodeRingLayout(cap, times, true) }

// encodeRingLayout is encodeRing, in the layout of a ring written before it
// kept the max of the newest record (tags ringSmallCount and ringCount) unless withMax.
func encodeRingLayout(cap int, times []int64, withMax bool) []byte {
	hdr, ext := 18, 0
	if cap > 80 {
		hdr = 122
	}
	if withMax {
		ext = 6
	}
	if hdr == 18 {
		ext = 0 // ringSmallCount with the last max keeps the max in the same 18 bytes
	}
	v := make([]byte, hdr+ext+6*cap)
	if hdr == 18 {
		v[0], v[1] = ringSmallCount, byte(cap)
		putU48(v[3:], times[len(times)-1])
	} else {
		v[0] = ringCount
		binary.BigEndian.PutUint32(v[1:], uint32(cap))
		putU48(v[18:], times[len(times)-1])
	}
	binary.BigEndian.PutUint32(v[9:], uint32(len(times)))
	if withMax {
		v[0] += ringWithLastMax
		if hdr == 18 {
			v[9], v[10], v[11], v[12] = byte(len(times)), 0, 0, 0 // the count a u8, the expiry and the max (0) after it
		}
	}
	for i, t := range times {
		putU48(v[hdr+ext+6*i:], t)
	}
	return v
}

// encodeUnitsRing returns the value of a units ring (with the max of its
// newest record, lastMax) of cap holding times and their units (oldest
// first), head at slot 0 and sequence number 0, its mirror holding the
// oldest entries, expiring (ms mod 2^40) at exp, as limit.lua writes it.
func encodeUnitsRing(cap int, times, units []int64, lastMax, exp int64) []byte {
	const hdr = 46 + 6 + 96
	B := cap/ringBucket + 2
	v := make([]byte, hdr+12*cap+6*B)
	v[0] = ringUnits + ringWithLastMax
	binary.BigEndian.PutUint32(v[1:], uint32(cap))
	binary.BigEndian.PutUint32(v[9:], uint32(len(times)))
	var e [8]byte
	binary.BigEndian.PutUint64(e[:], uint64(exp)%(1<<40))
	copy(v[13:18], e[3:])
	var total int64
	for i, t := range times {
		if i%ringBucket == 0 {
			putU48(v[hdr+12*cap+6*((i/ringBucket)%B):], total)
		}
		putU48(v[hdr+12*i:], t)
		putU48(v[hdr+12*i+6:], units[i])
		total += units[i]
	}
	putU48(v[32:], total)
	putU48(v[38:], times[len(times)-1])
	v[45] = byte(min(len(times), 8))
	putU48(v[46:], lastMax)
	copy(v[52:], v[hdr:hdr+12*int(v[45])])
	return v
}

// TestRingKeepsLastMax: a ring keeps the max of its newest record for Peek;
// a ring written before it did is still read (the max unknown), and takes
// the field at its next record, keeping its admissions.
func TestRingKeepsLastMax(t *testing.T) {
	const t0 = 1_700_000_000_000_000
	for _, cap := range []int{10, 100} {
		c := Check{Zone: "z", Key: testKey(t), Limit: Limit{Window: time.Minute, Max: 1000}}
		key := testPrefix(t) + "{" + c.Key + "}:z"
		times := make([]int64, cap)
		for i := range times {
			times[i] = t0 - int64(cap-i)*1000
		}
		if err := testClient.Set(context.Background(), key, encodeRingLayout(cap, times, false), 0).Err(); err != nil {
			t.Fatal(err)
		}
		peek := func(max int64) Decision {
			c.Limit.Max = max
			r := &scriptReq{op: opPeek, keys: []string{key}, checks: []Check{c}}
			runScript(t, testClient, t0, r)
			return r.decisions[0]
		}
		if d := peek(1000); d.LastMax != 0 || d.Remaining != int64(1000-cap) {
			t.Fatalf("cap %d, old layout: peek %+v, want LastMax 0 (unknown), Remaining %d", cap, d, 1000-cap)
		}
		c.Limit.Max = int64(cap) + 3
		r := &scriptReq{op: opAllow, keys: []string{key}, checks: []Check{c}}
		runScript(t, testClient, t0, r)
		if !r.decisions[0].Allowed {
			t.Fatalf("cap %d: allow under max %d: %+v", cap, c.Limit.Max, r.decisions[0])
		}
		ring := readRing(t, testClient, key, t0)
		if ring.version != map[bool]int{true: ringSmallCount, false: ringCount}[cap <= 80] || ring.lastMax != int64(cap)+3 || len(ring.times) != cap+1 || ring.times[0] != times[0] {
			t.Fatalf("cap %d: after a record, ring version %d lastMax %d with %d times from %d; want lastMax %d, %d times from %d",
				cap, ring.version, ring.lastMax, len(ring.times), ring.times[0], cap+3, cap+1, times[0])
		}
		if d := peek(1000); d.LastMax != int64(cap)+3 || d.Remaining != int64(1000-cap-1) {
			t.Fatalf("cap %d: peek %+v, want LastMax %d, Remaining %d", cap, d, cap+3, 1000-cap-1)
		}
		// A max above 2^24-1: a larger ring keeps it, a small count ring has
		// no room for it and says it does not know.
		c.Limit.Max = 1 << 24
		r = &scriptReq{op: opAllow, keys: []string{key}, checks: []Check{c}}
		runScript(t, testClient, t0+1, r)
		if d, want := peek(1000), map[bool]int64{true: 0, false: 1 << 24}[cap <= 80]; !r.decisions[0].Allowed || d.LastMax != want {
			t.Fatalf("cap %d: after an admission under max 2^24, peek %+v, want LastMax %d", cap, d, want)
		}
	}
}

// redisNow returns Redis's clock in microseconds.
func redisNow(tb testing.TB, client redis.Cmdable) int64 {
	tb.Helper()
	now, err := client.Time(context.Background()).Result()
	if err != nil {
		tb.Fatal(err)
	}
	return now.UnixMicro()
}

// scriptReq is one request of a limit.lua call made by hand.
type scriptReq struct {
	op        op
	keys      []string
	checks    []Check
	decisions []Decision
	wait      time.Duration
	leases    []uint64
}

// runScript runs limit.lua once for reqs at the time now (microseconds; 0
// for Redis's clock) and fills their decisions.
func runScript(tb testing.TB, client redis.Scripter, now int64, reqs ...*scriptReq) {
	tb.Helper()
	var keys []string
	var args []byte
	zones := 0
	for _, r := range reqs {
		keys = append(keys, r.keys...)
		if r.decisions == nil {
			r.decisions = make([]Decision, len(r.checks))
		}
		args = appendRequest(args, r.op, r.checks, r.decisions, r.wait, r.leases)
		zones += len(r.checks)
	}
	argv := []any{args}
	if now != 0 {
		argv = append(argv, now)
	}
	reply, err := limitScript.Run(context.Background(), client, keys, argv...).Result()
	if err != nil {
		tb.Fatalf("limit.lua: %v", err)
	}
	s, err := checkReply(reply, replyLen(len(reqs), zones))
	if err != nil {
		tb.Fatal(err)
	}
	for _, r := range reqs {
		n := replyLen(1, len(r.checks))
		decodeReply(s[:n], r.op, r.checks, r.decisions, r.wait, r.leases)
		s = s[n:]
	}
}
