// Package servertest starts vmsan's NBD server for other packages' tests.
//
// Simplest use:
//
//	dev := exporttest.NewFileDevice(t, "vol", 16<<20, backend.CacheWriteback)
//	srv, sock := servertest.ServeUnix(t, server.Config{Registry: exporttest.NewRegistry(dev)})
//	c, err := client.Dial(ctx, "nbd+unix:///vol?socket="+sock, nil)
//
// The server's own tests cannot use it (servertest imports server).
// Concurrency: each call starts an independent server on its own socket.
package servertest

import (
	"context"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/vmsan/vmsan/internal/nbd/server"
)

// ServeUnix starts server.New(cfg) on a fresh Unix socket in a temp dir and
// returns the server and the socket path. t.Cleanup shuts the server down,
// waiting up to 10 s for in-flight requests.
func ServeUnix(t testing.TB, cfg server.Config) (*server.Server, string) {
	t.Helper()
	srv := server.New(cfg)
	sock := filepath.Join(t.TempDir(), "v.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
	})
	return srv, sock
}
