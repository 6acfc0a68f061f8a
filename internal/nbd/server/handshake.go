package server

import (
	"container/list"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"runtime/debug"
	"sync"
	"time"

	"github.com/vmsan/vmsan/internal/export"
	"github.com/vmsan/vmsan/internal/nbd/proto"
)

// errClose ends a connection without a further reply (ABORT, protocol
// violation, EXPORT_NAME failure).
var errClose = errors.New("close connection")

// conn is one client connection.
type conn struct {
	s   *Server
	nc  net.Conn // the raw connection (closing it unblocks everything)
	rw  net.Conn // nc, or the TLS connection on top of it after STARTTLS
	log *slog.Logger
	// pendingEl: this connection in s.pending while in the handshake
	// (under s.mu).
	pendingEl *list.Element

	tls        bool
	noZeroes   bool
	structured bool
	// metaExport is the export name of the last successful
	// SET_META_CONTEXT that selected base:allocation ("" and metaOK false
	// when none).
	metaExport string
	metaOK     bool

	dev        export.Device
	info       export.Info
	exportName string
	tflags     uint16
	blockStat  bool // base:allocation active for the export in use
	tx         *txState

	stopOnce sync.Once
	stopped  chan struct{}
	buf      []byte // handshake scratch
}

func newConn(s *Server, nc net.Conn) *conn {
	return &conn{
		s:       s,
		nc:      nc,
		rw:      nc,
		log:     s.log.With("remote", nc.RemoteAddr().String()),
		stopped: make(chan struct{}),
	}
}

// stop asks the connection to finish: no new requests are read, in-flight
// ones complete and are replied to. Safe to call many times.
func (c *conn) stop() {
	c.stopOnce.Do(func() {
		close(c.stopped)
		// Unblock a reader waiting for the next request header.
		c.nc.SetReadDeadline(time.Now())
	})
}

// handshakeOver takes the connection out of the handshake count
// (MaxPendingHandshakes), once. Safe to call many times.
func (c *conn) handshakeOver() {
	c.s.mu.Lock()
	if c.pendingEl != nil {
		c.s.pending.Remove(c.pendingEl)
		c.pendingEl = nil
	}
	c.s.mu.Unlock()
}

func (c *conn) isStopped() bool {
	select {
	case <-c.stopped:
		return true
	default:
		return false
	}
}

func (c *conn) serve() {
	defer c.nc.Close()
	defer func() {
		if r := recover(); r != nil {
			// Last resort: a bug must not take the whole server down.
			c.s.ctr.panics.Add(1)
			c.log.Error("nbd: PANIC serving connection (bug)", "panic", r, "stack", string(debug.Stack()))
		}
	}()
	c.nc.SetDeadline(time.Now().Add(c.s.cfg.HandshakeTimeout))
	if c.isStopped() {
		// stop() ran before the deadline above replaced its own.
		return
	}
	err := c.handshake()
	if err != nil {
		c.s.ctr.handshakeFails.Add(1)
		if c.dev != nil {
			c.dev.Release()
		}
		if !errors.Is(err, errClose) && !errors.Is(err, io.EOF) {
			c.log.Debug("nbd: handshake ended", "err", err)
		}
		return
	}
	c.nc.SetDeadline(time.Time{})
	c.handshakeOver()
	if c.isStopped() {
		c.dev.Release()
		return
	}
	c.s.addExportConn(c.exportName, 1)
	defer c.s.addExportConn(c.exportName, -1)
	id := c.s.cfg.Sessions.Add(c.info.Name, remoteName(c.nc))
	defer c.s.cfg.Sessions.Remove(id)
	defer c.dev.Release()
	c.transmit()
}

// remoteName is the client address for status: the peer's address, or for
// a Unix socket client (which has none) the socket it came in on.
func remoteName(nc net.Conn) string {
	if a := nc.RemoteAddr(); a != nil && a.String() != "" && a.String() != "@" {
		return a.String()
	}
	if a := nc.LocalAddr(); a != nil && a.Network() == "unix" {
		return "unix:" + a.String()
	}
	return "unknown"
}

