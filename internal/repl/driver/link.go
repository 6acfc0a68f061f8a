package driver

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/vmsan/vmsan/internal/repl"
)

type pendingPair struct {
	data, ctl net.Conn
	at        time.Time
}

func (r *Replica) acceptLoop() {
	defer r.wg.Done()
	for {
		c, err := r.ln.Accept()
		if err != nil {
			return
		}
		go r.admit(c)
	}
}

// admit takes one accepted connection through the address check and the
// authenticated channel hello (auth.go) and hands it to the loop. Nothing
// is read from a connection whose remote address is not the peer's, and
// nothing reaches the loop (so nothing can replace the current link or
// touch the node's state) before the remote proved the shared secret.
func (r *Replica) admit(c net.Conn) {
	if !r.filter.allowed(c.RemoteAddr()) {
		r.refusedLog.warn(r.log, "addr", "refusing replication connection: not from the configured peer's address (set accept_from if the peer connects from another address)",
			"remote", c.RemoteAddr().String(), "peer", r.set.Peer)
		c.Close()
		return
	}
	select {
	case r.hsSem <- struct{}{}:
		defer func() { <-r.hsSem }()
	default:
		r.refusedLog.warn(r.log, "busy", "refusing replication connection: too many handshakes in progress", "remote", c.RemoteAddr().String())
		c.Close()
		return
	}
	ch, epoch, err := acceptHandshake(c, r.hsParams)
	r.admitted(c, ch, epoch, err)
}

// admitHello is admit for a connection whose hello a shared listener read
// (mux.go): this volume's address check, then the rest of the handshake
// on this volume's secret. REQUIRES: c's handshake deadline is set.
func (r *Replica) admitHello(c net.Conn, hello []byte, name string) {
	if !r.filter.allowed(c.RemoteAddr()) {
		r.refusedLog.warn(r.log, "addr", "refusing replication connection: not from the configured peer's address (set accept_from if the peer connects from another address)",
			"remote", c.RemoteAddr().String(), "peer", r.set.Peer)
		c.Close()
		return
	}
	ch, epoch, err := acceptHello(c, hello, name, r.hsParams)
	c.SetDeadline(time.Time{})
	r.admitted(c, ch, epoch, err)
}

// admitted hands an authenticated connection to the loop, or logs why the
// handshake failed and closes it.
func (r *Replica) admitted(c net.Conn, ch byte, epoch uint64, err error) {
	if err != nil {
		msg, key := "refusing replication connection", "hello"
		var hr *helloRefused
		if errors.As(err, &hr) && hr.auth {
			msg, key = "refusing replication connection: the remote did not authenticate as the peer", "auth"
		}
		r.refusedLog.warn(r.log, key, msg, "remote", c.RemoteAddr().String(), "err", err)
		c.Close()
		return
	}
	select {
	case r.events <- event{kind: evConn, ch: ch, epoch: epoch, conn: c}:
	case <-r.stop:
		c.Close()
	}
}

func (r *Replica) dialLoop() {
	defer r.wg.Done()
	t := time.NewTicker(500 * time.Millisecond)
	defer t.Stop()
	var attempt uint64 = uint64(time.Now().UnixNano())
	for {
		select {
		case <-r.stop:
			return
		case <-t.C:
		}
		if !r.wantDial.Load() {
			continue
		}
		attempt++
		d := net.Dialer{Timeout: 2 * time.Second}
		data, err := d.Dial("tcp", r.set.Peer)
		if err != nil {
			continue
		}
		ctl, err := d.Dial("tcp", r.set.Peer)
		if err != nil {
			data.Close()
			continue
		}
		err = DialHandshake(data, chData, attempt, r.hsParams)
		if err == nil {
			err = DialHandshake(ctl, chControl, attempt, r.hsParams)
		}
		if err != nil {
			// Nothing but the handshake was exchanged: the remote gets
			// no replication frame unless it proved the secret.
			r.refusedLog.warn(r.log, "dial", "replication handshake with the peer failed", "remote", data.RemoteAddr().String(), "err", err)
			data.Close()
			ctl.Close()
			continue
		}
		r.wantDial.Store(false)
		ok := true
		for _, e := range []event{{kind: evConn, ch: chData, epoch: attempt, conn: data}, {kind: evConn, ch: chControl, epoch: attempt, conn: ctl}} {
			select {
			case r.events <- e:
			case <-r.stop:
				ok = false
			}
		}
		if !ok {
			data.Close()
			ctl.Close()
			return
		}
	}
}

