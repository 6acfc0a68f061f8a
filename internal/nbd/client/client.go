package client

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/vmsan/vmsan/internal/nbd/proto"
)

// Options tune Dial. The zero value is good.
type Options struct {
	// Export overrides the export name from the URI.
	Export string
	// Connections is how many connections to open. 0 means 4 when the
	// server advertises CAN_MULTI_CONN and 1 otherwise. More than one is
	// only used with CAN_MULTI_CONN (without it a FLUSH on one connection
	// would not cover writes on another).
	Connections int
	// Depth bounds requests in flight per connection (default 128).
	Depth int
	// TLSConfig overrides the configuration built from the URI's
	// tls-certificates= directory for nbds:// URIs.
	TLSConfig *tls.Config
	// NoStructuredReplies / NoBlockStatus turn those negotiations off.
	NoStructuredReplies bool
	NoBlockStatus       bool
	// DialTimeout bounds connecting plus handshake when ctx has no deadline
	// (default 30 s).
	DialTimeout time.Duration
}

// Bounds on Options, so a caller's typo cannot open thousands of sockets
// or allocate huge queues.
const (
	maxDepth       = 4096
	maxConnections = 64
)

// Conn is a client for one export over one or more connections. All
// methods are safe for concurrent use; many requests from many goroutines
// are pipelined (kept in flight together) and their replies matched by
// cookie in whatever order the server sends them.
type Conn struct {
	ex    Export
	addr  Address
	conns []*conn
	calls sync.Pool
}

// Dial connects to uri (nbd://, nbds://, nbd+unix://, nbds+unix://) and
// negotiates an export.
func Dial(ctx context.Context, uri string, o *Options) (*Conn, error) {
	a, err := ParseURI(uri)
	if err != nil {
		return nil, err
	}
	var opts Options
	if o != nil {
		opts = *o
	}
	if opts.Export != "" {
		a.Export = opts.Export
	}
	if opts.Depth <= 0 {
		opts.Depth = 128
	}
	opts.Depth = min(opts.Depth, maxDepth)
	opts.Connections = min(opts.Connections, maxConnections)
	if opts.DialTimeout <= 0 {
		opts.DialTimeout = 30 * time.Second
	}
	first, ex, err := dialOne(ctx, a, &opts)
	if err != nil {
		return nil, err
	}
	c := &Conn{ex: ex, addr: a}
	c.calls.New = func() any { cl := &call{ch: make(chan struct{}, 1)}; cl.Done = cl.signal; return cl }
	c.conns = append(c.conns, newConn(first, &c.ex, opts.Depth))
	want := opts.Connections
	if want <= 0 {
		want = 4
	}
	if !ex.Has(proto.FlagCanMultiConn) {
		want = 1
	}
	for len(c.conns) < want {
		nc, ex2, err := dialOne(ctx, a, &opts)
		if err != nil {
			c.Close()
			return nil, fmt.Errorf("nbd: extra connection %d: %w", len(c.conns)+1, err)
		}
		if ex2.Size != ex.Size || ex2.Flags != ex.Flags {
			nc.Close()
			c.Close()
			return nil, errors.New("nbd: server offered a different export on another connection")
		}
		c.conns = append(c.conns, newConn(nc, &c.ex, opts.Depth))
	}
	return c, nil
}

func dialOne(ctx context.Context, a Address, o *Options) (net.Conn, Export, error) {
	dctx := ctx
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		dctx, cancel = context.WithTimeout(ctx, o.DialTimeout)
		defer cancel()
	}
	var d net.Dialer
	nc, err := d.DialContext(dctx, a.Network, a.Addr)
	if err != nil {
		return nil, Export{}, fmt.Errorf("nbd: %w", err)
	}
	if tc, ok := nc.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
	if dl, ok := dctx.Deadline(); ok {
		nc.SetDeadline(dl)
	}
	// Cancelling ctx aborts a handshake stuck on a silent server.
	stop := context.AfterFunc(dctx, func() { nc.SetDeadline(time.Unix(1, 0)) })
	tc, ex, err := negotiate(nc, a, o)
	stop()
	if err != nil {
		nc.Close()
		return nil, ex, err
	}
	tc.SetDeadline(time.Time{})
	return tc, ex, nil
}

// Export describes the negotiated export.
func (c *Conn) Export() Export { return c.ex }

// Size is the export size in bytes.
func (c *Conn) Size() int64 { return c.ex.Size }

