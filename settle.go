package slidingratelimit

import (
	"context"
	"net/http"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// serveCounted passes an admitted request on and then, when its response
// has a status that a zone's count_status does not list, gives back the
// admission that zone recorded, in the store that recorded it (the backend
// also forgets the denials it may have caused).
func serveCounted(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, b *backend, req *request, src source) error {
	sw := newStatusWriter(w)
	err := next.ServeHTTP(sw, r)
	if checks, decisions := req.uncounted(sw.finalStatus(err)); len(checks) > 0 {
		// The client may be gone; the admission is given back all the
		// same.
		b.refund(context.WithoutCancel(r.Context()), checks, decisions, src)
	}
	return err
}
