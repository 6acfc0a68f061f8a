package target

import (
	"bufio"
	"hash/crc32"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vmsan/vmsan/internal/iscsi/pdu"
	"github.com/vmsan/vmsan/internal/scsi"
)

// out is one queued item for the writer: a PDU (h, data) or a command's
// result to send as Data-In/SCSI Response PDUs.
type out struct {
	h      pdu.PDU
	data   []byte
	status bool // the PDU carries a status: StatSN advances after it

	// For a SCSI result: the task and its result (the writer cuts
	// DataIn into PDUs and calls Release).
	task *task
	res  *scsi.Result

	closeAfter bool // close the connection once this is written
	ping       bool // a target NOP-In: the writer stamps pingSent
	then       func()
	// finished, when set, has its finish(task) called after then: a
	// completed command's end, without a closure per command.
	finished *session
}

// conn is one TCP connection: its login, then its session's full feature
// phase (MaxConnections is 1, so a session has exactly one conn).
type conn struct {
	s    *Server
	nc   net.Conn
	tpgt uint16
	rel  uint16 // relative target port identifier
	rd   pdu.Reader
	br   *bufio.Reader // rd's buffer: Buffered() feeds scsi.Task.More
	bw   *sendBuf
	// held are written items whose data bw still references: their
	// buffers are released, and their then run, after the next flush.
	held []*out

	// Writer queue. INVARIANT: items are written in queue order; only
	// the writer goroutine touches bw, statSN and dig after login.
	qmu      sync.Mutex
	qcond    sync.Cond // writer waits for items
	space    sync.Cond // reader waits for room (reader-originated items only)
	q        []*out
	qclosed  bool
	statSN   uint32
	dig      pdu.Digests
	peerMax  int    // initiator's MaxRecvDataSegmentLength: Data-In/Text/NOP-In segment bound
	burstMax int    // negotiated MaxBurstLength: Data-In sequence bound
	spare    []*out // the writer's previous batch, reused as the next queue
	// The writer's scratch headers for results (no allocation per PDU).
	di  pdu.DataIn
	rsp pdu.SCSIResponse
	hdr [pdu.BHSLen + pdu.DigestLen]byte // writePDU's (Encode's interface call would move a local to the heap)

	lastRecv atomic.Int64 // unix nanos of the last PDU read, or of the reader's return to the socket
	// busy: the reader is handling a PDU (maybe waiting for room in the
	// queue), not reading: silence then says nothing about the peer.
	busy atomic.Bool
	// writeSince: unix nanos when the socket write now in progress began
	// (0: none); pingSent: when the writer queued the last target ping
	// into bw (it leaves with the next flush).
	writeSince atomic.Int64
	pingSent   atomic.Int64
	draining   atomic.Bool // Shutdown: stop taking commands, close when idle
	aborted    atomic.Bool
	sess       *session
	wdone      chan struct{}
}

// queueLimit bounds reader-originated items waiting for the writer
// (responses to NOP-Out, Text, Reject...): a peer that sends but never
// reads stalls its own reader, not the server's memory.
const queueLimit = 256

func newConn(s *Server, nc net.Conn, tpgt, rel uint16) *conn {
	c := &conn{s: s, nc: nc, tpgt: tpgt, rel: rel, bw: newSendBuf(nc), wdone: make(chan struct{})}
	c.br = bufio.NewReaderSize(nc, 64<<10)
	c.rd = pdu.Reader{R: c.br, MaxData: pdu.DefaultMaxRecvDataSegmentLength}
	c.qcond.L = &c.qmu
	c.space.L = &c.qmu
	c.peerMax = pdu.DefaultMaxRecvDataSegmentLength
	c.burstMax = 262144
	return c
}

func (c *conn) log() any { return c.nc.RemoteAddr().String() }

// serve runs the connection to its end.
func (c *conn) serve() {
	defer c.nc.Close()
	c.lastRecv.Store(time.Now().UnixNano())
	c.nc.SetDeadline(time.Now().Add(c.s.cfg.LoginTimeout))
	ss := c.login()
	c.s.pending.Add(-1) // logged in or refused: no longer pending
	if ss == nil {
		return
	}
	c.nc.SetDeadline(time.Time{})
	go c.writer()
	stopPing := make(chan struct{})
	if c.s.cfg.NopInterval > 0 {
		go c.pinger(stopPing)
	}
	ss.run()
	close(stopPing)
	// The session ends: abort what is left, wait for in-flight tasks, then
	// stop the writer (what is queued is still written, best effort).
	ss.end()
	c.closeQueue()
	select {
	case <-c.wdone:
	case <-time.After(10 * time.Second):
		c.nc.Close()
		<-c.wdone
	}
}

