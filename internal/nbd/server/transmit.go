package server

import (
	"bufio"
	"errors"
	"io"
	"net"
	"os"
	"runtime/debug"
	"sync"
	"syscall"

	"github.com/vmsan/vmsan/internal/export"
	"github.com/vmsan/vmsan/internal/nbd/proto"
	"github.com/vmsan/vmsan/internal/volrt"
)

type opKind uint8

const (
	kindPlain       opKind = iota // reply without data (or an error)
	kindRead                      // reply carries o.buf
	kindBlockStatus               // the writer asks the device and replies
)

// op is one request in flight. ops are pooled per connection's lifetime
// through opPool so that the steady state allocates nothing per request.
type op struct {
	c      *conn
	req    proto.Request
	kind   opKind
	errno  proto.Errno
	msg    string // reason for a protocol-level error (constant strings only)
	bufp   *[]byte
	nbytes int64 // payload bytes reserved against the connection's budget
	// trimFUA: a TRIM with FUA is followed by a FLUSH before replying.
	trimFUA bool
	r       export.Request
	doneFn  func(*export.Request)
	// lc decides who replies to an op submitted to the device: the
	// reader, if the op completed before Submit returned (inline on the
	// reader, or on a fast worker), otherwise the writer goroutine.
	lc volrt.Lifecycle
}

var opPool = sync.Pool{New: func() any {
	o := &op{}
	o.doneFn = o.done
	return o
}}

// txState is the per-connection transmission state shared by reader,
// completions and writer.
//
// Replies are written into bw under wmu by two goroutines: the reader, for
// ops that completed while it submitted them (the common case on a fast
// backend: the engine runs them inline on the reader, so a request costs
// no goroutine hand-off at all), and the writer, for ops completed later
// on engine workers. A reply is written whole under wmu, so chunks of two
// replies never interleave. The reader flushes before it would block
// reading the socket (nothing more is buffered), so replies are batched
// while requests keep coming and sent at once at queue depth 1; the writer
// flushes when its queue is empty.
type txState struct {
	replies chan *op      // completed ops, drained by the writer
	slots   chan struct{} // one token per op in flight
	wg      sync.WaitGroup
	br      *bufio.Reader // reader-owned

	wmu    sync.Mutex
	bw     *bufio.Writer // guarded by wmu
	broken bool          // guarded by wmu: a reply write failed
	dirty  bool          // guarded by wmu: bw holds unflushed replies

	budget    volrt.Budget // payload bytes held in flight
	flushFn   func()       // flushes buffered replies before budget waits
	maxP      uint32       // negotiated max payload (<= cfg.MaxPayload)
	minB      uint64
	holesFrom int
	descs     []proto.BlockDescriptor // reply scratch, guarded by wmu
	hdr       []byte                  // reply scratch, guarded by wmu
	pieces    []volrt.Piece           // reply scratch, guarded by wmu
}

// discardLimit is the largest WRITE payload we skip (to answer EINVAL and
// keep the stream in sync) rather than disconnect; the spec says payloads
// up to 2^25 bytes should never be treated as a denial of service.
func (c *conn) discardLimit() uint32 { return max(c.s.cfg.MaxPayload, proto.DefaultMaxPayload) }

func (c *conn) transmit() {
	cfg := &c.s.cfg
	bs := c.blockSize()
	// INVARIANT: every op holds one slots token from before it is created
	// until finish(), and only such ops are ever sent on replies, so a send
	// on replies never blocks — which is what lets the engine's completion
	// callback (op.done) send on it without stalling an engine worker.
	t := &txState{
		replies:   make(chan *op, cfg.MaxInflight),
		slots:     make(chan struct{}, cfg.MaxInflight),
		maxP:      bs.Max,
		minB:      uint64(bs.Min),
		holesFrom: cfg.StructuredReadHoles,
	}
	t.budget.InitChild(cfg.MaxInflightBytes, cfg.Budget)
	t.flushFn = func() { // made once: reserve must not allocate per request
		t.wmu.Lock()
		if t.dirty && !t.broken {
			c.flushLocked(t)
		}
		t.wmu.Unlock()
	}
	t.bw = bufio.NewWriterSize(c.rw, 256<<10)
	c.tx = t
	writerDone := make(chan struct{})
	go c.writer(t, writerDone)

	c.reader(t)

	// Let everything submitted complete and be replied to before closing.
	t.wg.Wait()
	close(t.replies)
	<-writerDone
}

