package repl_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmsan/vmsan/internal/daemon"
	"github.com/vmsan/vmsan/internal/repl/driver"
)

// writeConfig writes a daemon config file declaring volName with a
// replication section.
func writeConfig(t *testing.T, n *node, repl string) {
	t.Helper()
	if err := os.MkdirAll(n.dir, 0o755); err != nil {
		t.Fatal(err)
	}
	y := fmt.Sprintf(`data_dir: %s
listen: [%q]
no_default_volume: true
volumes:
  - name: %s
    size: 32M
    replication:
%s`, n.dir, n.nbd, volName, repl)
	n.config = filepath.Join(n.dir, "vmsan.yaml")
	if err := os.WriteFile(n.config, []byte(y), 0o644); err != nil {
		t.Fatal(err)
	}
}

// Replication configured only by the YAML file: two daemons started with
// --config connect, the secondary is synced with what the primary held
// before it came up, later writes replicate, and the settings from the
// file (protocol B, split-brain policy) are the ones in effect. Then the
// delete rules: a replicated volume is deleted only with --force, and its
// replication state goes with it (through the daemon and without one).
func TestConfigFileReplication(t *testing.T) {
	need(t, "qemu-io")
	base := t.TempDir()
	a := &node{t: t, name: "a", dir: filepath.Join(base, "a"), nbd: freeAddr(t), replAddr: freeAddr(t)}
	b := &node{t: t, name: "b", dir: filepath.Join(base, "b"), nbd: freeAddr(t), replAddr: freeAddr(t)}
	common := `      protocol: B
      ping_interval: 100ms
      ping_timeout: 1s
      ko_timeout: 20s
      resync_rate: 500M
      split_brain_policy: discard-zero-changes
      shared_secret: ` + pairSecret + `
`
	writeConfig(t, a, fmt.Sprintf("      listen: %s\n      peer: %s\n      role: primary\n      dial: \"yes\"\n%s", a.replAddr, b.replAddr, common))
	writeConfig(t, b, fmt.Sprintf("      listen: %s\n      peer: %s\n      role: secondary\n      dial: \"no\"\n%s", b.replAddr, a.replAddr, common))
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

	// The primary alone first: data written before the secondary exists
	// must reach it by resync.
	a.start()
	if st := a.status(); st.Role != "Primary" || st.Protocol != "B" || st.Peer != b.replAddr {
		t.Fatalf("config file not applied on a: %+v", st)
	}
	mustIO(t, a.uri(), "write -P 0x5a 0 1M", "write -P 0xa5 8M 512k", "flush")
	b.start()
	p.waitSynced(t, 30*time.Second)
	if st := b.status(); st.Role != "Secondary" || st.Protocol != "B" {
		t.Fatalf("config file not applied on b: %+v", st)
	}
	mustIO(t, a.uri(), "write -P 0x33 4M 256k", "flush")
	p.waitSynced(t, 30*time.Second)
	if a.rawSum() != b.rawSum() {
		t.Fatal("replicas differ after sync from config-file replication")
	}
	// And they hold what was written (not, say, two empty files).
	raw, err := os.ReadFile(filepath.Join(b.dir, "volumes", volName+".raw"))
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []struct {
		off, n int
		pat    byte
	}{{0, 1 << 20, 0x5a}, {4 << 20, 256 << 10, 0x33}, {8 << 20, 512 << 10, 0xa5}} {
		if got := raw[w.off : w.off+w.n]; string(got) != strings.Repeat(string([]byte{w.pat}), w.n) {
			t.Fatalf("secondary's copy at %d: not the 0x%x pattern written on the primary", w.off, w.pat)
		}
	}

	// Deleting a replicated volume through the daemon: refused without
	// --force, with a message that says why.
	out, err := exec.Command(vmsanBin, "volume", "delete", volName, "--data-dir", b.dir).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "replicated") {
		t.Fatalf("delete of a replicated volume without --force: err=%v, output %q", err, out)
	}
	replDir := driver.Dir(b.dir, volName)
	if _, err := os.Stat(filepath.Join(replDir, "config.json")); err != nil {
		t.Fatalf("refused delete touched the replication state: %v", err)
	}
	b.run("volume", "delete", volName, "--force")
	if _, err := os.Stat(replDir); !os.IsNotExist(err) {
		t.Fatalf("replication state still there after delete: %v", err)
	}
	dc, err := daemon.Dial(b.dir)
	if err != nil {
		t.Fatal(err)
	}
	var sts []driver.Status
	err = dc.Do("GET", "/v1/repl", nil, &sts)
	dc.Close()
	if err != nil || len(sts) != 0 {
		t.Fatalf("replica still running after its volume was deleted: %+v %v", sts, err)
	}
	// The primary notices and keeps serving.
	waitUntil(t, "a sees the peer gone", 20*time.Second, func() bool { return a.status().Conn != "Connected" })
	mustIO(t, a.uri(), "write -P 0x44 0 64k")

	// Without a daemon: the same rule on a stopped node.
	a.stop()
	out, err = exec.Command(vmsanBin, "volume", "delete", volName, "--data-dir", a.dir).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "replicated") {
		t.Fatalf("offline delete of a replicated volume without --force: err=%v, output %q", err, out)
	}
	a.run("volume", "delete", volName, "--force")
	if _, err := os.Stat(driver.Dir(a.dir, volName)); !os.IsNotExist(err) {
		t.Fatalf("replication state still there after offline delete: %v", err)
	}
}
