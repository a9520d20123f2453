package limiter

import (
	_ "embed"
	"encoding/binary"
	"fmt"
	"math"
	"time"
)

// limitSource decides a whole batch of requests in one call; limit.lua
// documents its semantics, keys, arguments and reply, and library.go how it
// is called.
//
//go:embed limit.lua
var limitSource string

// op is what limit.lua does with one request.
type op uint8

const (
	opPeek op = iota
	opAllow
	opSettle
	opExtend
)

const (
	// requestArgLen is the size of one request's own arguments: op, zones,
	// wait.
	requestArgLen = 2 + 8
	// zoneArgLen is the size of one zone's arguments: kind, window, max,
	// cost, token, aux.
	zoneArgLen = 1 + 5*8
	// requestReplyLen is the size of one request's own reply: its delay.
	requestReplyLen = 8
	// zoneReplyLen is the size of one zone's reply: flag, remaining, reset,
	// token.
	zoneReplyLen = 1 + 3*8
)

// floorToken is the token of a settle that is a floor (see holding.floor).
const floorToken = -2

// Reply flags of a zone.
const (
	flagDenied = iota
	flagAllowed
	flagNever
)

// appendRequest packs one request's arguments for limit.lua: the costs to
// reserve for opAllow and opPeek (with leases, the ids of the leases to
// take), the real costs and what decisions recorded for opSettle and
// opExtend.
func appendRequest(buf []byte, o op, checks []Check, decisions []Decision, wait time.Duration, leases []uint64) []byte {
	buf = append(buf, byte(o), byte(len(checks)))
	buf = appendFloat(buf, float64(microseconds(wait)))
	for i, c := range checks {
		cost, token, aux := float64(reserved(c)), -1.0, uint64(0)
		switch {
		case o >= opSettle:
			h := decisions[i].held
			cost, token, aux = float64(c.Cost), float64(h.at), math.Float64bits(float64(h.units))
			if h.floor {
				token = floorToken
			}
			if c.Limit.Algorithm == Concurrency {
				aux = h.lease
			}
		case leases != nil:
			aux = leases[i]
		}
		buf = append(buf, byte(c.Limit.Algorithm))
		buf = appendFloat(buf, float64(microseconds(c.Limit.Window)))
		buf = appendFloat(buf, float64(c.Limit.Max))
		buf = appendFloat(buf, cost)
		buf = appendFloat(buf, token)
		buf = binary.BigEndian.AppendUint64(buf, aux)
	}
	return buf
}

func appendFloat(buf []byte, f float64) []byte {
	return binary.BigEndian.AppendUint64(buf, math.Float64bits(f))
}

// decodeReply fills one request's decisions from its part of the reply. A
// settle or an extend changes no exported figure but a settle's Lifts: it
// spends what it settled, and reports the leases that extend found expired.
func decodeReply(reply string, o op, checks []Check, decisions []Decision, wait time.Duration, leases []uint64) (lost bool) {
	delay := time.Duration(replyNumber(reply)) * time.Microsecond
	reply = reply[requestReplyLen:]
	if o >= opSettle {
		for i := range decisions {
			switch {
			case o == opSettle:
				// The remaining figure is the room the zone had before.
				h := decisions[i].held
				decisions[i].Lifts = checks[i].Limit.Algorithm != Concurrency && h.recorded && int64(replyNumber(reply[i*zoneReplyLen+1:])) < h.units
				if at := int64(replyNumber(reply[i*zoneReplyLen+17:])); at > 0 {
					decisions[i].charged = at
				}
				decisions[i].held = holding{}
			case decisions[i].held.lease != 0 && reply[i*zoneReplyLen] != 1:
				decisions[i].held = holding{}
				lost = true
			}
		}
		return lost
	}
	admitted := true
	for i := range decisions {
		z := reply[i*zoneReplyLen:]
		d := Decision{
			Allowed:   z[0] == flagAllowed,
			Never:     z[0] == flagNever,
			Remaining: int64(replyNumber(z[1:])),
			Reset:     time.Duration(replyNumber(z[9:])) * time.Microsecond,
		}
		if !d.Allowed {
			admitted = false
			if !d.Never {
				d.RetryAfter = d.Reset
				if checks[i].Limit.Algorithm == SlidingLog {
					d.RetryAfter -= wait.Truncate(time.Microsecond)
				}
			}
		}
		if o == opPeek && checks[i].Limit.Algorithm == SlidingLog {
			d.LastMax = max(0, int64(replyNumber(z[17:]))) // the token field carries it
		}
		if o == opAllow {
			d.held = holding{recorded: true, at: int64(replyNumber(z[17:])), units: reserved(checks[i])}
			if leases != nil {
				d.held.lease = leases[i]
			}
		}
		decisions[i] = d
	}
	for i := range decisions {
		if admitted {
			decisions[i].Delay = delay
		} else {
			decisions[i].held = holding{}
		}
	}
	return false
}

// replyNumber reads a big-endian double from the first 8 bytes of b.
func replyNumber(b string) float64 {
	var u uint64
	for i := range 8 {
		u = u<<8 | uint64(b[i])
	}
	return math.Float64frombits(u)
}

// replyLen is the size of the reply to requests of zones zones in all.
func replyLen(requests, zones int) int { return requests*requestReplyLen + zones*zoneReplyLen }

// callTimeLen is the size of the call's own time in Redis, after the
// requests' replies.
const callTimeLen = 8

// checkReply reports a reply that is not want bytes long, and the call's
// time; it returns the requests' replies.
func checkReply(reply any, want int) (string, error) {
	s, ok := reply.(string)
	if !ok || len(s) != want+callTimeLen {
		return "", fmt.Errorf("rate limit script: unexpected reply of %T (%d bytes, want %d)", reply, len(s), want+callTimeLen)
	}
	return s[:want], nil
}

// callTime is the time a call spent in Redis, from its reply, which
// checkReply accepted.
func callTime(reply string) time.Duration {
	return time.Duration(replyNumber(reply[len(reply)-callTimeLen:]) * float64(time.Microsecond))
}
