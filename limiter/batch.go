package limiter

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

const (
	// maxBatch and maxBatchZones bound one script call: a full batch is about
	// a millisecond of Redis's time, a small part of any sensible timeout,
	// so one slow call holds few decisions.
	maxBatch      = 128
	maxBatchZones = 512
)

// Request states: a request is answered once, by whoever moves it out of
// pending first.
const (
	pending int32 = iota
	answering
	abandoned
)

// request is one Allow, Peek, Settle or Extend waiting for its batch.
type request struct {
	ctx  context.Context
	op   op
	keys []string
	// args are the request's packed arguments, made by the caller. The
	// flushers read checks and write decisions only for a request they
	// answer, whose caller still waits: never one it gave up and may be
	// reusing.
	args      []byte
	checks    []Check
	decisions []Decision
	wait      time.Duration
	// leases are the ids of the leases an Allow takes; nil without any.
	leases []uint64
	// deadline is when the request is answered without Redis: set before
	// the request is queued, moved by the watcher (graced) when the
	// host's CPUs held it up, read by the flushers without a lock.
	deadline atomicTime
	// graces counts the times the deadline was moved; under the
	// batcher's mu.
	graces int
	// life is the call that carries the request, once sent.
	life atomic.Pointer[callLife]
	// slot is the Redis Cluster slot of every key; 0 on a single server.
	slot  uint16
	state atomic.Int32
	err   error
	done  chan struct{}
	// key and arg hold the key and the arguments of a request of one
	// check, the most common, which then allocates neither.
	key [1]string
	arg [requestArgLen + zoneArgLen]byte
}

// atomicTime is a time read and written atomically: nanoseconds on the
// monotonic clock after monoBase.
type atomicTime struct{ ns atomic.Int64 }

// monoBase is the time atomicTime counts from.
var monoBase = time.Now()

func (t *atomicTime) Load() time.Time   { return monoBase.Add(time.Duration(t.ns.Load())) }
func (t *atomicTime) Store(v time.Time) { t.ns.Store(int64(v.Sub(monoBase))) }

// abandon answers r with err unless it was answered already, and reports
// whether it did.
func (r *request) abandon(err error) bool {
	if r.state.CompareAndSwap(pending, abandoned) {
		r.err = err
		close(r.done)
		return true
	}
	return false
}

// slotCall is one limit.lua call: the requests of one slot.
type slotCall struct {
	requests []*request
	keys     []string
	nkeys    int
	args     packedArgs
	zones    int
	// via is how the call is sent: as a function, or as a script.
	via callVia
	cmd *redis.Cmd
}

// packedArgs is a call's packed requests, ARGV[1]. go-redis writes a
// pointer to it through MarshalBinary, and boxes a pointer without
// allocating, as it does the keys' (*string).
type packedArgs []byte

// MarshalBinary implements encoding.BinaryMarshaler.
func (a *packedArgs) MarshalBinary() ([]byte, error) { return *a, nil }

// callVia is how a call reaches limit.lua.
type callVia uint8

const (
	// viaFunction calls the library's function: FCALL.
	viaFunction callVia = iota
	// viaScript calls the script by its hash: EVALSHA.
	viaScript
	// viaLoadedScript calls the script by its hash right after SCRIPT
	// LOAD: EVALSHA, which a NOSCRIPT then makes an EVAL.
	viaLoadedScript
	// viaSource sends the script itself: EVAL, only where SCRIPT LOAD
	// failed or did not help.
	viaSource
)

// The calls' first two words, boxed once.
var callWords = [...][2]any{
	viaFunction:     {"fcall", functionName},
	viaScript:       {"evalsha", limitScript.Hash()},
	viaLoadedScript: {"evalsha", limitScript.Hash()},
	viaSource:       {"eval", scriptSource},
}

// command appends c's FCALL, EVALSHA or EVAL (c.via) to args and returns
// it. now, when set (by tests), is the time in microseconds the script
// decides at, in place of Redis's clock.
func (c *slotCall) command(ctx context.Context, args []any, now func() int64) (*redis.Cmd, []any) {
	from := len(args)
	args = append(args, callWords[c.via][0], callWords[c.via][1])
	c.nkeys = len(c.keys)
	args = append(args, &c.nkeys)
	for i := range c.keys {
		args = append(args, &c.keys[i])
	}
	args = append(args, &c.args)
	if now != nil {
		args = append(args, now())
	}
	cmd := redis.NewCmd(ctx, args[from:len(args):len(args)]...)
	cmd.SetFirstKeyPos(3)
	return cmd, args
}

// noScript reports an error that says Redis lacks the script.
func noScript(err error) bool {
	return err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT")
}

// cmdErr is the error of one command of a pipeline. A pipeline that failed
// before its commands ran (a refused connection setup: wrong password, bad
// database index) leaves them without an error of their own: then the
// pipeline's error is theirs.
func cmdErr(cmd *redis.Cmd, execErr error) error {
	if err := cmd.Err(); err != nil {
		return err
	}
	if _, ok := cmd.Val().(string); !ok && execErr != nil {
		return execErr
	}
	return nil
}

// answer decodes a call's reply into its requests' decisions, or gives them
// its error. It returns the call's time in Redis, and whether the call ran
// there.
func (c *slotCall) answer(reply any, err error) (time.Duration, bool) {
	var s string
	if err == nil {
		s, err = checkReply(reply, replyLen(len(c.requests), c.zones))
	}
	if err != nil {
		err = fmt.Errorf("running rate limit script: %w", err)
	}
	for _, r := range c.requests {
		n := replyLen(1, len(r.keys))
		if r.state.CompareAndSwap(pending, answering) {
			if err != nil {
				r.err = err
			} else if decodeReply(s[:n], r.op, r.checks, r.decisions, r.wait, r.leases) {
				r.err = fmt.Errorf("extending leases: %w", ErrLeaseLost)
			}
			close(r.done)
		}
		if err == nil {
			s = s[n:]
		}
	}
	if err != nil {
		return 0, false
	}
	return callTime(reply.(string)), true
}

// groupCalls splits requests into one call per slot, keeping their order
// within each slot.
func groupCalls(calls []slotCall, requests []*request, cluster bool) []slotCall {
	for i := range calls {
		calls[i].requests = calls[i].requests[:0]
		calls[i].keys = calls[i].keys[:0]
		calls[i].args = calls[i].args[:0]
		calls[i].zones, calls[i].nkeys = 0, 0
		calls[i].cmd = nil
	}
	n := 0
	for _, r := range requests {
		i := 0
		if cluster {
			for i < n && calls[i].requests[0].slot != r.slot {
				i++
			}
		}
		if i == n {
			if n == len(calls) {
				calls = append(calls, slotCall{})
			}
			n++
		}
		c := &calls[i]
		c.requests = append(c.requests, r)
		c.keys = append(c.keys, r.keys...)
		c.args = append(c.args, r.args...)
		c.zones += len(r.keys)
	}
	return calls[:n]
}