// abort closes the connection at once (reinstatement, Close).
func (c *conn) abort() {
	c.aborted.Store(true)
	c.nc.Close()
}

// drain asks the connection to finish: a logged-in session stops reading
// new commands once its in-flight ones are answered.
func (c *conn) drain() {
	if !c.draining.CompareAndSwap(false, true) {
		return
	}
	ss := c.sessNow()
	if ss == nil {
		c.nc.Close() // still logging in: nothing to finish
		return
	}
	go func() {
		ss.waitIdle(30 * time.Second)
		c.post(&out{closeAfter: true})
	}()
}

// sessNow returns the connection's session once login has completed.
func (c *conn) sessNow() *session {
	c.qmu.Lock()
	defer c.qmu.Unlock()
	return c.sess
}

// send queues a reader-originated PDU, waiting for room.
func (c *conn) send(o *out) {
	c.qmu.Lock()
	for len(c.q) >= queueLimit && !c.qclosed {
		c.space.Wait()
	}
	c.push(o)
	c.qmu.Unlock()
}

// post queues a completion-originated item without waiting (completions
// run on engine goroutines that must never block on the socket; they are
// bounded by the CmdSN window).
func (c *conn) post(o *out) {
	c.qmu.Lock()
	c.push(o)
	c.qmu.Unlock()
}

// push appends o. REQUIRES: qmu held.
func (c *conn) push(o *out) {
	if c.qclosed {
		finishItem(o) // never written: release it as if it had been
		return
	}
	c.q = append(c.q, o)
	c.qcond.Signal()
}

func (c *conn) closeQueue() {
	c.qmu.Lock()
	c.qclosed = true
	c.qcond.Broadcast()
	c.space.Broadcast()
	c.qmu.Unlock()
}

// writer writes queued items until the queue is closed and empty or a
// write fails (then it discards the rest, releasing buffers).
func (c *conn) writer() {
	defer close(c.wdone)
	var failed bool
	for {
		c.qmu.Lock()
		for len(c.q) == 0 && !c.qclosed {
			if !failed && c.bw.Buffered() > 0 {
				c.qmu.Unlock()
				if err := c.flush(); err != nil {
					failed = true
					c.nc.Close()
				}
				c.qmu.Lock()
				continue
			}
			c.qcond.Wait()
		}
		if len(c.q) == 0 {
			c.qmu.Unlock()
			if !failed {
				c.flush()
			}
			c.finishHeld()
			return
		}
		batch := c.q
		c.q = c.spare[:0]
		c.space.Broadcast()
		c.qmu.Unlock()
		for _, o := range batch {
			if !failed {
				err := c.write(o)
				if err != nil {
					failed = true
					c.nc.Close()
				} else if o.ping {
					c.pingSent.Store(nowNano())
				}
			}
			if c.bw.Refs() > 0 && !failed {
				// Its data (or an earlier item's) is still referenced:
				// done after the flush, in queue order.
				c.held = append(c.held, o)
			} else {
				c.finishHeld()
				finishItem(o)
			}
			if o.closeAfter && !failed {
				c.flush()
				failed = true // nothing more goes out
				c.nc.Close()
			}
		}
		if failed {
			c.finishHeld()
		}
		clear(batch)
		c.spare = batch
	}
}

// flush writes what bw gathered, then finishes the items it referenced.
// Only the writer goroutine (or login, before it starts) calls it.
func (c *conn) flush() error {
	// Stamped for the pinger: a flush (at most about flushAt bytes) that
	// blocks means the peer stopped taking data.
	c.writeSince.Store(nowNano())
	err := c.bw.Flush()
	c.writeSince.Store(0)
	c.finishHeld()
	return err
}

// finishHeld finishes the held items (after a flush, or when nothing more
// will be written).
func (c *conn) finishHeld() {
	for k, o := range c.held {
		finishItem(o)
		c.held[k] = nil
	}
	c.held = c.held[:0]
}

