package control

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/vmsan/vmsan/internal/netutil"
)

// Server is the control socket: the API's handlers over an Ops (Register)
// on Mux, where the daemon and its plugins add their own routes before
// Serve.
type Server struct {
	Mux  *http.ServeMux
	ln   net.Listener
	srv  *http.Server
	path string
}

// Listen binds dataDir's control socket (SocketName) with mode and
// registers ops' handlers; stop ends event streams (closed when the
// server shuts down). Nothing is served until Serve.
func Listen(dataDir string, mode os.FileMode, ops Ops, log *slog.Logger, stop chan struct{}) (*Server, error) {
	// Only the owner (root, normally) may create or delete volumes: the
	// socket is mode from the start (see netutil.ListenUnix). Bind
	// under a temporary name, then rename it into place, so a client never
	// finds a socket under the real name that is not yet served.
	// (Holding the data-dir lock means no other daemon uses either name.)
	tmp := filepath.Join(dataDir, ".control.sock.tmp")
	path := filepath.Join(dataDir, SocketName)
	ln, err := netutil.ListenUnix(tmp, mode)
	if err != nil {
		return nil, fmt.Errorf("control socket: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		ln.Close()
		return nil, fmt.Errorf("control socket: %w", err)
	}
	mux := http.NewServeMux()
	Register(mux, ops, log, stop)
	srv := &http.Server{Handler: WithBodyDeadline(mux), ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout: IdleTimeout, MaxHeaderBytes: 64 << 10, ErrorLog: netutil.HTTPErrorLog(log)}
	srv.RegisterOnShutdown(func() { close(stop) })
	return &Server{Mux: mux, ln: ln, srv: srv, path: path}, nil
}

// Serve serves until Shutdown or Close. net/http retries only
// "temporary" accept errors; the wrapper retries every error but a close.
func (s *Server) Serve(log *slog.Logger) error {
	return s.srv.Serve(netutil.Retry(s.ln, log, "control socket"))
}

// Shutdown stops serving, waiting for handlers until ctx is done.
func (s *Server) Shutdown(ctx context.Context) error { return s.srv.Shutdown(ctx) }

// Close closes the listener and removes the socket.
func (s *Server) Close() {
	s.ln.Close()
	os.Remove(s.path)
}
