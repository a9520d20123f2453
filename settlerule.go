package slidingratelimit

import (
	"net/http"
	"net/textproto"
	"strings"
)

// Settle says how a zone learns what a request really cost, which is known
// only once its response is: the request reserves its cost (see the zone's
// cost, default 1) before it goes on, and is admitted while the window has
// room for that reservation; after the response, the reservation is replaced
// by the real cost, so the client pays in full for what it used, even past
// max_requests (it then waits until enough ages out). Set one of its fields.
type Settle struct {
	// Header names a response header, or trailer, whose value is the real
	// cost, such as the token usage an LLM upstream reports. reverse_proxy
	// copies an upstream's trailers into the response's header map at the
	// end of the body, where the value is read once the response is done;
	// a trailer wins over a header of the same name; a header that a handler
	// before this one deletes as the status goes out (header -X-Usage, to
	// keep it from clients) is read as it was then. The value is a whole
	// number of units, 0 included; a value above the call's max_requests
	// counts as max_requests (a charge above it blocks for one window,
	// whatever its size). No value, or one that is not a whole number
	// ("-5", "1.5", "abc"): the reservation stands, and the request is
	// counted and logged at most once a minute per zone.
	Header string `json:"header,omitempty"`

	// Bytes settles a request to the bytes of its response body as they
	// leave this handler (compressed, when encode runs after it, as it does
	// in Caddy's directive order), at most the call's max_requests. A
	// response with no body (HEAD, 304) costs 0; bytes after a protocol
	// switch (a WebSocket) are not counted.
	Bytes bool `json:"bytes,omitempty"`

	// JSON names the numbers of the response body that make its real
	// cost, as LLM APIs report usage: the cost is the sum, over these
	// dotted paths ("usage.total_tokens"), of the last number found at
	// each, in the body's JSON document (or each of a sequence, as
	// newline-delimited JSON), or in the data of each event of a
	// text/event-stream. A path matches at any depth: its names are the
	// keys of consecutive objects, the last one the number's own, so
	// "usage.total_tokens" finds response.usage.total_tokens too. The
	// body passes through as it comes, read as it goes without being
	// kept; a document or event counts once it is whole. No number at
	// any path, a last number that is not a whole number ("-5", "1.5",
	// "1e3"), a compressed body (a Content-Encoding), or a response cut
	// short (the client left, the upstream broke off, the handler
	// failed): the reservation stands, counted and logged as for header.
	// A sum above the call's max_requests counts as max_requests.
	JSON []string `json:"json,omitempty"`

	// header is Header in canonical form.
	header string
	// paths are the JSON paths, split at their dots.
	paths [][]string
}

// provision precomputes what each response needs.
func (s *Settle) provision() {
	s.header = textproto.CanonicalMIMEHeaderKey(s.Header)
	s.paths = make([][]string, len(s.JSON))
	for i, p := range s.JSON {
		s.paths[i] = strings.Split(p, ".")
	}
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
