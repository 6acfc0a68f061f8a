package driver

// auth.go: who may speak replication to this node. Every TCP connection,
// data and control alike, passes two gates before its first replication
// frame is read or written:
//
//  1. the remote address must be the configured peer's (or one listed in
//     accept_from); any other connection is closed before anything is
//     read from it (peerFilter);
//  2. the channel hello, a challenge-response on the shared secret: both
//     sides send a fresh random nonce and prove they hold the secret with
//     an HMAC-SHA256 over the whole exchange so far (both nonces, the
//     direction, the channel and attempt, the volume name and both node
//     ids), compared in constant time (dialHandshake, acceptHandshake).
//
// Binding both nonces and the direction means a recorded exchange cannot
// be replayed, an acceptor's proof cannot be reflected back as a dialer's,
// and a node relayed to itself is refused (equal node ids). The stream
// after the handshake is neither encrypted nor integrity protected (as
// DRBD's): run the link on a private network or a VPN when the path
// between the nodes is not trusted.

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/vmsan/vmsan/internal/replset"
)

// Channel hello, version 2 (version 1 had no authentication):
//
//	dialer:   magic u32 "VMRC" | version u8 | channel u8 (0 data, 1 control) |
//	          epoch u64 | name length u16 | name | node id u64 | auth u8 |
//	          nonce [32]
//	acceptor: magic u32 | version u8 | auth u8 | node id u64 | nonce [32] |
//	          proof [32]  = HMAC(secret, "vmsan repl acceptor" 0 | transcript)
//	dialer:   proof [32]  = HMAC(secret, "vmsan repl dialer" 0 | transcript | acceptor proof)
//	acceptor: result u8 (1: accepted)
//
// transcript is every byte of the dialer's hello and of the acceptor's
// reply up to its proof. auth is 1 with a shared secret, 0 for an
// insecure link (the proofs then use an empty key: they prove nothing,
// but both sides run one code path and a mismatch is reported clearly).
// The first 16 bytes keep version 1's layout so a node still speaking
// version 1 is recognised and told to upgrade.
//
// The acceptor pairs the data and control connections of one attempt by
// epoch; the volume name is checked so a misconfigured peer is refused.
const (
	chanMagic   = 0x564d5243
	chanVersion = 2
	chData      = 0
	chControl   = 1
	maxNameLen  = 255
	nonceLen    = 32
	proofLen    = sha256.Size
	authNone    = 0
	authHMAC    = 1
	// handshakeTimeout bounds the whole exchange on one connection.
	handshakeTimeout = 5 * time.Second
	// maxHandshakes bounds connections being authenticated at once; more
	// are closed at once (only the peer's addresses get this far).
	maxHandshakes = 8
)

var (
	labelAcceptor = []byte("vmsan repl acceptor\x00")
	labelDialer   = []byte("vmsan repl dialer\x00")
)

// ErrAuth is wrapped by every handshake error that means the other side
// did not prove the shared secret (or refused ours).
var ErrAuth = errors.New("replication peer authentication failed")

// HandshakeParams are one side's part in the channel hello.
type HandshakeParams struct {
	Name   string // volume name
	NodeID uint64 // this node's id (replset.Settings.NodeID)
	Secret []byte // nil: insecure link
}

func (p HandshakeParams) auth() byte {
	if p.Secret != nil {
		return authHMAC
	}
	return authNone
}

func proof(secret, label []byte, parts ...[]byte) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write(label)
	for _, b := range parts {
		m.Write(b)
	}
	return m.Sum(nil)
}

func authName(a byte) string {
	if a == authHMAC {
		return "a shared secret"
	}
	return "no shared secret (insecure)"
}

