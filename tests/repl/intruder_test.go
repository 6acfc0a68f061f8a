package repl_test

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vmsan/vmsan/internal/config"
	"github.com/vmsan/vmsan/internal/repl"
	"github.com/vmsan/vmsan/internal/repl/driver"
)

// The intruder speaks the replication wire protocol (internal/repl frames
// after the driver's channel hello) from a process that is not the
// configured peer and does not know the pair's shared secret. It tries the
// attacks an unauthenticated link allowed: a fake secondary receiving the
// primary's writes, a fake secondary claiming generation 0 to be sent the
// whole volume, a fake primary writing into the secondary, a fake resync
// making a blank secondary UpToDate, and a bad Hello pushing a node to
// StandAlone. Each must fail: the intruder receives no frame, nothing it
// sends is applied, and the real pair stays Connected/UpToDate with
// byte-equal replicas.

// intruderHello is how the intruder opens one channel (data or control)
// of a connection attempt: the first bytes it writes, and whatever it
// then has to read, before replication frames flow.
type intruderHello func(c net.Conn, ch byte, epoch uint64, name string) error

// helloV1 is the channel hello of the unauthenticated link: magic "VMRC",
// version 1, channel, epoch, volume name. It is all an intruder needed.
func helloV1(c net.Conn, ch byte, epoch uint64, name string) error {
	b := binary.BigEndian.AppendUint32(nil, 0x564d5243)
	b = append(b, 1, ch)
	b = binary.BigEndian.AppendUint64(b, epoch)
	b = binary.BigEndian.AppendUint16(b, uint16(len(name)))
	b = append(b, name...)
	_, err := c.Write(b)
	return err
}

// intruder is one fake peer: a data and a control connection.
type intruder struct {
	t         *testing.T
	data, ctl net.Conn
	dataR     *bufio.Reader
	ctlR      *bufio.Reader
	wmu       sync.Mutex // serialises writes per connection
	frames    atomic.Int64
	writes    atomic.Int64 // MsgData writes received
	rsBytes   atomic.Int64 // resync payload received
	acks      atomic.Int64 // WriteAck/RecvAck received
	closed    chan struct{}
}

// dialIntruder opens a connection attempt to addr as a peer would, from
// the local address src ("" for any).
func dialIntruder(t *testing.T, addr, src string, hello intruderHello) (*intruder, error) {
	t.Helper()
	d := net.Dialer{Timeout: 2 * time.Second}
	if src != "" {
		d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(src)}
	}
	epoch := uint64(time.Now().UnixNano())
	in := &intruder{t: t, closed: make(chan struct{})}
	var err error
	if in.data, err = d.Dial("tcp", addr); err != nil {
		return nil, err
	}
	if in.ctl, err = d.Dial("tcp", addr); err != nil {
		in.data.Close()
		return nil, err
	}
	t.Cleanup(in.close)
	if err := hello(in.data, 0, epoch, volName); err != nil {
		return in, fmt.Errorf("data hello: %w", err)
	}
	if err := hello(in.ctl, 1, epoch, volName); err != nil {
		return in, fmt.Errorf("control hello: %w", err)
	}
	in.dataR, in.ctlR = bufio.NewReader(in.data), bufio.NewReader(in.ctl)
	return in, nil
}

func (in *intruder) close() {
	select {
	case <-in.closed:
	default:
		close(in.closed)
	}
	in.data.Close()
	in.ctl.Close()
}

func (in *intruder) send(c net.Conn, m repl.Message) error {
	in.wmu.Lock()
	defer in.wmu.Unlock()
	c.SetWriteDeadline(time.Now().Add(5 * time.Second))
	_, err := c.Write(repl.AppendEncode(nil, &m))
	return err
}

