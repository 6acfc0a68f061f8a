package driver

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/vmsan/vmsan/internal/ioengine"
)

// Two volumes replicated between the same two nodes over one listener per
// node, each with its own secret: both pairs connect and replicate; a
// dialer that proves one volume's secret cannot reach the other volume
// (nor a volume that is not there); a volume leaving the listener does not
// disturb the other; the port closes with the last volume.
func TestSharedListenerVolumes(t *testing.T) {
	aAddr, bAddr := freeAddr(t), freeAddr(t)
	la, lb := NewListeners(quietLog()), NewListeners(quietLog())
	base := t.TempDir()
	secrets := map[string]string{"v1": "volume-one-secret-0123456789", "v2": "volume-two-secret-9876543210"}
	mk := func(side, name string, set Settings, lns *Listeners) *node {
		dir := filepath.Join(base, side+name)
		os.MkdirAll(dir, 0o755)
		set.SharedSecret = secrets[name]
		return newNodeWith(&node{t: t, dir: dir, path: filepath.Join(dir, "vol.raw"), set: set, name: name, lns: lns}, 8<<20)
	}
	common := Settings{Protocol: "C", Tick: msD(20), PingInterval: msD(100), PingTimeout: msD(2000), KoTimeout: msD(10000)}
	sa, sb := common, common
	sa.Listen, sa.Peer, sa.NodeID, sa.Role, sa.Dial = aAddr, bAddr, 1, "primary", "yes"
	sb.Listen, sb.Peer, sb.NodeID, sb.Role, sb.Dial = bAddr, aAddr, 2, "secondary", "no"
	a1, a2 := mk("a", "v1", sa, la), mk("a", "v2", sa, la)
	b1, b2 := mk("b", "v1", sb, lb), mk("b", "v2", sb, lb)
	stopped := map[*node]bool{}
	t.Cleanup(func() {
		for _, n := range []*node{a1, a2, b1, b2} {
			if !stopped[n] {
				n.stop()
			}
		}
	})
	if a1.r.Addr().String() != a2.r.Addr().String() || b1.r.Addr().String() != bAddr || b2.r.Addr().String() != bAddr {
		t.Fatalf("volumes do not share the listener: %v %v %v %v", a1.r.Addr(), a2.r.Addr(), b1.r.Addr(), b2.r.Addr())
	}
	for _, n := range []*node{a1, a2, b1, b2} {
		waitFor(t, "connect", 10*time.Second, connected(n))
	}
	for i, p := range [][2]*node{{a1, b1}, {a2, b2}} {
		if err := p[0].write(0, pattern(byte(i+1), 64<<10)); err != nil {
			t.Fatal(err)
		}
		if err := p[0].do(ioengine.OpFlush, 0, nil, 0); err != nil {
			t.Fatal(err)
		}
		if p[0].sum() != p[1].sum() {
			t.Fatalf("pair %d: replicas differ after a protocol C flush", i+1)
		}
	}

	// One volume's secret does not open another volume.
	for _, c := range []struct{ name, secret string }{{"v2", secrets["v1"]}, {"v1", secrets["v2"]}, {"nope", secrets["v1"]}} {
		conn, err := net.Dial("tcp", bAddr)
		if err != nil {
			t.Fatal(err)
		}
		err = DialHandshake(conn, chData, 42, HandshakeParams{Name: c.name, NodeID: 99, Secret: []byte(c.secret)})
		conn.Close()
		if err == nil {
			t.Fatalf("volume %s opened with another volume's secret", c.name)
		}
		if c.name != "nope" && !errors.Is(err, ErrAuth) {
			t.Fatalf("volume %s with another volume's secret: %v, want an authentication failure", c.name, err)
		}
	}
	for _, n := range []*node{a1, a2, b1, b2} {
		if c := n.r.Status().Conn; c != "Connected" {
			t.Fatalf("a refused intruder disturbed a pair: %s", c)
		}
	}

	// v1 leaves both listeners; v2 goes on.
	b1.stop()
	a1.stop()
	stopped[a1], stopped[b1] = true, true
	if err := a2.write(1<<20, pattern(9, 64<<10)); err != nil {
		t.Fatal(err)
	}
	if err := a2.do(ioengine.OpFlush, 0, nil, 0); err != nil {
		t.Fatal(err)
	}
	if a2.sum() != b2.sum() || b2.r.Status().Conn != "Connected" {
		t.Fatal("the other volume was disturbed by one leaving the shared listener")
	}
	b2.stop()
	stopped[b2] = true
	if c, err := net.DialTimeout("tcp", bAddr, time.Second); err == nil {
		c.Close()
		t.Fatal("shared listener still open after its last volume left")
	}
}
