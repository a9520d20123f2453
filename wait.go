package slidingratelimit

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/limiter"
)

// defaultMaxWaiting is how many requests a handler holds at once unless
// max_waiting says otherwise. A held request keeps its connection, the
// server's goroutine for it and one timer: some tens of KB, so a thousand
// cost some tens of MB at most, and a thousand clients waiting at once on
// one instance is more than waits of seconds need.
const defaultMaxWaiting = 1000

// heldBodyMax is the largest request body that an HTTP/1 request may have
// and still be held: the room reads it before holding (see hold), since Go's
// HTTP/1 server notices a client that went away only once the body has
// been read, and a held request whose client left must give its slot back.
// A thousand held requests buffer 64 MB at most. A larger body, or one of
// unknown length (chunked), is decided without a wait: its client could
// leave unseen and keep its slot and its place in max_waiting.
const heldBodyMax = 64 << 10

// waitRoom holds the requests of one handler that the store admits for a
// later time, until then; at most max of them at once. A request that finds
// it full is decided without a wait: denied, as in a zone without one,
// rather than promised a slot that it might not be held for.
//
// The store records a held request's admission at its future time, so every
// instance counts it and no later request takes its slot; the deny cache
// knows waits too (see limiter.DenyCache). Each held request has one timer;
// no goroutine is started.
type waitRoom struct {
	max  int64
	held atomic.Int64
	// margin is kept before a request's deadline: the decision that
	// grants a wait can take up to the store's timeout, and the hold starts
	// when it returns.
	margin time.Duration
	// report is mode report: nothing is held (see hold).
	report  bool
	backend *backend
	// waited observes each hold, by zone; abandoned counts the holds whose
	// client went away.
	waited    map[*Zone]prometheus.Observer
	abandoned map[*Zone]prometheus.Counter
}

// newWaitRoom returns the wait room of a handler with zones, or nil when no
// zone waits.
func newWaitRoom(zones []*Zone, max int, margin time.Duration, report bool, b *backend) *waitRoom {
	w := &waitRoom{max: int64(max), margin: margin, report: report, backend: b,
		waited: make(map[*Zone]prometheus.Observer), abandoned: make(map[*Zone]prometheus.Counter)}
	for _, z := range zones {
		if z.wait > 0 {
			w.waited[z] = limiterMetrics.waitSeconds.WithLabelValues(z.Name)
			w.abandoned[z] = limiterMetrics.waitsAbandoned.WithLabelValues(z.Name)
		}
	}
	if len(w.waited) == 0 {
		return nil
	}
	return w
}

// enter gives the checks of req their waits and takes a place in the room,
// if the request may wait and a place is free, and reports whether it took
// one: then hold must follow the decision. A request waits only if every
// zone of algorithm log that applies to it has a wait (the store holds it
// at most the least of them), and no longer than its deadlines leave.
func (w *waitRoom) enter(req *request, r *http.Request) bool {
	if w == nil {
		return false
	}
	wait := time.Duration(-1)
	for _, z := range req.zones {
		if z.limit.Algorithm == limiter.SlidingLog && (wait < 0 || z.wait < wait) {
			wait = z.wait
		}
	}
	if deadline, ok := requestDeadline(r); ok && wait > 0 {
		wait = min(wait, time.Until(deadline)-w.margin)
	}
	if wait <= 0 || !bodyWatchable(r) {
		return false
	}
	if w.held.Add(1) > w.max {
		w.held.Add(-1)
		limiterMetrics.waitRoomFull.Inc()
		return false
	}
	limiterMetrics.waiting.Inc()
	for i, z := range req.zones {
		if z.limit.Algorithm == limiter.SlidingLog {
			req.checks[i].Wait = wait
		}
	}
	return true
}

// hold follows a decision of a request that entered: when the store
// admitted it for a later time, it holds the request until then (in mode
// report it passes at once, as a denial would). Either way it gives the
// place back. It reports false when the client went away while held: the
// request's admissions are then given back (settled to zero) in every zone,
// so the slot it was promised goes to another request. It reports false
// with an error when the request's body, read before holding, failed: the
// admissions are given back too.
func (w *waitRoom) hold(r *http.Request, req *request, src source, err error) (bool, error) {
	defer func() {
		w.held.Add(-1)
		limiterMetrics.waiting.Dec()
	}()
	if err != nil || !limiter.Admitted(req.decisions) || req.decisions[0].Delay <= 0 || w.report {
		return true, nil
	}
	delay, z := req.decisions[0].Delay, w.holder(req)
	t := time.NewTimer(delay)
	defer t.Stop()
	if r.ProtoMajor == 1 && r.ContentLength > 0 {
		// Read to its end (enter let in no body above heldBodyMax), so that
		// the server watches the connection while the request is held. A
		// client that leaves during the read fails it.
		if _, err := readBodyUpTo(r, heldBodyMax); err != nil {
			w.giveBack(r, req, z, src)
			return false, bodyError(err)
		}
	}
	select {
	case <-t.C:
		w.waited[z].Observe(delay.Seconds())
		return true, nil
	case <-r.Context().Done():
		w.giveBack(r, req, z, src)
		return false, nil
	}
}