// DialHandshake runs the dialer's side of the channel hello on c for
// channel ch (0 data, 1 control) of attempt epoch. On success the peer
// proved the secret and accepted ours; the caller then speaks
// replication frames. Exported for tools and tests that play a peer.
func DialHandshake(c net.Conn, ch byte, epoch uint64, p HandshakeParams) error {
	if len(p.Name) > maxNameLen {
		return errors.New("repl: volume name too long")
	}
	c.SetDeadline(time.Now().Add(handshakeTimeout))
	defer c.SetDeadline(time.Time{})
	var nonce [nonceLen]byte
	rand.Read(nonce[:])
	hello := make([]byte, 0, 16+len(p.Name)+9+nonceLen)
	hello = binary.BigEndian.AppendUint32(hello, chanMagic)
	hello = append(hello, chanVersion, ch)
	hello = binary.BigEndian.AppendUint64(hello, epoch)
	hello = binary.BigEndian.AppendUint16(hello, uint16(len(p.Name)))
	hello = append(hello, p.Name...)
	hello = binary.BigEndian.AppendUint64(hello, p.NodeID)
	hello = append(hello, p.auth())
	hello = append(hello, nonce[:]...)
	if _, err := c.Write(hello); err != nil {
		return err
	}
	reply := make([]byte, 4+1+1+8+nonceLen+proofLen)
	if _, err := io.ReadFull(c, reply); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return fmt.Errorf("the peer closed the connection during the channel hello (it refused this node: see the peer's log; shared secret, volume name, accepted addresses or version differ?): %w", err)
		}
		return fmt.Errorf("channel hello: %w", err)
	}
	if binary.BigEndian.Uint32(reply) != chanMagic || reply[4] != chanVersion {
		return fmt.Errorf("%w: the peer's reply is not a version %d channel hello", ErrAuth, chanVersion)
	}
	if reply[5] != p.auth() {
		return fmt.Errorf("%w: the peer has %s, this node %s", ErrAuth, authName(reply[5]), authName(p.auth()))
	}
	if id := binary.BigEndian.Uint64(reply[6:]); id == p.NodeID {
		return fmt.Errorf("%w: the peer has this node's own node id %x (connected to itself?)", ErrAuth, id)
	}
	body, theirs := reply[:len(reply)-proofLen], reply[len(reply)-proofLen:]
	if !hmac.Equal(theirs, proof(p.Secret, labelAcceptor, hello, body)) {
		return fmt.Errorf("%w: the peer's proof does not match this node's shared secret (the secrets differ)", ErrAuth)
	}
	if _, err := c.Write(proof(p.Secret, labelDialer, hello, body, theirs)); err != nil {
		return err
	}
	var res [1]byte
	if _, err := io.ReadFull(c, res[:]); err != nil || res[0] != 1 {
		return fmt.Errorf("%w: the peer refused this node's proof (%v)", ErrAuth, err)
	}
	return nil
}

// helloRefused is a handshake failure as the acceptor logs it.
type helloRefused struct {
	auth bool // the remote did not prove the secret (vs. a wrong volume, version...)
	err  error
}

func (e *helloRefused) Error() string { return e.err.Error() }
func (e *helloRefused) Unwrap() error { return e.err }

// acceptHandshake runs the acceptor's side on c: it returns the channel
// and attempt once the dialer proved the secret.
func acceptHandshake(c net.Conn, p HandshakeParams) (ch byte, epoch uint64, err error) {
	c.SetDeadline(time.Now().Add(handshakeTimeout))
	defer c.SetDeadline(time.Time{})
	hello, name, err := readHello(c)
	if err != nil {
		return 0, 0, err
	}
	return acceptHello(c, hello, name, p)
}

// readHello reads the dialer's channel hello (bounded: at most
// maxNameLen bytes of name) and returns it with the volume name it asks
// for, so that a listener shared by several volumes can pick the volume
// whose secret the rest of the handshake (acceptHello) checks. Nothing in
// it is trusted yet: the name is bound into the transcript both proofs
// cover. REQUIRES: the caller set c's deadline.
func readHello(c net.Conn) (hello []byte, name string, err error) {
	var h [16]byte
	if _, err = io.ReadFull(c, h[:]); err != nil {
		return nil, "", &helloRefused{err: fmt.Errorf("channel hello: %w", err)}
	}
	if binary.BigEndian.Uint32(h[0:]) != chanMagic {
		return nil, "", &helloRefused{auth: true, err: errors.New("not a replication channel hello")}
	}
	if h[4] != chanVersion {
		return nil, "", &helloRefused{auth: true, err: fmt.Errorf("channel hello version %d, this node speaks %d "+
			"(version 1 is vmsan before peer authentication: upgrade the peer and set the same shared secret on both nodes)", h[4], chanVersion)}
	}
	if h[5] > chControl {
		return nil, "", &helloRefused{auth: true, err: fmt.Errorf("bad channel %d", h[5])}
	}
	n := int(binary.BigEndian.Uint16(h[14:]))
	if n > maxNameLen {
		return nil, "", &helloRefused{auth: true, err: errors.New("volume name too long")}
	}
	hello = make([]byte, 16+n+9+nonceLen)
	copy(hello, h[:])
	if _, err = io.ReadFull(c, hello[16:]); err != nil {
		return nil, "", &helloRefused{err: fmt.Errorf("channel hello: %w", err)}
	}
	return hello, string(hello[16 : 16+n]), nil
}

