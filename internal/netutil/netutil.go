// Package netutil holds the listener wrappers every vmsan listener uses
// (NBD, iSCSI portals, replication, metrics, control socket), so that one
// exhausted resource cannot stop a listener and a non-data listener
// cannot use up the process's file descriptors:
//
//   - Retry: Accept errors other than "listener closed" (EMFILE, ENFILE,
//     ENOBUFS, ECONNABORTED...) are logged at most once per second and
//     retried after a pause doubling from 5 ms to 1 s, as net/http does,
//     instead of ending the accept loop (which used to stop the daemon or,
//     for replication, leave the listener dead);
//   - Limit: at most n connections accepted and not yet closed; past it
//     Accept waits, so further connections wait in the kernel's backlog
//     and hold no file descriptor of the process.
//
// NofileLimit reads RLIMIT_NOFILE (the Go runtime raises the soft limit
// to the hard one at start), from which the daemon derives the caps of
// its non-data listeners.
//
// It imports nothing from the project (a leaf).
package netutil

import (
	"errors"
	"log/slog"
	"net"
	"sync"
	"syscall"
	"time"
)

// Backoff bounds of Retry, as net/http's Server.Serve.
const (
	minDelay = 5 * time.Millisecond
	maxDelay = time.Second
)

// logEvery is the rate limit of Retry's log line.
const logEvery = time.Second

type retryListener struct {
	net.Listener
	log  *slog.Logger
	what string

	closeOnce sync.Once
	closed    chan struct{}

	mu         sync.Mutex
	lastLog    time.Time
	suppressed uint64
}

// Retry wraps ln so that Accept returns only connections, or an error
// once ln is closed (net.ErrClosed, or the error of an Accept after
// Close). Other errors are logged as "what: accept failed, retrying"
// (at most once per second, with the count suppressed since the last
// line) and retried after a pause doubling from 5 ms to 1 s; Close ends
// a pause at once. log may be nil (no log).
func Retry(ln net.Listener, log *slog.Logger, what string) net.Listener {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &retryListener{Listener: ln, log: log, what: what, closed: make(chan struct{})}
}

func (l *retryListener) Accept() (net.Conn, error) {
	var delay time.Duration
	for {
		c, err := l.Listener.Accept()
		if err == nil {
			return c, nil
		}
		select {
		case <-l.closed:
			return nil, err
		default:
		}
		if errors.Is(err, net.ErrClosed) {
			return nil, err
		}
		delay = min(max(2*delay, minDelay), maxDelay)
		l.logErr(err, delay)
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-l.closed:
			t.Stop()
			return nil, net.ErrClosed
		}
	}
}

func (l *retryListener) logErr(err error, delay time.Duration) {
	l.mu.Lock()
	now := time.Now()
	if !l.lastLog.IsZero() && now.Sub(l.lastLog) < logEvery {
		l.suppressed++
		l.mu.Unlock()
		return
	}
	l.lastLog = now
	n := l.suppressed
	l.suppressed = 0
	l.mu.Unlock()
	l.log.Warn(l.what+": accept failed, retrying", "addr", l.Addr().String(), "err", err,
		"retry_in", delay, "failures_since_last_line", n)
}

func (l *retryListener) Close() error {
	l.closeOnce.Do(func() { close(l.closed) })
	return l.Listener.Close()
}

type limitListener struct {
	net.Listener
	sem       chan struct{}
	closeOnce sync.Once
	closed    chan struct{}
}

// Limit wraps ln so that at most n connections it accepted are open at
// once: Accept waits for one to close first (the waiting connections stay
// in the kernel's listen backlog and hold no file descriptor here). n < 1
// means 1.
func Limit(ln net.Listener, n int) net.Listener {
	return &limitListener{Listener: ln, sem: make(chan struct{}, max(n, 1)), closed: make(chan struct{})}
}

func (l *limitListener) Accept() (net.Conn, error) {
	select {
	case l.sem <- struct{}{}:
	case <-l.closed:
		return nil, net.ErrClosed
	}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.sem
		return nil, err
	}
	return &limitConn{Conn: c, release: func() { <-l.sem }}, nil
}

func (l *limitListener) Close() error {
	l.closeOnce.Do(func() { close(l.closed) })
	return l.Listener.Close()
}

type limitConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}

// NofileLimit returns the process's RLIMIT_NOFILE soft limit, or 0 when
// it cannot be read or is unlimited.
func NofileLimit() uint64 {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil || rl.Cur == ^uint64(0) {
		return 0
	}
	return rl.Cur
}

// Share returns def bounded by limit/div (at least min), so a non-data
// listener's cap never takes more than 1/div of the process's file
// descriptors; limit 0 (unknown) returns def.
func Share(def int, limit uint64, div, minimum int) int {
	if limit == 0 || div <= 0 {
		return def
	}
	return max(min(def, int(limit/uint64(div))), minimum)
}

// Addrs are the listeners' addresses, in order.
func Addrs(lns []net.Listener) []net.Addr {
	out := make([]net.Addr, len(lns))
	for i, ln := range lns {
		out[i] = ln.Addr()
	}
	return out
}