func (c *conn) reader(t *txState) {
	defer func() {
		if r := recover(); r != nil {
			c.s.ctr.panics.Add(1)
			c.log.Error("nbd: PANIC in request reader (bug)", "panic", r, "stack", string(debug.Stack()))
		}
	}()
	br := bufio.NewReaderSize(c.rw, 64<<10)
	t.br = br
	var hdr [proto.RequestSize]byte
	for !c.isStopped() {
		c.flushBeforeRead(t, proto.RequestSize)
		if _, err := io.ReadFull(br, hdr[:]); err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, os.ErrDeadlineExceeded) && !errors.Is(err, net.ErrClosed) {
				c.log.Debug("nbd: read request", "err", err)
			}
			return
		}
		req, err := proto.ParseRequest(hdr[:])
		if err != nil {
			// Garbage: the stream cannot be resynchronised. Close cleanly
			// after replying to what is in flight.
			c.s.ctr.protocolErrors.Add(1)
			c.log.Warn("nbd: bad request, closing connection", "err", err)
			return
		}
		if req.Type == proto.CmdDisc {
			c.s.ctr.requests[proto.CmdDisc].Add(1)
			return
		}
		if req.Type == proto.CmdWrite && req.Length > c.discardLimit() {
			c.s.ctr.protocolErrors.Add(1)
			c.log.Warn("nbd: write payload too large, disconnecting", "length", req.Length)
			return
		}
		t.slots <- struct{}{}
		t.wg.Add(1)
		c.s.ctr.inflight.Add(1)
		o := opPool.Get().(*op)
		o.c, o.req, o.kind, o.errno, o.msg = c, req, kindPlain, 0, ""
		if int(req.Type) < len(c.s.ctr.requests) {
			c.s.ctr.requests[req.Type].Add(1)
		}
		o.errno, o.msg = c.check(t, req)
		if req.Type == proto.CmdWrite {
			if !c.readPayload(t, br, o) {
				c.finish(t, o)
				return
			}
		}
		if o.errno != 0 {
			c.replyNow(t, o)
			continue
		}
		c.dispatch(t, o)
	}
}

// readPayload reads (or, for a request already failed, discards) a WRITE
// payload. REQUIRES: o.req.Length <= c.discardLimit().
func (c *conn) readPayload(t *txState, br *bufio.Reader, o *op) bool {
	n := int64(o.req.Length)
	if o.errno != 0 {
		_, err := br.Discard(int(n))
		return err == nil
	}
	// INVARIANT: n <= t.maxP here (check() failed the request otherwise),
	// so the allocation is bounded by the configured max payload.
	c.reserve(t, n)
	o.nbytes = n
	o.bufp = volrt.GetBuf(int(n))
	c.flushBeforeRead(t, int(n))
	if _, err := io.ReadFull(br, *o.bufp); err != nil {
		return false
	}
	c.s.ctr.bytesWritten.Add(uint64(n))
	return true
}

// reserve takes n payload bytes from the connection's budget and so from
// the daemon's (Config.Budget). While that waits the reader reads nothing
// more from this client: backpressure, the client's requests queue in its
// socket. It cannot deadlock on itself: what the connection holds is
// released by completions and the writer, never by the reader. Replies
// already buffered are flushed before waiting (t.flushFn), since the
// client may be waiting for them before it sends anything else.
func (c *conn) reserve(t *txState, n int64) { t.budget.ReserveWaiting(n, t.flushFn) }

// Messages for protocol-level errors (constants, so no allocation).
const (
	msgUnknownCmd = "unknown command"
	msgBadFlags   = "command flag not valid for this command or not negotiated"
	msgReadOnly   = "export is read-only"
	msgOverflow   = "offset+length overflows"
	msgBeyondEnd  = "offset+length beyond export size"
	msgMisaligned = "offset or length not a multiple of the minimum block size"
	msgTooLong    = "length exceeds maximum payload"
	msgNoContext  = "base:allocation metadata context not negotiated"
	msgZeroLength = "zero length"
)

