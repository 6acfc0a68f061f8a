package repl_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmsan/vmsan/internal/nbd/client"
)

// vmsanFails runs vmsan and returns its output, failing the test if the
// command succeeds.
func (n *node) vmsanFails(args ...string) string {
	n.t.Helper()
	out, err := exec.Command(vmsanBin, append(args, "--data-dir", n.dir)...).CombinedOutput()
	if err == nil {
		n.t.Fatalf("vmsan %v succeeded, want a refusal:\n%s", args, out)
	}
	return string(out)
}

// Demoting the primary while a client holds the volume open is refused
// (DRBD's "Device is held open"): the client would keep a read-write disk
// whose next write fails. --force demotes anyway; without clients demote
// just works.
func TestDemoteRefusedWhileClientConnected(t *testing.T) {
	p := newPair(t, pairOpts{size: "16M"})
	c, err := client.Dial(context.Background(), p.a.uri(), &client.Options{Connections: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	buf := make([]byte, 4096)
	if _, err := c.WriteAt(buf, 0); err != nil {
		t.Fatal(err)
	}
	out := p.a.vmsanFails("repl", "demote", volName)
	if !strings.Contains(out, "held open") || !strings.Contains(out, "--force") {
		t.Fatalf("refusal does not say why or how to override:\n%s", out)
	}
	out = p.a.vmsanFails("volume", "demote", volName)
	if !strings.Contains(out, "held open") {
		t.Fatalf("volume demote: %s", out)
	}
	if st := p.a.status(); st.Role != "Primary" {
		t.Fatalf("demoted although refused: %+v", st)
	}
	if _, err := c.WriteAt(buf, 4096); err != nil {
		t.Fatalf("client write after the refused demote: %v", err)
	}
	// Forced: the client's next write fails (it was warned).
	p.a.run("volume", "demote", volName, "--force")
	if st := p.a.status(); st.Role != "Secondary" {
		t.Fatalf("forced demote: %+v", st)
	}
	if _, err := c.WriteAt(buf, 8192); err == nil {
		t.Fatal("write accepted after a forced demote")
	}
	c.Close()
	// Without clients (once the server has let go of the connection) a
	// plain demote works.
	p.a.run("repl", "promote", volName)
	waitUntil(t, "demote without clients", 10*time.Second, func() bool {
		return exec.Command(vmsanBin, "repl", "demote", volName, "--data-dir", p.a.dir).Run() == nil
	})
	if st := p.a.status(); st.Role != "Secondary" {
		t.Fatalf("demote: %+v", st)
	}
}

// Resizing one copy of a replicated volume is refused, online (through
// the daemon) and offline (on the directory), with a message saying how
// to do it; the pair still reconnects afterwards.
func TestResizeReplicatedRefused(t *testing.T) {
	p := newPair(t, pairOpts{size: "16M"})
	for _, n := range []*node{p.a, p.b} {
		out := n.vmsanFails("volume", "resize", volName, "32M")
		if !strings.Contains(out, "replicated") || !strings.Contains(out, "docs/replication.md") {
			t.Fatalf("%s: online resize refusal unclear:\n%s", n.name, out)
		}
	}
	p.b.stop()
	out := p.b.vmsanFails("volume", "resize", volName, "32M")
	if !strings.Contains(out, "replicated") {
		t.Fatalf("offline resize refusal unclear:\n%s", out)
	}
	for _, n := range []*node{p.a, p.b} {
		if fi, err := os.Stat(filepath.Join(n.dir, "volumes", volName+".raw")); err != nil || fi.Size() != 16<<20 {
			t.Fatalf("%s: raw file after the refused resizes: %v %v", n.name, fi, err)
		}
	}
	p.b.start()
	p.waitSynced(t, 30*time.Second)
	mustIO(t, p.a.uri(), "write -P 0x71 15M 1M", "flush")
	p.waitSynced(t, 30*time.Second)
	if p.a.rawSum() != p.b.rawSum() {
		t.Fatal("replicas differ")
	}
}
