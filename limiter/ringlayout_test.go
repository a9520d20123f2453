package limiter

import (
	"context"
	"encoding/binary"
	"math"
	"testing"

	"github.com/redis/go-redis/v9"
)

// The ring's layout, as limit.lua writes it: a header of cap, head, count
// and base (uint32 each; base in seconds), then the samples, then cap
// slots; every time is an offset of W bytes in microseconds from base.
const (
	ringHeader = 16
	ringW      = 6
	ringSmall  = 512
)

// ringSamples is how many samples a ring of cap holds, and its bucket size.
func ringSamples(cap int) (b, s int) {
	if cap <= ringSmall {
		return 0, cap
	}
	s = int(math.Ceil(math.Sqrt(float64(cap))))
	return (cap + s - 1) / s, s
}

// ringState is a log key's ring, decoded.
type ringState struct {
	cap, head int
	// times are the kept admission times in microseconds, oldest first.
	times []int64
	// samples are the header's copies of slots b*S.
	samples []int64
	slots   []int64
}

func readOffset(b []byte) int64 {
	var buf [8]byte
	copy(buf[8-ringW:], b[:ringW])
	return int64(binary.BigEndian.Uint64(buf[:]))
}

// readRing decodes the ring at key, failing the test when the value is not
// a well-formed ring: its length, strictly increasing times, samples equal to
// the slots they copy.
func readRing(tb testing.TB, client redis.Cmdable, key string) ringState {
	tb.Helper()
	v, err := client.Get(context.Background(), key).Bytes()
	if err != nil {
		tb.Fatalf("GET %s: %v", key, err)
	}
	if len(v) < ringHeader {
		tb.Fatalf("ring %s: %d bytes, shorter than its header", key, len(v))
	}
	r := ringState{cap: int(binary.BigEndian.Uint32(v[0:])), head: int(binary.BigEndian.Uint32(v[4:]))}
	n := int(binary.BigEndian.Uint32(v[8:]))
	base := int64(binary.BigEndian.Uint32(v[12:])) * 1_000_000
	readTime := func(b []byte) int64 { return base + readOffset(b) }
	b, s := ringSamples(r.cap)
	if want := ringHeader + ringW*(b+r.cap); len(v) != want {
		tb.Fatalf("ring %s of cap %d: %d bytes, want %d", key, r.cap, len(v), want)
	}
	if n > r.cap || (r.cap > 0 && r.head >= r.cap) {
		tb.Fatalf("ring %s: cap %d, head %d, count %d", key, r.cap, r.head, n)
	}
	for i := range b {
		r.samples = append(r.samples, readTime(v[ringHeader+ringW*i:]))
	}
	for p := range r.cap {
		r.slots = append(r.slots, readTime(v[ringHeader+ringW*(b+p):]))
	}
	for i := range n {
		r.times = append(r.times, r.slots[(r.head+i)%r.cap])
		if i > 0 && r.times[i] <= r.times[i-1] {
			tb.Fatalf("ring %s: time %d (%d) not after time %d (%d)", key, i, r.times[i], i-1, r.times[i-1])
		}
	}
	for i := range b {
		p := i * s
		if (p-r.head+r.cap)%r.cap < n && r.samples[i] != r.slots[p] {
			tb.Fatalf("ring %s: sample %d = %d, slot %d = %d", key, i, r.samples[i], p, r.slots[p])
		}
	}
	return r
}

// encodeRing returns the value of a full ring of cap holding times (oldest
// first, at most cap of them), head at slot 0, as limit.lua writes it.
func encodeRing(cap int, times []int64) []byte {
	b, s := ringSamples(cap)
	v := make([]byte, ringHeader+ringW*(b+cap))
	binary.BigEndian.PutUint32(v[0:], uint32(cap))
	binary.BigEndian.PutUint32(v[8:], uint32(len(times)))
	base := times[0] / 1_000_000
	binary.BigEndian.PutUint32(v[12:], uint32(base))
	put := func(off int, t int64) {
		var buf [8]byte
		binary.BigEndian.PutUint64(buf[:], uint64(t-base*1_000_000))
		copy(v[off:off+ringW], buf[8-ringW:])
	}
	for i, t := range times {
		put(ringHeader+ringW*(b+i), t)
		if s > 0 && i%s == 0 && b > 0 {
			put(ringHeader+ringW*(i/s), t)
		}
	}
	return v
}