// Connections is the number of open connections.
func (c *Conn) Connections() int { return len(c.conns) }

// Address is the parsed URI.
func (c *Conn) Address() Address { return c.addr }

// pick returns the connection with the fewest requests in flight.
func (c *Conn) pick() *conn {
	best := c.conns[0]
	if len(c.conns) == 1 {
		return best
	}
	bn := best.inflight.Load()
	for _, x := range c.conns[1:] {
		if n := x.inflight.Load(); n < bn {
			best, bn = x, n
		}
	}
	return best
}

// Submit sends r asynchronously; r.Done is called exactly once.
// REQUIRES: r.Done != nil; for READ/WRITE len(r.Data) == r.Length and the
// length is within the export's maximum block size.
func (c *Conn) Submit(r *Request) {
	if err := c.check(r); err != nil {
		r.Err = err
		r.Done(r)
		return
	}
	c.pick().submit(r)
}

func (c *Conn) check(r *Request) error {
	switch r.Cmd {
	case proto.CmdRead, proto.CmdWrite:
		if uint64(len(r.Data)) != uint64(r.Length) {
			return fmt.Errorf("nbd: %v with %d bytes of buffer for length %d", r.Cmd, len(r.Data), r.Length)
		}
		if r.Length > c.ex.MaxBlock {
			return fmt.Errorf("nbd: %v of %d bytes exceeds the maximum block size %d", r.Cmd, r.Length, c.ex.MaxBlock)
		}
	case proto.CmdBlockStatus:
		if !c.ex.HasAlloc {
			return fmt.Errorf("nbd: server did not agree to base:allocation: %w", proto.ENOTSUP)
		}
	}
	if r.Cmd == proto.CmdWrite || r.Cmd == proto.CmdTrim || r.Cmd == proto.CmdWriteZeroes {
		if c.ex.Has(proto.FlagReadOnly) {
			return fmt.Errorf("nbd: export is read-only: %w", proto.EPERM)
		}
	}
	if r.Offset < 0 || uint64(r.Offset)+uint64(r.Length) > uint64(c.ex.Size) {
		return fmt.Errorf("nbd: %v [%d,+%d) beyond export size %d: %w", r.Cmd, r.Offset, r.Length, c.ex.Size, proto.EINVAL)
	}
	return nil
}

// call is a pooled Request for the synchronous helpers, so a blocking
// ReadAt or WriteAt does not allocate.
type call struct {
	Request
	ch chan struct{}
}

func (cl *call) signal(*Request) { cl.ch <- struct{}{} }

func (c *Conn) do(cmd proto.Cmd, flags proto.CmdFlag, off int64, length uint32, data []byte) error {
	cl := c.calls.Get().(*call)
	cl.Cmd, cl.Flags, cl.Offset, cl.Length, cl.Data, cl.Err, cl.Extents = cmd, flags, off, length, data, nil, cl.Extents[:0]
	c.Submit(&cl.Request)
	<-cl.ch
	err := cl.Err
	cl.Data = nil
	c.calls.Put(cl)
	return err
}

// ReadAt reads len(p) bytes at off. Requests larger than the maximum block
// size are split and sent concurrently.
func (c *Conn) ReadAt(p []byte, off int64) (int, error) {
	return c.rw(proto.CmdRead, 0, p, off)
}

// WriteAt writes p at off.
func (c *Conn) WriteAt(p []byte, off int64) (int, error) {
	return c.rw(proto.CmdWrite, 0, p, off)
}

func (c *Conn) rw(cmd proto.Cmd, flags proto.CmdFlag, p []byte, off int64) (int, error) {
	max := int(c.ex.MaxBlock)
	if len(p) <= max {
		if err := c.do(cmd, flags, off, uint32(len(p)), p); err != nil {
			return 0, err
		}
		return len(p), nil
	}
	// Split into pieces and keep them all in flight.
	n := (len(p) + max - 1) / max
	reqs := make([]Request, n)
	var wg sync.WaitGroup
	wg.Add(n)
	done := func(*Request) { wg.Done() }
	for i := range reqs {
		s := i * max
		e := min(s+max, len(p))
		reqs[i] = Request{Cmd: cmd, Flags: flags, Offset: off + int64(s), Length: uint32(e - s), Data: p[s:e], Done: done}
		c.Submit(&reqs[i])
	}
	wg.Wait()
	for i := range reqs {
		if reqs[i].Err != nil {
			return i * max, reqs[i].Err
		}
	}
	return len(p), nil
}

