package slidingratelimit

import (
	"bytes"
	"io"
	"net/http"
	"time"
)

// A zone whose cost is read from the request's body (cost json, cost llm)
// reads the body before the request is decided, and hands it on intact.

const (
	// costJSONMaxBody is the most of a request body that cost json
	// reads: a chat request with a long conversation fits; a larger one
	// reserves the default.
	costJSONMaxBody = 1 << 20
)

// costJSONReadTime is how long a body may take to arrive before the request
// reserves the default and goes on (its body follows as it comes): a slow
// client holds a reader, not the request. Tests shorten it.
var costJSONReadTime = 10 * time.Second

// Why cost json took the default.
const (
	costNotJSON  = "not JSON"
	costTooLarge = "body above 1 MiB"
	costSlow     = "body not read in time"
	costUnread   = "body not readable"
)

// peekedBody is what cost json read of a request body: its bytes, its
// size (a bound, when it was not read whole), and why it is not usable.
type peekedBody struct {
	data []byte
	size int64
	why  string
}

// bodyPeek is a request body that was read ahead (by a goroutine, so that
// a slow client costs a wait of costJSONReadTime at most), then handed on:
// what was read, then the rest.
type bodyPeek struct {
	rest io.ReadCloser
	done chan struct{}
	buf  []byte
	err  error
	off  int
	// peeked is what the reading gave, for the zones after the first.
	peeked peekedBody
	// model is the model the body names, once cost llm read it
	// (modelRead), for settle llm's prices.
	model     string
	modelRead bool
	// output is the largest output bound a cost llm read (with modelRead).
	output int64
	// searches are the most searches its server tools may bill, for a
	// settle whose usage does not report them (llm.go's requestSearches).
	searches int64
}

// peekBody reads r's body, up to costJSONMaxBody bytes and for
// costJSONReadTime at most, and puts it back, whole, for the handlers
// after; a second zone gets what the first read.
func peekBody(r *http.Request) peekedBody {
	if p, ok := r.Body.(*bodyPeek); ok {
		return p.peeked
	}
	if r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
		return peekedBody{}
	}
	p := &bodyPeek{rest: r.Body, done: make(chan struct{})}
	go func() {
		defer close(p.done)
		if n := r.ContentLength; n > 0 && n <= costJSONMaxBody {
			// A length the body states is read into a buffer of that
			// size, whole: a bytes.Buffer would copy it into one twice
			// as large to look for the end. What follows, if anything,
			// stays in rest.
			p.buf = make([]byte, n)
			var k int
			k, p.err = io.ReadFull(p.rest, p.buf)
			p.buf = p.buf[:k]
			return
		}
		var b bytes.Buffer
		_, p.err = b.ReadFrom(io.LimitReader(p.rest, costJSONMaxBody+1))
		p.buf = b.Bytes()
	}()
	r.Body = p
	unread := func(why string) peekedBody {
		size := r.ContentLength
		if size < 0 {
			size = costJSONMaxBody
		}
		return peekedBody{size: size, why: why}
	}
	timer := time.NewTimer(costJSONReadTime)
	defer timer.Stop()
	select {
	case <-p.done:
		switch {
		case p.err != nil:
			p.peeked = unread(costUnread)
		case len(p.buf) > costJSONMaxBody:
			p.peeked = unread(costTooLarge)
			p.peeked.size = max(p.peeked.size, int64(len(p.buf)))
		default:
			p.peeked = peekedBody{data: p.buf, size: int64(len(p.buf))}
		}
	case <-timer.C:
		p.peeked = unread(costSlow)
	case <-r.Context().Done():
		p.peeked = unread(costUnread)
	}
	return p.peeked
}

// Read reads what was read ahead, then the rest of the body.
func (p *bodyPeek) Read(b []byte) (int, error) {
	<-p.done
	if p.off < len(p.buf) {
		n := copy(b, p.buf[p.off:])
		p.off += n
		return n, nil
	}
	if p.err != nil {
		return 0, p.err
	}
	return p.rest.Read(b)
}

// Close closes the body, once its reading ahead is over.
func (p *bodyPeek) Close() error {
	return p.rest.Close()
}

// Why a request was refused for its body, the values of the reason label of
// body_refusals_total.
const (
	refusedSlow = iota
	refusedNotJSON
	refusedUnbounded
)

// bodyRefusal is the answer to a request whose body cannot be priced: it
// is refused before the next handler sees it.
type bodyRefusal struct {
	reason int
	// why says, for refusedUnbounded, what could not be bounded.
	why string
}

var refusalReasons = [...]string{refusedSlow: "slow", refusedNotJSON: "not_json", refusedUnbounded: "unbounded"}

func (b *bodyRefusal) Error() string {
	switch b.reason {
	case refusedNotJSON:
		return "request body is not one JSON value that the rate limiter can read"
	case refusedUnbounded:
		return "the rate limiter cannot bound what this call may spend, so this route refuses it: " + b.why
	}
	return "request body did not arrive whole in time"
}

// status is the response's: 408 for a body that did not arrive, 400 for
// one that is not JSON or cannot be bounded.
func (b *bodyRefusal) status() int {
	if b.reason == refusedSlow {
		return http.StatusRequestTimeout
	}
	return http.StatusBadRequest
}