// check validates a request against the spec and the negotiated state.
func (c *conn) check(t *txState, req proto.Request) (proto.Errno, string) {
	allowed := proto.CmdFlagFUA
	write := false
	switch req.Type {
	case proto.CmdRead:
		if c.structured {
			allowed |= proto.CmdFlagDF
		}
	case proto.CmdWrite, proto.CmdTrim:
		write = true
	case proto.CmdWriteZeroes:
		write = true
		allowed |= proto.CmdFlagNoHole | proto.CmdFlagFastZero
	case proto.CmdBlockStatus:
		if !c.blockStat {
			return proto.EINVAL, msgNoContext
		}
		allowed |= proto.CmdFlagReqOne
	case proto.CmdFlush, proto.CmdCache:
	default:
		return proto.EINVAL, msgUnknownCmd
	}
	if req.Flags&^allowed != 0 {
		return proto.EINVAL, msgBadFlags
	}
	if write && c.info.ReadOnly {
		return proto.EPERM, msgReadOnly
	}
	if req.Type == proto.CmdFlush {
		return 0, ""
	}
	off, n := req.Offset, uint64(req.Length)
	end := off + n
	if end < off {
		return proto.EINVAL, msgOverflow
	}
	if end > uint64(c.info.Size) {
		// The spec: ENOSPC for writes past the end, EINVAL for reads and
		// trims (and everything else).
		if req.Type == proto.CmdWrite || req.Type == proto.CmdWriteZeroes {
			return proto.ENOSPC, msgBeyondEnd
		}
		return proto.EINVAL, msgBeyondEnd
	}
	if off%t.minB != 0 || n%t.minB != 0 {
		return proto.EINVAL, msgMisaligned
	}
	switch req.Type {
	case proto.CmdRead, proto.CmdWrite:
		if req.Length > t.maxP {
			return proto.EINVAL, msgTooLong
		}
	case proto.CmdBlockStatus:
		if n == 0 {
			return proto.EINVAL, msgZeroLength
		}
	}
	return 0, ""
}

func (c *conn) dispatch(t *txState, o *op) {
	req := o.req
	r := &o.r
	*r = export.Request{Offset: int64(req.Offset), Length: int64(req.Length), Done: o.doneFn, Ctx: o, Cookie: req.Cookie}
	switch req.Type {
	case proto.CmdRead:
		if req.Length == 0 {
			o.kind = kindRead
			c.replyNow(t, o)
			return
		}
		o.kind = kindRead
		n := int64(req.Length)
		c.reserve(t, n)
		o.nbytes = n
		o.bufp = volrt.GetBuf(int(n))
		r.Op, r.Data, r.Inline = export.OpRead, *o.bufp, true
	case proto.CmdWrite:
		if req.Length == 0 {
			c.replyNow(t, o)
			return
		}
		r.Op, r.Data, r.FUA, r.Inline = export.OpWrite, *o.bufp, req.Flags&proto.CmdFlagFUA != 0, true
	case proto.CmdFlush:
		r.Op, r.Offset, r.Length = export.OpFlush, 0, 0
	case proto.CmdTrim:
		if req.Length == 0 {
			c.replyNow(t, o)
			return
		}
		r.Op = export.OpTrim
		o.trimFUA = req.Flags&proto.CmdFlagFUA != 0
	case proto.CmdCache:
		if req.Length == 0 {
			c.replyNow(t, o)
			return
		}
		r.Op = export.OpCache
	case proto.CmdWriteZeroes:
		if req.Length == 0 {
			c.replyNow(t, o)
			return
		}
		r.Op = export.OpWriteZeroes
		r.FUA = req.Flags&proto.CmdFlagFUA != 0
		r.NoHole = req.Flags&proto.CmdFlagNoHole != 0
		r.FastZero = req.Flags&proto.CmdFlagFastZero != 0
	case proto.CmdBlockStatus:
		// Answered now (Device.Extents is synchronous); every write
		// replied to before this request arrived has completed, so the
		// answer reflects it.
		o.kind = kindBlockStatus
		c.replyNow(t, o)
		return
	}
	// Reads and writes may run inline on this goroutine (the engine
	// decides; see export.Request.Inline): blocking the reader for one
	// fast backend call is cheaper than two goroutine hand-offs, and a
	// slow backend makes the engine use its workers instead.
	// more: another request is already buffered, so the engine's write
	// gathering knows this connection's stream continues at once;
	// otherwise the client is likely waiting for this one (queue depth
	// 1). volrt.Lifecycle.Submit turns this into the engine's hints.
	if o.lc.Submit(c.dev, r, t.br.Buffered() >= proto.RequestSize) {
		// Completed before Submit returned: done() left the reply to us.
		c.replyNow(t, o)
	}
	// INVARIANT: when Submit returns false o belongs to done() and the
	// writer; it must not be touched here.
}

// done is the engine completion callback. It must not block: it only
// leaves the op to the reader (completed during Submit) or hands it to the
// writer (the replies channel has room for every op in flight).
func (o *op) done(r *export.Request) {
	if r.Err == nil && o.trimFUA {
		o.trimFUA = false
		r.Op, r.Offset, r.Length = export.OpFlush, 0, 0
		// Submit may block (engine backpressure) and we are on an engine
		// goroutine: hand it off. Rare path (TRIM with FUA), so the
		// goroutine's cost does not matter.
		go o.c.dev.Submit(r)
		return
	}
	if r.Err != nil {
		o.errno = toErrno(r.Err)
	}
	if o.lc.Complete() {
		return // the reader, still in Submit, replies
	}
	o.c.tx.replies <- o
}