func readFrame(br *bufio.Reader, c net.Conn, d time.Duration) (repl.Message, error) {
	var m repl.Message
	c.SetReadDeadline(time.Now().Add(d))
	var h [repl.HeaderSize]byte
	if _, err := io.ReadFull(br, h[:]); err != nil {
		return m, err
	}
	n, err := repl.DecodeHeader(h[:], &m)
	if err != nil {
		return m, err
	}
	m.Data = make([]byte, n)
	_, err = io.ReadFull(br, m.Data)
	return m, err
}

// peerHello reads the node's first frame, its Hello; an error means the
// node never spoke replication to the intruder.
func (in *intruder) peerHello() (repl.Hello, error) {
	m, err := readFrame(in.dataR, in.data, 5*time.Second)
	if err != nil {
		return repl.Hello{}, err
	}
	in.frames.Add(1)
	if m.Type != repl.MsgHello {
		return repl.Hello{}, fmt.Errorf("first frame %v, want Hello", m.Type)
	}
	return repl.DecodeHello(m.Data)
}

// handshake sends our Hello and an empty bitmap.
func (in *intruder) handshake(h repl.Hello) error {
	if err := in.send(in.data, repl.Message{Type: repl.MsgHello, Data: repl.EncodeHello(h)}); err != nil {
		return err
	}
	return in.send(in.data, repl.Message{Type: repl.MsgBitmap, Flags: repl.FlagLast, Data: repl.EncodeRuns(nil)})
}

// serve plays the peer in the background: answers pings, acknowledges
// every replicated write and resync range, and counts what it got.
func (in *intruder) serve() {
	go func() {
		for {
			m, err := readFrame(in.ctlR, in.ctl, time.Hour)
			if err != nil {
				return
			}
			in.frames.Add(1)
			switch m.Type {
			case repl.MsgPing:
				in.send(in.ctl, repl.Message{Type: repl.MsgPingAck})
			case repl.MsgWriteAck, repl.MsgRecvAck:
				in.acks.Add(1)
			}
		}
	}()
	go func() {
		for {
			m, err := readFrame(in.dataR, in.data, time.Hour)
			if err != nil {
				return
			}
			in.frames.Add(1)
			switch m.Type {
			case repl.MsgData:
				if m.Op == repl.OpWrite {
					in.writes.Add(1)
				}
				in.send(in.ctl, repl.Message{Type: repl.MsgRecvAck, Seq: m.Seq})
				in.send(in.ctl, repl.Message{Type: repl.MsgWriteAck, Seq: m.Seq})
			case repl.MsgRSData, repl.MsgRSZero:
				if m.Type == repl.MsgRSData {
					in.rsBytes.Add(int64(len(m.Data)))
				}
				in.send(in.ctl, repl.Message{Type: repl.MsgRSAck, Offset: m.Offset, Length: m.Length})
			}
		}
	}()
}

// fakeHello is the Hello an intruder answers with: the node's own,
// changed by f, from another node id.
func fakeHello(h repl.Hello, f func(*repl.Hello)) repl.Hello {
	h.NodeID ^= 0x5a5a5a5a5a5a5a5a
	h.Dirty = 0
	h.CrashedPrimary = false
	f(&h)
	return h
}

// rawAt reads length bytes at off of a node's backing file.
func (n *node) rawAt(off, length int64) []byte {
	n.t.Helper()
	f, err := os.Open(filepath.Join(n.dir, "volumes", volName+".raw"))
	if err != nil {
		n.t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, length)
	if _, err := f.ReadAt(b, off); err != nil && !errors.Is(err, io.EOF) {
		n.t.Fatal(err)
	}
	return b
}

// stillConnected checks the real pair kept its link through the attack.
func (p *pairT) stillConnected(t *testing.T, what string) {
	t.Helper()
	sa, sb := p.a.status(), p.b.status()
	if sa.Conn != "Connected" || sb.Conn != "Connected" || sa.Disk != "UpToDate" || sb.Disk != "UpToDate" {
		t.Errorf("%s: the real pair lost its link: a=%s/%s b=%s/%s", what, sa.Conn, sa.Disk, sb.Conn, sb.Disk)
	}
}

