package repl_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmsan/vmsan/internal/nbd/client"
)

// logHas reports whether one line of n's serve.log contains every want.
func (n *node) logHas(want ...string) bool {
	b, _ := os.ReadFile(filepath.Join(n.dir, "serve.log"))
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

// floodNBD opens up to max NBD connections to n that complete the
// handshake and then stay idle (a connection still in the handshake is
// capped separately and closed past the cap, so only finished handshakes
// can use up the server's descriptors). It stops at the first that does
// not get through (the server is out of descriptors and no longer
// accepts) and returns the open ones.
func floodNBD(t *testing.T, n *node, max int) []*client.Conn {
	t.Helper()
	var conns []*client.Conn
	for range max {
		c, err := client.Dial(context.Background(), n.uri(), &client.Options{Connections: 1, DialTimeout: 2 * time.Second})
		if err != nil {
			break
		}
		conns = append(conns, c)
	}
	t.Logf("%d idle NBD connections to %s", len(conns), n.name)
	return conns
}

func closeAll(conns []*client.Conn) {
	for _, c := range conns {
		c.Close()
	}
}

// TestReconnectAfterFdFlood: node b (the accepting side, RLIMIT_NOFILE
// 256) runs out of file descriptors through its NBD port (idle
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
	flood := floodNBD(t, p.b, 400)
	defer func() { closeAll(flood) }()
	waitUntil(t, "b out of descriptors (NBD accept failing)", 10*time.Second, func() bool {
		return p.b.logHas("nbd: accept failed", "too many open files")
	})
	p.px.Refuse(false)
	// The primary dials every 500 ms: its connections reach b's backlog
	// and b's accept fails meanwhile.
	time.Sleep(2 * time.Second)
	closeAll(flood)
	flood = nil
	// Write on the primary while reconnecting: the resync must carry it.
	mustIO(t, p.a.uri(), "write -P 0x3c 0 1M")
	p.waitSynced(t, 30*time.Second)
	if p.a.rawSum() != p.b.rawSum() {
		t.Fatal("replicas differ after the reconnect")
	}
	// The volume's listener (shared by the node's volumes on that
	// address) is named by its address.
	if !p.b.logHas("repl "+p.b.replAddr+": accept failed, retrying", "too many open files") {
		t.Error("b did not log its replication accept failures")
	}
}

// TestMetadataWriteDuringFdFlood: the primary (RLIMIT_NOFILE 256) is
// Connected when a flood of idle NBD connections takes all its file
// descriptors; then the link breaks and a client that connected before
// the flood writes. Those writes need metadata writes (generations,
// bitmap: atomic file replaces, each a new descriptor) while the process
// has none. The primary uses its descriptor reserve or holds the
// acknowledgements and retries; it must not stop replication. After the
// flood the pair reconnects, resyncs, and every acknowledged write is on
// both replicas. Before, the first EMFILE stopped replication for good
// ("replication metadata write failed; stopping replication"), the
// writes failed with EIO and the pair never reconnected.
func TestMetadataWriteDuringFdFlood(t *testing.T) {
	// Whether a metadata write meets the exhausted descriptors depends on
	// how the machine schedules the daemon's goroutines against the
	// flood; a round where none did checks nothing about this path, so
	// it is run again (a fresh pair), up to 3 times. Every round checks
	// that no acknowledged write is lost.
	for round := 1; ; round++ {
		if metadataWriteDuringFdFlood(t) {
			return
		}
		if round == 3 {
			t.Fatal("no metadata write ran out of descriptors during the flood in 3 rounds")
		}
		t.Logf("round %d: no metadata write ran out of descriptors; again", round)
	}
}

// metadataWriteDuringFdFlood is one round of TestMetadataWriteDuringFdFlood;
// it reports whether a metadata write ran out of descriptors.
func metadataWriteDuringFdFlood(t *testing.T) bool {
	p := newPair(t, pairOpts{nofileA: 256})
	c, err := client.Dial(context.Background(), p.a.uri(), &client.Options{Connections: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// One write while connected: the link is live when the flood starts.
	if _, err := c.WriteAt(bytes.Repeat([]byte{0x11}, 1<<20), 0); err != nil {
		t.Fatal(err)
	}
	flood := floodNBD(t, p.a, 400)
	defer func() { closeAll(flood) }()
	waitUntil(t, "a out of descriptors (NBD accept failing)", 10*time.Second, func() bool {
		return p.a.logHas("nbd: accept failed", "too many open files")
	})
	// The link breaks while a has no descriptor left; a must record the
	// writes that follow as out of sync, durably, before acknowledging.
	p.px.Refuse(true)
	// The broken link frees a's two replication sockets: take them (and
	// any other descriptor freed meanwhile) with more idle connections,
	// or the metadata writes below may find them free, depending on how
	// the machine schedules the two (seen on a loaded 2-core machine).
	waitUntil(t, "a to notice the cut link", 10*time.Second, func() bool { return p.a.status().Conn != "Connected" })
	flood = append(flood, floodNBD(t, p.a, 50)...)
	const nw = 8
	done := make(chan error, 1)
	go func() {
		for i := range nw {
			buf := bytes.Repeat([]byte{byte(0x40 + i)}, 1<<20)
			// 4 MiB apart: each write a new activity log extent.
			if _, err := c.WriteAt(buf, int64(1+4*i)<<20); err != nil {
				done <- err
				return
			}
		}
		done <- c.Flush()
	}()
	// Give the writes time to run into the exhausted descriptors (or be
	// acknowledged through the reserve) before the flood ends.
	var werr error
	select {
	case werr = <-done:
		done = nil
	case <-time.After(3 * time.Second):
	}
	closeAll(flood)
	flood = nil
	if done != nil {
		select {
		case werr = <-done:
		case <-time.After(30 * time.Second):
			t.Fatal("writes still not acknowledged 30 s after the flood ended")
		}
	}
	if werr != nil {
		t.Fatalf("client write during the flood: %v (a stopped replication: %v)", werr, p.a.logHas("stopping replication"))
	}
	if p.a.logHas("stopping replication") {
		t.Fatal("a stopped replication on a metadata write while out of descriptors")
	}
	p.px.Refuse(false)
	p.waitSynced(t, 30*time.Second)
	if p.a.rawSum() != p.b.rawSum() {
		t.Fatal("replicas differ after the flood")
	}
	raw, err := os.ReadFile(filepath.Join(p.b.dir, "volumes", volName+".raw"))
	if err != nil {
		t.Fatal(err)
	}
	for i := range nw {
		off := int64(1+4*i) << 20
		if !bytes.Equal(raw[off:off+1<<20], bytes.Repeat([]byte{byte(0x40 + i)}, 1<<20)) {
			t.Fatalf("acknowledged write %d (offset %d) missing on b", i, off)
		}
	}
	if !bytes.Equal(raw[:1<<20], bytes.Repeat([]byte{0x11}, 1<<20)) {
		t.Fatal("the write before the flood is missing on b")
	}
	reserve, held := p.a.logHas("released the descriptor reserve"), p.a.logHas("acknowledgements held")
	t.Logf("descriptor reserve used: %v; acknowledgements held: %v", reserve, held)
	return reserve || held
}