// addHalf pairs connections. REQUIRES: loop goroutine. A complete pair replaces any
// current link: the peer would not dial or accept anew if it still
// believed in the old one (e.g. it restarted).
// INVARIANT: every half here passed the peer's address check and proved
// the shared secret (admit, dialLoop), so only the authenticated peer can
// replace the link.
func (r *Replica) addHalf(ev event) {
	for ep, p := range r.pending {
		if time.Since(p.at) > 10*time.Second {
			closeIf(p.data)
			closeIf(p.ctl)
			delete(r.pending, ep)
		}
	}
	p := r.pending[ev.epoch]
	if p == nil {
		p = &pendingPair{at: time.Now()}
		r.pending[ev.epoch] = p
	}
	if ev.ch == chData {
		closeIf(p.data)
		p.data = ev.conn
	} else {
		closeIf(p.ctl)
		p.ctl = ev.conn
	}
	if p.data == nil || p.ctl == nil {
		return
	}
	delete(r.pending, ev.epoch)
	if r.node.Status().Conn == repl.StandAlone {
		// Administratively disconnected or split brain: refuse.
		p.data.Close()
		p.ctl.Close()
		return
	}
	// Settle the node before the new link exists. Its Ready may still hold
	// the disconnect of a link lost earlier in this batch of events
	// (evLinkErr drops the link but leaves the node's output to process):
	// processed after the new link is installed, that disconnect would
	// tear down the new link instead, leaving the node in Handshake with
	// no link, and Connect below would then be a no-op at the next pair
	// (no Hello sent: the peer hears pings but never completes its
	// handshake). And a node not back in Connecting still believes in an
	// earlier connection: end it, so Connect starts a fresh handshake.
	r.processNow()
	if st := r.node.Status().Conn; r.link != nil || st != repl.Connecting {
		r.dropLink()
		r.node.Disconnect("replaced by a new connection")
		r.processNow()
	}
	// INVARIANT: here the node is Connecting, its Ready holds no
	// disconnect, and r.link is nil: Connect sends Hello and bitmap on the
	// new link, and nothing pending can drop it.
	r.epoch++
	r.rxReset()
	l := newLink(r, r.epoch, p.data, p.ctl)
	r.link = l
	r.sendMu.Lock()
	r.curSender = l.dataW
	r.sendMu.Unlock()
	r.remote = p.data.RemoteAddr().String()
	r.log.Info("replication connected", "peer", r.set.Peer, "remote", r.remote)
	r.node.Listen()
	r.node.Connect()
}

func closeIf(c net.Conn) {
	if c != nil {
		c.Close()
	}
}

func (r *Replica) dropLink() {
	if r.link == nil {
		return
	}
	r.link.close()
	r.link = nil
	r.sendMu.Lock()
	r.curSender = nil
	r.sendMu.Unlock()
}

// link is one established pair of connections.
type link struct {
	epoch     uint64
	data, ctl net.Conn
	dataW     *sender
	ctlW      *sender
	once      sync.Once
}

func newLink(r *Replica, epoch uint64, data, ctl net.Conn) *link {
	if tc, ok := data.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
	if tc, ok := ctl.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
	l := &link{epoch: epoch, data: data, ctl: ctl}
	fail := func(err error) {
		select {
		case r.events <- event{kind: evLinkErr, epoch: epoch, err: err}:
		case <-r.stop:
		}
	}
	l.dataW = newSender(data, fail)
	l.ctlW = newSender(ctl, fail)
	go r.readConn(epoch, data, true, fail, nil)
	go r.readConn(epoch, ctl, false, fail, l.ctlW)
	return l
}

func (l *link) send(m repl.Message) {
	if m.Type.Control() {
		l.ctlW.push(m)
	} else {
		l.dataW.push(m)
	}
}

// close tears the link down without blocking the caller: the senders
// first write what is queued (bounded by a timeout), then both connections
// close. Draining matters when the node itself decides to disconnect right
// after the handshake (split brain, refused): its Hello and bitmap must
// still reach the peer, or the peer could never reach the same decision
// and would keep redialing a node that refuses it.
func (l *link) close() {
	l.once.Do(func() {
		l.dataW.drainClose()
		l.ctlW.drainClose()
		go func() {
			t := time.NewTimer(2 * time.Second)
			defer t.Stop()
			for _, s := range []*sender{l.dataW, l.ctlW} {
				select {
				case <-s.done:
				case <-t.C:
				}
			}
			l.data.Close()
			l.ctl.Close()
			l.dataW.close()
			l.ctlW.close()
		}()
	})
}