// finishItem releases a written item's result buffer and runs its then.
func finishItem(o *out) {
	if o.res != nil {
		o.res.Release()
	}
	if o.then != nil {
		o.then()
	}
	if o.finished != nil {
		o.finished.finish(o.task)
	}
}

func statusSNs(h pdu.PDU) *pdu.StatusSNs {
	switch p := h.(type) {
	case *pdu.NOPIn:
		return &p.StatusSNs
	case *pdu.SCSIResponse:
		return &p.StatusSNs
	case *pdu.TaskMgmtResponse:
		return &p.StatusSNs
	case *pdu.TextResponse:
		return &p.StatusSNs
	case *pdu.DataIn:
		return &p.StatusSNs
	case *pdu.LogoutResponse:
		return &p.StatusSNs
	case *pdu.R2T:
		return &p.StatusSNs
	case *pdu.AsyncMessage:
		return &p.StatusSNs
	case *pdu.Reject:
		return &p.StatusSNs
	case *pdu.LoginResponse:
		return &p.StatusSNs
	}
	return nil
}

// write sends one item. Only the writer goroutine calls it.
func (c *conn) write(o *out) error {
	if o.res != nil {
		return c.writeResult(o.task, o.res)
	}
	if o.h == nil {
		return nil // a marker (closeAfter)
	}
	return c.writePDU(o.h, o.data, o.status)
}

