package repl_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/vmsan/vmsan/internal/daemon"
	"github.com/vmsan/vmsan/internal/nbd/client"
	"github.com/vmsan/vmsan/internal/repl/driver"
)

// ioLoop is an NBD client writing and reading back 4 KiB blocks on one
// volume until stopped; every error is kept. pause/unpause hold it between
// two blocks (to compare the replicas' bytes).
type ioLoop struct {
	c      *client.Conn
	hold   sync.Mutex
	stop   chan struct{}
	done   chan struct{}
	n      atomic.Int64
	mu     sync.Mutex
	errs   []error
	blocks int64
}

func startIO(t *testing.T, uri string, blocks int64) *ioLoop {
	t.Helper()
	c, err := client.Dial(context.Background(), uri, &client.Options{Connections: 1})
	if err != nil {
		t.Fatal(err)
	}
	l := &ioLoop{c: c, stop: make(chan struct{}), done: make(chan struct{}), blocks: blocks}
	go l.run()
	t.Cleanup(func() { l.halt(); c.Close() })
	return l
}

func (l *ioLoop) run() {
	defer close(l.done)
	w, r := make([]byte, 4096), make([]byte, 4096)
	for i := int64(0); ; i++ {
		select {
		case <-l.stop:
			return
		default:
		}
		l.hold.Lock()
		off := (i % l.blocks) * 4096
		for j := range w {
			w[j] = byte(i + int64(j)/512)
		}
		binary.LittleEndian.PutUint64(w, uint64(i))
		_, err := l.c.WriteAt(w, off)
		if err == nil {
			_, err = l.c.ReadAt(r, off)
			if err == nil && !bytes.Equal(w, r) {
				err = fmt.Errorf("block at %d: read back differs from the write %d", off, i)
			}
		}
		l.hold.Unlock()
		if err != nil {
			l.mu.Lock()
			l.errs = append(l.errs, err)
			l.mu.Unlock()
			if len(l.errs) > 20 {
				return
			}
		}
		l.n.Add(1)
		time.Sleep(2 * time.Millisecond) // a steady trickle on a shared machine
	}
}

func (l *ioLoop) halt() {
	select {
	case <-l.stop:
	default:
		close(l.stop)
	}
	<-l.done
}

func (l *ioLoop) check(t *testing.T, what string) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.errs) > 0 {
		t.Fatalf("%s: client saw %d I/O error(s), first: %v", what, len(l.errs), l.errs[0])
	}
}

// progress waits until the loop completed more blocks (it is not stuck).
func (l *ioLoop) progress(t *testing.T, what string) {
	t.Helper()
	n := l.n.Load()
	waitUntil(t, what+": client I/O progresses", 30*time.Second, func() bool { return l.n.Load() > n+20 })
}

func (n *node) replStatuses() []driver.Status {
	n.t.Helper()
	c, err := daemon.Dial(n.dir)
	if err != nil {
		n.t.Fatalf("%s: %v", n.name, err)
	}
	defer c.Close()
	var st []driver.Status
	if err := c.Do("GET", "/v1/repl", nil, &st); err != nil {
		n.t.Fatalf("%s: repl status: %v", n.name, err)
	}
	return st
}

// sameBytes waits until the raw files of vm1 on a and b are byte-equal
// (the client is held, so the primary's copy does not move).
func sameBytes(t *testing.T, a, b *node) {
	t.Helper()
	waitUntil(t, fmt.Sprintf("%s and %s byte-equal", a.name, b.name), 30*time.Second, func() bool { return a.rawSum() == b.rawSum() })
}

