package limiter

import (
	_ "embed"
	"encoding/binary"
	"fmt"
	"math"
	"time"

	"github.com/redis/go-redis/v9"
)

// limitScript decides a whole batch of requests in one call; limit.lua
// documents its keys, arguments and reply.
var (
	//go:embed limit.lua
	limitSource string
	limitScript = redis.NewScript(limitSource)
)

// op is what limit.lua does with one request.
type op uint8

const (
	opPeek op = iota
	opAllow
	opRefund
)

const (
	// zoneArgLen is the size of one zone's arguments: algorithm, window,
	// max, token.
	zoneArgLen = 1 + 3*8
	// zoneReplyLen is the size of one zone's reply: allowed, remaining,
	// reset, token.
	zoneReplyLen = 1 + 3*8
)

// appendRequest packs one request's arguments for limit.lua.
func appendRequest(buf []byte, o op, checks []Check, decisions []Decision) []byte {
	buf = append(buf, byte(o), byte(len(checks)))
	for i, c := range checks {
		token := int64(-1)
		if o == opRefund {
			token = decisions[i].token
		}
		buf = append(buf, byte(c.Limit.Algorithm))
		buf = binary.BigEndian.AppendUint64(buf, math.Float64bits(float64(c.Limit.Window.Microseconds())))
		buf = binary.BigEndian.AppendUint64(buf, math.Float64bits(float64(c.Limit.Max)))
		buf = binary.BigEndian.AppendUint64(buf, math.Float64bits(float64(token)))
	}
	return buf
}

// decodeReply fills one request's decisions from its part of the reply. A
// refund only clears the tokens: what was refunded records nothing more.
func decodeReply(reply string, o op, decisions []Decision) {
	for i := range decisions {
		z := reply[i*zoneReplyLen:]
		if o == opRefund {
			decisions[i].token = -1
			continue
		}
		d := Decision{
			Allowed:   z[0] == 1,
			Remaining: int64(replyNumber(z[1:])),
			Reset:     time.Duration(replyNumber(z[9:])) * time.Microsecond,
			token:     int64(replyNumber(z[17:])),
		}
		if !d.Allowed {
			d.RetryAfter = d.Reset
		}
		decisions[i] = d
	}
}

// replyNumber reads a big-endian double from the first 8 bytes of b.
func replyNumber(b string) float64 {
	var u uint64
	for i := range 8 {
		u = u<<8 | uint64(b[i])
	}
	return math.Float64frombits(u)
}

// checkReply reports a reply that does not hold zones decisions.
func checkReply(reply any, zones int) (string, error) {
	s, ok := reply.(string)
	if !ok || len(s) != zones*zoneReplyLen {
		return "", fmt.Errorf("rate limit script: unexpected reply of %T for %d zones", reply, zones)
	}
	return s, nil
}
