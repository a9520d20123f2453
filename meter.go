package slidingratelimit

import (
	"errors"
	"io"
	"net/http"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

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
