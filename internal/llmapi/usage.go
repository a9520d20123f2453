package llmapi

import (
	"bytes"
	"strings"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/strictnum"
)

// Usage is what a response reports it used, in tokens of each kind a price
// may set. Each vendor's file says how its fields map to these.
type Usage struct {
	// Input is the fresh input: not read from a cache nor written to one.
	Input int64
	// Cached is the input read from a cache.
	Cached int64
	// CacheWrite is the input written to a cache.
	CacheWrite int64
	// Output is the output, reasoning and thinking included.
	Output int64
	// Reported is the vendor's own total, 0 when it reports none.
	Reported int64

	// The dimensions within the kinds that are priced apart: AudioInput
	// of Input, AudioOutput of Output, CacheWrite1h (an hour's TTL) of
	// CacheWrite, each at most its whole.
	AudioInput, AudioOutput, CacheWrite1h int64
	// WebSearches is how many web searches a server tool made, each a
	// fee beside the tokens.
	WebSearches int64
	// Service is the service tier the response says served it, as
	// ServiceTiers names it ("" when it does not say, "other" for a name
	// not among them).
	Service string
}

// ServiceTiers are the service tiers' names the responses use: OpenAI's
// ("default", "auto", "flex", "scale", "priority") and Anthropic's
// ("standard", "priority", "batch").
var ServiceTiers = []string{"default", "auto", "standard", "priority", "flex", "batch", "scale"}

// serviceCode is the slot value of a service tier's name: its index in
// ServiceTiers plus 1, or len+1 for a name not among them.
func serviceCode(name []byte, long bool) int64 {
	if !long {
		for i, t := range ServiceTiers {
			if string(name) == t {
				return int64(i) + 1
			}
		}
	}
	return int64(len(ServiceTiers)) + 1
}

// Total is the whole usage: the vendor's own total, or the sum of the
// kinds when that is larger (a total that leaves a part out) or there is
// no total. A part is never added to a total that holds it.
func (u Usage) Total() int64 {
	return max(addSat(addSat(u.Input, u.Cached), addSat(u.CacheWrite, u.Output)), u.Reported)
}

// Why a response has no usage to charge, beside strictnum.Missing (none
// found) and strictnum.NotWhole (a usage field that is not a whole number
// of at least 0).
const (
	// Encoded: the body has a Content-Encoding other than identity, and is
	// not read (its usage would be guessed from bytes that are not it).
	Encoded = "encoded body"
	// BadFrame: an event stream frame had a bad CRC or was malformed, so
	// the rest of the stream cannot be told apart.
	BadFrame = "bad event stream frame"
)

// UsageReader reads, as a response body passes, the usage an API's
// response reports. It keeps no part of the body: a streaming scanner holds
// the keys of the objects it is in and the number it reads, an event
// stream reader the frame it is in (its payload only for a metadata frame,
// at most 64 KiB), so its memory does not grow with the body and Write
// allocates nothing once warm.
//
// How the body is read: a body whose first byte (after whitespace) is '{'
// or '[' is a sequence of JSON values (a document, NDJSON, or Gemini's JSON
// array of responses, whose elements are documents), whatever its
// Content-Type says; an application/vnd.amazon.eventstream body, or one
// whose first byte is 0 (an event stream frame's length), is AWS's frames;
// anything else is a text/event-stream, since OpenAI-compatible servers
// send events under other types. Reading the wrong way finds no usage,
// never a smaller one.
type UsageReader struct {
	r reader
}

// NewUsageReader returns a reader of the usage of a response of api, with
// the response headers contentType and contentEncoding.
func NewUsageReader(api API, contentType, contentEncoding string) *UsageReader {
	if int(api) >= len(usageSpecs) {
		api = Unknown
	}
	u := &UsageReader{}
	u.r.init(usageSpecs[api], contentType, contentEncoding)
	return u
}

// Write reads the next bytes of the body.
func (u *UsageReader) Write(b []byte) { u.r.write(b) }

// Final reports whether the response reported its final usage: a document
// with usage at a place that no later event's usage replaces (everything
// but Anthropic's message_start). Gemini reports running totals in every
// chunk, each at the place of the last: the caller knows from the body
// being whole that the last one came. A response that ended without its
// final usage has reported, in Usage, only what it used up to some point.
func (u *UsageReader) Final() bool { return u.r.final }

// After is the bytes of the body read since the end of the last document
// with usage (all of them when none had any), counted by whole Writes: at
// least what came after it, for a bound of the output not yet reported.
func (u *UsageReader) After() int64 { return u.r.after }