func (c *conn) write(b []byte) error {
	_, err := c.rw.Write(b)
	return err
}

func (c *conn) reply(opt proto.Opt, rep proto.Rep, data []byte) error {
	c.buf = proto.AppendOptionReply(c.buf[:0], opt, rep, data)
	return c.write(c.buf)
}

// replyErr sends an error reply with a human-readable message (the spec
// allows a UTF-8 string as the data of error replies).
func (c *conn) replyErr(opt proto.Opt, rep proto.Rep, msg string) error {
	return c.reply(opt, rep, []byte(msg))
}

// handshake runs option haggling. On success c.dev is set and the
// connection is ready for transmission.
func (c *conn) handshake() error {
	var hdr [proto.OptionHeaderSize]byte
	if err := c.write(proto.AppendServerGreeting(nil, proto.FlagFixedNewstyle|proto.FlagNoZeroes)); err != nil {
		return err
	}
	if _, err := io.ReadFull(c.rw, hdr[:proto.ClientFlagsSize]); err != nil {
		return err
	}
	cf, _ := proto.ParseClientFlags(hdr[:])
	if cf&^(proto.FlagCFixedNewstyle|proto.FlagCNoZeroes) != 0 {
		// The spec: the server MUST drop the connection on unknown client flags.
		c.s.ctr.protocolErrors.Add(1)
		return fmt.Errorf("unknown client flags %#x: %w", cf, errClose)
	}
	c.noZeroes = cf&proto.FlagCNoZeroes != 0
	fixed := cf&proto.FlagCFixedNewstyle != 0
	tlsReq := c.s.cfg.TLSMode == TLSRequired
	if tlsReq && !fixed {
		// TLS needs fixed newstyle; such a client could only send
		// EXPORT_NAME, which we would have to refuse by closing.
		return fmt.Errorf("client without fixed newstyle in TLS-required mode: %w", errClose)
	}
	data := make([]byte, 0, 512)
	for {
		if _, err := io.ReadFull(c.rw, hdr[:]); err != nil {
			return err
		}
		h, err := proto.ParseOptionHeader(hdr[:])
		if errors.Is(err, proto.ErrBadMagic) {
			c.s.ctr.protocolErrors.Add(1)
			return fmt.Errorf("%v: %w", err, errClose)
		}
		if errors.Is(err, proto.ErrTooLong) {
			// We refuse to read (or skip) an unbounded amount of option
			// data: say why, then hard-disconnect as the spec permits for
			// lengths that amount to a denial of service.
			c.s.ctr.protocolErrors.Add(1)
			c.replyErr(h.Opt, proto.RepErrTooBig, "option data too long")
			return fmt.Errorf("%v: %w", err, errClose)
		}
		// INVARIANT: h.Length <= proto.MaxOptionLength (checked by ParseOptionHeader).
		if cap(data) < int(h.Length) {
			data = make([]byte, h.Length)
		}
		data = data[:h.Length]
		if _, err := io.ReadFull(c.rw, data); err != nil {
			return err
		}
		done, err := c.option(h.Opt, data, tlsReq && !c.tls, fixed)
		if err != nil || done {
			return err
		}
	}
}

