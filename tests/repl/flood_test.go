package repl_test

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestReconnectAfterFdFlood: node b (the accepting side, RLIMIT_NOFILE
// 256) runs out of file descriptors through its NBD port (400 silent
// connections) while the replication link is down, and the primary's
// reconnects reach b's replication listener while accept fails with
// EMFILE. The failure is logged and accept retried: once the flood ends
// the pair reconnects and resyncs. Before, b's replication accept loop
// ended silently at the first error and the pair never reconnected.
func TestReconnectAfterFdFlood(t *testing.T) {
	p := newPair(t, pairOpts{nofileB: 256})
	// Cut the link first (b persists the state change while it still
	// has descriptors), then exhaust b's descriptors, then let the
	// primary's reconnects through to b's replication listener.
	p.px.Refuse(true)
	waitUntil(t, "b to notice the cut link", 10*time.Second, func() bool { return p.b.status().Conn != "Connected" })
	var flood []net.Conn
	defer func() {
		for _, c := range flood {
			c.Close()
		}
	}()
	for range 400 {
		c, err := net.DialTimeout("tcp", p.b.nbd, 2*time.Second)
		if err != nil {
			break
		}
		flood = append(flood, c)
	}
	t.Logf("%d connections to b's NBD port", len(flood))
	logHas := func(want ...string) bool {
		b, _ := os.ReadFile(filepath.Join(p.b.dir, "serve.log"))
		for _, l := range strings.Split(string(b), "\n") {
			ok := true
			for _, w := range want {
				ok = ok && strings.Contains(l, w)
			}
			if ok {
				return true
			}
		}
		return false
	}
	waitUntil(t, "b out of descriptors (NBD accept failing)", 10*time.Second, func() bool {
		return logHas("nbd: accept failed", "too many open files")
	})
	p.px.Refuse(false)
	// The primary dials every 500 ms: its connections reach b's backlog
	// and b's accept fails meanwhile.
	time.Sleep(2 * time.Second)
	for _, c := range flood {
		c.Close()
	}
	flood = nil
	// Write on the primary while reconnecting: the resync must carry it.
	mustIO(t, p.a.uri(), "write -P 0x3c 0 1M")
	p.waitSynced(t, 30*time.Second)
	if p.a.rawSum() != p.b.rawSum() {
		t.Fatal("replicas differ after the reconnect")
	}
	// The volume's listener (shared by the node's volumes on that
	// address) is named by its address.
	if !logHas("repl "+p.b.replAddr+": accept failed, retrying", "too many open files") {
		t.Error("b did not log its replication accept failures")
	}
}