// Flush makes every write completed so far durable. With CAN_MULTI_CONN one
// FLUSH covers every connection; without it there is only one connection.
func (c *Conn) Flush() error {
	if !c.ex.Has(proto.FlagSendFlush) {
		return nil // the server has no volatile cache to flush
	}
	return c.do(proto.CmdFlush, 0, 0, 0, nil)
}

// Trim deallocates [off, off+length).
func (c *Conn) Trim(off, length int64) error {
	if !c.ex.Has(proto.FlagSendTrim) {
		return fmt.Errorf("nbd: server does not support TRIM: %w", proto.ENOTSUP)
	}
	return c.ranges(proto.CmdTrim, 0, off, length)
}

// ZeroFlags select WRITE_ZEROES behaviour.
type ZeroFlags = proto.CmdFlag

// Zero makes [off, off+length) read as zeroes. flags may include
// proto.CmdFlagNoHole, proto.CmdFlagFastZero and proto.CmdFlagFUA.
func (c *Conn) Zero(off, length int64, flags ZeroFlags) error {
	if !c.ex.Has(proto.FlagSendWriteZeroes) {
		return fmt.Errorf("nbd: server does not support WRITE_ZEROES: %w", proto.ENOTSUP)
	}
	if flags&proto.CmdFlagFastZero != 0 && !c.ex.Has(proto.FlagSendFastZero) {
		return fmt.Errorf("nbd: server does not support FAST_ZERO: %w", proto.ENOTSUP)
	}
	return c.ranges(proto.CmdWriteZeroes, flags, off, length)
}

// Cache asks the server to pre-load [off, off+length) into its cache.
func (c *Conn) Cache(off, length int64) error {
	if !c.ex.Has(proto.FlagSendCache) {
		return fmt.Errorf("nbd: server does not support CACHE: %w", proto.ENOTSUP)
	}
	return c.ranges(proto.CmdCache, 0, off, length)
}

// ranges issues a length-only command over a range larger than 32 bits
// allows, in pieces aligned to the preferred block size.
func (c *Conn) ranges(cmd proto.Cmd, flags proto.CmdFlag, off, length int64) error {
	step := int64(1<<32-1) / int64(c.ex.PrefBlock) * int64(c.ex.PrefBlock)
	for length > 0 {
		n := min(length, step)
		if err := c.do(cmd, flags, off, uint32(n), nil); err != nil {
			return err
		}
		off += n
		length -= n
	}
	return nil
}

// maxStatusLength caps the length of one BLOCK_STATUS request: 2^31 - 1
// rounded down to the export's minimum block size, the cap QEMU's NBD
// client uses. A request up to 2^32 - 1 is legal, but servers people run
// mishandle lengths above 2^31 (nbdkit 1.32's memory plugin answers a
// 0xFFFFFFFF request with a longer extent and aborts on its own
// assertion), and the answer is only a hint anyway.
func maxStatusLength(minBlock uint32) int64 {
	a := int64(max(minBlock, 1))
	return (1<<31 - 1) / a * a
}

// BlockStatus returns base:allocation extents starting at off, covering at
// least part of [off, off+length) and never extending past it (servers may
// answer less, so ask again from the end of the last extent; an extent a
// server reports beyond the request is clipped). A request longer than
// maxStatusLength is shortened to it; the range is also clipped to the
// export size.
func (c *Conn) BlockStatus(off, length int64) ([]Extent, error) {
	length = min(length, maxStatusLength(c.ex.MinBlock), c.ex.Size-off)
	if length <= 0 {
		return nil, fmt.Errorf("nbd: BLOCK_STATUS at %d beyond export size %d: %w", off, c.ex.Size, proto.EINVAL)
	}
	cl := c.calls.Get().(*call)
	cl.Cmd, cl.Flags, cl.Offset, cl.Length, cl.Data, cl.Err, cl.Extents = proto.CmdBlockStatus, 0, off, uint32(length), nil, nil, nil
	c.Submit(&cl.Request)
	<-cl.ch
	err, ex := cl.Err, cl.Extents
	cl.Extents = nil
	c.calls.Put(cl)
	return ex, err
}

// Close waits for requests in flight, sends NBD_CMD_DISC and closes every
// connection.
func (c *Conn) Close() error {
	var first error
	for _, x := range c.conns {
		if err := x.close(); err != nil && first == nil {
			first = err
		}
	}
	return first
}
