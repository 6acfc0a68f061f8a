package server

import (
	"container/list"
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vmsan/vmsan/internal/export"
	"github.com/vmsan/vmsan/internal/nbd/proto"
	"github.com/vmsan/vmsan/internal/netutil"
	"github.com/vmsan/vmsan/internal/volrt"
)

// TLSMode selects the spec's TLS mode of operation.
type TLSMode int

const (
	// TLSOff is the spec's NOTLS mode: STARTTLS gets NBD_REP_ERR_POLICY.
	TLSOff TLSMode = iota
	// TLSOptional is SELECTIVETLS with no TLS-only export: clients may
	// upgrade with STARTTLS but need not.
	TLSOptional
	// TLSRequired is FORCEDTLS: before STARTTLS only ABORT and STARTTLS are
	// served; every other option gets NBD_REP_ERR_TLS_REQD.
	TLSRequired
)

func (m TLSMode) String() string {
	switch m {
	case TLSOff:
		return "off"
	case TLSOptional:
		return "optional"
	case TLSRequired:
		return "required"
	}
	return "unknown"
}

// Config configures a Server. Only Registry is required.
type Config struct {
	Registry  export.Registry
	TLSConfig *tls.Config // required unless TLSMode is TLSOff
	TLSMode   TLSMode
	// MaxPayload bounds READ and WRITE lengths (default 32 MiB). Larger
	// requests get NBD_EINVAL.
	MaxPayload uint32
	Logger     *slog.Logger
	// Sessions, if set, records each connection in transmission phase
	// (volume, client address, since) for front-end-neutral status.
	Sessions *volrt.Sessions

	// MaxInflight bounds concurrently outstanding requests per connection
	// (default 256).
	MaxInflight int
	// MaxInflightBytes bounds payload bytes held per connection (default
	// 2*MaxPayload, at least MaxPayload).
	MaxInflightBytes int64
	// Budget, when set, is the daemon-wide in-flight budget every
	// connection's budget also reserves from (shared with other front
	// ends): when it is spent, connections stop reading requests until
	// memory frees. It must be at least MaxPayload.
	Budget *volrt.Budget
	// MaxConns bounds the connections open at once (default 1024); a
	// connection past it is closed right after accept, before the
	// greeting, so the client learns at once instead of waiting in the
	// listen backlog.
	MaxConns int
	// HandshakeTimeout bounds the whole handshake, from accept to the
	// start of transmission (default 30s): a client that connects and says
	// nothing, or trickles its options, is closed when it expires.
	HandshakeTimeout time.Duration
	// MaxPendingHandshakes bounds the connections still in the handshake
	// (default 64): a new connection past it closes the oldest one still
	// in the handshake, so a flood of silent connections holds at most
	// this many descriptors (never those of clients that completed their
	// handshake), and a real client, whose handshake takes milliseconds,
	// still gets through it.
	MaxPendingHandshakes int
	// StructuredReadHoles enables OFFSET_HOLE chunks for reads of at least
	// this many bytes (default 64 KiB; smaller reads always send data,
	// because asking the device for extents costs more than sending a
	// few zeroes). Negative disables holes in reads.
	StructuredReadHoles int
}

// Stats are cumulative counters (plus current gauges) for metrics.
type Stats struct {
	Accepted         uint64 // connections accepted
	ActiveConns      int64  // connections currently open
	HandshakeFails   uint64 // connections that ended before transmission
	TLSHandshakes    uint64
	Requests         [8]uint64 // by proto.Cmd (READ..BLOCK_STATUS)
	ErrorReplies     uint64
	BytesRead        uint64 // READ payload bytes sent
	BytesWritten     uint64 // WRITE payload bytes received
	ProtocolErrors   uint64 // connections closed for protocol violations
	Panics           uint64 // recovered panics (each is a bug)
	HoleChunks       uint64 // OFFSET_HOLE chunks sent
	InflightRequests int64
	ConnsRefused     uint64 // connections closed for MaxConns, or in the handshake for MaxPendingHandshakes
}

type counters struct {
	accepted, handshakeFails, tlsHandshakes, errorReplies atomic.Uint64
	bytesRead, bytesWritten, protocolErrors, panics       atomic.Uint64
	holeChunks, connsRefused                              atomic.Uint64
	requests                                              [8]atomic.Uint64
	active, inflight                                      atomic.Int64
}

// Server serves NBD. Create with New.
type Server struct {
	cfg Config
	log *slog.Logger
	ctr counters

	mu        sync.Mutex
	listeners map[net.Listener]struct{}
	conns     map[*conn]struct{}
	perExport map[string]int
	closing   bool
	connWG    sync.WaitGroup
	refusals  volrt.RateLog
	// pending: the connections in the handshake, oldest first (under
	// mu); hsRefusals rate-limits the log of those closed past the cap.
	pending    list.List
	hsRefusals volrt.RateLog
}

