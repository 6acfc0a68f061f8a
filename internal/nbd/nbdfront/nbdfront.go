// Package nbdfront is the NBD front end: the NBD server (nbd/server) on
// the listeners the daemon bound, over the daemon's volumes, with TLS
// policy warnings, status counters and the start-up banner's QEMU lines.
// It is built against frontend.Host and imports no daemon.
package nbdfront

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/vmsan/vmsan/internal/frontend"
	"github.com/vmsan/vmsan/internal/nbd/proto"
	"github.com/vmsan/vmsan/internal/nbd/server"
	"github.com/vmsan/vmsan/internal/netutil"
	"github.com/vmsan/vmsan/internal/volrt"
)

// Config is what the daemon decided for the NBD front end.
type Config struct {
	// Listeners are bound by the daemon, in configuration order; the
	// front end owns them from New on (Close closes them and removes
	// Unix socket files).
	Listeners []net.Listener
	// TLS is the server's TLS configuration (nil: TLS off); TLSMode is
	// tls.mode ("off", "optional", "required"); ClientCA says tls.ca is
	// set (client certificates required).
	TLS      *tls.Config
	TLSMode  string
	ClientCA bool
	// MaxPayload is the largest read/write; MaxConns bounds open
	// connections (0: the server's default).
	MaxPayload uint32
	MaxConns   int
	// MaxPendingHandshakes bounds connections still in the handshake
	// (past it the oldest is closed); HandshakeTimeout closes one that
	// has not finished in time (0: the server's defaults).
	MaxPendingHandshakes int
	HandshakeTimeout     time.Duration
}

// FrontEnd serves the volumes over NBD on the configured listeners.
type FrontEnd struct {
	h         frontend.Host
	log       *slog.Logger
	tlsMode   string
	srv       *server.Server
	lns       []net.Listener
	sessions  *volrt.Sessions
	closeOnce sync.Once
}

func tlsMode(s string) server.TLSMode {
	switch s {
	case "optional":
		return server.TLSOptional
	case "required":
		return server.TLSRequired
	}
	return server.TLSOff
}

// New builds the NBD front end over h on c.Listeners. Nothing is served
// until Serve.
func New(h frontend.Host, c Config) *FrontEnd {
	f := &FrontEnd{h: h, log: h.Logger(), tlsMode: c.TLSMode, lns: c.Listeners, sessions: h.NewSessions("nbd")}
	f.srv = server.New(server.Config{
		Registry:   h.Registry(),
		TLSConfig:  c.TLS,
		TLSMode:    tlsMode(c.TLSMode),
		MaxPayload: c.MaxPayload,
		Budget:     h.Budget(),
		MaxConns:   c.MaxConns,
		// Connections still in the handshake are not the data path yet.
		MaxPendingHandshakes: c.MaxPendingHandshakes,
		HandshakeTimeout:     c.HandshakeTimeout,
		Logger:               f.log,
		Sessions:             f.sessions,
	})
	for _, ln := range f.lns {
		// NBD has no access control of its own: TLS with client
		// certificates is what keeps strangers on the network out.
		if networkReachable(ln.Addr()) {
			switch {
			case c.TLSMode != "required":
				f.log.Warn("NBD listener is reachable from the network without TLS (tls.mode required): any client that reaches it can read and write every volume", "listen", ln.Addr().String())
			case !c.ClientCA:
				f.log.Warn("NBD listener is reachable from the network and tls.ca is not set: any TLS client can read and write every volume (set tls.ca to require client certificates)", "listen", ln.Addr().String())
			}
		}
	}
	return f
}

func (f *FrontEnd) Name() string { return "nbd" }

func (f *FrontEnd) Serve(ctx context.Context) error {
	errc := make(chan error, len(f.lns))
	for _, ln := range f.lns {
		go func(ln net.Listener) {
			err := f.srv.Serve(ln)
			if err != nil && !errors.Is(err, server.ErrServerClosed) {
				err = fmt.Errorf("nbd listener %s: %w", ln.Addr(), err)
			} else {
				err = nil
			}
			errc <- err
		}(ln)
	}
	for range f.lns {
		if err := <-errc; err != nil {
			return err
		}
	}
	return nil
}

func (f *FrontEnd) Shutdown(ctx context.Context) error {
	if err := f.srv.Shutdown(ctx); err != nil {
		return fmt.Errorf("nbd server shutdown: %w", err)
	}
	return nil
}

func (f *FrontEnd) Close() {
	f.closeOnce.Do(func() {
		for _, ln := range f.lns {
			ln.Close() // already closed by server.Shutdown normally; harmless
			if a, ok := ln.Addr().(*net.UnixAddr); ok {
				os.Remove(a.Name)
			}
		}
	})
}

// Addrs are the bound listener addresses in configuration order.
func (f *FrontEnd) Addrs() []net.Addr { return netutil.Addrs(f.lns) }