// converged: after a flush the replicas are byte-equal.
func (p *pairT) converged(t *testing.T, what string) {
	t.Helper()
	mustIO(t, p.a.uri(), "flush")
	p.waitSynced(t, 30*time.Second)
	if p.a.rawSum() != p.b.rawSum() {
		t.Errorf("%s: the replicas differ", what)
	}
}

// helloGuess is the authenticated channel hello (driver.DialHandshake)
// with a guessed secret: the intruder knows the protocol, not the secret.
func helloGuess(c net.Conn, ch byte, epoch uint64, name string) error {
	return driver.DialHandshake(c, ch, epoch, driver.HandshakeParams{Name: name, NodeID: 0xbad, Secret: []byte("guessed-secret-0123456789")})
}

// helloNone is the authenticated channel hello of an insecure link (no
// secret at all).
func helloNone(c net.Conn, ch byte, epoch uint64, name string) error {
	return driver.DialHandshake(c, ch, epoch, driver.HandshakeParams{Name: name, NodeID: 0xbad})
}

// attackHellos are the ways an intruder without the secret opens a
// connection attempt: the unauthenticated hello of vmsan before peer
// authentication, and the authenticated one with a wrong or no secret.
func attackHellos() map[string]intruderHello {
	return map[string]intruderHello{"v1": helloV1, "guessed-secret": helloGuess, "no-secret": helloNone}
}

// (a) A fake secondary connects to the primary and is sent its
// acknowledged (FUA) writes, while the real secondary misses them.
func TestIntruderFakeSecondaryGetsNoWrites(t *testing.T) {
	for name, hello := range attackHellos() {
		t.Run(name, func(t *testing.T) {
			p := newPair(t, pairOpts{size: "32M"})
			in, err := dialIntruder(t, p.a.replAddr, "", hello)
			if err == nil {
				var h repl.Hello
				if h, err = in.peerHello(); err == nil {
					err = in.handshake(fakeHello(h, func(h *repl.Hello) { h.Role, h.Disk = repl.Secondary, repl.UpToDate }))
					in.serve()
				}
			}
			t.Logf("intruder handshake: %v", err)
			// Writes a client gets acknowledged while the intruder is there.
			time.Sleep(300 * time.Millisecond)
			mustIO(t, p.a.uri(), fuaWrites(0x61, 0, 64<<10, 64<<10, 32)...)
			in.close()
			if n := in.writes.Load(); n > 0 || in.frames.Load() > 0 {
				t.Errorf("the intruder received %d frames, %d of them replicated writes", in.frames.Load(), n)
			}
			p.stillConnected(t, "fake secondary")
			p.converged(t, "fake secondary")
		})
	}
}

func fuaWrites(pat int, base, size, stride int64, n int) []string {
	var c []string
	for i := 0; i < n; i++ {
		c = append(c, fmt.Sprintf("write -f -P %d %d %d", pat, base+int64(i)*stride, size))
	}
	return c
}

// (b) A fake secondary claiming a blank disk (generation 0) is sent a
// full sync: the whole volume.
func TestIntruderGenerationZeroGetsNoSync(t *testing.T) {
	for name, hello := range attackHellos() {
		t.Run(name, func(t *testing.T) {
			p := newPair(t, pairOpts{size: "32M"})
			mustIO(t, p.a.uri(), writes(0x62, 0, 1<<20, 2<<20, 8)...)
			p.waitSynced(t, 30*time.Second)
			in, err := dialIntruder(t, p.a.replAddr, "", hello)
			if err == nil {
				var h repl.Hello
				if h, err = in.peerHello(); err == nil {
					err = in.handshake(fakeHello(h, func(h *repl.Hello) {
						h.Role, h.Disk, h.Gens, h.PromotedAt = repl.Secondary, repl.Inconsistent, repl.Generations{}, 0
					}))
					in.serve()
				}
			}
			t.Logf("intruder handshake: %v", err)
			waitFor := time.Now().Add(3 * time.Second)
			for time.Now().Before(waitFor) && in.rsBytes.Load() < 8<<20 {
				time.Sleep(50 * time.Millisecond)
			}
			in.close()
			if n := in.rsBytes.Load(); n > 0 || in.frames.Load() > 0 {
				t.Errorf("the intruder received %d frames, %d bytes of resync data", in.frames.Load(), n)
			}
			p.stillConnected(t, "generation 0")
			p.converged(t, "generation 0")
		})
	}
}