// readConn decodes frames and hands them to the loop. Every length is
// bounded by DecodeHeader before the payload is allocated.
//
// The control reader answers pings itself (pong != nil): even while the
// loop waits for a metadata fdatasync on a busy disk, the peer keeps
// hearing from us. Our own liveness check is unaffected: the loop's tick
// stops while it is blocked, and it handles queued messages before ticking.
func (r *Replica) readConn(epoch uint64, c net.Conn, isData bool, fail func(error), pong *sender) {
	br := bufio.NewReaderSize(c, 256<<10)
	var h [repl.HeaderSize]byte
	for {
		if _, err := io.ReadFull(br, h[:]); err != nil {
			fail(fmt.Errorf("read: %w", err))
			return
		}
		var m repl.Message
		n, err := repl.DecodeHeader(h[:], &m)
		if err != nil {
			fail(err)
			return
		}
		if m.Type.Control() == isData {
			// Control frames carry no payload; keeping each type on its
			// own connection keeps every payload under the rx budget.
			fail(fmt.Errorf("repl: %v on the wrong connection", m.Type))
			return
		}
		if isData && n > 0 {
			// Bound what is received but not yet processed. Applied data
			// is released when its write completes, the rest when the
			// loop has handled it.
			if !r.rxAcquire(int64(n)) {
				return
			}
		}
		if n > 0 {
			// Ownership passes to the node with Step; stream data comes
			// back to the pool when its apply completes (Apply.Received),
			// anything else is left to the GC.
			if m.Type == repl.MsgData || m.Type == repl.MsgRSData {
				m.Data = getRxBuf(n)
			} else {
				m.Data = make([]byte, n)
			}
			if _, err := io.ReadFull(br, m.Data); err != nil {
				fail(fmt.Errorf("read: %w", err))
				return
			}
		}
		if pong != nil && m.Type == repl.MsgPing {
			pong.push(repl.Message{Type: repl.MsgPingAck})
			continue
		}
		select {
		case r.events <- event{kind: evMsg, epoch: epoch, msg: m}:
		case <-r.stop:
			return
		}
	}
}

// sender is a connection's writer: an unbounded FIFO drained by one
// goroutine through a buffered writer, flushed when the FIFO runs dry.
type sender struct {
	mu       sync.Mutex
	cond     *sync.Cond
	q        []repl.Message
	bytes    int64
	closed   bool
	draining bool          // write what is queued, then stop
	done     chan struct{} // closed when run returns
}

func newSender(c net.Conn, fail func(error)) *sender {
	s := &sender{done: make(chan struct{})}
	s.cond = sync.NewCond(&s.mu)
	go s.run(c, fail)
	return s
}

func (s *sender) push(m repl.Message) {
	s.mu.Lock()
	if s.draining || s.closed {
		s.mu.Unlock()
		return
	}
	s.q = append(s.q, m)
	s.bytes += int64(len(m.Data))
	s.mu.Unlock()
	s.cond.Broadcast()
}

func (s *sender) close() {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.cond.Broadcast()
}

// drainClose stops accepting new work: run writes what is queued, flushes
// and returns (closing done).
func (s *sender) drainClose() {
	s.mu.Lock()
	s.draining = true
	s.mu.Unlock()
	s.cond.Broadcast()
}

// waitBelow blocks while more than limit payload bytes are queued (used to
// push back on clients under protocol A, where nothing else would).
//
// It returns as soon as the link is dropped (draining or closed), not when
// the drain finishes: a frozen peer never drains its queue, and once the
// node has given up on the peer the client's write goes local-only, so it
// must not wait out the drain timeout too.
func (s *sender) waitBelow(limit int64) {
	s.mu.Lock()
	for s.bytes > limit && !s.closed && !s.draining {
		s.cond.Wait()
	}
	s.mu.Unlock()
}

func (s *sender) run(c net.Conn, fail func(error)) {
	defer close(s.done)
	bw := bufio.NewWriterSize(c, 256<<10)
	var hdr []byte
	for {
		s.mu.Lock()
		for len(s.q) == 0 && !s.closed && !s.draining {
			s.mu.Unlock()
			if err := bw.Flush(); err != nil {
				fail(err)
				s.close()
				return
			}
			s.mu.Lock()
			if len(s.q) == 0 && !s.closed && !s.draining {
				s.cond.Wait()
			}
		}
		if s.closed || (s.draining && len(s.q) == 0) {
			s.mu.Unlock()
			if !s.closed {
				bw.Flush()
			}
			return
		}
		batch := s.q
		s.q = nil
		s.mu.Unlock()
		for _, m := range batch {
			hdr = repl.AppendHeader(hdr[:0], &m)
			if _, err := bw.Write(hdr); err != nil {
				fail(err)
				s.close()
				return
			}
			if _, err := bw.Write(m.Data); err != nil {
				fail(err)
				s.close()
				return
			}
			s.mu.Lock()
			s.bytes -= int64(len(m.Data))
			s.mu.Unlock()
			s.cond.Broadcast()
		}
	}
}
