package client

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strings"

	"github.com/vmsan/vmsan/internal/nbd/proto"
)

// maxOptReply bounds the data of one option reply the client will read.
// Every reply the client asks for (INFO items, META_CONTEXT, an error
// message) is a few names of at most 4096 bytes.
const maxOptReply = 64 << 10

// Export is what the handshake learned about the export.
type Export struct {
	Name        string
	Description string
	Size        int64
	Flags       uint16 // transmission flags
	// Block sizes from NBD_INFO_BLOCK_SIZE, or the spec defaults (1, 4096,
	// 32 MiB) when the server sent none.
	MinBlock, PrefBlock, MaxBlock uint32
	StructuredReplies             bool
	// AllocContext is the id of base:allocation, valid if HasAlloc.
	AllocContext uint32
	HasAlloc     bool
	TLS          bool
}

// Has reports whether transmission flag f was advertised.
func (e Export) Has(f uint16) bool { return e.Flags&f != 0 }

// FlagNames lists the advertised transmission flags by name.
func (e Export) FlagNames() []string {
	names := []struct {
		f uint16
		n string
	}{
		{proto.FlagHasFlags, "HAS_FLAGS"}, {proto.FlagReadOnly, "READ_ONLY"}, {proto.FlagSendFlush, "SEND_FLUSH"},
		{proto.FlagSendFUA, "SEND_FUA"}, {proto.FlagRotational, "ROTATIONAL"}, {proto.FlagSendTrim, "SEND_TRIM"},
		{proto.FlagSendWriteZeroes, "SEND_WRITE_ZEROES"}, {proto.FlagSendDF, "SEND_DF"}, {proto.FlagCanMultiConn, "CAN_MULTI_CONN"},
		{proto.FlagSendResize, "SEND_RESIZE"}, {proto.FlagSendCache, "SEND_CACHE"}, {proto.FlagSendFastZero, "SEND_FAST_ZERO"},
		{proto.FlagBlockStatusPayload, "BLOCK_STATUS_PAYLOAD"},
	}
	var out []string
	for _, x := range names {
		if e.Flags&x.f != 0 {
			out = append(out, x.n)
		}
	}
	return out
}

// hs is one handshake in progress on a raw connection.
type hs struct {
	c    net.Conn
	buf  []byte
	opts *Options
}

func (h *hs) sendOpt(opt proto.Opt, data []byte) error {
	h.buf = proto.AppendOption(h.buf[:0], opt, data)
	_, err := h.c.Write(h.buf)
	return err
}

// readReply reads one option reply for opt, with its data bounded.
func (h *hs) readReply(opt proto.Opt) (proto.OptionReplyHeader, []byte, error) {
	var hdr [proto.OptionReplyHdrSize]byte
	if _, err := io.ReadFull(h.c, hdr[:]); err != nil {
		return proto.OptionReplyHeader{}, nil, fmt.Errorf("nbd: reading reply to %v: %w", opt, err)
	}
	rh, err := proto.ParseOptionReplyHeader(hdr[:])
	if err != nil {
		return rh, nil, err
	}
	if rh.Opt != opt {
		return rh, nil, fmt.Errorf("nbd: server answered %v to %v", rh.Opt, opt)
	}
	if rh.Length > maxOptReply {
		return rh, nil, fmt.Errorf("nbd: %v reply of %d bytes exceeds %d: %w", opt, rh.Length, maxOptReply, proto.ErrTooLong)
	}
	data := make([]byte, rh.Length)
	if _, err := io.ReadFull(h.c, data); err != nil {
		return rh, nil, fmt.Errorf("nbd: reading reply to %v: %w", opt, err)
	}
	return rh, data, nil
}

func repErr(opt proto.Opt, rh proto.OptionReplyHeader, data []byte) error {
	return &proto.RepError{Opt: opt, Rep: rh.Type, Message: string(data)}
}

// simpleOpt sends an option whose only success reply is ACK.
func (h *hs) simpleOpt(opt proto.Opt, data []byte) error {
	if err := h.sendOpt(opt, data); err != nil {
		return err
	}
	rh, d, err := h.readReply(opt)
	if err != nil {
		return err
	}
	if rh.Type.IsError() {
		return repErr(opt, rh, d)
	}
	if rh.Type != proto.RepAck {
		return fmt.Errorf("nbd: unexpected %v reply to %v", rh.Type, opt)
	}
	return nil
}