// (c) A fake primary connects to the secondary and writes into it.
func TestIntruderFakePrimaryWritesNothing(t *testing.T) {
	for name, hello := range attackHellos() {
		t.Run(name, func(t *testing.T) {
			p := newPair(t, pairOpts{size: "32M"})
			const off, length = 20 << 20, 64 << 10
			in, err := dialIntruder(t, p.b.replAddr, "", hello)
			if err == nil {
				var h repl.Hello
				if h, err = in.peerHello(); err == nil {
					err = in.handshake(fakeHello(h, func(h *repl.Hello) { h.Role, h.Disk = repl.Primary, repl.UpToDate }))
					in.serve()
					// At once: the real primary redials within a second
					// and would replace the intruder's link.
					for i := int64(0); i < 2 && err == nil; i++ {
						err = in.send(in.data, repl.Message{Type: repl.MsgData, Op: repl.OpWrite, Flags: repl.FlagFUA, Seq: uint64(i + 1),
							Offset: off + i*length, Length: length, Data: bytes.Repeat([]byte{0xee}, length)})
					}
				}
			}
			t.Logf("intruder handshake and writes: %v", err)
			time.Sleep(time.Second)
			acks := in.acks.Load()
			in.close()
			if got := p.b.rawAt(off, 2*length); bytes.Count(got, []byte{0xee}) > 0 || acks > 0 {
				t.Errorf("the intruder's writes reached the secondary (%d acknowledged, %d bytes on disk)", acks, bytes.Count(got, []byte{0xee}))
			}
			p.stillConnected(t, "fake primary")
			p.converged(t, "fake primary")
		})
	}
}

// (d) A fake primary's SyncStart/SyncDone makes a blank secondary
// UpToDate without sending it any data.
func TestIntruderFakeResyncLeavesBlankSecondaryInconsistent(t *testing.T) {
	for name, hello := range attackHellos() {
		t.Run(name, func(t *testing.T) {
			need(t, "qemu-io")
			c := &node{t: t, name: "c", dir: filepath.Join(t.TempDir(), "c"), nbd: freeAddr(t), replAddr: freeAddr(t)}
			os.MkdirAll(c.dir, 0o755)
			c.run("volume", "create", volName, "--size", "32M")
			c.run(append([]string{"repl", "configure", volName, "--listen", c.replAddr, "--peer", freeAddr(t), "--dial", "no", "--role", "secondary"}, intruderSecretFlags(t)...)...)
			c.start()
			t.Cleanup(c.stop)
			if st := c.status(); st.Disk != "Inconsistent" {
				t.Fatalf("blank secondary starts %s, want Inconsistent", st.Disk)
			}
			in, err := dialIntruder(t, c.replAddr, "", hello)
			if err == nil {
				var h repl.Hello
				if h, err = in.peerHello(); err == nil {
					gen := uint64(0x1234567890abcdef)
					err = in.handshake(fakeHello(h, func(h *repl.Hello) {
						h.Role, h.Disk, h.Gens, h.PromotedAt = repl.Primary, repl.UpToDate, repl.Generations{Current: gen}, time.Now().UnixNano()
					}))
					in.serve()
					if err == nil {
						err = in.send(in.data, repl.Message{Type: repl.MsgSyncStart, Seq: 0, Offset: int64(gen)})
					}
					if err == nil {
						err = in.send(in.data, repl.Message{Type: repl.MsgSyncDone, Seq: gen})
					}
				}
			}
			t.Logf("intruder handshake and resync: %v", err)
			time.Sleep(time.Second)
			in.close()
			if st := c.status(); st.Disk != "Inconsistent" {
				t.Errorf("the blank secondary is %s after the intruder's fake resync, want Inconsistent", st.Disk)
			}
		})
	}
}

