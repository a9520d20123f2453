package slidingratelimit

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/limiter"
)

// countsStatus reports whether a response with status keeps its admission
// counted under list (a zone's count_status): an entry is a status code, or
// a single digit n for the class nxx, as Caddy's response matchers read
// status codes. An empty list counts every response.
func countsStatus(list []int, status int) bool {
	if len(list) == 0 {
		return true
	}
	for _, s := range list {
		if s == status || s < 10 && status/100 == s {
			return true
		}
	}
	return false
}

// checkCountStatus accepts codes from 100 to 599 and classes 1 to 5.
func checkCountStatus(list []int) error {
	for _, s := range list {
		if !(s >= 1 && s <= 5 || s >= 100 && s <= 599) {
			return fmt.Errorf("count_status must be status codes from 100 to 599 or classes 1 to 5 (1xx to 5xx), got %d", s)
		}
	}
	return nil
}

// parseStatus reads one count_status argument: "401" or "4xx".
func parseStatus(arg string) (int, error) {
	if len(arg) == 3 && arg[1:] == "xx" && arg[0] >= '1' && arg[0] <= '5' {
		return int(arg[0] - '0'), nil
	}
	n, err := strconv.Atoi(arg)
	if err != nil || n < 100 || n > 599 {
		return 0, fmt.Errorf("count_status takes status codes (401) or classes (4xx), got %q", arg)
	}
	return n, nil
}

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

// serveCounted passes an admitted request on and then gives back the slot it
// reserved in each zone whose count_status does not list the status of the
// response.
func (h *Handler) serveCounted(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, req *request, src source) error {
	sw := newStatusWriter(w)
	err := next.ServeHTTP(sw, r)
	h.giveBack(r.Context(), req, src, sw.finalStatus(err))
	return err
}

// giveBack refunds the admissions of the zones that do not count status, in
// the store that recorded them (backend.refund also forgets the denials they
// may have caused).
func (h *Handler) giveBack(ctx context.Context, req *request, src source, status int) {
	var checks []limiter.Check
	var decisions []limiter.Decision
	for i, z := range req.zones {
		if !countsStatus(z.CountStatus, status) {
			checks = append(checks, req.checks[i])
			decisions = append(decisions, req.decisions[i])
		}
	}
	if len(checks) == 0 {
		return
	}
	// The client may be gone; the slot is given back all the same.
	ctx = context.WithoutCancel(ctx)
	h.backend.refund(ctx, checks, decisions, src)
}