// negotiate runs the fixed-newstyle handshake and returns the connection to
// use for transmission (a TLS connection after STARTTLS).
func negotiate(c net.Conn, a Address, o *Options) (net.Conn, Export, error) {
	h := &hs{c: c, opts: o}
	var ex Export
	var greet [proto.ServerGreetingSize]byte
	if _, err := io.ReadFull(c, greet[:]); err != nil {
		return nil, ex, fmt.Errorf("nbd: reading greeting: %w", err)
	}
	sflags, err := proto.ParseServerGreeting(greet[:])
	if err != nil {
		return nil, ex, err
	}
	if sflags&proto.FlagFixedNewstyle == 0 {
		return nil, ex, errors.New("nbd: server does not speak fixed newstyle")
	}
	cflags := proto.FlagCFixedNewstyle
	noZeroes := sflags&proto.FlagNoZeroes != 0
	if noZeroes {
		cflags |= proto.FlagCNoZeroes
	}
	if _, err := c.Write(proto.AppendClientFlags(nil, cflags)); err != nil {
		return nil, ex, err
	}

	if a.TLS {
		if err := h.simpleOpt(proto.OptStartTLS, nil); err != nil {
			return nil, ex, fmt.Errorf("nbd: STARTTLS: %w", err)
		}
		cfg := o.TLSConfig
		if cfg == nil {
			cfg, err = TLSConfigFromDir(a.TLSCertDir, a.Host, a.TLSNoVerify)
			if err != nil {
				return nil, ex, err
			}
		}
		tc := tls.Client(c, cfg)
		if err := tc.Handshake(); err != nil {
			return nil, ex, fmt.Errorf("nbd: TLS handshake: %w", err)
		}
		c = tc
		h.c = tc
		ex.TLS = true
	}

	if !o.NoStructuredReplies {
		err := h.simpleOpt(proto.OptStructuredReply, nil)
		var re *proto.RepError
		switch {
		case err == nil:
			ex.StructuredReplies = true
		case errors.As(err, &re):
			// Old server: fall back to simple replies.
		default:
			return nil, ex, err
		}
	}
	if ex.StructuredReplies && !o.NoBlockStatus {
		if err := h.sendOpt(proto.OptSetMetaContext, proto.AppendMetaContextRequest(nil, a.Export, []string{proto.MetaContextBaseAllocation})); err != nil {
			return nil, ex, err
		}
		for {
			rh, d, err := h.readReply(proto.OptSetMetaContext)
			if err != nil {
				return nil, ex, err
			}
			if rh.Type == proto.RepAck || rh.Type.IsError() {
				break // an error only means no block status
			}
			if rh.Type == proto.RepMetaContext {
				id, name, err := proto.ParseRepMetaContext(d)
				if err != nil {
					return nil, ex, err
				}
				if name == proto.MetaContextBaseAllocation {
					ex.AllocContext, ex.HasAlloc = id, true
				}
			}
		}
	}

	// NBD_OPT_GO, asking for block sizes (which also promises the client
	// honours them).
	if err := h.sendOpt(proto.OptGo, proto.AppendInfoRequest(nil, a.Export, []proto.InfoType{proto.InfoBlockSize, proto.InfoDescription})); err != nil {
		return nil, ex, err
	}
	gotExport := false
	for {
		rh, d, err := h.readReply(proto.OptGo)
		if err != nil {
			return nil, ex, err
		}
		if rh.Type == proto.RepAck {
			break
		}
		if rh.Type.IsError() {
			if rh.Type == proto.RepErrUnsup {
				return goFallback(h, a, ex, noZeroes)
			}
			if rh.Type == proto.RepErrUnknown {
				return nil, ex, noSuchExport(h, a, repErr(proto.OptGo, rh, d))
			}
			return nil, ex, repErr(proto.OptGo, rh, d)
		}
		if rh.Type != proto.RepInfo {
			continue // unknown reply types are ignored
		}
		in, err := proto.ParseInfo(d)
		if err != nil {
			return nil, ex, err
		}
		switch in.Type {
		case proto.InfoExport:
			ex.Size, ex.Flags, gotExport = int64(in.Export.Size), in.Export.Flags, true
		case proto.InfoName:
			ex.Name = in.Text
		case proto.InfoDescription:
			ex.Description = in.Text
		case proto.InfoBlockSize:
			ex.MinBlock, ex.PrefBlock, ex.MaxBlock = in.BlockSize.Min, in.BlockSize.Preferred, in.BlockSize.Max
		}
	}
	if !gotExport {
		return nil, ex, errors.New("nbd: server finished NBD_OPT_GO without NBD_INFO_EXPORT")
	}
	return c, finish(ex, a), nil
}