// (e) A Hello with the wrong volume size sends the node to StandAlone
// (until an operator's repl connect).
func TestIntruderBadHelloKeepsLink(t *testing.T) {
	for name, hello := range attackHellos() {
		t.Run(name, func(t *testing.T) {
			p := newPair(t, pairOpts{size: "32M"})
			in, err := dialIntruder(t, p.b.replAddr, "", hello)
			if err == nil {
				var h repl.Hello
				if h, err = in.peerHello(); err == nil {
					err = in.handshake(fakeHello(h, func(h *repl.Hello) { h.Role, h.Size = repl.Primary, h.Size+4096 }))
				}
			}
			t.Logf("intruder handshake: %v", err)
			time.Sleep(time.Second)
			in.close()
			if st := p.b.status(); st.Conn == "StandAlone" {
				t.Errorf("the intruder's Hello sent the secondary to StandAlone")
			}
			p.stillConnected(t, "bad Hello")
			mustIO(t, p.a.uri(), writes(0x65, 0, 64<<10, 64<<10, 4)...)
			p.converged(t, "bad Hello")
		})
	}
}

// intruderSecretFlags are the `repl configure` flags a node of the tests
// is configured with.
func intruderSecretFlags(t *testing.T) []string {
	return []string{"--shared-secret-file", secretFile(t, t.TempDir(), pairSecret)}
}

// serveLog is a node's log so far.
func (n *node) serveLog() string {
	b, _ := os.ReadFile(filepath.Join(n.dir, "serve.log"))
	return string(b)
}

// A connection from an address that is not the peer's is closed before
// anything is read from it, and the log names the address it really came
// from (not the configured peer); a burst of them costs a few log lines,
// not one each.
func TestIntruderOtherAddressDropped(t *testing.T) {
	p := newPair(t, pairOpts{size: "32M"})
	const src = "127.0.0.2" // loopback, but not the peer's 127.0.0.1
	for i := 0; i < 50; i++ {
		in, err := dialIntruder(t, p.b.replAddr, src, helloV1)
		if err != nil && i == 0 {
			t.Logf("first connection: %v", err)
		}
		if in != nil {
			// Closed by the node without a reply.
			if _, err := readFrame(bufio.NewReader(in.data), in.data, 5*time.Second); err == nil {
				t.Fatal("a connection from another address got a frame")
			}
			in.close()
		}
	}
	var lines []string
	waitUntil(t, "the refusal is logged", 5*time.Second, func() bool {
		lines = logLines(p.b.serveLog(), "not from the configured peer")
		return len(lines) > 0
	})
	if !strings.Contains(lines[0], "remote="+src+":") {
		t.Errorf("the log line does not name the real remote address %s: %s", src, lines[0])
	}
	if len(lines) > 5 {
		t.Errorf("%d log lines for 50 refused connections: not rate-limited", len(lines))
	}
	p.stillConnected(t, "other address")
	mustIO(t, p.a.uri(), writes(0x66, 0, 64<<10, 64<<10, 4)...)
	p.converged(t, "other address")
}

func logLines(s, sub string) []string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return out
}