// Replication changed on running daemons: added to a plain volume, its
// protocol changed, re-peered to a third node, removed, all with
// `vmsan repl configure` / `vmsan repl remove` and no restart. An NBD
// client does I/O on the replicated volume and another on a second volume
// of the same daemon throughout: neither ever sees an error (the clients
// stay connected across every change).
func TestRuntimeReplicationChanges(t *testing.T) {
	base := t.TempDir()
	mk := func(name string) *node {
		return &node{t: t, name: name, dir: filepath.Join(base, name), nbd: freeAddr(t), replAddr: freeAddr(t)}
	}
	n1, n2, n3 := mk("n1"), mk("n2"), mk("n3")
	for _, n := range []*node{n1, n2, n3} {
		os.MkdirAll(n.dir, 0o755)
		n.run("volume", "create", volName, "--size", "16M")
	}
	n1.run("volume", "create", "vmb", "--size", "8M")
	for _, n := range []*node{n1, n2, n3} {
		n.start()
	}
	t.Cleanup(func() {
		for _, n := range []*node{n1, n2, n3} {
			n.stop()
			if t.Failed() {
				b, _ := os.ReadFile(filepath.Join(n.dir, "serve.log"))
				t.Logf("%s serve.log (tail):\n%s", n.name, tail(string(b), 30))
			}
		}
	})
	secret := secretFile(t, base, pairSecret)
	common := []string{"--tick-ms", "20", "--ping-interval", "5", "--ping-timeout", "50", "--ko-ticks", "500", "--shared-secret-file", secret}
	configure := func(n *node, peer *node, role, dial string, extra ...string) {
		t.Helper()
		args := append([]string{"repl", "configure", volName, "--listen", n.replAddr, "--peer", peer.replAddr, "--role", role, "--dial", dial}, common...)
		out := n.run(append(args, extra...)...)
		if !strings.Contains(out, "applied now") {
			t.Fatalf("%s: repl configure on a running daemon did not apply at once:\n%s", n.name, out)
		}
	}

	ioA := startIO(t, "nbd://"+n1.nbd+"/"+volName, 256) // the first MiB of A
	ioB := startIO(t, "nbd://"+n1.nbd+"/vmb", 128)
	ioA.progress(t, "before replication")

	// 1. Replication added to the plain volume on both running daemons.
	configure(n2, n1, "secondary", "no")
	configure(n1, n2, "primary", "yes")
	p12 := &pairT{a: n1, b: n2}
	p12.waitSynced(t, 60*time.Second)
	ioA.progress(t, "replicated")
	ioA.hold.Lock()
	sameBytes(t, n1, n2)
	ioA.hold.Unlock()
	ioA.check(t, "adding replication")
	ioB.check(t, "adding replication (other volume)")

	// 1b. Timeouts and rates change in place: the link stays up.
	before := n1.status().Disconnects
	configure(n1, n2, "primary", "yes", "--resync-rate", "200M", "--ko-ticks", "400")
	if st := n1.status(); st.Conn != "Connected" || st.Disconnects != before {
		t.Fatalf("retuning dropped the link: %s, disconnects %d -> %d", st.Conn, before, st.Disconnects)
	}
	if b, _ := os.ReadFile(filepath.Join(n1.dir, "serve.log")); !strings.Contains(string(b), "replication settings applied in place") {
		t.Fatal("rates and timeouts not applied in place (no log line)")
	}

	// 2. Protocol changed at runtime (both sides; they refuse to connect
	// while they differ, then resync what was written meanwhile).
	configure(n1, n2, "primary", "yes", "--protocol", "A")
	configure(n2, n1, "secondary", "no", "--protocol", "A")
	waitUntil(t, "protocol A on both", 30*time.Second, func() bool {
		return n1.status().Protocol == "A" && n2.status().Protocol == "A"
	})
	// A node whose handshake was refused in between (protocols differed)
	// went StandAlone; configure again connects it (as drbdadm adjust).
	configure(n1, n2, "primary", "yes", "--protocol", "A")
	configure(n2, n1, "secondary", "no", "--protocol", "A")
	p12.waitSynced(t, 60*time.Second)
	ioA.progress(t, "protocol A")
	ioA.check(t, "changing the protocol")

	// 3. Re-peered to a third node: n2 drops out, n3 (a fresh copy that
	// never shared a generation with n1) gets a full sync, holes skipped.
	n2.run("repl", "remove", volName)
	if st := n2.replStatuses(); len(st) != 0 {
		t.Fatalf("n2 still replicating after remove: %+v", st)
	}
	configure(n3, n1, "secondary", "no", "--protocol", "A")
	configure(n1, n3, "primary", "yes", "--protocol", "A")
	p13 := &pairT{a: n1, b: n3}
	p13.waitSynced(t, 60*time.Second)
	st := n1.status()
	if st.Peer != n3.replAddr || !strings.Contains(st.Decision, "full-source") {
		t.Fatalf("re-peered replica: peer %s (want %s), decision %q (want a full sync)", st.Peer, n3.replAddr, st.Decision)
	}
	if st.ResyncZeroBytes == 0 || st.ResyncBytes >= 16<<20 {
		t.Fatalf("full sync to the new peer did not skip holes: sent %d B, zero ranges %d B", st.ResyncBytes, st.ResyncZeroBytes)
	}
	t.Logf("re-peer: decision %q, resync sent %d B, zero ranges %d B", st.Decision, st.ResyncBytes, st.ResyncZeroBytes)
	ioA.progress(t, "re-peered")
	ioA.hold.Lock()
	sameBytes(t, n1, n3)
	ioA.hold.Unlock()
	ioA.check(t, "re-peering")

	// 4. Replication removed: a plain volume again, the client still on it.
	n1.run("repl", "remove", volName)
	if st := n1.replStatuses(); len(st) != 0 {
		t.Fatalf("n1 still replicating after remove: %+v", st)
	}
	if _, err := os.Stat(driver.Dir(n1.dir, volName)); !os.IsNotExist(err) {
		t.Fatalf("replication state left after remove: %v", err)
	}
	c, err := daemon.Dial(n1.dir)
	if err != nil {
		t.Fatal(err)
	}
	ds, err := c.Status()
	c.Close()
	if _, ok := ds.Extra["replication"]; err != nil || ok {
		t.Fatalf("status of a daemon with no replicated volume: replication section %v (%v)", ds.Extra["replication"], err)
	}
	ioA.progress(t, "plain again")
	ioA.check(t, "removing replication")
	ioB.check(t, "every change (other volume)")
	t.Logf("client blocks written and read back: A %d, B %d", ioA.n.Load(), ioB.n.Load())
	if ioB.n.Load() == 0 {
		t.Fatal("no I/O on the other volume")
	}
}

