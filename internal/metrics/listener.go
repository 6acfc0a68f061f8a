package metrics

import (
	"context"
	"fmt"
	"html"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/vmsan/vmsan/internal/netutil"
	"github.com/vmsan/vmsan/internal/version"
)

// Listener is the metrics listener: /metrics, an index page on GET /,
// Go profiling under /debug/pprof/ when asked; accept errors retried
// (netutil.Retry), connections capped (netutil.Limit).
type Listener struct {
	ln     net.Listener
	served net.Listener
	srv    *http.Server
}

// Metrics listener limits: a scrape is one short request; Prometheus
// keeps its connection alive between scrapes (15 s to 1 min apart).
const (
	MaxConns     = 64
	readTimeout  = 60 * time.Second // request header and body; pprof's default 30 s profile fits
	writeTimeout = 90 * time.Second
	idleTimeout  = 90 * time.Second
)

// Listen binds addr and builds the server over src; maxConns caps its
// connections (the daemon derives it from the descriptor limit).
func Listen(addr string, src Source, pprof bool, maxConns int, log *slog.Logger) (*Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics listener: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", Handler(src))
	mux.HandleFunc("GET /{$}", index(pprof))
	if pprof {
		RegisterPprof(mux)
	}
	return &Listener{ln: ln, served: netutil.Limit(netutil.Retry(ln, log, "metrics"), maxConns),
		srv: &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: readTimeout,
			WriteTimeout: writeTimeout, IdleTimeout: idleTimeout, MaxHeaderBytes: 64 << 10,
			ErrorLog: netutil.HTTPErrorLog(log)}}, nil
}

// Addr is the bound address.
func (l *Listener) Addr() net.Addr { return l.ln.Addr() }

// Serve serves until Shutdown or Close.
func (l *Listener) Serve() error { return l.srv.Serve(l.served) }

// Shutdown stops serving, waiting for requests in progress until ctx is done.
func (l *Listener) Shutdown(ctx context.Context) error { return l.srv.Shutdown(ctx) }

// Close closes the listener (also when it was never served).
func (l *Listener) Close() error { return l.ln.Close() }

// RegisterPprof serves Go profiling under /debug/pprof/ on mux.
func RegisterPprof(mux *http.ServeMux) {
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
}

// index answers GET / on the metrics listener with links to what it
// serves, so a person pointing a browser at the port (or a load balancer
// health check) gets a page rather than a 404. Other paths stay 404.
func index(pprof bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		fmt.Fprint(w, `<!DOCTYPE html>
<html><head><title>vmsan</title></head>
<body>
<h1>vmsan</h1>
<p>Version `+html.EscapeString(version.Get().Version)+`</p>
<ul>
<li><a href="/metrics">/metrics</a>: Prometheus metrics</li>
`)
		if pprof {
			fmt.Fprint(w, `<li><a href="/debug/pprof/">/debug/pprof/</a>: Go profiling</li>
`)
		}
		fmt.Fprint(w, `</ul>
</body></html>
`)
	}
}
