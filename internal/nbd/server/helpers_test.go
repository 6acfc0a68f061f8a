package server

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vmsan/vmsan/internal/backend"
	"github.com/vmsan/vmsan/internal/export"
	"github.com/vmsan/vmsan/internal/nbd/proto"
)

// testDev is a minimal export.Device over a backend.Backend that runs every
// request on its own goroutine (so completions are naturally out of order).
// gate, if set, is consulted before executing each request and may block.
type testDev struct {
	b         backend.Backend
	info      export.Info
	gate      func(r *export.Request)
	submitted atomic.Int64
	refs      atomic.Int64
}

func (d *testDev) Info() export.Info { return d.info }
func (d *testDev) Release()          { d.refs.Add(-1) }
func (d *testDev) Extents(off, n int64) ([]backend.Extent, error) {
	return d.b.Extents(off, n)
}
func (d *testDev) Submit(r *export.Request) {
	d.submitted.Add(1)
	go func() {
		if d.gate != nil {
			d.gate(r)
		}
		r.Err = execReq(d.b, r)
		r.Done(r)
	}()
}

func execReq(b backend.Backend, r *export.Request) error {
	switch r.Op {
	case export.OpRead:
		return b.ReadvAt([][]byte{r.Data}, r.Offset)
	case export.OpWrite:
		return b.WritevAt([][]byte{r.Data}, r.Offset, r.FUA)
	case export.OpFlush:
		return b.Sync()
	case export.OpTrim:
		return b.Trim(r.Offset, r.Length)
	case export.OpWriteZeroes:
		return b.WriteZeroes(r.Offset, r.Length, !r.NoHole, r.FastZero)
	case export.OpCache:
		return nil
	}
	return errors.New("bad op")
}

type testReg struct {
	mu   sync.Mutex
	devs map[string]export.Device
}

func (r *testReg) Open(name string) (export.Device, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	d, ok := r.devs[name]
	if !ok {
		return nil, export.ErrNotFound
	}
	if td, ok := d.(*testDev); ok {
		td.refs.Add(1)
	}
	return d, nil
}

func (r *testReg) List() []export.Info {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []export.Info
	for _, d := range r.devs {
		out = append(out, d.Info())
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

func newTestDev(name string, size int64) *testDev {
	return &testDev{b: backend.NewMem(size), info: export.Info{
		Name: name, Description: "test " + name, Size: size, CanMultiConn: true,
		MinBlock: 512, PrefBlock: 4096, MaxBlock: 1 << 20,
	}}
}

// startServer serves reg on an ephemeral TCP port and returns the address.
func startServer(t testing.TB, cfg Config) (*Server, string) {
	t.Helper()
	srv := New(cfg)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(l) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		if err := <-done; !errors.Is(err, ErrServerClosed) {
			t.Errorf("Serve returned %v", err)
		}
		if p := srv.Stats().Panics; p != 0 {
			t.Errorf("%d panics recovered", p)
		}
	})
	return srv, l.Addr().String()
}

// rawClient is a hand-driven NBD client for protocol tests.
type rawClient struct {
	t  testing.TB
	c  net.Conn
	hs uint16
}

func dialRaw(t testing.TB, addr string) *rawClient {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(20 * time.Second))
	t.Cleanup(func() { c.Close() })
	var g [proto.ServerGreetingSize]byte
	if _, err := io.ReadFull(c, g[:]); err != nil {
		t.Fatal(err)
	}
	hs, err := proto.ParseServerGreeting(g[:])
	if err != nil {
		t.Fatal(err)
	}
	return &rawClient{t: t, c: c, hs: hs}
}

func (rc *rawClient) send(b []byte) {
	rc.t.Helper()
	if _, err := rc.c.Write(b); err != nil {
		rc.t.Fatal(err)
	}
}

func (rc *rawClient) flags(f uint32) { rc.send(proto.AppendClientFlags(nil, f)) }

type optReply struct {
	h    proto.OptionReplyHeader
	data []byte
}

func (rc *rawClient) readOptReply() (optReply, error) {
	var h [proto.OptionReplyHdrSize]byte
	if _, err := io.ReadFull(rc.c, h[:]); err != nil {
		return optReply{}, err
	}
	oh, err := proto.ParseOptionReplyHeader(h[:])
	if err != nil {
		return optReply{}, err
	}
	if oh.Length > 1<<20 {
		return optReply{}, fmt.Errorf("reply too long %d", oh.Length)
	}
	d := make([]byte, oh.Length)
	_, err = io.ReadFull(rc.c, d)
	return optReply{oh, d}, err
}

// option sends an option and collects replies up to the final one.
func (rc *rawClient) option(opt proto.Opt, data []byte) []optReply {
	rc.t.Helper()
	rc.send(proto.AppendOption(nil, opt, data))
	var out []optReply
	for {
		r, err := rc.readOptReply()
		if err != nil {
			rc.t.Fatalf("%v reply: %v", opt, err)
		}
		out = append(out, r)
		if r.h.Type == proto.RepAck || r.h.Type.IsError() {
			return out
		}
	}
}