// writePDU stamps the sequence numbers and writes one PDU.
func (c *conn) writePDU(h pdu.PDU, data []byte, status bool) error {
	if sns := statusSNs(h); sns != nil {
		sns.StatSN = c.statSN
		if ss := c.sess; ss != nil {
			sns.ExpCmdSN, sns.MaxCmdSN = ss.window()
		}
	}
	if status {
		c.statSN++
	}
	l := h.Framing()
	l.TotalAHSLength = 0
	l.DataSegmentLength = uint32(len(data))
	hdr := &c.hdr
	if err := h.Encode(hdr[:pdu.BHSLen]); err != nil {
		return err
	}
	n := pdu.BHSLen
	if c.dig.Header {
		putDigest(hdr[n:], pdu.CRC32C(hdr[:n]))
		n += pdu.DigestLen
	}
	if _, err := c.bw.Write(hdr[:n]); err != nil {
		return err
	}
	if len(data) == 0 {
		return nil
	}
	if len(data) >= refMin {
		c.bw.Ref(data) // not copied: see sendBuf, writer's held
	} else if _, err := c.bw.Write(data); err != nil {
		return err
	}
	var pad [3]byte
	p := pdu.Pad(len(data))
	if _, err := c.bw.Write(pad[:p]); err != nil {
		return err
	}
	if c.dig.Data {
		var d [pdu.DigestLen]byte
		crc := crc32.Update(0, castagnoli, data)
		crc = crc32.Update(crc, castagnoli, pad[:p])
		putDigest(d[:], crc)
		if _, err := c.bw.Write(d[:]); err != nil {
			return err
		}
	}
	if c.bw.Buffered() >= flushAt {
		return c.flush()
	}
	return nil
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func putDigest(b []byte, v uint32) {
	b[0], b[1], b[2], b[3] = byte(v), byte(v>>8), byte(v>>16), byte(v>>24)
}

// writeResult sends a command's data-in (cut to the initiator's
// MaxRecvDataSegmentLength, F at every MaxBurstLength sequence end) and
// its status: on the last Data-In (S bit) when the status is GOOD or
// CONDITION MET without sense, else in a SCSI Response.
func (c *conn) writeResult(t *task, r *scsi.Result) error {
	data := r.DataIn
	if uint64(len(data)) > uint64(t.expIn) {
		data = data[:t.expIn]
	}
	piggy := len(data) > 0 && len(r.Sense) == 0 && (r.Status == 0x00 || r.Status == 0x04)
	var dataSN uint32
	for off := 0; off < len(data); {
		n := min(len(data)-off, c.peerMax)
		// Sequences end at MaxBurstLength boundaries (RFC 7143 13.13).
		if rem := c.burstMax - off%c.burstMax; n > rem {
			n = rem
		}
		last := off+n == len(data)
		di := &c.di
		*di = pdu.DataIn{LUN: t.rawLUN, ITT: t.itt, TTT: pdu.ReservedTag, DataSN: dataSN,
			BufferOffset: uint32(off), Final: last || (off+n)%c.burstMax == 0}
		if last && piggy {
			di.HasStatus, di.Final, di.Status = true, true, pdu.SCSIStatus(r.Status)
			di.Overflow, di.Underflow, di.ResidualCount = r.Overflow, r.Underflow, r.Residual
		}
		if err := c.writePDU(di, data[off:off+n], last && piggy); err != nil {
			return err
		}
		dataSN++
		off += n
	}
	c.s.bytesRead.Add(uint64(len(data)))
	if piggy {
		return nil
	}
	rsp := &c.rsp
	*rsp = pdu.SCSIResponse{ITT: t.itt, Status: pdu.SCSIStatus(r.Status), ExpDataSN: dataSN,
		Overflow: r.Overflow, Underflow: r.Underflow, ResidualCount: r.Residual}
	if !r.Overflow && !r.Underflow {
		rsp.ResidualCount = 0
	}
	var sense []byte
	if len(r.Sense) > 0 {
		sense = pdu.SenseData(r.Sense)
	}
	return c.writePDU(rsp, sense, true)
}

// pinger declares a silent connection dead: it sends a NOP-In when
// nothing has arrived for NopInterval and closes the connection when
// nothing arrives within NopTimeout of the ping leaving. A dead initiator
// (cable pulled, host frozen) then does not hold its session, its
// reservations and its in-flight budget; above all, a path that went
// silent is closed before the initiator can have failed its I/O over to
// another path, so commands it sent before the loss and the network
// still holds (retransmitted, or in a stalled switch) meet a closed
// socket when the path returns instead of executing over newer writes
// made on the other path. That needs NopInterval + NopTimeout (+ a
// tick) below the initiator's detection plus recovery timeout (docs/
// iscsi.md, "What happens on each failure").
//
// Silence counts only while the reader is waiting on the socket: a
// reader held up by its own backpressure has not heard from the peer
// because it is not listening. A socket write (one flush, at most about
// flushAt bytes) blocked for NopInterval + NopTimeout means the peer
// takes no data: dead too. That covers a ping stuck behind it and a
// reader stuck behind the writer.
func (c *conn) pinger(stop chan struct{}) {
	iv, to := c.s.cfg.NopInterval, c.s.cfg.NopTimeout
	tick := time.NewTicker(pingTick(iv, to))
	defer tick.Stop()
	stall := (iv + to).Nanoseconds()
	var pingedAt time.Time // when the ping was queued; zero: none out
	var ttt uint32 = 0x40000000
	dead := func(why string) {
		c.s.nopTimeouts.Add(1)
		c.s.cfg.Logger.Warn("iscsi: initiator silent; closing the connection", "remote", c.log(), "why", why)
		c.abort()
	}
	for {
		select {
		case <-stop:
			return
		case now := <-tick.C:
			if ws := c.writeSince.Load(); ws != 0 && now.UnixNano()-ws > stall {
				dead("a socket write made no progress")
				return
			}
			if c.busy.Load() {
				continue
			}
			last := time.Unix(0, c.lastRecv.Load())
			if !pingedAt.IsZero() {
				if last.After(pingedAt) {
					pingedAt = time.Time{}
					continue
				}
				if ps := c.pingSent.Load(); ps != 0 && now.UnixNano()-ps > to.Nanoseconds() {
					dead("no answer to NOP-In")
					return
				}
				continue
			}
			if now.Sub(last) >= iv {
				ttt++
				if ttt == pdu.ReservedTag {
					ttt = 0x40000000
				}
				pingedAt = now
				c.pingSent.Store(0)
				// ITT reserved: a target ping; StatSN is not advanced.
				c.post(&out{h: &pdu.NOPIn{ITT: pdu.ReservedTag, TTT: ttt, LUN: 0}, ping: true})
			}
		}
	}
}

// pingTick is the pinger's period: a tenth of the shorter timer, so a
// silent connection closes at most that much after NopInterval +
// NopTimeout.
func pingTick(iv, to time.Duration) time.Duration {
	return max(min(iv, to)/10, 10*time.Millisecond)
}