func (f *FrontEnd) Stats() volrt.FrontEndStats {
	st := f.srv.Stats()
	fs := volrt.FrontEndStats{
		Name:         "nbd",
		Accepted:     st.Accepted,
		Active:       st.ActiveConns,
		ErrorReplies: st.ErrorReplies,
		BytesRead:    st.BytesRead,
		BytesWritten: st.BytesWritten,
		Clients:      f.sessions.List(),
		Detail:       newNBDDetail(st),

		HandshakeFails: st.HandshakeFails,
		TLSHandshakes:  st.TLSHandshakes,
		ProtocolErrors: st.ProtocolErrors,
		Panics:         st.Panics,
		HoleChunks:     st.HoleChunks,
		Inflight:       st.InflightRequests,
		Refused:        st.ConnsRefused,
		Commands:       make([]volrt.CommandCount, len(st.Requests)),
	}
	for i, n := range st.Requests {
		fs.Requests += n
		fs.Commands[i] = volrt.CommandCount{Command: nbdCmdNames[i], Count: n}
	}
	for _, a := range f.Addrs() {
		if a.Network() == "unix" {
			fs.Listeners = append(fs.Listeners, "unix:"+a.String())
		} else {
			fs.Listeners = append(fs.Listeners, a.String())
		}
	}
	return fs
}

// BannerLines: QEMU options and nbdinfo URLs for the default export, on
// the first TCP and first Unix listener.
func (f *FrontEnd) BannerLines() []string {
	exp := f.h.BannerExport()
	if exp == "" {
		return nil
	}
	var tcp *net.TCPAddr
	var unix *net.UnixAddr
	for _, a := range f.Addrs() {
		switch a := a.(type) {
		case *net.TCPAddr:
			if tcp == nil {
				tcp = a
			}
		case *net.UnixAddr:
			if unix == nil {
				unix = a
			}
		}
	}
	scheme := "nbd"
	if f.tlsMode == "required" {
		scheme = "nbds"
	}
	var out []string
	if tcp != nil {
		host := tcp.IP.String()
		if tcp.IP.IsUnspecified() {
			host = "127.0.0.1"
		}
		hp := net.JoinHostPort(host, fmt.Sprint(tcp.Port))
		out = append(out,
			"",
			"Use it from QEMU with:",
			fmt.Sprintf("  -drive file=%s://%s/%s,format=raw,if=virtio,cache=none", scheme, hp, exp),
			"or:",
			fmt.Sprintf("  -blockdev driver=nbd,server.type=inet,server.host=%s,server.port=%d,export=%s,node-name=disk0", host, tcp.Port, exp),
			"Inspect it with:",
			fmt.Sprintf("  nbdinfo %s://%s/%s", scheme, hp, exp))
	}
	if unix != nil {
		sock := unix.String()
		if abs, err := filepath.Abs(sock); err == nil {
			sock = abs
		}
		out = append(out, "Over the Unix socket:", fmt.Sprintf("  nbdinfo 'nbd+unix:///%s?socket=%s'", exp, sock))
	}
	return out
}

// nbdDetail is the NBD server's counters as status shows them (the
// front end's Detail, and Status.Server): snake_case names like the rest
// of the control API, requests labelled by command.
type nbdDetail struct {
	Accepted         uint64            `json:"accepted"`
	ActiveConns      int64             `json:"active_connections"`
	HandshakeFails   uint64            `json:"handshake_failures"`
	TLSHandshakes    uint64            `json:"tls_handshakes"`
	Requests         map[string]uint64 `json:"requests"` // by command: read, write, ..., every command listed
	ErrorReplies     uint64            `json:"error_replies"`
	BytesRead        uint64            `json:"bytes_read"`
	BytesWritten     uint64            `json:"bytes_written"`
	ProtocolErrors   uint64            `json:"protocol_errors"`
	Panics           uint64            `json:"panics"`
	HoleChunks       uint64            `json:"hole_chunks"`
	InflightRequests int64             `json:"inflight_requests"`
	ConnsRefused     uint64            `json:"connections_refused"`
}

func newNBDDetail(st server.Stats) nbdDetail {
	d := nbdDetail{Accepted: st.Accepted, ActiveConns: st.ActiveConns, HandshakeFails: st.HandshakeFails, TLSHandshakes: st.TLSHandshakes,
		Requests: make(map[string]uint64, len(st.Requests)), ErrorReplies: st.ErrorReplies, BytesRead: st.BytesRead, BytesWritten: st.BytesWritten,
		ProtocolErrors: st.ProtocolErrors, Panics: st.Panics, HoleChunks: st.HoleChunks, InflightRequests: st.InflightRequests, ConnsRefused: st.ConnsRefused}
	for i, n := range st.Requests {
		d.Requests[nbdCmdNames[i]] = n
	}
	return d
}

// nbdCmdNames label server.Stats.Requests (indexed by proto.Cmd):
// "NBD_CMD_WRITE_ZEROES" -> "write_zeroes", matching the engine's op label.
var nbdCmdNames = func() (n [len(server.Stats{}.Requests)]string) {
	for i := range n {
		n[i] = strings.ToLower(strings.TrimPrefix(proto.Cmd(i).String(), "NBD_CMD_"))
	}
	return n
}()

// networkReachable says a listener accepts connections from other hosts
// (a TCP address that is not loopback).
func networkReachable(a net.Addr) bool {
	ta, ok := a.(*net.TCPAddr)
	return ok && !ta.IP.IsLoopback()
}
