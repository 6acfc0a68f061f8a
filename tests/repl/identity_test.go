package repl_test

import (
	"crypto/rand"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmsan/vmsan/internal/daemon"
	"github.com/vmsan/vmsan/internal/repl/driver"
)

// A secondary whose raw file was replaced, or deleted, while it was down
// must not come back "UpToDate, 0 B out of sync" with other bytes: the
// volume store notices (data identity; a missing file is refused until
// `vmsan volume repair --recreate`), and replication restarts it as
// Inconsistent and fully resyncs it from the primary, until the two raw
// files are byte-equal. Before the fix the replaced file came back
// UpToDate with foreign data, and the deleted one was silently recreated
// as zeroes and also reported UpToDate.
func TestReplacedSecondaryDataFullSync(t *testing.T) {
	p := newPair(t, pairOpts{size: "32M"})
	raw := filepath.Join(p.b.dir, "volumes", volName+".raw")
	const size = 32 << 20
	mustIO(t, p.a.uri(), writes(0x31, 0, 256<<10, 1<<20, 24)...)
	p.waitSynced(t, 30*time.Second)

	// restartB brings the secondary back with the link held down, checks
	// it reports Inconsistent (not UpToDate) before it has talked to the
	// primary, then lets it connect and waits for a full sync.
	restartB := func(round string, written int64) {
		t.Helper()
		before := p.a.status().ResyncBytes
		p.px.Drop(true)
		p.b.start()
		if sb := p.b.status(); sb.Disk != "Inconsistent" || sb.Role != "Secondary" {
			t.Fatalf("%s: secondary came back %s/%s (want Secondary/Inconsistent): %+v", round, sb.Role, sb.Disk, sb)
		}
		p.px.Drop(false)
		p.waitSynced(t, 60*time.Second)
		sa := p.a.status()
		t.Logf("%s: decision %q, resync sent %d B", round, sa.Decision, sa.ResyncBytes-before)
		if !strings.Contains(sa.Decision, "full-source") {
			t.Errorf("%s: primary's decision %q, want a full sync", round, sa.Decision)
		}
		if got := sa.ResyncBytes - before; got < written {
			t.Errorf("%s: resync sent %d bytes, less than the %d the primary holds", round, got, written)
		}
		mustIO(t, p.a.uri(), "flush")
		if p.a.rawSum() != p.b.rawSum() {
			t.Fatalf("%s: raw files differ after the resync", round)
		}
	}

	// Round 1: replaced by another file of the same size (foreign bytes).
	p.b.stop()
	mustIO(t, p.a.uri(), writes(0x32, 16<<20, 256<<10, 1<<20, 8)...) // while it is down
	junk := make([]byte, 4<<20)
	rand.Read(junk)
	tmp := raw + ".new"
	if err := os.WriteFile(tmp, junk, 0o600); err != nil {
		t.Fatal(err)
	}
	os.Truncate(tmp, size)
	if err := os.Rename(tmp, raw); err != nil {
		t.Fatal(err)
	}
	restartB("replaced", 24*256<<10) // distinct bytes written: 24 × 256 KiB

	// Round 2: deleted. The store refuses to serve it and says how to
	// repair; it neither recreates the file nor lets replication run.
	p.b.stop()
	if err := os.Remove(raw); err != nil {
		t.Fatal(err)
	}
	p.px.Drop(true)
	p.b.start()
	c, err := daemon.Dial(p.b.dir)
	if err != nil {
		t.Fatal(err)
	}
	vi, err := c.Info(volName)
	var st []driver.Status
	c.Do("GET", "/v1/repl", nil, &st)
	c.Close()
	if err != nil || vi.Open || !strings.Contains(vi.Problem, "vmsan volume repair "+volName+" --recreate") {
		t.Fatalf("deleted raw file: info %+v %v", vi, err)
	}
	if len(st) != 0 {
		t.Fatalf("replication started on a volume with no data file: %+v", st)
	}
	if _, err := os.Stat(raw); !os.IsNotExist(err) {
		t.Fatalf("raw file recreated behind the operator's back: %v", err)
	}
	if log, _ := os.ReadFile(filepath.Join(p.b.dir, "serve.log")); !strings.Contains(string(log), "--recreate") {
		t.Fatalf("no repair command in the log:\n%s", tail(string(log), 20))
	}
	p.b.stop()
	// Repair is offline: refused while a daemon holds the directory.
	p.b.start()
	if out, err := exec.Command(vmsanBin, "volume", "repair", volName, "--recreate", "--data-dir", p.b.dir).CombinedOutput(); err == nil ||
		!strings.Contains(string(out), "stop vmsan serve first") {
		t.Fatalf("repair with the daemon running: %v\n%s", err, out)
	}
	p.b.stop()
	out := p.b.run("volume", "repair", volName, "--recreate")
	t.Logf("repair: %s", strings.TrimSpace(out))
	restartB("deleted+recreated", 24*256<<10)

	// And a clean restart afterwards is not a full sync again.
	before := p.a.status().ResyncBytes
	p.b.stop()
	p.b.start()
	p.waitSynced(t, 30*time.Second)
	if got := p.a.status().ResyncBytes - before; got > 4<<20 {
		t.Fatalf("clean restart after the repair resynced %d bytes", got)
	}
}

// `vmsan repl configure ../../x` used to write ../../x/config.json outside
// the data directory, and configure volumes that do not exist.
func TestReplConfigureValidatesVolume(t *testing.T) {
	base := t.TempDir()
	dir := filepath.Join(base, "d", "data")
	n := &node{t: t, name: "a", dir: dir}
	n.run("volume", "create", volName, "--size", "1M")
	for _, v := range []string{"../../x", "nope"} {
		out, err := exec.Command(vmsanBin, "repl", "configure", v, "--listen", "127.0.0.1:1", "--peer", "127.0.0.1:2", "--insecure", "--data-dir", dir).CombinedOutput()
		if err == nil {
			t.Errorf("configure %q succeeded: %s", v, out)
		}
		t.Logf("configure %q: %s", v, strings.TrimSpace(string(out)))
	}
	filepath.WalkDir(base, func(p string, d os.DirEntry, err error) error {
		if d != nil && d.Name() == "config.json" {
			t.Errorf("settings written to %s", p)
		}
		return nil
	})
	n.run("repl", "configure", volName, "--listen", "127.0.0.1:1", "--peer", "127.0.0.1:2", "--insecure")
}
