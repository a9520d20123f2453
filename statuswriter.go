package slidingratelimit

import (
	"errors"
	"net/http"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// statusWriter records the status of the response the client gets.
type statusWriter struct {
	*caddyhttp.ResponseWriterWrapper
	status int
}

func newStatusWriter(w http.ResponseWriter) *statusWriter {
	return &statusWriter{ResponseWriterWrapper: &caddyhttp.ResponseWriterWrapper{ResponseWriter: w}}
}

// WriteHeader records the first final status (1xx are interim, but for 101).
func (w *statusWriter) WriteHeader(status int) {
	if w.status == 0 && (status >= 200 || status == http.StatusSwitchingProtocols) {
		w.status = status
	}
	w.ResponseWriterWrapper.WriteHeader(status)
}

// Write sends the implicit 200 if no status was written.
func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriterWrapper.Write(b)
}

// finalStatus is the status the client gets: the one written, or, when a
// later handler returned an error before writing anything, the error's
// status, which Caddy's error handling answers with.
func (w *statusWriter) finalStatus(err error) int {
	if w.status != 0 {
		return w.status
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