// Two volumes replicated between the same two daemons through one listen
// address per node (one listener, volumes told apart by the hello), each
// with its own secret, configured at runtime: both pairs sync and stay
// byte-equal under writes.
func TestSharedListenAddress(t *testing.T) {
	need(t, "qemu-io")
	base := t.TempDir()
	mk := func(name string) *node {
		return &node{t: t, name: name, dir: filepath.Join(base, name), nbd: freeAddr(t), replAddr: freeAddr(t)}
	}
	n1, n2 := mk("n1"), mk("n2")
	vols := []string{volName, "vm2"}
	for _, n := range []*node{n1, n2} {
		os.MkdirAll(n.dir, 0o755)
		for _, v := range vols {
			n.run("volume", "create", v, "--size", "8M")
		}
		n.start()
	}
	t.Cleanup(func() {
		for _, n := range []*node{n1, n2} {
			n.stop()
			if t.Failed() {
				b, _ := os.ReadFile(filepath.Join(n.dir, "serve.log"))
				t.Logf("%s serve.log (tail):\n%s", n.name, tail(string(b), 30))
			}
		}
	})
	for i, v := range vols {
		secret := secretFile(t, base, fmt.Sprintf("%s-secret-%d-0123456789abcdef", v, i))
		common := []string{"--tick-ms", "20", "--ping-interval", "5", "--ping-timeout", "50", "--shared-secret-file", secret}
		n2.run(append([]string{"repl", "configure", v, "--listen", n2.replAddr, "--peer", n1.replAddr, "--role", "secondary", "--dial", "no"}, common...)...)
		n1.run(append([]string{"repl", "configure", v, "--listen", n1.replAddr, "--peer", n2.replAddr, "--role", "primary", "--dial", "yes"}, common...)...)
	}
	synced := func() bool {
		for _, n := range []*node{n1, n2} {
			st := n.replStatuses()
			if len(st) != 2 {
				return false
			}
			for _, s := range st {
				if s.Conn != "Connected" || s.Disk != "UpToDate" || s.OutOfSync != 0 || s.Listen != n.replAddr {
					return false
				}
			}
		}
		return true
	}
	waitUntil(t, "both volumes synced over one listener per node", 60*time.Second, synced)
	for i, v := range vols {
		mustIO(t, "nbd://"+n1.nbd+"/"+v, fmt.Sprintf("write -P 0x%x 0 1M", 0x31+i), "flush")
	}
	for _, v := range vols {
		sum := func(n *node) [32]byte {
			b, err := os.ReadFile(filepath.Join(n.dir, "volumes", v+".raw"))
			if err != nil {
				t.Fatal(err)
			}
			return sha256.Sum256(b)
		}
		waitUntil(t, v+" byte-equal", 30*time.Second, func() bool { return sum(n1) == sum(n2) })
	}
}

