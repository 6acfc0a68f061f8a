// Package faultproxy is a fault-injecting TCP proxy for tests: put it
// between two nodes and add delay, limit bandwidth, stall the link
// (blackhole), refuse and drop connections, or reset them mid-stream.
//
// Simplest use:
//
//	p, err := faultproxy.New("127.0.0.1:0", targetAddr)
//	defer p.Close()
//	dial(p.Addr())          // instead of targetAddr
//	p.SetDelay(5*time.Millisecond)
//	p.Reset()               // RST every connection now
//
// Faults apply to both directions and to connections already open.
// Concurrency: all methods are safe for concurrent use.
package faultproxy

import (
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Proxy forwards every accepted connection to a target.
type Proxy struct {
	addr   string // the listening address; stays the same across re-listens
	target string

	delay      atomic.Int64 // ns per chunk, one way
	bandwidth  atomic.Int64 // bytes/s per direction per connection; 0 = unlimited
	blackhole  atomic.Bool  // stall: forward nothing, keep connections open
	drop       atomic.Bool  // refuse new connections (accept and close)
	followDown atomic.Bool  // stop listening while the target is down
	refuse     atomic.Bool  // not listening: new connections are refused

	mu     sync.Mutex
	ln     net.Listener // replaced when the proxy listens again
	down   net.Listener // the listener closed (target down, or Refuse)
	conns  map[*pair]struct{}
	wake   chan struct{} // closed and replaced when blackhole lifts
	closed bool
	wg     sync.WaitGroup

	// Bytes counts payload forwarded in both directions.
	Bytes atomic.Int64
	// Accepted counts connections accepted; DialErrors those closed at
	// once because the target could not be dialed.
	Accepted, DialErrors atomic.Int64

	logf atomic.Pointer[func(format string, args ...any)]
}

// SetLog makes the proxy report connection events (accepted, dial
// failures, closes with byte counts) through f; nil turns it off.
func (p *Proxy) SetLog(f func(format string, args ...any)) {
	if f == nil {
		p.logf.Store(nil)
		return
	}
	p.logf.Store(&f)
}

func (p *Proxy) log(format string, args ...any) {
	if f := p.logf.Load(); f != nil {
		(*f)(format, args...)
	}
}

type pair struct {
	a, b  net.Conn
	reset atomic.Bool // Reset closed it: a blackhole no longer holds its close
}

// New listens on listen and forwards to target.
func New(listen, target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, addr: ln.Addr().String(), target: target, conns: map[*pair]struct{}{}, wake: make(chan struct{})}
	p.wg.Add(1)
	go p.accept(ln)
	return p, nil
}

// Addr is the proxy's listening address.
func (p *Proxy) Addr() string { return p.addr }

// FollowTarget (on) makes the proxy stop listening while its target
// cannot be dialed (noticed when a dial for a new connection fails or an
// upstream connection ends), and listen again on the same address once
// the target accepts connections: a client then gets connection refused,
// as it would from the target's own host with the process dead, instead
// of a connection that is accepted and reset at once. The latter happens
// on no real network path to a dead node, and open-iscsi's reconnect can
// wedge on it: a reset between binding the new connection to the session
// and the login leaves the kernel connection in cleanup, and every later
// bind fails with ENOTCONN.
func (p *Proxy) FollowTarget(on bool) { p.followDown.Store(on) }

// SetDelay adds d of one-way latency to every chunk forwarded.
func (p *Proxy) SetDelay(d time.Duration) { p.delay.Store(int64(d)) }

// SetBandwidth limits each direction of each connection to bps bytes per
// second (0: unlimited).
func (p *Proxy) SetBandwidth(bps int64) { p.bandwidth.Store(bps) }

// Blackhole stalls (on) or resumes (off) all forwarding. Like a network
// that silently loses every packet while TCP keeps retransmitting: the
// connections stay open, nothing arrives, and everything sent is delivered
// once the blackhole lifts (unless the endpoints gave up). A close is
// held too: an endpoint that gives up during a blackhole is seen to close
// by the other only when it lifts, as a FIN lost in the network would be
// retransmitted then (what was sent before the close is then delivered
// to an endpoint that may have closed in the meantime).
func (p *Proxy) Blackhole(on bool) {
	p.blackhole.Store(on)
	if !on {
		p.mu.Lock()
		close(p.wake)
		p.wake = make(chan struct{})
		p.mu.Unlock()
	}
}