// bodyError is the error of a held request whose body could not be read:
// 413 for a body above request_body's max_size, else 400 (the client sent
// less than it said, or left: then no one reads it).
func bodyError(err error) error {
	var tooLarge *http.MaxBytesError
	if errors.As(err, &tooLarge) {
		return caddyhttp.Error(http.StatusRequestEntityTooLarge, err)
	}
	return caddyhttp.Error(http.StatusBadRequest, fmt.Errorf("reading the request body: %w", err))
}

// giveBack gives the admissions of a held request whose client went away
// back, in every zone, so that the slot it was promised goes to another
// request.
func (w *waitRoom) giveBack(r *http.Request, req *request, z *Zone, src source) {
	w.abandoned[z].Inc()
	s := req.givenBack()
	w.backend.settle(context.WithoutCancel(r.Context()), s.checks, s.decisions, s.lowered, src)
}

// bodyWatchable reports whether the server can see r's client leave while
// r is held: always over HTTP/2 and HTTP/3, whose streams end on their own;
// over HTTP/1 when r's body is empty or of a known length the room reads
// before holding (see heldBodyMax).
func bodyWatchable(r *http.Request) bool {
	return r.ProtoMajor != 1 || r.ContentLength >= 0 && r.ContentLength <= heldBodyMax
}

// holder is the zone a held request is counted under: of the zones that
// wait, the one with the least room left, which is the one that held it.
func (w *waitRoom) holder(req *request) *Zone {
	var holder *Zone
	var least int64
	for i, z := range req.zones {
		if _, waits := w.waited[z]; waits && (holder == nil || req.decisions[i].Remaining < least) {
			holder, least = z, req.decisions[i].Remaining
		}
	}
	return holder
}

// requestDeadline is the earliest time by which r must be answered: its
// context's deadline, and the server's write timeout and, when a body is
// still to be read, its read timeout, both counted from when the server
// took the request (its start_time), as the server counts them.
func requestDeadline(r *http.Request) (time.Time, bool) {
	deadline, ok := r.Context().Deadline()
	srv, _ := r.Context().Value(caddyhttp.ServerCtxKey).(*caddyhttp.Server)
	start, _ := caddyhttp.GetVar(r.Context(), "start_time").(time.Time)
	if srv == nil || start.IsZero() {
		return deadline, ok
	}
	timeouts := []caddy.Duration{srv.WriteTimeout, 0}
	if r.ContentLength != 0 {
		timeouts[1] = srv.ReadTimeout
	}
	for _, timeout := range timeouts {
		if timeout > 0 {
			if d := start.Add(time.Duration(timeout)); !ok || d.Before(deadline) {
				deadline, ok = d, true
			}
		}
	}
	return deadline, ok
}

// readBodyUpTo reads r's body, up to limit bytes, and puts it back intact
// for the next handler: the bytes read, then whatever the client has still
// to send. It reports whether that was the whole body (the body ended
// within limit). A body that ended was read to its end, which is what
// makes Go's HTTP/1 server watch the connection from then on: a client that
// goes away then cancels the request's context.
//
// A read error (the client went away, the server's read timeout) is
// returned as is; the body is then put back with what was read, and the
// error comes again to the next reader.
func readBodyUpTo(r *http.Request, limit int64) (whole bool, err error) {
	if r.Body == nil || r.Body == http.NoBody {
		return true, nil
	}
	original := r.Body
	read, err := io.ReadAll(io.LimitReader(original, limit+1))
	whole = err == nil && int64(len(read)) <= limit
	switch {
	case whole:
		// Read to EOF: nothing is left to read from the client.
		r.Body = readBody{bytes.NewReader(read), original}
	case err != nil:
		r.Body = readBody{io.MultiReader(bytes.NewReader(read), errorReader{err}), original}
	default:
		r.Body = readBody{io.MultiReader(bytes.NewReader(read), original), original}
	}
	return whole, err
}

// readBody is a body read in part or whole (reader), still closed through
// the one the server gave.
type readBody struct {
	io.Reader
	original io.Closer
}

func (b readBody) Close() error { return b.original.Close() }

// errorReader fails each read with err.
type errorReader struct{ err error }

func (e errorReader) Read([]byte) (int, error) { return 0, e.err }