// A changed replication section of the configuration file applies on
// SIGHUP (no restart): both daemons move from protocol B to A and the pair
// reconnects and syncs.
func TestReloadAppliesReplication(t *testing.T) {
	need(t, "qemu-io")
	base := t.TempDir()
	a := &node{t: t, name: "a", dir: filepath.Join(base, "a"), nbd: freeAddr(t), replAddr: freeAddr(t)}
	b := &node{t: t, name: "b", dir: filepath.Join(base, "b"), nbd: freeAddr(t), replAddr: freeAddr(t)}
	section := func(n, peer *node, role, dial, proto string) string {
		return fmt.Sprintf("      listen: %s\n      peer: %s\n      role: %s\n      dial: %q\n      protocol: %s\n      ping_interval: 100ms\n      ping_timeout: 1s\n      shared_secret: %s\n",
			n.replAddr, peer.replAddr, role, dial, proto, pairSecret)
	}
	writeConfig(t, a, section(a, b, "primary", "yes", "B"))
	writeConfig(t, b, section(b, a, "secondary", "no", "B"))
	p := &pairT{a: a, b: b}
	t.Cleanup(func() {
		a.stop()
		b.stop()
		if t.Failed() {
			for _, n := range []*node{a, b} {
				out, _ := os.ReadFile(filepath.Join(n.dir, "serve.log"))
				t.Logf("%s serve.log (tail):\n%s", n.name, tail(string(out), 30))
			}
		}
	})
	a.start()
	b.start()
	p.waitSynced(t, 30*time.Second)
	io := startIO(t, a.uri(), 128)
	io.progress(t, "before reload")
	writeConfig(t, a, section(a, b, "primary", "yes", "A"))
	writeConfig(t, b, section(b, a, "secondary", "no", "A"))
	for _, n := range []*node{a, b} {
		n.cmd.Process.Signal(syscall.SIGHUP)
	}
	waitUntil(t, "protocol A on both after SIGHUP", 30*time.Second, func() bool {
		return a.status().Protocol == "A" && b.status().Protocol == "A"
	})
	// A node whose handshake was refused while the other still had
	// protocol B went StandAlone (as DRBD): connect it.
	for _, n := range []*node{a, b} {
		if n.status().Conn == "StandAlone" {
			n.run("repl", "connect", volName)
		}
	}
	p.waitSynced(t, 30*time.Second)
	io.progress(t, "after reload")
	// The client stayed connected throughout (a restart would have
	// dropped it).
	io.check(t, "reloading replication settings")
}