// Drop makes the proxy close new connections at once (on) and, when
// turned on, also closes every open connection.
func (p *Proxy) Drop(on bool) {
	p.drop.Store(on)
	if on {
		p.Reset()
	}
}

// Refuse (on) stops listening, so that new connections are refused, as
// by a host whose port is gone, and resets every open connection; off
// listens again on the same address. Unlike Drop, a client never holds a
// connection that was accepted and then reset: no real path to a dead
// port gives it one, and open-iscsi's reconnect can wedge on it (see
// FollowTarget). Refuse(false) returns once the proxy listens again (or
// after 2 s, e.g. while FollowTarget waits for a target that is down).
func (p *Proxy) Refuse(on bool) {
	p.refuse.Store(on)
	if !on {
		// The accept loop, polling in relisten, listens again.
		for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			p.mu.Lock()
			up := p.down == nil || p.closed
			p.mu.Unlock()
			if up {
				return
			}
		}
		return
	}
	p.mu.Lock()
	if !p.closed && p.down == nil {
		p.down = p.ln
		p.ln.Close()
	}
	p.mu.Unlock()
	p.log("faultproxy %s: refusing connections", p.addr)
	p.Reset()
}

// Reset closes every open connection with a TCP RST (linger 0).
func (p *Proxy) Reset() {
	p.mu.Lock()
	cs := make([]*pair, 0, len(p.conns))
	for c := range p.conns {
		cs = append(cs, c)
	}
	p.mu.Unlock()
	for _, c := range cs {
		c.reset.Store(true)
		rst(c.a)
		rst(c.b)
	}
}

// Conns is the number of open proxied connections.
func (p *Proxy) Conns() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.conns)
}

func rst(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetLinger(0)
	}
	c.Close()
}

// Close stops the proxy and closes every connection.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.closed = true
	ln := p.ln
	p.mu.Unlock()
	err := ln.Close()
	p.Reset()
	p.Blackhole(false)
	p.wg.Wait()
	return err
}

func (p *Proxy) accept(ln net.Listener) {
	defer p.wg.Done()
	for {
		c, err := ln.Accept()
		if err != nil {
			if p.isDown(ln) {
				// Closed by targetDown or Refuse: listen again when the
				// target is up and connections are not refused.
				if ln = p.relisten(); ln != nil {
					continue
				}
			}
			return
		}
		p.Accepted.Add(1)
		if p.drop.Load() {
			p.log("faultproxy %s: %s dropped", p.Addr(), c.RemoteAddr())
			rst(c)
			continue
		}
		t, err := net.DialTimeout("tcp", p.target, 2*time.Second)
		if err != nil {
			p.DialErrors.Add(1)
			p.log("faultproxy %s: %s: dial %s: %v", p.Addr(), c.RemoteAddr(), p.target, err)
			rst(c)
			p.targetDown(ln)
			continue
		}
		p.log("faultproxy %s: %s -> %s connected", p.Addr(), c.RemoteAddr(), t.LocalAddr())
		pr := &pair{a: c, b: t}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			c.Close()
			t.Close()
			return
		}
		p.conns[pr] = struct{}{}
		p.mu.Unlock()
		var done sync.WaitGroup
		done.Add(2)
		p.wg.Add(1)
		go p.pipe(pr, c, t, &done)
		go p.pipe(pr, t, c, &done)
		cur := ln // the loop's ln changes when the proxy listens again
		go func() {
			done.Wait()
			p.mu.Lock()
			delete(p.conns, pr)
			p.mu.Unlock()
			p.log("faultproxy %s: %s closed", p.Addr(), c.RemoteAddr())
			if p.followDown.Load() {
				p.watchTarget(cur)
			}
			p.wg.Done()
		}()
	}
}

