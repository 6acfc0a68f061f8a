package driver

import (
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/vmsan/vmsan/internal/netutil"
)

// Listeners shared by volumes: replicas whose Listen address is the same
// register with one listener (Options.Listeners; the daemon plugin passes
// its own), so a node needs one replication port for all its volumes. The
// dialer's channel hello names the volume; the listener reads that much
// (bounded, under the handshake deadline) and hands the connection to the
// volume's replica, which runs the rest of the handshake with its own
// secret (acceptHello). The gates stay those of a listener of its own
// (auth.go): a remote address that no registered volume accepts is closed
// before anything is read; the volume's own address check runs before its
// secret is tried; the volume name is covered by both proofs, so a peer
// that proved one volume's secret cannot reach another volume's replica
// under it.

// Listeners is a set of replication listeners shared by volumes, by
// listen address. The zero value is not usable: NewListeners.
type Listeners struct {
	log *slog.Logger
	mu  sync.Mutex
	lns map[string]*sharedListener
}

// NewListeners returns an empty set.
func NewListeners(log *slog.Logger) *Listeners {
	if log == nil {
		log = slog.Default()
	}
	return &Listeners{log: log, lns: map[string]*sharedListener{}}
}

type sharedListener struct {
	addr string
	ln   net.Listener
	log  *slog.Logger
	// sem bounds connections being read or authenticated at once, over
	// every volume of the listener.
	sem        chan struct{}
	refusedLog *logLimiter

	mu   sync.Mutex
	vols map[string]*Replica
}

// register adds r (volume name) to the listener on addr, opening it if it
// is the first volume there.
func (l *Listeners) register(addr, name string, r *Replica) (*sharedListener, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	sl := l.lns[addr]
	if sl == nil {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return nil, err
		}
		sl = &sharedListener{addr: addr, log: l.log.With("component", "repl", "listen", addr),
			sem: make(chan struct{}, maxHandshakes), refusedLog: newLogLimiter(10 * time.Second), vols: map[string]*Replica{}}
		// Accept errors are logged and retried (as a volume's own
		// listener): the accept loop must outlive them.
		sl.ln = netutil.Retry(ln, sl.log, "repl "+addr)
		l.lns[addr] = sl
		go sl.acceptLoop()
	}
	sl.mu.Lock()
	defer sl.mu.Unlock()
	if sl.vols[name] != nil {
		return nil, fmt.Errorf("volume %s is already replicated on %s", name, addr)
	}
	sl.vols[name] = r
	return sl, nil
}

// unregister removes r; the listener closes with its last volume.
func (l *Listeners) unregister(sl *sharedListener, name string, r *Replica) {
	l.mu.Lock()
	defer l.mu.Unlock()
	sl.mu.Lock()
	if sl.vols[name] == r {
		delete(sl.vols, name)
	}
	empty := len(sl.vols) == 0
	sl.mu.Unlock()
	if empty && l.lns[sl.addr] == sl {
		delete(l.lns, sl.addr)
		sl.ln.Close()
	}
}

func (sl *sharedListener) acceptLoop() {
	for {
		c, err := sl.ln.Accept()
		if err != nil {
			return
		}
		go sl.admit(c)
	}
}

// anyAllows reports whether some volume on the listener accepts remote.
func (sl *sharedListener) anyAllows(remote net.Addr) bool {
	sl.mu.Lock()
	rs := make([]*Replica, 0, len(sl.vols))
	for _, r := range sl.vols {
		rs = append(rs, r)
	}
	sl.mu.Unlock()
	for _, r := range rs {
		if r.filter.allowed(remote) {
			return true
		}
	}
	return false
}

func (sl *sharedListener) admit(c net.Conn) {
	if !sl.anyAllows(c.RemoteAddr()) {
		sl.refusedLog.warn(sl.log, "addr", "refusing replication connection: not from the configured peer's address of any volume on this listener (set accept_from if the peer connects from another address)",
			"remote", c.RemoteAddr().String())
		c.Close()
		return
	}
	select {
	case sl.sem <- struct{}{}:
		defer func() { <-sl.sem }()
	default:
		sl.refusedLog.warn(sl.log, "busy", "refusing replication connection: too many handshakes in progress", "remote", c.RemoteAddr().String())
		c.Close()
		return
	}
	c.SetDeadline(time.Now().Add(handshakeTimeout))
	hello, name, err := readHello(c)
	if err != nil {
		sl.refusedLog.warn(sl.log, "hello", "refusing replication connection", "remote", c.RemoteAddr().String(), "err", err)
		c.Close()
		return
	}
	sl.mu.Lock()
	r := sl.vols[name]
	sl.mu.Unlock()
	if r == nil {
		sl.refusedLog.warn(sl.log, "volume", "refusing replication connection: no volume of that name is replicated on this listener",
			"remote", c.RemoteAddr().String(), "volume", name)
		c.Close()
		return
	}
	r.admitHello(c, hello, name)
}
