package client

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vmsan/vmsan/internal/nbd/proto"
)

// Request is one NBD command for Submit. Fill Cmd, Flags, Offset, Length
// and Data (WRITE payload, or READ destination of len Length); set Done.
//
// The caller owns the Request until Done is called and must not touch it
// (or Data) in between. Done is called exactly once, from a connection
// goroutine or from Submit itself on early failure; it must not block.
type Request struct {
	Cmd    proto.Cmd
	Flags  proto.CmdFlag
	Offset int64
	Length uint32
	Data   []byte
	// Extents receives the base:allocation extents of a BLOCK_STATUS
	// command (appended, so a reused slice avoids allocation).
	Extents []Extent
	// Err is nil on success, a proto.Errno for an error the server
	// reported, or a connection error.
	Err  error
	Done func(*Request)
	User any // for the caller

	cookie  uint64
	covered uint64 // READ bytes delivered by structured chunks
	conn    *conn
}

// Extent is one run of a block-status answer.
type Extent struct {
	Offset int64
	Length int64
	Hole   bool // NBD_STATE_HOLE: not allocated
	Zero   bool // NBD_STATE_ZERO: reads as zeroes
}

// appendExtents appends the extents of one BLOCK_STATUS chunk for a request
// of [off, off+length), clipped to that range: the spec lets the last
// extent run past the request, and some servers send longer ones still;
// callers get only what they asked about. Descriptors after the end of the
// request are dropped.
func appendExtents(dst []Extent, off, length int64, ds []proto.BlockDescriptor) []Extent {
	end := off + length
	for _, d := range ds {
		if off >= end {
			break
		}
		n := min(int64(d.Length), end-off)
		dst = append(dst, Extent{Offset: off, Length: n, Hole: d.Flags&proto.StateHole != 0, Zero: d.Flags&proto.StateZero != 0})
		off += n
	}
	return dst
}

// ErrClosed is returned for requests on a closed or failed connection.
var ErrClosed = errors.New("nbd: connection closed")

// ErrProtocol wraps server behaviour that breaks the protocol (unknown
// cookie, chunk outside the request, bad magic); the connection is dropped.
var ErrProtocol = errors.New("nbd: protocol violation by server")

// maxStatusPayload bounds a BLOCK_STATUS chunk we are willing to read: the
// spec's 2^20 descriptors plus the context id.
const maxStatusPayload = 4 + 8*proto.MaxBlockStatusDescriptors

// conn is one transmission-phase connection. Many goroutines submit on it;
// one reader goroutine matches replies to requests by cookie, in whatever
// order the server sends them.
type conn struct {
	nc   net.Conn
	ex   *Export
	sem  chan struct{} // bounds requests in flight
	wmu  sync.Mutex    // serialises request writes
	wbuf []byte

	mu      sync.Mutex
	pending map[uint64]*Request
	next    uint64
	err     error // set once the connection has failed or closed

	scratch []byte  // reader goroutine only: small chunk payloads
	ob      [8]byte // reader goroutine only: OFFSET_DATA offset

	inflight atomic.Int32
	done     chan struct{} // closed when the reader exits
}

func newConn(nc net.Conn, ex *Export, depth int) *conn {
	c := &conn{
		nc:      nc,
		ex:      ex,
		sem:     make(chan struct{}, depth),
		pending: make(map[uint64]*Request, depth),
		wbuf:    make([]byte, 0, 64<<10+proto.RequestSize),
		done:    make(chan struct{}),
	}
	go c.readLoop()
	return c
}

// submit sends r. INVARIANT: r is in pending before its header can reach
// the server, so the reader always finds the cookie of a reply.
func (c *conn) submit(r *Request) {
	r.conn = c
	r.covered = 0
	select {
	case c.sem <- struct{}{}:
	case <-c.done:
		// The reader is gone (connection failed or closed): no slot will
		// ever free up.
		c.mu.Lock()
		r.Err = c.err
		c.mu.Unlock()
		if r.Err == nil {
			r.Err = ErrClosed
		}
		r.Done(r)
		return
	}
	c.mu.Lock()
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		<-c.sem
		r.Err = err
		r.Done(r)
		return
	}
	c.next++
	r.cookie = c.next
	c.pending[r.cookie] = r
	c.inflight.Add(1)
	c.mu.Unlock()

	hdr := proto.Request{Flags: r.Flags, Type: r.Cmd, Cookie: r.cookie, Offset: uint64(r.Offset), Length: r.Length}
	c.wmu.Lock()
	c.wbuf = proto.AppendRequest(c.wbuf[:0], hdr)
	var err error
	if r.Cmd == proto.CmdWrite && len(r.Data) > 0 {
		if len(r.Data) <= cap(c.wbuf)-len(c.wbuf) {
			// Small payloads go out with their header in one write.
			c.wbuf = append(c.wbuf, r.Data...)
			_, err = c.nc.Write(c.wbuf)
		} else {
			if _, err = c.nc.Write(c.wbuf); err == nil {
				_, err = c.nc.Write(r.Data)
			}
		}
	} else {
		_, err = c.nc.Write(c.wbuf)
	}
	c.wmu.Unlock()
	if err != nil {
		c.fail(fmt.Errorf("nbd: sending %v: %w", r.Cmd, err))
	}
}

