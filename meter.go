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
// trailers stay in the header map, where the settle step reads them.
type responseMeter struct {
	*caddyhttp.ResponseWriterWrapper
	status int
	bytes  int64
}

func newResponseMeter(w http.ResponseWriter) *responseMeter {
	return &responseMeter{ResponseWriterWrapper: &caddyhttp.ResponseWriterWrapper{ResponseWriter: w}}
}

// WriteHeader records the first final status (1xx are interim, but for 101).
func (m *responseMeter) WriteHeader(status int) {
	if m.status == 0 && (status >= 200 || status == http.StatusSwitchingProtocols) {
		m.status = status
	}
	m.ResponseWriterWrapper.WriteHeader(status)
}

// Write counts the bytes written, and sends the implicit 200 if no status
// was written.
func (m *responseMeter) Write(b []byte) (int, error) {
	if m.status == 0 {
		m.status = http.StatusOK
	}
	n, err := m.ResponseWriterWrapper.Write(b)
	m.bytes += int64(n)
	return n, err
}

// ReadFrom counts the bytes copied. The wrapper's ReadFrom hands the copy to
// the underlying writer (sendfile, for file_server), past Write: without
// this, a file served that way would cost nothing.
func (m *responseMeter) ReadFrom(r io.Reader) (int64, error) {
	if m.status == 0 {
		m.status = http.StatusOK
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

// Interface guard
var _ io.ReaderFrom = (*responseMeter)(nil)
