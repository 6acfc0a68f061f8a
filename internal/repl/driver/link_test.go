package driver

import (
	"bufio"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/vmsan/vmsan/internal/repl"
)

// fakeHalves is one connection attempt as the acceptor sees it: the data
// and control connections it got, and the far ends the test holds.
type fakeHalves struct {
	data, ctl         net.Conn // handed to the replica
	peerData, peerCtl net.Conn // the test's ends
	epoch             uint64
}

func newFakeHalves(t *testing.T, epoch uint64) *fakeHalves {
	f := &fakeHalves{epoch: epoch}
	f.data, f.peerData = net.Pipe()
	f.ctl, f.peerCtl = net.Pipe()
	t.Cleanup(func() { f.peerData.Close(); f.peerCtl.Close() })
	return f
}

func (f *fakeHalves) events() []event {
	return []event{{kind: evConn, ch: chData, epoch: f.epoch, conn: f.data}, {kind: evConn, ch: chControl, epoch: f.epoch, conn: f.ctl}}
}

// readFrame reads one frame from the peer's end of a connection.
func readFrame(c net.Conn, br *bufio.Reader, d time.Duration) (repl.Message, error) {
	c.SetReadDeadline(time.Now().Add(d))
	defer c.SetReadDeadline(time.Time{})
	var h [repl.HeaderSize]byte
	var m repl.Message
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

// The stuck handshake of the fault loop (a link blackhole whose backlog is
// delivered at once when it lifts): on the acceptor, a link error and the
// next complete pair of connections are handled in the same batch of
// events. The node's disconnect for the lost link was still in its Ready
// when the new link was installed, and processing it dropped the new link
// instead; the node stayed in Handshake without a link, so at the next
// pair Connect did nothing and no Hello was ever sent on it. The peer got
// pings answered but never a Hello: stuck in Handshake while this side sat
// in SyncTarget waiting for a resync that never started.
func TestLinkErrorAndNewPairInOneBatch(t *testing.T) {
	base := t.TempDir()
	os.MkdirAll(filepath.Join(base, "b"), 0o755)
	set := Settings{Protocol: "C", Tick: msD(20), PingInterval: msD(100), PingTimeout: msD(20000), KoTimeout: msD(20000),
		Listen: freeAddr(t), Peer: freeAddr(t), NodeID: 2, Role: "secondary", Dial: "no"}
	b := newNode(t, filepath.Join(base, "b"), 1<<20, set, nil)
	t.Cleanup(b.stop)
	r := b.r

	// inject runs fn on the loop, as one batch followed by process.
	inject := func(fn func()) {
		t.Helper()
		if err := r.call(func() error { fn(); return nil }); err != nil {
			t.Fatal(err)
		}
	}
	linkEpoch := func() (e uint64, up bool) {
		inject(func() {
			if r.link != nil {
				e, up = r.link.epoch, true
			}
		})
		return
	}
	// expectHello: the first frame on the attempt's data connection is
	// this node's Hello (sent at Connect).
	expectHello := func(f *fakeHalves, what string) {
		t.Helper()
		m, err := readFrame(f.peerData, bufio.NewReader(f.peerData), 5*time.Second)
		if err != nil || m.Type != repl.MsgHello {
			t.Fatalf("%s: first frame on the new data connection: %v %v, want a Hello", what, m.Type, err)
		}
	}

	first := newFakeHalves(t, 100)
	inject(func() {
		for _, ev := range first.events() {
			r.handle(ev)
		}
	})
	expectHello(first, "first pair")
	e1, up := linkEpoch()
	if !up {
		t.Fatal("first pair: no link")
	}

	// The first link fails and the second pair completes in one batch.
	second := newFakeHalves(t, 101)
	inject(func() {
		r.handle(event{kind: evLinkErr, epoch: e1, err: errors.New("read: EOF")})
		for _, ev := range second.events() {
			r.handle(ev)
		}
	})
	if _, up := linkEpoch(); !up {
		t.Fatal("second pair: the disconnect of the lost link dropped the new one")
	}
	expectHello(second, "second pair")

	// And whatever happened to the previous link, a new pair always gets
	// a fresh handshake.
	third := newFakeHalves(t, 102)
	inject(func() {
		for _, ev := range third.events() {
			r.handle(ev)
		}
	})
	expectHello(third, "third pair")

	// Even if the link is gone without the node being told (no driver path
	// does this now), the next pair must not find the node still in
	// Handshake: it gets a fresh handshake, Hello first.
	inject(func() { r.dropLink() })
	fourth := newFakeHalves(t, 103)
	inject(func() {
		for _, ev := range fourth.events() {
			r.handle(ev)
		}
	})
	expectHello(fourth, "fourth pair")
	if st := r.Status(); st.Conn != "Handshake" {
		t.Fatalf("after the fourth pair: %s, want Handshake", st.Conn)
	}
}