// option handles one option; done means transmission starts.
func (c *conn) option(opt proto.Opt, data []byte, needTLS, fixed bool) (done bool, err error) {
	if needTLS {
		switch opt {
		case proto.OptAbort, proto.OptStartTLS:
		case proto.OptExportName:
			return false, fmt.Errorf("EXPORT_NAME before STARTTLS in TLS-required mode: %w", errClose)
		default:
			return false, c.replyErr(opt, proto.RepErrTLSReqd, "TLS is required: use NBD_OPT_STARTTLS")
		}
	}
	o, perr := proto.ParseOptionData(opt, data)
	if perr != nil && opt != proto.OptExportName {
		if !fixed {
			return false, fmt.Errorf("bad option from non-fixed client: %w", errClose)
		}
		return false, c.replyErr(opt, proto.RepErrInvalid, perr.Error())
	}
	switch opt {
	case proto.OptExportName:
		if perr != nil {
			return false, fmt.Errorf("%v: %w", perr, errClose)
		}
		if err := c.open(o.Name); err != nil {
			// EXPORT_NAME cannot be answered with an error: close.
			return false, fmt.Errorf("export %q: %v: %w", o.Name, err, errClose)
		}
		// Metadata contexts apply only to the export they were set for.
		c.blockStat = c.metaOK && c.metaExport == c.exportName && c.structured
		c.computeFlags()
		size := uint64(c.info.Size)
		if err := c.write(proto.AppendExportNameReply(nil, proto.ExportInfo{Size: size, Flags: c.tflags}, c.noZeroes)); err != nil {
			return false, err
		}
		return true, nil
	case proto.OptAbort:
		// The spec says the server SHOULD reply ACK, then close.
		c.reply(opt, proto.RepAck, nil)
		return false, fmt.Errorf("client abort: %w", errClose)
	case proto.OptList:
		for _, in := range c.s.cfg.Registry.List() {
			if err := c.reply(opt, proto.RepServer, proto.AppendRepServer(nil, in.Name, in.Description)); err != nil {
				return false, err
			}
		}
		return false, c.reply(opt, proto.RepAck, nil)
	case proto.OptStartTLS:
		return false, c.startTLS()
	case proto.OptInfo, proto.OptGo:
		return c.infoGo(o)
	case proto.OptStructuredReply:
		c.structured = true
		return false, c.reply(opt, proto.RepAck, nil)
	case proto.OptListMetaContext, proto.OptSetMetaContext:
		return false, c.metaContext(o)
	default:
		// Includes NBD_OPT_EXTENDED_HEADERS (not implemented) and anything
		// unknown: the session continues.
		return false, c.replyErr(opt, proto.RepErrUnsup, "option not supported")
	}
}

func (c *conn) startTLS() error {
	opt := proto.OptStartTLS
	if c.s.cfg.TLSMode == TLSOff {
		return c.replyErr(opt, proto.RepErrPolicy, "TLS is not enabled on this server")
	}
	if c.tls {
		return c.replyErr(opt, proto.RepErrInvalid, "TLS already negotiated")
	}
	if err := c.reply(opt, proto.RepAck, nil); err != nil {
		return err
	}
	tc := tls.Server(c.nc, c.s.cfg.TLSConfig)
	if err := tc.Handshake(); err != nil {
		// Too late to continue without TLS: the ACK has been sent.
		c.log.Info("nbd: TLS handshake failed", "err", err)
		return fmt.Errorf("tls handshake: %v: %w", err, errClose)
	}
	c.s.ctr.tlsHandshakes.Add(1)
	c.rw = tc
	c.tls = true
	// The spec: no negotiation state from before STARTTLS survives it
	// (a man in the middle could have injected it).
	c.structured, c.metaOK, c.metaExport = false, false, ""
	return nil
}

// open looks the export up and holds a reference to it in c.dev.
func (c *conn) open(name string) error {
	d, err := c.s.cfg.Registry.Open(name)
	if err != nil {
		return err
	}
	if c.dev != nil {
		c.dev.Release()
	}
	c.dev, c.info, c.exportName = d, d.Info(), name
	return nil
}

func (c *conn) computeFlags() {
	in := c.info
	f := proto.FlagHasFlags | proto.FlagSendFlush | proto.FlagSendFUA | proto.FlagSendCache
	if in.ReadOnly {
		f |= proto.FlagReadOnly
	} else {
		f |= proto.FlagSendTrim | proto.FlagSendWriteZeroes | proto.FlagSendFastZero
	}
	if in.Rotational {
		f |= proto.FlagRotational
	}
	if in.CanMultiConn {
		f |= proto.FlagCanMultiConn
	}
	if c.structured {
		f |= proto.FlagSendDF
	}
	c.tflags = f
}