// take removes the request with cookie from pending.
func (c *conn) take(cookie uint64) *Request {
	c.mu.Lock()
	r := c.pending[cookie]
	delete(c.pending, cookie)
	c.mu.Unlock()
	return r
}

func (c *conn) lookup(cookie uint64) *Request {
	c.mu.Lock()
	r := c.pending[cookie]
	c.mu.Unlock()
	return r
}

func (c *conn) complete(r *Request) {
	c.inflight.Add(-1)
	<-c.sem
	r.Done(r)
}

// fail closes the connection and completes every pending request with err.
func (c *conn) fail(err error) {
	c.mu.Lock()
	if c.err == nil {
		c.err = err
	}
	err = c.err
	ps := c.pending
	c.pending = map[uint64]*Request{}
	c.mu.Unlock()
	c.nc.Close()
	for _, r := range ps {
		if r.Err == nil {
			r.Err = err
		}
		c.complete(r)
	}
}

func (c *conn) readLoop() {
	defer close(c.done)
	br := bufio.NewReaderSize(c.nc, 256<<10)
	var hdr [proto.ChunkHeaderSize]byte
	for {
		if _, err := io.ReadFull(br, hdr[:4]); err != nil {
			c.fail(readErr(err))
			return
		}
		magic, _ := proto.ReplyMagic(hdr[:4])
		var err error
		switch magic {
		case proto.SimpleReplyMagic:
			err = c.simpleReply(br, hdr[:proto.SimpleReplySize])
		case proto.StructuredReplyMagic:
			err = c.chunk(br, hdr[:proto.ChunkHeaderSize])
		default:
			err = fmt.Errorf("%w: reply magic %#x", ErrProtocol, magic)
		}
		if err != nil {
			c.fail(err)
			return
		}
	}
}

func readErr(err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) {
		return ErrClosed
	}
	return fmt.Errorf("nbd: reading reply: %w", err)
}

func (c *conn) simpleReply(br *bufio.Reader, h []byte) error {
	if _, err := io.ReadFull(br, h[4:]); err != nil {
		return readErr(err)
	}
	sr, err := proto.ParseSimpleReply(h)
	if err != nil {
		return err
	}
	r := c.take(sr.Cookie)
	if r == nil {
		return fmt.Errorf("%w: simple reply for unknown cookie %d", ErrProtocol, sr.Cookie)
	}
	if sr.Error != 0 {
		r.Err = sr.Error
	} else if r.Cmd == proto.CmdRead {
		if c.ex.StructuredReplies {
			// A simple reply to READ with no error after structured
			// replies were negotiated is not allowed: data framing unknown.
			r.Err = fmt.Errorf("%w: simple reply with data to READ", ErrProtocol)
			c.complete(r)
			return r.Err
		}
		if _, err := io.ReadFull(br, r.Data[:r.Length]); err != nil {
			r.Err = readErr(err)
			c.complete(r)
			return r.Err
		}
	}
	c.complete(r)
	return nil
}