// Usage returns the usage read so far, and "" or why there is none to
// charge (strictnum.Missing, strictnum.NotWhole, Encoded, BadFrame). Whether
// the body was whole is the caller's to know: a stream cut short has not
// reported its usage yet.
func (u *UsageReader) Usage() (Usage, string) {
	r := &u.r
	if why := r.why(); why != "" {
		return Usage{}, why
	}
	var us Usage
	var inInput int64
	seen := false
	for s, k := range r.spec.kinds {
		v := r.slots[s]
		if !v.seen {
			continue
		}
		if k == serviceTier {
			us.Service = "other"
			if v.n >= 1 && v.n <= int64(len(ServiceTiers)) {
				us.Service = ServiceTiers[v.n-1]
			}
			continue
		}
		if !v.whole {
			return Usage{}, strictnum.NotWhole
		}
		seen = true
		switch k {
		case input:
			us.Input = addSat(us.Input, v.n)
		case inputCached:
			inInput = addSat(inInput, v.n)
		case cached:
			us.Cached = addSat(us.Cached, v.n)
		case cacheWrite:
			us.CacheWrite = addSat(us.CacheWrite, v.n)
		case output:
			us.Output = addSat(us.Output, v.n)
		case total:
			us.Reported = max(us.Reported, v.n)
		case audioIn:
			us.AudioInput = addSat(us.AudioInput, v.n)
		case audioOut:
			us.AudioOutput = addSat(us.AudioOutput, v.n)
		case cacheWrite1h:
			us.CacheWrite1h = addSat(us.CacheWrite1h, v.n)
		case webSearches:
			us.WebSearches = addSat(us.WebSearches, v.n)
		}
	}
	if !seen {
		return Usage{}, strictnum.Missing
	}
	// The cache reads that input holds move to Cached; more of them than
	// input is a vendor's error, charged as it says.
	us.Input = max(us.Input-inInput, 0)
	us.Cached = addSat(us.Cached, inInput)
	us.AudioInput = min(us.AudioInput, us.Input)
	us.AudioOutput = min(us.AudioOutput, us.Output)
	us.CacheWrite1h = min(us.CacheWrite1h, us.CacheWrite)
	return us, ""
}

// PathReader reads, as a response body passes, the numbers at dotted
// paths, each from the top of a document or event (each element of a
// top-level array is a document too), the last whole document's number at
// each path counting: the generic settle json. It reads the body as a
// UsageReader does.
type PathReader struct {
	r reader
}

// NewPathReader returns a reader of paths (dotted names, split at their
// dots) for a response with the headers contentType and contentEncoding.
func NewPathReader(paths [][]string, contentType, contentEncoding string) *PathReader {
	spec := &usageSpec{perField: true, kinds: make([]kind, len(paths))}
	for i, p := range paths {
		spec.kinds[i] = sum
		spec.places = append(spec.places, usagePlace{path: p, slot: i})
		spec.paths = append(spec.paths, p)
	}
	pr := &PathReader{}
	pr.r.init(spec, contentType, contentEncoding)
	return pr
}

// Write reads the next bytes of the body.
func (p *PathReader) Write(b []byte) { p.r.write(b) }

// Sum is the sum of the last numbers found at the paths, and "" or why
// there is none to charge: none found (strictnum.Missing), one whose last
// number is not a whole number (strictnum.NotWhole), Encoded, BadFrame.
func (p *PathReader) Sum() (int64, string) {
	r := &p.r
	if why := r.why(); why != "" {
		return 0, why
	}
	var n int64
	seen := false
	for _, v := range r.slots {
		if !v.seen {
			continue
		}
		if !v.whole {
			return 0, strictnum.NotWhole
		}
		seen = true
		n = addSat(n, v.n)
	}
	if !seen {
		return 0, strictnum.Missing
	}
	return n, ""
}

// usageSpec is where a reader finds numbers and what each counts: a
// table's usage places, or settle json's paths.
type usageSpec struct {
	places []usagePlace
	// kinds are what each slot counts; a slot is a usage field, which
	// several places may report (message_start's and message_delta's
	// input_tokens are one).
	kinds    []kind
	perField bool
	// paths are the places' paths, which the scanner reads its way to;
	// strings those of them where a string is read.
	paths, strings [][]string
}

// usagePlace is a path, from the top of a document, where a number is a
// slot's.
type usagePlace struct {
	path []string
	// when lists the document's top-level "type" values for which it
	// counts; nil: any.
	when []string
	// partial: a usage here is not the final one (table.go's usageAt).
	partial bool
	// aside: a string beside the usage (the service tier), which counts
	// only in a document that has usage.
	aside bool
	slot  int
}