// New returns a Server; it does not listen until Serve.
func New(cfg Config) *Server {
	if cfg.MaxPayload == 0 {
		cfg.MaxPayload = proto.DefaultMaxPayload
	}
	if cfg.MaxInflight <= 0 {
		cfg.MaxInflight = 256
	}
	if cfg.MaxInflightBytes < int64(cfg.MaxPayload) {
		if cfg.MaxInflightBytes == 0 {
			cfg.MaxInflightBytes = 2 * int64(cfg.MaxPayload)
		} else {
			cfg.MaxInflightBytes = int64(cfg.MaxPayload)
		}
	}
	if cfg.MaxConns <= 0 {
		cfg.MaxConns = 1024
	}
	if cfg.HandshakeTimeout <= 0 {
		cfg.HandshakeTimeout = 30 * time.Second
	}
	if cfg.MaxPendingHandshakes <= 0 {
		cfg.MaxPendingHandshakes = 64
	}
	if cfg.StructuredReadHoles == 0 {
		cfg.StructuredReadHoles = 64 << 10
	}
	if cfg.TLSConfig == nil {
		cfg.TLSMode = TLSOff
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Server{
		cfg:       cfg,
		log:       log,
		listeners: map[net.Listener]struct{}{},
		conns:     map[*conn]struct{}{},
		perExport: map[string]int{},
	}
}

// ErrServerClosed is returned by Serve after Shutdown.
var ErrServerClosed = errors.New("nbd server: closed")

// Serve accepts connections on l until l is closed or Shutdown is called.
// It returns ErrServerClosed after Shutdown, otherwise the accept error.
func (s *Server) Serve(l net.Listener) error {
	// Accept errors other than a close (EMFILE, ...) are transient: the
	// wrapper logs them (rate-limited) and retries with backoff, so the
	// listener keeps serving once the resource is back.
	l = netutil.Retry(l, s.log, "nbd")
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		l.Close()
		return ErrServerClosed
	}
	s.listeners[l] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.listeners, l)
		s.mu.Unlock()
	}()
	for {
		c, err := l.Accept()
		if err != nil {
			s.mu.Lock()
			closing := s.closing
			s.mu.Unlock()
			if closing {
				return ErrServerClosed
			}
			return err
		}
		s.connWG.Add(1)
		go func() {
			defer s.connWG.Done()
			s.ServeConn(context.Background(), c)
		}()
	}
}

// ServeConn serves one already-accepted connection and closes it when done.
// It returns when the client disconnects, on a protocol error, when ctx is
// cancelled, or after Shutdown drained it.
func (s *Server) ServeConn(ctx context.Context, nc net.Conn) {
	s.ctr.accepted.Add(1)
	c := newConn(s, nc)
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		nc.Close()
		return
	}
	if len(s.conns) >= s.cfg.MaxConns {
		s.mu.Unlock()
		s.ctr.connsRefused.Add(1)
		if ok, n := s.refusals.Allow(); ok {
			s.log.Warn("nbd: connection refused: connection limit reached (max_connections)",
				"remote", nc.RemoteAddr().String(), "max_connections", s.cfg.MaxConns, "refused_since_last_line", n)
		}
		nc.Close()
		return
	}
	var evict *conn
	if s.pending.Len() >= s.cfg.MaxPendingHandshakes {
		// The oldest connection still in the handshake makes room: it is
		// the nearest to its timeout anyway, and a real client completes
		// its handshake in milliseconds, so it gets through a flood of
		// silent connections instead of being refused with them.
		evict = s.pending.Remove(s.pending.Front()).(*conn)
		evict.pendingEl = nil
	}
	c.pendingEl = s.pending.PushBack(c)
	s.conns[c] = struct{}{}
	s.mu.Unlock()
	if evict != nil {
		s.ctr.connsRefused.Add(1)
		if ok, n := s.hsRefusals.Allow(); ok {
			s.log.Warn("nbd: too many connections still in the handshake (max_pending_handshakes): closed the oldest",
				"closed", evict.nc.RemoteAddr().String(), "max_pending_handshakes", s.cfg.MaxPendingHandshakes,
				"handshake_timeout", s.cfg.HandshakeTimeout, "closed_since_last_line", n)
		}
		evict.nc.Close()
	}
	s.ctr.active.Add(1)
	defer func() {
		s.ctr.active.Add(-1)
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		c.handshakeOver()
	}()
	stop := context.AfterFunc(ctx, c.stop)
	defer stop()
	c.serve()
}

// Shutdown stops accepting, stops reading new requests on every connection,
// lets in-flight requests finish and their replies go out, then closes the
// connections. If ctx expires first the remaining connections are closed
// hard and ctx.Err() is returned.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	s.closing = true
	for l := range s.listeners {
		l.Close()
	}
	conns := make([]*conn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	for _, c := range conns {
		c.stop()
	}
	done := make(chan struct{})
	go func() {
		s.connWG.Wait()
		for {
			s.mu.Lock()
			n := len(s.conns)
			s.mu.Unlock()
			if n == 0 {
				break
			}
			time.Sleep(5 * time.Millisecond) // ServeConn callers outside Serve
		}
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		s.mu.Lock()
		for c := range s.conns {
			c.nc.Close()
		}
		s.mu.Unlock()
		return ctx.Err()
	}
}

// Connections returns how many connections are in transmission phase on the
// named export.
func (s *Server) Connections(exportName string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.perExport[exportName]
}

func (s *Server) addExportConn(name string, d int) {
	s.mu.Lock()
	s.perExport[name] += d
	if s.perExport[name] <= 0 {
		delete(s.perExport, name)
	}
	s.mu.Unlock()
}

// Stats returns a snapshot of the counters.
func (s *Server) Stats() Stats {
	st := Stats{
		Accepted:         s.ctr.accepted.Load(),
		ActiveConns:      s.ctr.active.Load(),
		HandshakeFails:   s.ctr.handshakeFails.Load(),
		TLSHandshakes:    s.ctr.tlsHandshakes.Load(),
		ErrorReplies:     s.ctr.errorReplies.Load(),
		BytesRead:        s.ctr.bytesRead.Load(),
		BytesWritten:     s.ctr.bytesWritten.Load(),
		ProtocolErrors:   s.ctr.protocolErrors.Load(),
		Panics:           s.ctr.panics.Load(),
		HoleChunks:       s.ctr.holeChunks.Load(),
		InflightRequests: s.ctr.inflight.Load(),
		ConnsRefused:     s.ctr.connsRefused.Load(),
	}
	for i := range st.Requests {
		st.Requests[i] = s.ctr.requests[i].Load()
	}
	return st
}