// blockSize returns the sizes advertised in NBD_INFO_BLOCK_SIZE, sanitised
// so that they satisfy the spec's rules whatever the device says.
func (c *conn) blockSize() proto.BlockSize {
	in := c.info
	minB := in.MinBlock
	if minB == 0 || minB&(minB-1) != 0 || minB > proto.MaxMinBlockSize {
		minB = 1
	}
	pref := in.PrefBlock
	if pref == 0 || pref&(pref-1) != 0 {
		pref = 4096
	}
	pref = max(pref, minB, 512)
	maxP := c.s.cfg.MaxPayload
	if in.MaxBlock != 0 && in.MaxBlock < maxP {
		maxP = in.MaxBlock
	}
	maxP = max(maxP, pref)
	maxP -= maxP % minB
	return proto.BlockSize{Min: minB, Preferred: pref, Max: maxP}
}

func (c *conn) infoGo(o proto.Option) (bool, error) {
	opt := o.Opt
	d, err := c.s.cfg.Registry.Open(o.Name)
	if err != nil {
		if errors.Is(err, export.ErrNotFound) {
			return false, c.replyErr(opt, proto.RepErrUnknown, "no such export")
		}
		return false, c.replyErr(opt, proto.RepErrPlatform, err.Error())
	}
	// Make c.info describe this export while we answer.
	prevDev, prevInfo, prevName := c.dev, c.info, c.exportName
	c.dev, c.info, c.exportName = d, d.Info(), o.Name
	c.computeFlags()
	restore := func() {
		d.Release()
		c.dev, c.info, c.exportName = prevDev, prevInfo, prevName
	}
	b := proto.AppendInfoExport(nil, proto.ExportInfo{Size: uint64(c.info.Size), Flags: c.tflags})
	if err := c.reply(opt, proto.RepInfo, b); err != nil {
		restore()
		return false, err
	}
	// Always send BLOCK_SIZE (harmless to clients that did not ask), NAME
	// and DESCRIPTION when asked; ignore unknown requests as the spec says.
	sent := map[proto.InfoType]bool{}
	items := append([]proto.InfoType{proto.InfoBlockSize}, o.InfoRequests...)
	for _, t := range items {
		if sent[t] {
			continue
		}
		sent[t] = true
		var p []byte
		switch t {
		case proto.InfoName:
			p = proto.AppendInfoString(nil, t, c.info.Name)
		case proto.InfoDescription:
			if c.info.Description == "" {
				continue
			}
			p = proto.AppendInfoString(nil, t, c.info.Description)
		case proto.InfoBlockSize:
			p = proto.AppendInfoBlockSize(nil, c.blockSize())
		default:
			continue
		}
		if err := c.reply(opt, proto.RepInfo, p); err != nil {
			restore()
			return false, err
		}
	}
	if err := c.reply(opt, proto.RepAck, nil); err != nil {
		restore()
		return false, err
	}
	if opt == proto.OptInfo {
		restore()
		return false, nil
	}
	if prevDev != nil {
		prevDev.Release()
	}
	c.blockStat = c.metaOK && c.metaExport == c.exportName && c.structured
	return true, nil
}

// metaContextID is the id of base:allocation, the only context we serve.
const metaContextID = 1

func (c *conn) metaContext(o proto.Option) error {
	opt := o.Opt
	if opt == proto.OptSetMetaContext && !c.structured {
		return c.replyErr(opt, proto.RepErrInvalid, "negotiate structured replies first")
	}
	d, err := c.s.cfg.Registry.Open(o.Name)
	if err != nil {
		if opt == proto.OptSetMetaContext {
			c.metaOK = false
		}
		return c.replyErr(opt, proto.RepErrUnknown, "no such export")
	}
	d.Release()
	match := false
	if opt == proto.OptListMetaContext && len(o.Queries) == 0 {
		match = true // empty LIST query lists every context
	}
	for _, q := range o.Queries {
		switch {
		case q == proto.MetaContextBaseAllocation:
			match = true
		case opt == proto.OptListMetaContext && (q == "base:" || q == "base"):
			// LIST may use a namespace-only query as a wildcard.
			match = true
		}
	}
	if match {
		if err := c.reply(opt, proto.RepMetaContext, proto.AppendRepMetaContext(nil, metaContextID, proto.MetaContextBaseAllocation)); err != nil {
			return err
		}
	}
	if opt == proto.OptSetMetaContext {
		c.metaOK, c.metaExport = match, o.Name
	}
	return c.reply(opt, proto.RepAck, nil)
}
