package control

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"
)

// Control socket limits. Requests are small JSON documents (at most
// MaxBodyBytes; `volume import` sends the path of a file it filled, not
// the data), but handlers may run long (a --copy snapshot) and
// `vmsan events` streams for as long as the client likes: so no
// ReadTimeout or WriteTimeout on the server (a ReadTimeout would also
// cancel long handlers' contexts), but a deadline on reading the body
// (WithBodyDeadline) and an idle timeout between requests.
const (
	BodyTimeout = 10 * time.Second
	IdleTimeout = 2 * time.Minute
)

// WithBodyDeadline reads a request's body (at most MaxBodyBytes) within
// BodyTimeout before the handler runs, so a client that sends a
// complete header and then trickles its body cannot hold a handler and
// its connection forever: it gets 408 and the connection is closed. The
// handler reads the buffered body.
func WithBodyDeadline(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
			h.ServeHTTP(w, r)
			return
		}
		rc := http.NewResponseController(w)
		rc.SetReadDeadline(time.Now().Add(BodyTimeout))
		b, err := io.ReadAll(io.LimitReader(r.Body, MaxBodyBytes+1))
		switch {
		case err != nil:
			w.Header().Set("Connection", "close")
			st := http.StatusBadRequest
			if errors.Is(err, os.ErrDeadlineExceeded) {
				st = http.StatusRequestTimeout
			}
			WriteJSON(w, st, &APIError{Code: "bad_request", Message: "reading the request body: " + err.Error()})
			return
		case len(b) > MaxBodyBytes:
			w.Header().Set("Connection", "close")
			WriteJSON(w, http.StatusBadRequest, &APIError{Code: "bad_request", Message: fmt.Sprintf("bad request body: larger than %d bytes", MaxBodyBytes)})
			return
		}
		rc.SetReadDeadline(time.Time{})
		r.Body = io.NopCloser(bytes.NewReader(b))
		h.ServeHTTP(w, r)
	})
}