// usageSpecs are the tables' usage specs, by API.
var usageSpecs = func() (all [len(tables)]*usageSpec) {
	for api, t := range tables {
		all[api] = specOf(t)
	}
	return all
}()

// specOf returns the usage spec of t: its places (or those of its parts),
// one slot per usage field name.
func specOf(t *table) *usageSpec {
	s := &usageSpec{perField: t.perField}
	parts := t.parts
	if parts == nil {
		parts = []*table{t}
	}
	slotOf := map[string]int{}
	for _, p := range parts {
		for _, f := range p.usage {
			if f.kind == part {
				continue
			}
			slot, ok := slotOf[f.name]
			if !ok {
				slot = len(s.kinds)
				slotOf[f.name] = slot
				s.kinds = append(s.kinds, f.kind)
			} else if s.kinds[slot] != f.kind {
				panic("llmapi: usage field " + f.name + " counts two kinds in " + t.name)
			}
			for _, at := range p.usageAt {
				path := f.name
				if sibling, ok := strings.CutPrefix(f.name, "../"); ok {
					path = sibling
					if i := strings.LastIndex(at.path, "."); i >= 0 {
						path = at.path[:i] + "." + sibling
					}
				} else if at.path != "" {
					path = at.path + "." + f.name
				}
				place := usagePlace{path: strings.Split(path, "."), when: at.when, partial: at.partial, slot: slot, aside: f.kind == serviceTier}
				if s.add(place) && place.aside {
					s.strings = append(s.strings, place.path)
				}
			}
		}
	}
	return s
}

// add adds p unless s has it, and reports whether it did; a place that two
// tables share is partial when either says so (the ending is then charged
// as a cut one, never less).
func (s *usageSpec) add(p usagePlace) bool {
	for i, q := range s.places {
		if strings.Join(q.path, ".") == strings.Join(p.path, ".") && strings.Join(q.when, ",") == strings.Join(p.when, ",") {
			s.places[i].partial = q.partial || p.partial
			return false
		}
	}
	s.places = append(s.places, p)
	s.paths = append(s.paths, p.path)
	return true
}

// slotValue is a number found at a slot's place.
type slotValue struct {
	seen bool
	// whole is false when that number is not a whole number of at least
	// 0 (-5, 1.5, 1e3, or too long to read).
	whole bool
	n     int64
}

// reader is the engine of UsageReader and PathReader: it splits a body
// into documents (JSON values, events, frames), finds the numbers at the
// spec's places, and keeps each slot's from the last whole document.
type reader struct {
	spec *usageSpec
	// slots are what counts, by slot; docSlots those of the document
	// ending; pending the numbers of the document being read, by place.
	slots, docSlots, pending []slotValue
	pendingSeen              bool
	// final is set once a document had usage at a place that is not
	// partial; after counts the bytes since the last document with usage,
	// and found whether one ended in the Write being read.
	final, found bool
	after        int64
	// off is why the body is not read at all ("" when it is).
	off    string
	mode   uint8
	scan   jsonScanner
	sse    sseLines
	frames frameReader
}

// How the body is split into documents.
const (
	modeUndecided uint8 = iota
	modeJSON
	modeSSE
	modeFrames
)

func (r *reader) init(spec *usageSpec, contentType, contentEncoding string) {
	r.spec = spec
	vals := make([]slotValue, 2*len(spec.kinds)+len(spec.places))
	r.slots, r.docSlots, r.pending = vals[:len(spec.kinds)], vals[len(spec.kinds):2*len(spec.kinds)], vals[2*len(spec.kinds):]
	if contentEncoding != "" && !strings.EqualFold(contentEncoding, "identity") {
		r.off = Encoded
		return
	}
	if mt, _, _ := strings.Cut(contentType, ";"); strings.EqualFold(strings.TrimSpace(mt), "application/vnd.amazon.eventstream") {
		r.mode = modeFrames
	}
	r.scan.paths, r.scan.strings = spec.paths, spec.strings
	r.scan.reset()
}

func (r *reader) why() string {
	switch {
	case r.off != "":
		return r.off
	case r.frames.bad:
		return BadFrame
	}
	return ""
}

func (r *reader) write(b []byte) {
	if r.off != "" {
		return
	}
	// A Write in which usage came counts whole as after it: never less
	// than the bytes that followed the usage.
	r.found = false
	r.read(b)
	if r.found {
		r.after = int64(len(b))
	} else {
		r.after += int64(len(b))
	}
}