// targetDown closes ln (the accept loop then waits for the target in
// relisten) when following the target.
func (p *Proxy) targetDown(ln net.Listener) {
	if !p.followDown.Load() {
		return
	}
	p.mu.Lock()
	closing := p.ln == ln && !p.closed && p.down == nil
	if closing {
		p.down = ln
		ln.Close()
	}
	p.mu.Unlock()
	if closing {
		p.log("faultproxy %s: target %s down: not listening", p.addr, p.target)
	}
}

// watchTarget probes the target for a while after a connection ended
// (perhaps because the target died: a killed process's connections and
// listener close one by one, so the listener may still accept at first)
// and calls targetDown if it stops accepting. Probing stops at the first
// refusal or after about 1.3 s.
func (p *Proxy) watchTarget(ln net.Listener) {
	for d := 10 * time.Millisecond; d <= 640*time.Millisecond; d *= 2 {
		p.mu.Lock()
		stop := p.closed || p.ln != ln || p.down != nil
		p.mu.Unlock()
		if stop {
			return
		}
		if !dialable(p.target) {
			p.targetDown(ln)
			return
		}
		time.Sleep(d)
	}
}

// isDown reports whether ln was closed by targetDown or Refuse.
func (p *Proxy) isDown(ln net.Listener) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.down == ln && !p.closed
}

// relisten waits until connections are not refused and (when following
// the target) the target can be dialed, then listens on the proxy's
// address again. It returns nil when the proxy is closed first.
func (p *Proxy) relisten() net.Listener {
	for {
		time.Sleep(50 * time.Millisecond)
		p.mu.Lock()
		closed := p.closed
		p.mu.Unlock()
		if closed {
			return nil
		}
		if p.refuse.Load() || (p.followDown.Load() && !dialable(p.target)) {
			continue
		}
		ln, err := net.Listen("tcp", p.addr)
		if err != nil {
			continue // the port is briefly taken: try again
		}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			ln.Close()
			return nil
		}
		p.ln, p.down = ln, nil
		p.mu.Unlock()
		p.log("faultproxy %s: listening again (target %s)", p.addr, p.target)
		return ln
	}
}

func dialable(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

type chunk struct {
	b  []byte
	at time.Time
}

// pipe copies src to dst through a delay line: a reader goroutine stamps
// chunks, this goroutine releases each at stamp+delay, paced by bandwidth.
func (p *Proxy) pipe(pr *pair, src, dst net.Conn, done *sync.WaitGroup) {
	defer done.Done()
	q := make(chan chunk, 256)
	go func() {
		defer close(q)
		for {
			b := make([]byte, 32<<10)
			n, err := src.Read(b)
			if n > 0 {
				q <- chunk{b[:n], time.Now()}
			}
			if err != nil {
				p.log("faultproxy %s: read %s -> %s: %v", p.Addr(), src.RemoteAddr(), src.LocalAddr(), err)
				return
			}
		}
	}()
	defer func() {
		src.Close()
		dst.Close()
		for range q {
		}
	}()
	for c := range q {
		p.waitLift(pr)
		if d := time.Duration(p.delay.Load()); d > 0 {
			if wait := time.Until(c.at.Add(d)); wait > 0 {
				time.Sleep(wait)
			}
		}
		start := time.Now()
		if _, err := dst.Write(c.b); err != nil {
			return
		}
		p.Bytes.Add(int64(len(c.b)))
		if bw := p.bandwidth.Load(); bw > 0 {
			want := time.Duration(int64(len(c.b)) * int64(time.Second) / bw)
			if el := time.Since(start); el < want {
				time.Sleep(want - el)
			}
		}
	}
	// src ended: its close crosses no blackhole either.
	p.waitLift(pr)
}

// waitLift returns when no blackhole is on (or the pair was reset: there
// is nothing left to hold).
func (p *Proxy) waitLift(pr *pair) {
	for p.blackhole.Load() && !pr.reset.Load() {
		p.mu.Lock()
		w := p.wake
		p.mu.Unlock()
		if !p.blackhole.Load() {
			return
		}
		select {
		case <-w:
		case <-time.After(50 * time.Millisecond):
		}
	}
}