// acceptHello finishes the acceptor's side after readHello: the volume
// must be p's, then the challenge-response on p's secret.
func acceptHello(c net.Conn, hello []byte, name string, p HandshakeParams) (ch byte, epoch uint64, err error) {
	h := hello[:16]
	rest := hello[16+len(name):]
	if name != p.Name {
		return 0, 0, &helloRefused{err: fmt.Errorf("peer connected for volume %q", name)}
	}
	if rest[8] != p.auth() {
		return 0, 0, &helloRefused{auth: true, err: fmt.Errorf("the remote has %s, this node %s", authName(rest[8]), authName(p.auth()))}
	}
	if id := binary.BigEndian.Uint64(rest); id == p.NodeID {
		return 0, 0, &helloRefused{auth: true, err: fmt.Errorf("the remote claims this node's own node id %x (a connection relayed back to this node?)", id)}
	}
	var nonce [nonceLen]byte
	rand.Read(nonce[:])
	body := make([]byte, 0, 4+1+1+8+nonceLen+proofLen)
	body = binary.BigEndian.AppendUint32(body, chanMagic)
	body = append(body, chanVersion, p.auth())
	body = binary.BigEndian.AppendUint64(body, p.NodeID)
	body = append(body, nonce[:]...)
	ours := proof(p.Secret, labelAcceptor, hello, body)
	if _, err = c.Write(append(body, ours...)); err != nil {
		return 0, 0, &helloRefused{err: err}
	}
	theirs := make([]byte, proofLen)
	if _, err = io.ReadFull(c, theirs); err != nil {
		return 0, 0, &helloRefused{auth: true, err: fmt.Errorf("no proof of the shared secret (the remote closed or stalled: secrets differ?): %w", err)}
	}
	if !hmac.Equal(theirs, proof(p.Secret, labelDialer, hello, body, ours)) {
		c.Write([]byte{0})
		return 0, 0, &helloRefused{auth: true, err: errors.New("wrong proof of the shared secret")}
	}
	if _, err = c.Write([]byte{1}); err != nil {
		return 0, 0, &helloRefused{err: err}
	}
	return h[5], binary.BigEndian.Uint64(h[6:]), nil
}

// peerFilter decides which remote addresses may connect: accept_from when
// set, else the addresses the peer's host resolves to (a literal IP is
// its own; a name is resolved again at most every resolveEvery when an
// unknown address knocks, so a peer whose address changed gets in
// without a restart, and a flood costs no lookups).
type peerFilter struct {
	fixed []netip.Prefix // accept_from, or the peer's literal IP
	host  string         // peer host to resolve ("" when fixed)

	mu       sync.Mutex
	resolved []netip.Addr
	at       time.Time
}

const resolveEvery = 10 * time.Second

func newPeerFilter(s replset.Settings) (*peerFilter, error) {
	f := &peerFilter{}
	for _, a := range s.AcceptFrom {
		p, err := replset.ParseAcceptFrom(a)
		if err != nil {
			return nil, fmt.Errorf("accept_from %q: %w", a, err)
		}
		f.fixed = append(f.fixed, p)
	}
	if len(f.fixed) > 0 {
		return f, nil
	}
	host, _, err := net.SplitHostPort(s.Peer)
	if err != nil {
		return nil, fmt.Errorf("peer %q: %w", s.Peer, err)
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		ip = ip.Unmap().WithZone("")
		f.fixed = []netip.Prefix{netip.PrefixFrom(ip, ip.BitLen())}
		return f, nil
	}
	f.host = host
	f.refresh()
	return f, nil
}

func (f *peerFilter) refresh() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	ips, err := net.DefaultResolver.LookupNetIP(ctx, "ip", f.host)
	f.at = time.Now()
	if err == nil {
		f.resolved = f.resolved[:0]
		for _, ip := range ips {
			f.resolved = append(f.resolved, ip.Unmap().WithZone(""))
		}
	}
}

// allowed reports whether a connection from remote may go on to the
// handshake.
func (f *peerFilter) allowed(remote net.Addr) bool {
	ap, err := netip.ParseAddrPort(remote.String())
	if err != nil {
		return false
	}
	// Zones are dropped: a zoned address never matches a prefix.
	ip := ap.Addr().Unmap().WithZone("")
	for _, p := range f.fixed {
		if p.Contains(ip) {
			return true
		}
	}
	if f.host == "" {
		return false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for pass := 0; pass < 2; pass++ {
		for _, a := range f.resolved {
			if a == ip {
				return true
			}
		}
		if pass == 1 || time.Since(f.at) < resolveEvery {
			break
		}
		f.refresh()
	}
	return false
}

// logLimiter lets one log line per key through every interval and counts
// the ones it held back, so a flood of refused connections costs a line
// every few seconds, not one per connection.
type logLimiter struct {
	mu       sync.Mutex
	interval time.Duration
	next     map[string]time.Time
	held     map[string]int
}

func newLogLimiter(d time.Duration) *logLimiter {
	return &logLimiter{interval: d, next: map[string]time.Time{}, held: map[string]int{}}
}

// warn logs msg under key unless one was logged less than interval ago;
// the line carries how many were held back since the last one.
func (l *logLimiter) warn(log *slog.Logger, key, msg string, args ...any) {
	l.mu.Lock()
	now := time.Now()
	if now.Before(l.next[key]) {
		l.held[key]++
		l.mu.Unlock()
		return
	}
	l.next[key] = now.Add(l.interval)
	held := l.held[key]
	l.held[key] = 0
	l.mu.Unlock()
	if held > 0 {
		args = append(args, "suppressed_since_last", held)
	}
	log.Warn(msg, args...)
}