// replyNow writes o's reply from the reader goroutine and releases o. It
// flushes unless another complete request is already buffered (the reader
// will come back here, or flush before blocking: flushBeforeRead).
func (c *conn) replyNow(t *txState, o *op) {
	c.sendReply(t, o, t.br.Buffered() < proto.RequestSize)
	c.finish(t, o)
}

// flushBeforeRead flushes replies left in bw when the reader is about to
// block reading need bytes that are not buffered yet: the client may be
// waiting for those replies before it sends more.
func (c *conn) flushBeforeRead(t *txState, need int) {
	if t.br.Buffered() >= need {
		return
	}
	t.wmu.Lock()
	defer t.wmu.Unlock()
	if t.dirty && !t.broken {
		c.flushLocked(t)
	}
}

// sendReply writes o's reply into bw under wmu (a reply is never split by
// another one) and flushes if asked. After a write error the connection is
// closed (which also stops the reader) and later replies are dropped.
func (c *conn) sendReply(t *txState, o *op, flush bool) {
	t.wmu.Lock()
	defer t.wmu.Unlock() // also on a panic, so the other side cannot deadlock
	if t.broken {
		return
	}
	if err := c.writeReply(t, t.bw, o); err != nil {
		c.brokenLocked(t, err)
		return
	}
	t.dirty = true
	if flush {
		c.flushLocked(t)
	}
}

// REQUIRES: t.wmu held.
func (c *conn) flushLocked(t *txState) {
	t.dirty = false
	if err := t.bw.Flush(); err != nil {
		c.brokenLocked(t, err)
	}
}

// REQUIRES: t.wmu held.
func (c *conn) brokenLocked(t *txState, err error) {
	t.broken = true
	c.log.Debug("nbd: write reply", "err", err)
	c.nc.Close() // unblocks the reader; remaining ops are only released
}

// finish releases everything an op holds. Called once per op, by the
// writer (or by the reader for an op that never got queued).
func (c *conn) finish(t *txState, o *op) {
	if o.bufp != nil {
		volrt.PutBuf(o.bufp)
		o.bufp = nil
	}
	t.budget.Release(o.nbytes)
	o.nbytes = 0
	o.trimFUA = false
	o.r = export.Request{}
	o.c = nil
	opPool.Put(o)
	c.s.ctr.inflight.Add(-1)
	<-t.slots
	t.wg.Done()
}

// toErrno maps an engine/backend error onto the spec's error values: the
// front-end-neutral class (volrt.Errno) one to one, except errors that
// already carry an NBD value.
func toErrno(err error) proto.Errno {
	var e proto.Errno
	if errors.As(err, &e) {
		return e
	}
	switch volrt.Errno(err) {
	case syscall.EOPNOTSUPP:
		return proto.ENOTSUP
	case syscall.EINVAL:
		return proto.EINVAL
	case syscall.ENOSPC:
		return proto.ENOSPC
	case syscall.EPERM:
		return proto.EPERM
	case syscall.ENOMEM:
		return proto.ENOMEM
	case syscall.ESHUTDOWN:
		return proto.ESHUTDOWN
	}
	return proto.EIO
}

// ---- writer ----------------------------------------------------------------

func (c *conn) writer(t *txState, done chan struct{}) {
	defer close(done)
	defer func() {
		if r := recover(); r != nil {
			c.s.ctr.panics.Add(1)
			c.log.Error("nbd: PANIC in reply writer (bug)", "panic", r, "stack", string(debug.Stack()))
			c.nc.Close()
			for o := range t.replies {
				c.finish(t, o)
			}
		}
	}()
	for o := range t.replies {
		// Batch replies: flush only when nothing else is ready.
		c.sendReply(t, o, len(t.replies) == 0)
		c.finish(t, o)
	}
	// The reader has returned: flush what it may have left.
	t.wmu.Lock()
	if !t.broken {
		c.flushLocked(t)
	}
	t.wmu.Unlock()
}