// goFallback uses NBD_OPT_EXPORT_NAME for servers without NBD_OPT_GO.
func goFallback(h *hs, a Address, ex Export, noZeroes bool) (net.Conn, Export, error) {
	if err := h.sendOpt(proto.OptExportName, []byte(a.Export)); err != nil {
		return nil, ex, err
	}
	n := 10
	if !noZeroes {
		n += proto.ExportNameZeroesSize
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(h.c, b); err != nil {
		return nil, ex, fmt.Errorf("nbd: NBD_OPT_EXPORT_NAME: %w", err)
	}
	ei, err := proto.ParseExportNameReply(b)
	if err != nil {
		return nil, ex, err
	}
	ex.Size, ex.Flags = int64(ei.Size), ei.Flags
	return h.c, finish(ex, a), nil
}

func finish(ex Export, a Address) Export {
	if ex.Name == "" {
		ex.Name = a.Export
	}
	if ex.MinBlock == 0 {
		ex.MinBlock = 1
	}
	if ex.PrefBlock == 0 {
		ex.PrefBlock = 4096
	}
	if ex.MaxBlock == 0 || ex.MaxBlock > proto.DefaultMaxPayload {
		// Without an advertised maximum, 32 MiB is what every server must
		// accept; above it we do not go even if offered (bounded buffers).
		ex.MaxBlock = proto.DefaultMaxPayload
	}
	return ex
}

// maxListedExports bounds what noSuchExport reads of an NBD_OPT_LIST
// reply and shows: enough to pick from, never unbounded memory.
const (
	maxListedExports = 10000
	shownExports     = 20
)

// noSuchExport turns the server's "unknown export" into an error a person
// can act on: the export list (NBD_OPT_LIST, asked on the same
// connection: after an error reply the handshake goes on) and the URL to
// write. goErr stays in the chain (errors.As finds the *proto.RepError).
func noSuchExport(h *hs, a Address, goErr error) error {
	what := fmt.Sprintf("%s has no export %q", a.Addr, a.Export)
	if a.Export == "" {
		what = fmt.Sprintf("the URL names no export and %s has no default export", a.Addr)
	}
	names, err := listExports(h)
	switch {
	case err != nil:
		return fmt.Errorf("nbd: %s, and it does not list its exports (%v); name one in the URL, e.g. %s: %w",
			what, err, exportURL(a, "NAME"), goErr)
	case len(names) == 0:
		return fmt.Errorf("nbd: %s, and it lists none: %w", what, goErr)
	}
	shown := names
	more := ""
	if len(shown) > shownExports {
		shown, more = shown[:shownExports], fmt.Sprintf(" and %d more", len(names)-shownExports)
	}
	q := make([]string, len(shown))
	for i, n := range shown {
		q[i] = fmt.Sprintf("%q", n)
	}
	return fmt.Errorf("nbd: %s; its exports are %s%s; name one in the URL, e.g. %s: %w",
		what, strings.Join(q, ", "), more, exportURL(a, names[0]), goErr)
}

// listExports asks for the export names (NBD_OPT_LIST).
func listExports(h *hs) ([]string, error) {
	if err := h.sendOpt(proto.OptList, nil); err != nil {
		return nil, err
	}
	var names []string
	for n := 0; ; n++ {
		rh, d, err := h.readReply(proto.OptList)
		if err != nil {
			return nil, err
		}
		switch {
		case rh.Type == proto.RepAck:
			return names, nil
		case rh.Type.IsError():
			return nil, repErr(proto.OptList, rh, d)
		case rh.Type == proto.RepServer:
			if n >= maxListedExports {
				return names, nil // enough to show; the rest is not read
			}
			name, _, err := proto.ParseRepServer(d)
			if err != nil {
				return nil, err
			}
			names = append(names, name)
		}
	}
}

// exportURL is a's URL with the export name set, in the scheme a came in.
func exportURL(a Address, name string) string {
	scheme := "nbd"
	if a.TLS {
		scheme = "nbds"
	}
	path := "/" + url.PathEscape(name)
	if a.Network == "unix" {
		return scheme + "+unix://" + path + "?socket=" + a.Addr
	}
	return scheme + "://" + a.Addr + path
}
