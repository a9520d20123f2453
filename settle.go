package slidingratelimit

import (
	"context"
	"errors"
	"io"
	"net/http"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/jsonusage"
	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/llmapi"
	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/strictnum"
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
			z.units.settle.follow(m, r)
			if z.units.cost.prices != nil {
				m.model, m.searches = requestModel(r), requestSearches(r)
			}
			if z.units.settle.LLM {
				m.output, m.outputKnown = requestOutput(r)
			}
		}
	}
	if m.readsLLM && m.llmAPI == llmapi.OpenAIChat && askUsage(r) {
		// The meter reads the usage chunk; the client does not get it.
		u := newUsageChunkWriter(w)
		m.ResponseWriter = u
		defer u.finish()
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
			n, ok, why := z.units.settled(m, cost)
			if !ok {
				z.units.settleFallbacks.record(z.units.settleSource, why)
			}
			cost = n
		}
		if z.units != nil {
			z.units.admitted.Add(float64(cost))
			if z.units.cost.prices != nil {
				z.units.cost.prices.spent.Add(float64(cost))
			}
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

// cost returns what the response m metered cost, in full: a usage above
// the call's max is charged, and the client waits until it ages out. ok is
// false when it says nothing usable: the reservation then stands, and why
// says why. settle llm's cost is zoneUnits.settled's.
func (s *Settle) cost(m *responseMeter) (cost int64, ok bool, why string) {
	switch {
	case s.Bytes:
		return min(m.bytes, strictnum.Max), true, ""
	case len(s.JSON) > 0:
		return s.jsonCost(m)
	}
	v := usage(m, s.header)
	n, ok := strictnum.Parse(v)
	if !ok {
		if v == "" {
			return 0, false, strictnum.Missing
		}
		return 0, false, strictnum.NotWhole
	}
	return n, true, ""
}

// settled is what the response that m metered cost in the zone, whose
// admission reserved reserved: with prices, the usage of each kind at the
// request's model's price (the model that its reservation was priced at);
// without, what the settle reads. ok is false when the response did not
// say (why says why): the reservation then stands, or, for settle llm, at
// least what the response had reported (llmBound).
func (u *zoneUnits) settled(m *responseMeter, reserved int64) (cost int64, ok bool, why string) {
	if !u.settle.LLM {
		n, ok, why := u.settle.cost(m)
		if !ok {
			n = reserved
		}
		return n, ok, why
	}
	usage, ok, why := m.llmUsage()
	if !ok {
		bound, read := m.llmBound()
		if !read {
			return reserved, false, why
		}
		usage = bound
	}
	n := min(usage.Total(), strictnum.Max)
	if u.cost.prices != nil {
		// An API whose usage does not report searches pays the most
		// its request allowed, as reserved.
		usage.WebSearches = max(usage.WebSearches, m.searches)
		n = u.cost.prices.charge(m.model, usage)
	}
	if !ok {
		n = max(n, reserved)
	}
	return n, ok, why
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

// follow makes m keep what s reads of the response to r: a header, or the
// body's usage.
func (s *Settle) follow(m *responseMeter, r *http.Request) {
	switch {
	case s.header != "":
		m.watch(s.header)
	case len(s.paths) > 0:
		m.readJSON(s.paths)
	case s.LLM:
		m.readLLM(llmapi.Detect(r.URL.Path))
	}
}

// jsonCost is the usage that the paths of JSON add up to in the body that
// m read, when the response was whole.
func (s *Settle) jsonCost(m *responseMeter) (int64, bool, string) {
	u := m.jsonUsage(s.paths)
	if u == nil {
		// No body began (an error before any byte).
		return 0, false, strictnum.Missing
	}
	if !m.whole {
		// Its usage comes last: what was read is not the call's.
		return 0, false, jsonusage.Cut
	}
	n, why := u.Total()
	if why != "" {
		return 0, false, why
	}
	return n, true, ""
}

// llmUsage is the usage of each kind the LLM API reported in the body that
// m read, when the response was whole and its final usage came (a stream
// that ended after Anthropic's message_start has not reported its output).
func (m *responseMeter) llmUsage() (llmapi.Usage, bool, string) {
	if m.llm == nil {
		return llmapi.Usage{}, false, strictnum.Missing
	}
	if !m.whole {
		return llmapi.Usage{}, false, jsonusage.Cut
	}
	u, why := m.llm.Usage()
	if why != "" {
		return llmapi.Usage{}, false, why
	}
	if !m.llm.Final() {
		return llmapi.Usage{}, false, strictnum.Missing
	}
	return u, true, ""
}

// llmBound is the most a response that ended without its final usage (cut,
// or whole without it) can have used, from what it reported so far: the
// input and cache tokens it reported (Anthropic's message_start, Gemini's
// running totals: the input that the request's body does not carry, a
// document by file id, shows there), and the output raised to the
// request's output bound, the most the vendor generates for the call,
// reasoning and thinking that no byte shows included. Without a bound (the
// zone's cost is not cost llm, or the body was not read), the output
// reported plus the bytes of the body since that report: a token of text
// is at least a byte. read is false when the body could not be read (its
// encoding, a bad frame, a usage that is no whole number): nothing seen
// can be trusted, and the reservation stands.
func (m *responseMeter) llmBound() (u llmapi.Usage, read bool) {
	if m.llm == nil {
		return llmapi.Usage{}, false
	}
	u, why := m.llm.Usage()
	switch why {
	case "":
	case strictnum.Missing:
		u = llmapi.Usage{}
	default:
		return llmapi.Usage{}, false
	}
	out := u.Output
	if m.outputKnown {
		out = max(out, m.output)
	} else {
		out = min(out+m.llm.After(), strictnum.Max)
	}
	if u.Reported > 0 {
		// A total that holds a kind that none of the fields does keeps it.
		u.Reported = min(u.Reported+out-u.Output, strictnum.Max)
	}
	u.Output = out
	return u, true
}

// requestOutput is the output bound that cost llm read from r's body, if
// one did.
func requestOutput(r *http.Request) (int64, bool) {
	if p, ok := r.Body.(*bodyPeek); ok && p.modelRead {
		return p.output, true
	}
	return 0, false
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
	usages  []*jsonusage.Usage
	// llmAPI is the API whose usage settle llm reads, when readsLLM, and
	// llm its reader, from the first byte on.
	llmAPI   llmapi.API
	readsLLM bool
	llm      *llmapi.UsageReader
	// model is the model the request names, for priced zones.
	model string
	// searches are the searches its request allows, for priced zones
	// whose API's usage does not report the searches made.
	searches int64
	// output is the request's output bound, when outputKnown, for the
	// charge of a response that ends without its final usage.
	output      int64
	outputKnown bool
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

// readLLM makes the meter read the usage that api reports in the body.
func (m *responseMeter) readLLM(api llmapi.API) {
	m.llmAPI, m.readsLLM = api, true
}

// jsonUsage is what the meter read at paths (as given to readJSON) of the
// body, nil if no body began.
func (m *responseMeter) jsonUsage(paths [][]string) *jsonusage.Usage {
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
			m.usages = append(m.usages, jsonusage.New(paths, h.Get("Content-Type"), h.Get("Content-Encoding")))
		}
	}
	if m.readsLLM {
		h := m.Header()
		m.llm = llmapi.NewUsageReader(m.llmAPI, h.Get("Content-Type"), h.Get("Content-Encoding"))
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
		u.Write(b[:n])
	}
	if m.llm != nil {
		m.llm.Write(b[:n])
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
	if len(m.usages) > 0 || m.readsLLM {
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
