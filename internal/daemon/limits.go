package daemon

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/vmsan/vmsan/internal/control"
	"github.com/vmsan/vmsan/internal/netutil"
)

// File descriptors: the Go runtime raises the RLIMIT_NOFILE soft limit
// to the hard limit at start, so the daemon can use all it is allowed.
// The data path (NBD connections, iSCSI sessions, replication links,
// volume files) must keep the most of them: listeners that are not the
// data path get a bounded share, derived from the limit (fdShare), so a
// flood on them runs into their own cap, never into EMFILE for a client:
//
//   - metrics: at most metricsMaxConns connections, and at most 1/16 of
//     the limit; past it new connections wait in the kernel's backlog
//     (no descriptor used) until one closes; idle keep-alive connections
//     close after metricsIdleTimeout;
//   - iSCSI connections still logging in: iscsi.max_pending_logins
//     (default 64), at most 1/8 of the limit; past it closed at accept;
//   - NBD connections still in the handshake: max_pending_handshakes
//     (default 64), at most 1/8 of the limit; past it closed at accept,
//     and each closed after handshake_timeout (default 30 s).
//
// Every listener retries accept errors (netutil.Retry) instead of
// stopping, so running out of descriptors anyway (a flood of data-path
// connections) pauses accepting, logged, until descriptors are free.

// fdShare is a non-data listener's connection cap: configured (def when
// 0), bounded by 1/div of the file descriptor limit (at least 4).
func fdShare(configured, def, div int) int {
	v := configured
	if v <= 0 {
		v = def
	}
	return netutil.Share(v, netutil.NofileLimit(), div, 4)
}

// Metrics listener limits: a scrape is one short request; Prometheus
// keeps its connection alive between scrapes (15 s to 1 min apart).
const (
	metricsMaxConns     = 64
	metricsReadTimeout  = 60 * time.Second // request header and body; pprof's default 30 s profile fits
	metricsWriteTimeout = 90 * time.Second
	metricsIdleTimeout  = 90 * time.Second
)

// Control socket limits. Requests are small JSON documents (at most
// control.MaxBodyBytes; `volume import` sends the path of a file it filled, not
// the data), but handlers may run long (a --copy snapshot) and
// `vmsan events` streams for as long as the client likes: so no
// ReadTimeout or WriteTimeout on the server (a ReadTimeout would also
// cancel long handlers' contexts), but a deadline on reading the body
// (withBodyDeadline) and an idle timeout between requests.
const (
	controlBodyTimeout = 10 * time.Second
	controlIdleTimeout = 2 * time.Minute
)

// withBodyDeadline reads a request's body (at most control.MaxBodyBytes) within
// controlBodyTimeout before the handler runs, so a client that sends a
// complete header and then trickles its body cannot hold a handler and
// its connection forever: it gets 408 and the connection is closed. The
// handler reads the buffered body.
func withBodyDeadline(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
			h.ServeHTTP(w, r)
			return
		}
		rc := http.NewResponseController(w)
		rc.SetReadDeadline(time.Now().Add(controlBodyTimeout))
		b, err := io.ReadAll(io.LimitReader(r.Body, control.MaxBodyBytes+1))
		switch {
		case err != nil:
			w.Header().Set("Connection", "close")
			st := http.StatusBadRequest
			if errors.Is(err, os.ErrDeadlineExceeded) {
				st = http.StatusRequestTimeout
			}
			writeJSON(w, st, &APIError{Code: "bad_request", Message: "reading the request body: " + err.Error()})
			return
		case len(b) > control.MaxBodyBytes:
			w.Header().Set("Connection", "close")
			writeJSON(w, http.StatusBadRequest, &APIError{Code: "bad_request", Message: fmt.Sprintf("bad request body: larger than %d bytes", control.MaxBodyBytes)})
			return
		}
		rc.SetReadDeadline(time.Time{})
		r.Body = io.NopCloser(bytes.NewReader(b))
		h.ServeHTTP(w, r)
	})
}

// limitedListener is the metrics listener's wrapping: accept errors
// retried, connections capped.
func limitedListener(ln net.Listener, d *Daemon, what string, n int) net.Listener {
	return netutil.Limit(netutil.Retry(ln, d.log, what), n)
}

// httpErrorLog sends net/http's own error lines (malformed requests and
// the like, which any client can cause at will) to the daemon's log at
// debug level, not to stderr unfiltered.
func httpErrorLog(l *slog.Logger) *log.Logger {
	return slog.NewLogLogger(l.Handler(), slog.LevelDebug)
}