// Two real nodes whose secrets differ never connect, and both say why;
// with the same secret they connect (every newPair test).
func TestWrongSecretPeerRefused(t *testing.T) {
	need(t, "qemu-io")
	base := t.TempDir()
	a := &node{t: t, name: "a", dir: filepath.Join(base, "a"), nbd: freeAddr(t), replAddr: freeAddr(t)}
	b := &node{t: t, name: "b", dir: filepath.Join(base, "b"), nbd: freeAddr(t), replAddr: freeAddr(t)}
	for _, n := range []*node{a, b} {
		os.MkdirAll(n.dir, 0o755)
		n.run("volume", "create", volName, "--size", "16M")
	}
	a.run("repl", "configure", volName, "--listen", a.replAddr, "--peer", b.replAddr, "--dial", "yes", "--role", "primary",
		"--shared-secret-file", secretFile(t, base, "the-secret-of-node-a-123"))
	b.run("repl", "configure", volName, "--listen", b.replAddr, "--peer", a.replAddr, "--dial", "no", "--role", "secondary",
		"--shared-secret-file", secretFile(t, base, "the-secret-of-node-b-456"))
	a.start()
	b.start()
	t.Cleanup(func() {
		a.stop()
		b.stop()
		if t.Failed() {
			t.Logf("a:\n%s\nb:\n%s", tail(a.serveLog(), 20), tail(b.serveLog(), 20))
		}
	})
	mustIO(t, a.uri(), writes(0x67, 0, 64<<10, 64<<10, 4)...)
	waitUntil(t, "both nodes log the refusal", 20*time.Second, func() bool {
		return len(logLines(a.serveLog(), "secrets differ")) > 0 && len(logLines(b.serveLog(), "did not authenticate as the peer")) > 0
	})
	if l := logLines(b.serveLog(), "did not authenticate as the peer")[0]; !strings.Contains(l, "remote=127.0.0.1:") {
		t.Errorf("acceptor's refusal does not name the remote address: %s", l)
	}
	for _, n := range []*node{a, b} {
		if st := n.status(); st.Conn == "Connected" || st.PeerDisk == "UpToDate" {
			t.Errorf("%s connected to a peer with another secret: %+v", n.name, st)
		}
	}
	if b.rawSum() == a.rawSum() {
		t.Error("the secondary received the primary's writes through a link with a wrong secret")
	}
}

// A replicated volume configured before peer authentication (settings
// without a secret) is not served over an open link: the daemon refuses
// to start and names the key to set.
func TestNoSecretRefusesToStart(t *testing.T) {
	n := &node{t: t, name: "a", dir: filepath.Join(t.TempDir(), "a"), nbd: freeAddr(t), replAddr: freeAddr(t)}
	os.MkdirAll(n.dir, 0o755)
	n.run("volume", "create", volName, "--size", "1M")
	// The settings file as vmsan before peer authentication wrote it.
	if err := driver.SaveSettings(driver.Dir(n.dir, volName), driver.Settings{Listen: n.replAddr, Peer: freeAddr(t), NodeID: 9}); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(vmsanBin, "serve", "--data-dir", n.dir, "--listen", n.nbd).CombinedOutput()
	if err == nil {
		t.Fatalf("serve started a replicated volume without a shared secret:\n%s", out)
	}
	for _, want := range []string{"no shared secret", "shared_secret_file", "--shared-secret-file", "insecure"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("serve's refusal does not mention %q:\n%s", want, out)
		}
	}
	// And `repl configure` without a secret says the same.
	cmd := exec.Command(vmsanBin, "repl", "configure", volName, "--listen", n.replAddr, "--peer", "127.0.0.1:2", "--data-dir", n.dir)
	if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "--shared-secret-file") {
		t.Errorf("configure without a secret: %v\n%s", err, out)
	}
}

// The inline secret never appears in `serve --print-config`.
func TestPrintConfigHidesSecret(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "vmsan.yaml")
	y := fmt.Sprintf("data_dir: %s\nno_default_volume: true\nvolumes:\n  - name: vm1\n    size: 1M\n    replication: {listen: 127.0.0.1:7001, peer: 127.0.0.1:7002, shared_secret: %q}\n",
		filepath.Join(dir, "data"), pairSecret)
	if err := os.WriteFile(cfg, []byte(y), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(vmsanBin, "serve", "--config", cfg, "--print-config").CombinedOutput()
	if err != nil || strings.Contains(string(out), pairSecret) || !strings.Contains(string(out), "shared_secret: '"+config.Masked+"'") {
		t.Fatalf("print-config: %v\n%s", err, out)
	}
}