// negotiate does flags, STRUCTURED_REPLY (optional), SET_META_CONTEXT
// (if structured) and GO; it returns the export info.
func (rc *rawClient) negotiate(name string, structured bool) proto.ExportInfo {
	rc.t.Helper()
	rc.flags(proto.FlagCFixedNewstyle | proto.FlagCNoZeroes)
	if structured {
		if r := rc.option(proto.OptStructuredReply, nil); r[0].h.Type != proto.RepAck {
			rc.t.Fatalf("structured reply: %v", r[0].h.Type)
		}
		rs := rc.option(proto.OptSetMetaContext, proto.AppendMetaContextRequest(nil, name, []string{proto.MetaContextBaseAllocation}))
		if len(rs) != 2 || rs[0].h.Type != proto.RepMetaContext {
			rc.t.Fatalf("set meta context: %+v", rs)
		}
	}
	rs := rc.option(proto.OptGo, proto.AppendInfoRequest(nil, name, []proto.InfoType{proto.InfoBlockSize}))
	var ei proto.ExportInfo
	for _, r := range rs {
		if r.h.Type.IsError() {
			rc.t.Fatalf("GO: %v %s", r.h.Type, r.data)
		}
		if r.h.Type == proto.RepInfo {
			in, err := proto.ParseInfo(r.data)
			if err != nil {
				rc.t.Fatal(err)
			}
			if in.Type == proto.InfoExport {
				ei = in.Export
			}
		}
	}
	return ei
}

func (rc *rawClient) request(r proto.Request, payload []byte) {
	rc.t.Helper()
	b := proto.AppendRequest(nil, r)
	rc.send(append(b, payload...))
}

// reply is one decoded transmission reply (all chunks of a structured
// reply collected).
type reply struct {
	cookie uint64
	errno  proto.Errno
	data   []byte // READ data (holes filled with zeroes), relative to request offset
	holes  int
	chunks []proto.ReplyType
	descs  []proto.BlockDescriptor
}

// readReply reads one complete reply. readLen gives the READ length for
// simple replies (by cookie); base is the READ offset (by cookie).
func (rc *rawClient) readReply(readLen map[uint64]uint32, base map[uint64]uint64) (reply, error) {
	var m [4]byte
	if _, err := io.ReadFull(rc.c, m[:]); err != nil {
		return reply{}, err
	}
	switch binary.BigEndian.Uint32(m[:]) {
	case proto.SimpleReplyMagic:
		var rest [12]byte
		if _, err := io.ReadFull(rc.c, rest[:]); err != nil {
			return reply{}, err
		}
		sr, _ := proto.ParseSimpleReply(append(m[:], rest[:]...))
		rp := reply{cookie: sr.Cookie, errno: sr.Error}
		if n, ok := readLen[sr.Cookie]; ok && sr.Error == 0 {
			rp.data = make([]byte, n)
			if _, err := io.ReadFull(rc.c, rp.data); err != nil {
				return rp, err
			}
		}
		return rp, nil
	case proto.StructuredReplyMagic:
		var rp reply
		first := true
		for {
			if !first {
				if _, err := io.ReadFull(rc.c, m[:]); err != nil {
					return rp, err
				}
			}
			first = false
			var rest [16]byte
			if _, err := io.ReadFull(rc.c, rest[:]); err != nil {
				return rp, err
			}
			h, err := proto.ParseChunkHeader(append(m[:], rest[:]...))
			if err != nil {
				return rp, err
			}
			if h.Length > 64<<20 {
				return rp, fmt.Errorf("chunk too long")
			}
			p := make([]byte, h.Length)
			if _, err := io.ReadFull(rc.c, p); err != nil {
				return rp, err
			}
			rp.cookie = h.Cookie
			rp.chunks = append(rp.chunks, h.Type)
			if rp.data == nil && readLen[h.Cookie] > 0 {
				rp.data = make([]byte, readLen[h.Cookie])
			}
			switch h.Type {
			case proto.ReplyTypeOffsetData:
				off, d, err := proto.ParseOffsetDataPrefix(p)
				if err != nil {
					return rp, err
				}
				copy(rp.data[off-base[h.Cookie]:], d)
			case proto.ReplyTypeOffsetHole:
				if _, _, err := proto.ParseOffsetHole(p); err != nil {
					return rp, err
				}
				rp.holes++
			case proto.ReplyTypeBlockStatus:
				_, ds, err := proto.ParseBlockStatus(p, nil)
				if err != nil {
					return rp, err
				}
				rp.descs = append(rp.descs, ds...)
			case proto.ReplyTypeError, proto.ReplyTypeErrorOffset:
				ce, err := proto.ParseErrorChunk(h.Type, p)
				if err != nil {
					return rp, err
				}
				rp.errno = ce.Errno
			}
			if h.Flags&proto.ReplyFlagDone != 0 {
				return rp, nil
			}
		}
	}
	return reply{}, fmt.Errorf("bad reply magic %x", m)
}

// do sends one request and waits for its reply.
func (rc *rawClient) do(r proto.Request, payload []byte) reply {
	rc.t.Helper()
	rc.request(r, payload)
	lens, bases := map[uint64]uint32{}, map[uint64]uint64{}
	if r.Type == proto.CmdRead {
		lens[r.Cookie], bases[r.Cookie] = r.Length, r.Offset
	}
	rp, err := rc.readReply(lens, bases)
	if err != nil {
		rc.t.Fatalf("%v reply: %v", r.Type, err)
	}
	if rp.cookie != r.Cookie {
		rc.t.Fatalf("cookie %d want %d", rp.cookie, r.Cookie)
	}
	return rp
}

// expectClosed checks the server closes the connection (EOF) without
// sending anything else.
func (rc *rawClient) expectClosed() {
	rc.t.Helper()
	rc.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	b, err := io.ReadAll(rc.c)
	if err != nil || len(b) != 0 {
		rc.t.Fatalf("want clean close, got %d bytes (%x), err %v", len(b), b[:min(len(b), 32)], err)
	}
}

func netListen() (net.Listener, error) { return net.Listen("tcp", "127.0.0.1:0") }