// chunk handles one structured reply chunk. scratch is a reusable buffer
// for small payloads (block status, errors).
func (c *conn) chunk(br *bufio.Reader, h []byte) error {
	if _, err := io.ReadFull(br, h[4:]); err != nil {
		return readErr(err)
	}
	ch, err := proto.ParseChunkHeader(h)
	if err != nil {
		return err
	}
	r := c.lookup(ch.Cookie)
	if r == nil {
		return fmt.Errorf("%w: chunk %v for unknown cookie %d", ErrProtocol, ch.Type, ch.Cookie)
	}
	switch ch.Type {
	case proto.ReplyTypeNone:
		if ch.Length != 0 {
			return fmt.Errorf("%w: NONE chunk with payload", ErrProtocol)
		}
	case proto.ReplyTypeOffsetData:
		if r.Cmd != proto.CmdRead || ch.Length < 9 {
			return fmt.Errorf("%w: OFFSET_DATA for %v, length %d", ErrProtocol, r.Cmd, ch.Length)
		}
		ob := c.ob[:] // a conn field: a local array would escape to the heap
		if _, err := io.ReadFull(br, ob); err != nil {
			return readErr(err)
		}
		off := be64(ob)
		n := uint64(ch.Length - 8)
		start := off - uint64(r.Offset)
		if off < uint64(r.Offset) || start+n > uint64(r.Length) {
			return fmt.Errorf("%w: OFFSET_DATA [%d,+%d) outside request [%d,+%d)", ErrProtocol, off, n, r.Offset, r.Length)
		}
		if _, err := io.ReadFull(br, r.Data[start:start+n]); err != nil {
			return readErr(err)
		}
		r.covered += n
	case proto.ReplyTypeOffsetHole:
		p, err := c.readPayload(br, ch, 12)
		if err != nil {
			return err
		}
		off, size, err := proto.ParseOffsetHole(p)
		if err != nil || r.Cmd != proto.CmdRead {
			return fmt.Errorf("%w: bad OFFSET_HOLE", ErrProtocol)
		}
		start := off - uint64(r.Offset)
		if off < uint64(r.Offset) || start+uint64(size) > uint64(r.Length) {
			return fmt.Errorf("%w: OFFSET_HOLE outside request", ErrProtocol)
		}
		clear(r.Data[start : start+uint64(size)])
		r.covered += uint64(size)
	case proto.ReplyTypeBlockStatus:
		p, err := c.readPayload(br, ch, maxStatusPayload)
		if err != nil {
			return err
		}
		id, ds, err := proto.ParseBlockStatus(p, nil)
		if err != nil || r.Cmd != proto.CmdBlockStatus {
			return fmt.Errorf("%w: bad BLOCK_STATUS chunk", ErrProtocol)
		}
		if c.ex.HasAlloc && id == c.ex.AllocContext {
			r.Extents = appendExtents(r.Extents, r.Offset, int64(r.Length), ds)
		}
	default:
		if ch.Type.IsError() {
			p, err := c.readPayload(br, ch, 6+proto.MaxNameLength+8)
			if err != nil {
				return err
			}
			ce, err := proto.ParseErrorChunk(ch.Type, p)
			if err != nil {
				return fmt.Errorf("%w: %v", ErrProtocol, err)
			}
			if r.Err == nil {
				r.Err = &ServerError{Errno: ce.Errno, Message: ce.Message}
			}
		} else {
			// Unknown non-error chunk types must be ignored (bounded).
			if _, err := c.readPayload(br, ch, 1<<20); err != nil {
				return err
			}
		}
	}
	if ch.Flags&proto.ReplyFlagDone != 0 {
		c.take(ch.Cookie)
		if r.Cmd == proto.CmdRead && r.Err == nil && r.covered != uint64(r.Length) {
			r.Err = fmt.Errorf("%w: READ reply covered %d of %d bytes", ErrProtocol, r.covered, r.Length)
		}
		c.complete(r)
	}
	return nil
}

// readPayload reads a chunk payload of at most max bytes into the reader's
// scratch buffer. Only the reader goroutine calls it.
func (c *conn) readPayload(br *bufio.Reader, ch proto.ChunkHeader, max uint32) ([]byte, error) {
	if ch.Length > max {
		return nil, fmt.Errorf("%w: %v chunk of %d bytes (max %d)", ErrProtocol, ch.Type, ch.Length, max)
	}
	if cap(c.scratch) < int(ch.Length) {
		c.scratch = make([]byte, ch.Length)
	}
	p := c.scratch[:ch.Length]
	if _, err := io.ReadFull(br, p); err != nil {
		return nil, readErr(err)
	}
	return p, nil
}

func be64(b []byte) uint64 {
	return uint64(b[0])<<56 | uint64(b[1])<<48 | uint64(b[2])<<40 | uint64(b[3])<<32 |
		uint64(b[4])<<24 | uint64(b[5])<<16 | uint64(b[6])<<8 | uint64(b[7])
}

// ServerError is an error chunk from the server: an errno with an optional
// message. errors.Is(err, proto.EINVAL) matches its Errno.
type ServerError struct {
	Errno   proto.Errno
	Message string
}

func (e *ServerError) Error() string {
	if e.Message == "" {
		return e.Errno.Error()
	}
	return e.Errno.Error() + ": " + e.Message
}

// Unwrap lets errors.Is match the errno.
func (e *ServerError) Unwrap() error { return e.Errno }

// closeTimeout bounds how long Close waits for replies in flight.
var closeTimeout = 30 * time.Second

// close sends NBD_CMD_DISC once in-flight requests are answered, then
// closes the socket.
func (c *conn) close() error {
	// Take every slot: no request is in flight after this. A server that
	// never answers gets closeTimeout, then its requests fail with
	// ErrClosed when the socket closes.
	tm := time.NewTimer(closeTimeout)
	defer tm.Stop()
wait:
	for i := 0; i < cap(c.sem); i++ {
		select {
		case c.sem <- struct{}{}:
		case <-c.done:
			break wait
		case <-tm.C:
			break wait
		}
	}
	c.mu.Lock()
	alive := c.err == nil
	if alive {
		c.err = ErrClosed
	}
	c.mu.Unlock()
	if alive {
		c.wmu.Lock()
		c.wbuf = proto.AppendRequest(c.wbuf[:0], proto.Request{Type: proto.CmdDisc})
		_, _ = c.nc.Write(c.wbuf)
		c.wmu.Unlock()
	}
	err := c.nc.Close()
	<-c.done
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}