func (c *conn) writeReply(t *txState, bw *bufio.Writer, o *op) error {
	req := o.req
	h := t.hdr[:0]
	if o.errno != 0 {
		c.s.ctr.errorReplies.Add(1)
	}
	switch {
	case o.kind == kindBlockStatus:
		if o.errno == 0 {
			h = c.blockStatus(t, h, o)
		} else {
			h = proto.AppendErrorChunk(h, proto.ReplyFlagDone, req.Cookie, o.errno, o.msg)
		}
		t.hdr = h
		_, err := bw.Write(h)
		return err
	case o.kind == kindRead && c.structured:
		if o.errno != 0 {
			h = proto.AppendErrorChunk(h, proto.ReplyFlagDone, req.Cookie, o.errno, o.msg)
			t.hdr = h
			_, err := bw.Write(h)
			return err
		}
		return c.structuredRead(t, bw, o)
	}
	h = proto.AppendSimpleReply(h, proto.SimpleReply{Error: o.errno, Cookie: req.Cookie})
	t.hdr = h
	if _, err := bw.Write(h); err != nil {
		return err
	}
	if o.kind == kindRead && o.errno == 0 && o.bufp != nil {
		c.s.ctr.bytesRead.Add(uint64(len(*o.bufp)))
		_, err := bw.Write(*o.bufp)
		return err
	}
	return nil
}

func (c *conn) structuredRead(t *txState, bw *bufio.Writer, o *op) error {
	req := o.req
	var data []byte
	if o.bufp != nil {
		data = *o.bufp
	}
	if len(data) == 0 {
		t.hdr = proto.AppendNoneChunk(t.hdr[:0], req.Cookie)
		_, err := bw.Write(t.hdr)
		return err
	}
	ps := t.pieces[:0]
	if req.Flags&proto.CmdFlagDF == 0 && t.holesFrom >= 0 && len(data) >= t.holesFrom {
		ps = volrt.SplitHoles(ps, c.dev, req.Offset, data)
	}
	if len(ps) == 0 {
		ps = append(ps, volrt.Piece{Off: req.Offset, N: uint64(len(data))})
	}
	t.pieces = ps
	c.s.ctr.bytesRead.Add(uint64(len(data)))
	for i, p := range ps {
		var fl uint16
		if i == len(ps)-1 {
			fl = proto.ReplyFlagDone
		}
		rel := p.Off - req.Offset
		if p.Hole {
			c.s.ctr.holeChunks.Add(1)
			t.hdr = proto.AppendOffsetHole(t.hdr[:0], fl, req.Cookie, p.Off, uint32(p.N))
			if _, err := bw.Write(t.hdr); err != nil {
				return err
			}
			continue
		}
		t.hdr = proto.AppendOffsetDataHeader(t.hdr[:0], fl, req.Cookie, p.Off, uint32(p.N))
		if _, err := bw.Write(t.hdr); err != nil {
			return err
		}
		if _, err := bw.Write(data[rel : rel+p.N]); err != nil {
			return err
		}
	}
	return nil
}

// blockStatus builds the BLOCK_STATUS reply (or an error chunk) into h.
func (c *conn) blockStatus(t *txState, h []byte, o *op) []byte {
	req := o.req
	off, end := req.Offset, req.Offset+uint64(req.Length)
	exts, err := c.dev.Extents(int64(off), int64(req.Length))
	if err != nil {
		c.s.ctr.errorReplies.Add(1)
		return proto.AppendErrorChunk(h, proto.ReplyFlagDone, req.Cookie, toErrno(err), "extents")
	}
	ds := t.descs[:0]
	pos := off
	for _, e := range exts {
		s, f := max(uint64(e.Offset), pos), min(uint64(e.Offset+e.Length), end)
		if e.Length <= 0 || f <= s || s != pos {
			if s > pos {
				break // gap: stop here, the client asks again from there
			}
			continue
		}
		var fl uint32
		if e.Hole {
			fl |= proto.StateHole
		}
		if e.Zero {
			fl |= proto.StateZero
		}
		if n := len(ds); n > 0 && ds[n-1].Flags == fl {
			ds[n-1].Length += uint32(f - s)
		} else {
			if len(ds) == proto.MaxBlockStatusDescriptors {
				break
			}
			ds = append(ds, proto.BlockDescriptor{Length: uint32(f - s), Flags: fl})
		}
		pos = f
		if req.Flags&proto.CmdFlagReqOne != 0 && len(ds) == 1 {
			// Keep merging equal extents into the single descriptor.
			continue
		}
	}
	if req.Flags&proto.CmdFlagReqOne != 0 && len(ds) > 1 {
		ds = ds[:1]
	}
	if len(ds) == 0 {
		// The spec: at least one descriptor; status 0 is always safe.
		ds = append(ds, proto.BlockDescriptor{Length: req.Length, Flags: 0})
	}
	t.descs = ds
	return proto.AppendBlockStatus(h, proto.ReplyFlagDone, req.Cookie, metaContextID, ds)
}
