package slidingratelimit

import (
	"context"
	"errors"
	"io"
	"mime"
	"net/http"
	"strings"

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

// cost returns what the response m metered cost, at most max. ok is false
// when it says nothing usable: the reservation then stands, and why says
// why.
func (s *Settle) cost(m *responseMeter, max int64) (cost int64, ok bool, why string) {
	if s.Bytes {
		return min(m.bytes, max), true, ""
	}
	if len(s.JSON) > 0 {
		return s.jsonCost(m, max)
	}
	v := usage(m, s.header)
	n, ok := parseCount(v)
	if !ok {
		if v == "" {
			return 0, false, valueMissing
		}
		return 0, false, valueNotWhole
	}
	return min(n, max), true, ""
}

// usage reads the value of header name (canonical) once the response that m
// metered is done: a trailer that was not announced in the Trailer header
// (kept under http.TrailerPrefix), else the header's last value (an
// announced trailer is added after the header of its name), else the value
// it had as the status went out (deleted since from the response).
func usage(m *responseMeter, name string) string {
	h := m.Header()
	if v := h[http.TrailerPrefix+name]; len(v) > 0 {
		return v[len(v)-1]
	}
	if v := h[name]; len(v) > 0 {
		return v[len(v)-1]
	}
	return m.sentValue(name)
}

// follow makes m keep what s reads: a header, or the body's usage.
func (s *Settle) follow(m *responseMeter) {
	switch {
	case s.header != "":
		m.watch(s.header)
	case len(s.paths) > 0:
		m.readJSON(s.paths)
	}
}

// jsonCost is the usage that the paths of JSON add up to in the body that
// m read, when the response was whole.
func (s *Settle) jsonCost(m *responseMeter, max int64) (int64, bool, string) {
	u := m.jsonUsage(s.paths)
	if u == nil {
		// No body began (an error before any byte).
		return 0, false, valueMissing
	}
	if !m.whole {
		// Its usage comes last: what was read is not the call's.
		return 0, false, usageCut
	}
	n, why := u.total()
	if why != "" {
		return 0, false, why
	}
	return min(n, max), true, ""
}

// responseMeter records what the client gets of a response: its status and
// the bytes of its body, as they leave this handler (compressed, when an
// encoder runs after it, as it does in Caddy's directive order). Headers and
// trailers stay in the header map, where the settle step reads them; the
// headers it watches are also kept as the status goes out, since a handler
// before this one may delete them from the map then (a deferred
// `header -X-Usage`, which keeps an upstream's usage from clients).
type responseMeter struct {
	*caddyhttp.ResponseWriterWrapper
	status int
	bytes  int64
	// watched are the names of the headers to keep, sent their last values
	// as the status went out ("" for none).
	watched, sent     []string
	watchBuf, sentBuf [2]string
	// readers are the JSON paths of the settles that read the body
	// (settle json), and usages what each read, from the first byte on.
	readers [][][]string
	usages  []*jsonUsage
	// whole is true when the response ended as its handlers meant it to:
	// they returned no error, nothing failed to reach the client, and
	// the client had not left (served).
	whole    bool
	writeErr bool
}

func newResponseMeter(w http.ResponseWriter) *responseMeter {
	return &responseMeter{ResponseWriterWrapper: &caddyhttp.ResponseWriterWrapper{ResponseWriter: w}}
}

// watch adds a header (canonical name) to keep as the status goes out.
func (m *responseMeter) watch(name string) {
	if m.watched == nil {
		m.watched = m.watchBuf[:0]
	}
	m.watched = append(m.watched, name)
}

// readJSON makes the meter read the usage at paths (not empty) from the
// body.
func (m *responseMeter) readJSON(paths [][]string) {
	m.readers = append(m.readers, paths)
}

// jsonUsage is what the meter read at paths (as given to readJSON) of the
// body, nil if no body began.
func (m *responseMeter) jsonUsage(paths [][]string) *jsonUsage {
	for i, r := range m.readers {
		if &r[0] == &paths[0] && i < len(m.usages) {
			return m.usages[i]
		}
	}
	return nil
}

// served records how the handlers after this one ended: err is what they
// returned (a panic never gets here, and leaves whole false).
func (m *responseMeter) served(r *http.Request, err error) {
	m.whole = err == nil && !m.writeErr && r.Context().Err() == nil
}

// sentValue is the last value that header name (watched) had as the status
// went out, "" if none.
func (m *responseMeter) sentValue(name string) string {
	for i, w := range m.watched {
		if w == name && i < len(m.sent) {
			return m.sent[i]
		}
	}
	return ""
}

// final records the final status and keeps the watched headers.
func (m *responseMeter) final(status int) {
	m.status = status
	if len(m.readers) > 0 {
		h := m.Header()
		for _, paths := range m.readers {
			m.usages = append(m.usages, newJSONUsage(paths, h.Get("Content-Type"), h.Get("Content-Encoding")))
		}
	}
	if len(m.watched) == 0 {
		return
	}
	h := m.Header()
	m.sent = m.sentBuf[:0]
	for range m.watched {
		m.sent = append(m.sent, "")
	}
	for i, name := range m.watched {
		if v := h[name]; len(v) > 0 {
			m.sent[i] = v[len(v)-1]
		}
	}
}

// WriteHeader records the first final status (1xx are interim, but for 101).
func (m *responseMeter) WriteHeader(status int) {
	if m.status == 0 && (status >= 200 || status == http.StatusSwitchingProtocols) {
		m.final(status)
	}
	m.ResponseWriterWrapper.WriteHeader(status)
}

// Write counts the bytes written, and sends the implicit 200 if no status
// was written.
func (m *responseMeter) Write(b []byte) (int, error) {
	if m.status == 0 {
		m.final(http.StatusOK)
	}
	n, err := m.ResponseWriterWrapper.Write(b)
	m.bytes += int64(n)
	if err != nil {
		m.writeErr = true
	}
	// Read after the bytes went on: reading never delays them.
	for _, u := range m.usages {
		u.write(b[:n])
	}
	return n, err
}

// ReadFrom counts the bytes copied. The wrapper's ReadFrom hands the copy to
// the underlying writer (sendfile, for file_server), past Write: without
// this, a file served that way would cost nothing.
func (m *responseMeter) ReadFrom(r io.Reader) (int64, error) {
	if m.status == 0 {
		m.final(http.StatusOK)
	}
	if len(m.usages) > 0 {
		// The body is read as it goes: through Write.
		return io.Copy(writerOnly{m}, r)
	}
	n, err := m.ResponseWriterWrapper.ReadFrom(r)
	m.bytes += n
	return n, err
}

// finalStatus is the status the client gets: the one written, or, when a
// later handler returned an error before writing anything, the error's
// status, which Caddy's error handling answers with.
func (m *responseMeter) finalStatus(err error) int {
	if m.status != 0 {
		return m.status
	}
	if err == nil {
		return http.StatusOK
	}
	var handlerErr caddyhttp.HandlerError
	if errors.As(err, &handlerErr) && handlerErr.StatusCode != 0 {
		return handlerErr.StatusCode
	}
	return http.StatusInternalServerError
}

// writerOnly hides a writer's ReadFrom, so that io.Copy writes.
type writerOnly struct{ io.Writer }

// Interface guard
var _ io.ReaderFrom = (*responseMeter)(nil)

// jsonUsage reads, as a response body passes, the usage that settle json
// names: for each path, the last number found at it, in one JSON document
// (or a sequence of them, as newline-delimited JSON streams are), or in the
// data of each server-sent event of a text/event-stream. It keeps no part
// of the body: a streaming scanner holds the keys of the objects it is in
// (at most jsonMaxDepth of them, each cut at jsonMaxKey bytes) and the
// number it is reading (at most jsonMaxNumber bytes), so its memory does not
// grow with the body, and the body goes on as it came.
//
// A document's numbers count once it is whole: a document cut short, or
// that is not JSON (`data: [DONE]`), adds nothing.
type jsonUsage struct {
	paths [][]string
	// found are the numbers of each path, from the documents read whole;
	// pending those of the document being read.
	found, pending []pathNumber
	// off is why the body is not read at all ("" when it is).
	off  string
	sse  bool
	scan jsonScanner
	ev   sseLines
}

// pathNumber is the last number found at a path.
type pathNumber struct {
	seen bool
	// whole is false when that number is not a whole number of at least
	// 0 (-5, 1.5, 1e3, or too long to read).
	whole bool
	n     int64
}

// Why settle json found no usage.
const (
	usageEncoded = "encoded body"
	usageCut     = "response cut short"
)

// newJSONUsage returns a reader of paths (dotted, checked by the rules) for
// a response with the headers contentType and contentEncoding.
func newJSONUsage(paths [][]string, contentType, contentEncoding string) *jsonUsage {
	u := &jsonUsage{paths: paths, found: make([]pathNumber, 2*len(paths))}
	u.found, u.pending = u.found[:len(paths)], u.found[len(paths):]
	if contentEncoding != "" && !strings.EqualFold(contentEncoding, "identity") {
		// A compressed body is not read: its usage would be guessed from
		// bytes that are not the document. The reservation stands.
		u.off = usageEncoded
		return u
	}
	if mt, _, err := mime.ParseMediaType(contentType); err == nil && mt == "text/event-stream" {
		u.sse = true
	}
	u.scan.reset()
	return u
}

// write reads the next bytes of the body.
func (u *jsonUsage) write(b []byte) {
	if u.off != "" {
		return
	}
	if !u.sse {
		u.feed(b)
		return
	}
	for i := 0; i < len(b); i++ {
		if u.ev.state == sseValue {
			// The rest of a data line, at once.
			j := i
			for j < len(b) && b[j] != '\n' && b[j] != '\r' {
				j++
			}
			u.feed(b[i:j])
			if i = j; i == len(b) {
				return
			}
		}
		switch u.ev.next(b[i]) {
		case sseData:
			u.byte(b[i])
		case sseDataEnd:
			// Lines of data join with a newline (whitespace to JSON).
			u.byte('\n')
		case sseDispatch:
			// An event ends: its document, read whole or not, ends with it.
			u.scan.reset()
			clear(u.pending)
		}
	}
}

// feed reads bytes of a document, skipping at once what a string's value
// holds and everything after the scanner stopped.
func (u *jsonUsage) feed(b []byte) {
	s := &u.scan
	for i := 0; i < len(b); i++ {
		switch {
		case s.state == jsBroken:
			return
		case s.state == jsString:
			j := i
			for j < len(b) && b[j] != '"' && b[j] != '\\' && b[j] >= 0x20 {
				j++
			}
			if s.inKey {
				s.keyBytes(b[i:j])
			}
			if i = j; i == len(b) {
				return
			}
		case s.state <= jsAfter && isSpace(b[i]):
			// Whitespace between tokens says nothing.
			continue
		}
		u.byte(b[i])
	}
}

// byte feeds c to the scanner and records what it completes.
func (u *jsonUsage) byte(c byte) {
	r := u.scan.step(c)
	if r == scanNumber {
		u.number()
		r = u.scan.step(c)
	}
	if r == scanDocument {
		for i, p := range u.pending {
			if p.seen {
				u.found[i] = p
			}
		}
		clear(u.pending)
	}
}

// number records the number the scanner just read, at each path that ends
// where it stands.
func (u *jsonUsage) number() {
	s := &u.scan
	for i, path := range u.paths {
		if !s.at(path) {
			continue
		}
		p := pathNumber{seen: true}
		if !s.numberLong {
			p.n, p.whole = parseCount(string(s.number))
		}
		u.pending[i] = p
	}
}

// total is the sum of the numbers found, and "" or why there is none to
// charge: no path found, or one whose last number is not whole.
func (u *jsonUsage) total() (int64, string) {
	if u.off != "" {
		return 0, u.off
	}
	var sum int64
	seen := false
	for _, p := range u.found {
		if !p.seen {
			continue
		}
		if !p.whole {
			return 0, valueNotWhole
		}
		seen = true
		sum = min(sum+p.n, maxCount)
	}
	if !seen {
		return 0, valueMissing
	}
	return sum, ""
}

// What a byte of an event stream is.
const (
	sseOther    = iota // a field name, another field, a comment
	sseData            // a byte of a data field's value
	sseDataEnd         // the end of a data line
	sseDispatch        // the blank line that ends an event
)

// sseLines splits an event stream (WHATWG HTML, server-sent events) into
// its data and the ends of its events, keeping nothing but the field name
// being read (at most 5 bytes: only "data" matters).
type sseLines struct {
	state     uint8
	name      [5]byte
	nameLen   uint8
	afterCR   bool
	lineStart bool
	started   bool
}

const (
	sseName uint8 = iota
	sseSpace
	sseValue
	sseIgnore
)

// next says what byte c of the stream is.
func (l *sseLines) next(c byte) int {
	if !l.started {
		l.started, l.lineStart = true, true
	}
	if c == '\n' && l.afterCR {
		// The \n of a \r\n: the line ended at the \r.
		l.afterCR = false
		return sseOther
	}
	l.afterCR = c == '\r'
	if c == '\r' || c == '\n' {
		was, data := l.lineStart, l.state == sseValue || l.state == sseSpace || l.state == sseName && l.isData()
		l.state, l.nameLen, l.lineStart = sseName, 0, true
		switch {
		case was:
			return sseDispatch
		case data:
			return sseDataEnd
		}
		return sseOther
	}
	l.lineStart = false
	switch l.state {
	case sseName:
		if c == ':' {
			l.state = sseIgnore
			if l.isData() {
				l.state = sseSpace
			}
			return sseOther
		}
		if l.nameLen < uint8(len(l.name)) {
			l.name[l.nameLen] = c
		}
		l.nameLen++
		if l.nameLen > uint8(len(l.name)) {
			l.state = sseIgnore
		}
		return sseOther
	case sseSpace:
		l.state = sseValue
		if c == ' ' {
			return sseOther
		}
		return sseData
	case sseValue:
		return sseData
	}
	return sseOther
}

func (l *sseLines) isData() bool {
	return l.nameLen == 4 && string(l.name[:4]) == "data"
}

// What a step of the scanner completed.
const (
	scanNothing  = iota
	scanNumber   // a number, in number
	scanDocument // a top-level value
)

// jsonScanner is a JSON tokenizer (RFC 8259) fed a byte at a time, which
// keeps only the keys of the objects it is in and the number it reads.
// Anything that is not JSON stops it until reset.
type jsonScanner struct {
	state  uint8
	frames []jsonFrame
	// inKey is true while a string is an object's key.
	inKey bool
	// literal is what is left to read of true, false or null.
	literal string
	// hex counts the digits left of a \u escape.
	hex        uint8
	number     []byte
	numberLong bool
	frameBuf   [8]jsonFrame
	numberBuf  [jsonMaxNumber]byte
}

// jsonFrame is an object or array the scanner is in; an object's key is the
// one whose value it reads.
type jsonFrame struct {
	object bool
	// odd is true when the key is too long or escaped: it matches nothing.
	odd bool
	key []byte
}

const (
	jsValue      uint8 = iota // a value is next
	jsFirstKey                // a key or } is next
	jsKey                     // a key is next
	jsColon                   // : is next
	jsFirstValue              // a value or ] is next
	jsAfter                   // , or the end of the container is next
	jsString
	jsEscape
	jsNumber
	jsLiteral
	jsBroken
)

func (s *jsonScanner) reset() {
	if s.frames == nil {
		s.frames = s.frameBuf[:0]
	}
	s.state, s.frames = jsValue, s.frames[:0]
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

// step reads c.
func (s *jsonScanner) step(c byte) int {
	switch s.state {
	case jsValue:
		return s.value(c)
	case jsFirstKey, jsKey:
		switch {
		case isSpace(c):
		case c == '"':
			top := &s.frames[len(s.frames)-1]
			top.key, top.odd = top.key[:0], false
			s.state, s.inKey = jsString, true
		case c == '}' && s.state == jsFirstKey:
			return s.pop()
		default:
			s.state = jsBroken
		}
	case jsColon:
		switch {
		case isSpace(c):
		case c == ':':
			s.state = jsValue
		default:
			s.state = jsBroken
		}
	case jsFirstValue:
		if c == ']' {
			return s.pop()
		}
		return s.value(c)
	case jsAfter:
		return s.after(c)
	case jsString:
		switch {
		case c == '"':
			if s.inKey {
				s.state = jsColon
				return scanNothing
			}
			return s.done()
		case c == '\\':
			s.state = jsEscape
		case c < 0x20:
			s.state = jsBroken
		case s.inKey:
			s.keyBytes([]byte{c})
		}
	case jsEscape:
		if s.hex > 0 {
			if !isHex(c) {
				s.state = jsBroken
				return scanNothing
			}
			if s.hex--; s.hex == 0 {
				s.state = jsString
			}
			return scanNothing
		}
		if strings.IndexByte(`"\/bfnrtu`, c) < 0 {
			s.state = jsBroken
			return scanNothing
		}
		if s.inKey {
			// An escaped key is no path's: paths are plain names.
			s.frames[len(s.frames)-1].odd = true
		}
		s.state = jsString
		if c == 'u' {
			s.hex, s.state = 4, jsEscape
		}
	case jsNumber:
		if c >= '0' && c <= '9' || c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-' {
			if len(s.number) < jsonMaxNumber {
				s.number = append(s.number, c)
			} else {
				s.numberLong = true
			}
			return scanNothing
		}
		if len(s.frames) == 0 {
			// A number alone is a document, and no usage.
			s.state = jsValue
			return s.value(c)
		}
		// c is not read: the caller records the number where it stands,
		// then steps c again.
		s.state = jsAfter
		return scanNumber
	case jsLiteral:
		if c != s.literal[0] {
			s.state = jsBroken
			return scanNothing
		}
		if s.literal = s.literal[1:]; s.literal == "" {
			return s.done()
		}
	}
	return scanNothing
}

// keyBytes adds b to the key being read, up to jsonMaxKey bytes: a longer
// key matches nothing.
func (s *jsonScanner) keyBytes(b []byte) {
	top := &s.frames[len(s.frames)-1]
	if top.odd || len(top.key)+len(b) > jsonMaxKey {
		top.odd = true
		return
	}
	top.key = append(top.key, b...)
}

// value reads the first byte of a value.
func (s *jsonScanner) value(c byte) int {
	switch {
	case isSpace(c):
	case c == '{' || c == '[':
		if len(s.frames) == jsonMaxDepth {
			s.state = jsBroken
			return scanNothing
		}
		// A frame popped keeps its key's buffer for the next one.
		if len(s.frames) < cap(s.frames) {
			s.frames = s.frames[:len(s.frames)+1]
		} else {
			s.frames = append(s.frames, jsonFrame{})
		}
		f := &s.frames[len(s.frames)-1]
		f.object, f.odd, f.key = c == '{', false, f.key[:0]
		s.state = jsFirstValue
		if c == '{' {
			s.state = jsFirstKey
		}
	case c == '"':
		s.state, s.inKey = jsString, false
	case c == '-' || c >= '0' && c <= '9':
		if s.number == nil {
			s.number = s.numberBuf[:0]
		}
		s.number, s.numberLong = append(s.number[:0], c), false
		s.state = jsNumber
	case c == 't':
		s.state, s.literal = jsLiteral, "rue"
	case c == 'f':
		s.state, s.literal = jsLiteral, "alse"
	case c == 'n':
		s.state, s.literal = jsLiteral, "ull"
	default:
		s.state = jsBroken
	}
	return scanNothing
}

// after reads what follows a value in a container.
func (s *jsonScanner) after(c byte) int {
	top := &s.frames[len(s.frames)-1]
	switch {
	case isSpace(c):
	case c == ',' && top.object:
		s.state = jsKey
	case c == ',':
		s.state = jsValue
	case c == '}' && top.object, c == ']' && !top.object:
		return s.pop()
	default:
		s.state = jsBroken
	}
	return scanNothing
}

// pop ends the innermost container.
func (s *jsonScanner) pop() int {
	s.frames = s.frames[:len(s.frames)-1]
	return s.done()
}

// done ends a value: the document's, when it is at the top.
func (s *jsonScanner) done() int {
	if len(s.frames) == 0 {
		s.state = jsValue
		return scanDocument
	}
	s.state = jsAfter
	return scanNothing
}

// at reports whether the number just read is at path: the keys of the
// innermost objects, consecutive, are the path's names.
func (s *jsonScanner) at(path []string) bool {
	if len(path) > len(s.frames) {
		return false
	}
	frames := s.frames[len(s.frames)-len(path):]
	for i, name := range path {
		f := &frames[i]
		if !f.object || f.odd || string(f.key) != name {
			return false
		}
	}
	return true
}

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}