// read reads the next bytes of the body, split as its mode says.
func (r *reader) read(b []byte) {
	if r.mode == modeUndecided {
		i := 0
		for i < len(b) && isSpace(b[i]) {
			i++
		}
		if b = b[i:]; len(b) == 0 {
			return
		}
		switch b[0] {
		case '{', '[':
			r.mode = modeJSON
		case 0:
			r.mode = modeFrames
		default:
			r.mode = modeSSE
		}
	}
	switch r.mode {
	case modeJSON:
		r.feed(b)
	case modeSSE:
		r.events(b)
	case modeFrames:
		for len(b) > 0 {
			n, payload := r.frames.write(b)
			if payload != nil {
				r.payload(payload)
			}
			b = b[n:]
		}
	}
}

// events reads bytes of an event stream: each event's data is a document
// sequence of its own.
func (r *reader) events(b []byte) {
	for i := 0; i < len(b); i++ {
		if r.sse.state == sseValue {
			// The rest of a data line, at once.
			j := len(b)
			if k := bytes.IndexByte(b[i:], '\n'); k >= 0 {
				j = i + k
			}
			if k := bytes.IndexByte(b[i:j], '\r'); k >= 0 {
				j = i + k
			}
			r.feed(b[i:j])
			if i = j; i == len(b) {
				return
			}
		}
		switch r.sse.next(b[i]) {
		case sseData:
			r.byte(b[i])
		case sseDataEnd:
			// Lines of data join with a newline (whitespace to JSON).
			r.byte('\n')
		case sseDispatch:
			// An event ends: its document, read whole or not, ends with it.
			r.restart()
		}
	}
}

// payload reads the payload of a metadata frame: a document of its own.
func (r *reader) payload(p []byte) {
	r.restart()
	r.feed(p)
	r.restart()
}

// restart forgets the document being read.
func (r *reader) restart() {
	r.scan.reset()
	if r.pendingSeen {
		clear(r.pending)
		r.pendingSeen = false
	}
}

// feed reads bytes of a document sequence, skipping at once what a string
// or a skipped value holds and everything after the scanner stopped.
func (r *reader) feed(b []byte) {
	s := &r.scan
	for i := 0; i < len(b); i++ {
		switch {
		case s.state == jsBroken:
			return
		case s.state == jsSkip:
			n, end := s.skip.read(b[i:], len(s.frames))
			if s.skipped(end) == scanDocument {
				r.commit()
			}
			if i += n - 1; s.state != jsBroken {
				continue
			}
			return
		case s.state == jsString:
			j := i
			for j < len(b) && plain[b[j]] {
				j++
			}
			s.stringBytes(b[i:j])
			if i = j; i == len(b) {
				return
			}
		case s.state <= jsAfter && isSpace(b[i]):
			// Whitespace between tokens says nothing.
			continue
		}
		r.byte(b[i])
	}
}

// byte feeds c to the scanner and records what it completes.
func (r *reader) byte(c byte) {
	ev := r.scan.step(c)
	switch ev {
	case scanNumber:
		r.number()
		ev = r.scan.step(c)
	case scanString:
		r.text()
		ev = scanNothing
	}
	if ev == scanDocument {
		r.commit()
	}
}

// number records the number the scanner just read at each place where it
// stands (the last of duplicate keys, as JSON parsers take it).
func (r *reader) number() {
	for i := range r.spec.places {
		if !r.spec.places[i].aside && r.scan.at(r.spec.places[i].path) {
			n, ok := r.scan.whole()
			r.pending[i] = slotValue{seen: true, whole: ok, n: n}
			r.pendingSeen = true
		}
	}
}

// text records the string the scanner just read at each aside place where
// it stands.
func (r *reader) text() {
	for i := range r.spec.places {
		if r.spec.places[i].aside && r.scan.at(r.spec.places[i].path) {
			r.pending[i] = slotValue{seen: true, whole: true, n: serviceCode(r.scan.text())}
			r.pendingSeen = true
		}
	}
}

// commit makes the document that just ended count, if it has usage: its
// slots replace the ones before (perField: only those it has).
func (r *reader) commit() {
	if !r.pendingSeen {
		return
	}
	clear(r.docSlots)
	found := false
	for i, p := range r.spec.places {
		v := r.pending[i]
		if !v.seen || p.when != nil && !r.scan.typeIs(p.when) {
			continue
		}
		d := &r.docSlots[p.slot]
		if d.seen {
			d.n, d.whole = max(d.n, v.n), d.whole && v.whole
		} else {
			*d = v
		}
		if !p.aside {
			found = true
			r.final = r.final || !p.partial
		}
	}
	clear(r.pending)
	r.pendingSeen = false
	if !found {
		return
	}
	r.found = true
	if !r.spec.perField {
		copy(r.slots, r.docSlots)
		return
	}
	for s, d := range r.docSlots {
		if d.seen {
			r.slots[s] = d
		}
	}
}
