package repl_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vmsan/vmsan/internal/repl/driver"
)

// writes builds qemu-io write commands: n writes of size bytes at stride,
// from base, with pattern pat.
func writes(pat int, base, size, stride int64, n int) []string {
	var c []string
	for i := 0; i < n; i++ {
		c = append(c, fmt.Sprintf("write -P %d %d %d", pat, base+int64(i)*stride, size))
	}
	return c
}

func reads(pat int, base, size, stride int64, n int) []string {
	var c []string
	for i := 0; i < n; i++ {
		c = append(c, fmt.Sprintf("read -P %d %d %d", pat, base+int64(i)*stride, size))
	}
	return c
}

// Loops of: a write workload through a real client while the replication
// link is reset, blackholed or dropped mid-stream; then restore, wait for
// resync, and check that both backing files are identical and every
// acknowledged write reads back.
func TestLinkFaultsConverge(t *testing.T) {
	p := newPair(t, pairOpts{})
	faults := []struct {
		name    string
		inject  func()
		restore func()
	}{
		{"reset", func() { p.px.Reset() }, func() {}},
		{"blackhole", func() { p.px.Blackhole(true) }, func() { p.px.Blackhole(false) }},
		{"drop", func() { p.px.Drop(true) }, func() { p.px.Drop(false) }},
		{"delay+bandwidth", func() { p.px.SetDelay(20 * time.Millisecond); p.px.SetBandwidth(2 << 20) }, func() { p.px.SetDelay(0); p.px.SetBandwidth(0) }},
	}
	for round, f := range faults {
		pat := 0x10 + round
		base := int64(round) * (12 << 20)
		cmds := writes(pat, base, 128<<10, 160<<10, 64)
		// Inject the fault after the 8th acknowledged write, so it lands
		// mid-stream however fast the machine is; restore 700 ms later
		// (longer than the 500 ms ping timeout) while writes continue.
		var restored sync.WaitGroup
		acked, ioErr := qemuIOWatch(t, p.a.uri(), func(n int) {
			if n == 8 {
				f.inject()
				restored.Add(1)
				go func() {
					defer restored.Done()
					time.Sleep(700 * time.Millisecond)
					f.restore()
				}()
			}
		}, cmds...)
		restored.Wait()
		if ioErr != nil || len(acked) != len(cmds) {
			t.Fatalf("round %s: %d of %d writes acknowledged (the primary must keep serving): %v", f.name, len(acked), len(cmds), ioErr)
		}
		p.waitSynced(t, 60*time.Second)
		// Every acknowledged write is on the primary...
		mustIO(t, p.a.uri(), reads(pat, base, 128<<10, 160<<10, 64)...)
		sa := p.a.status()
		t.Logf("round %s: disconnects so far %d, resync sent %d B in total", f.name, sa.Disconnects, sa.ResyncBytes)
	}
	// ...and the replicas converged byte for byte.
	mustIO(t, p.a.uri(), "flush")
	if p.a.rawSum() != p.b.rawSum() {
		t.Fatal("backing files differ after resync")
	}
	if sa := p.a.status(); sa.Disconnects == 0 || sa.ResyncBytes == 0 {
		t.Fatalf("faults caused %d disconnects and %d resync bytes: they did not land mid-stream", sa.Disconnects, sa.ResyncBytes)
	}
}

// kill -9 of the secondary mid-workload and restart: only the region
// written while it was down (plus its activity-log hot extents) is resent.
func TestKillSecondaryQuickResync(t *testing.T) {
	p := newPair(t, pairOpts{})
	mustIO(t, p.a.uri(), writes(0x21, 0, 1<<20, 1<<20, 8)...)
	// Let the activity log retire those extents (50 ticks of 20 ms): only
	// the extents hot at the kill should be replayed.
	time.Sleep(1500 * time.Millisecond)
	// Keep writing while the secondary dies.
	killed := make(chan struct{})
	acked, ioErr := qemuIOWatch(t, p.a.uri(), func(n int) {
		if n == 64 {
			go func() { p.b.kill9(); close(killed) }()
		}
	}, writes(0x22, 8<<20, 64<<10, 64<<10, 256)...)
	<-killed
	if len(acked) != 256 {
		t.Fatalf("%d of 256 writes acknowledged: the primary must keep serving", len(acked))
	}
	if ioErr != nil {
		t.Fatal(ioErr)
	}
	waitUntil(t, "primary notices", 10*time.Second, func() bool { return p.a.status().Conn == "Connecting" })
	before := p.a.status()
	// Written while down: 4 MiB in 64 KiB chunks (whole bitmap chunks).
	const downBytes = 4 << 20
	mustIO(t, p.a.uri(), writes(0x23, 32<<20, 64<<10, 64<<10, downBytes/(64<<10))...)
	al, err := driver.LoadAL(driver.Dir(p.b.dir, volName))
	if err != nil {
		t.Fatal(err)
	}
	hot := int64(len(al)) * (4 << 20)
	p.b.start()
	p.waitSynced(t, 60*time.Second)
	after := p.a.status()
	resent := after.ResyncBytes - before.ResyncBytes
	oos := before.OutOfSync + downBytes
	t.Logf("out of sync from the workload around the kill %d B, written later while down %d B, secondary hot extents %d (%d B); resent %d B data + %d B as zero ranges",
		before.OutOfSync, downBytes, len(al), hot, resent, after.ResyncZeroBytes-before.ResyncZeroBytes)
	if limit := oos*11/10 + hot; resent > limit {
		t.Fatalf("resent %d bytes > 1.1 x %d + hot extents %d", resent, oos, hot)
	}
	if resent < downBytes {
		t.Fatalf("resent only %d bytes, less than the %d written while down", resent, downBytes)
	}
	mustIO(t, p.a.uri(), "flush")
	if p.a.rawSum() != p.b.rawSum() {
		t.Fatal("backing files differ after resync")
	}
}

// kill -9 of the primary under protocol C: the secondary is promoted and
// every write acknowledged to the client before the kill is there.
func TestKillPrimaryPromote(t *testing.T) {
	p := newPair(t, pairOpts{protocol: "C"})
	cmds := writes(0x31, 0, 64<<10, 64<<10, 400)
	acked, _ := qemuIOWatch(t, p.a.uri(), func(n int) {
		if n == 100 {
			p.a.kill9() // qemu-io keeps going and fails on the next write
		}
	}, cmds...)
	if len(acked) < 100 || len(acked) == len(cmds) {
		t.Fatalf("%d of %d writes acknowledged: the kill did not land mid-workload", len(acked), len(cmds))
	}
	waitUntil(t, "secondary notices", 10*time.Second, func() bool { return p.b.status().Conn == "Connecting" })
	if err := p.b.admin("promote"); err != nil {
		t.Fatal(err)
	}
	if st := p.b.status(); st.Role != "Primary" {
		t.Fatalf("promoted: %+v", st)
	}
	var checks []string
	for _, l := range acked {
		// "wrote 65536/65536 bytes at offset 131072"
		var n, n2, off int64
		if _, err := fmt.Sscanf(l, "wrote %d/%d bytes at offset %d", &n, &n2, &off); err != nil {
			t.Fatalf("parse %q: %v", l, err)
		}
		checks = append(checks, fmt.Sprintf("read -P 0x31 %d %d", off, n))
	}
	mustIO(t, p.b.uri(), checks...)
	t.Logf("%d acknowledged writes before kill -9, all present on the promoted secondary", len(acked))
	// The new primary serves writes.
	mustIO(t, p.b.uri(), "write -P 0x32 60M 64k", "read -P 0x32 60M 64k")
}

// Both promoted while disconnected and both written: on reconnect the pair
// refuses to sync and reports split brain; data is kept on both sides.
func TestSplitBrainDetected(t *testing.T) {
	p := newPair(t, pairOpts{})
	mustIO(t, p.a.uri(), "write -P 0x41 0 1M")
	p.px.Drop(true)
	waitUntil(t, "disconnect", 10*time.Second, func() bool { return p.b.status().Conn == "Connecting" })
	if err := p.b.admin("promote"); err != nil {
		t.Fatal(err)
	}
	mustIO(t, p.a.uri(), "write -P 0x42 2M 64k")
	mustIO(t, p.b.uri(), "write -P 0x43 4M 64k")
	p.px.Drop(false)
	waitUntil(t, "split brain reported", 20*time.Second, func() bool {
		sa, sb := p.a.status(), p.b.status()
		return sa.Conn == "StandAlone" && sb.Conn == "StandAlone" &&
			strings.Contains(sa.LastError, "split brain") && strings.Contains(sb.LastError, "split brain")
	})
	// Never silently resolved: each side still has its own write.
	mustIO(t, p.a.uri(), "read -P 0x42 2M 64k", "read -P 0 4M 64k")
	mustIO(t, p.b.uri(), "read -P 0x43 4M 64k", "read -P 0 2M 64k")
	t.Logf("a: %s", p.a.status().LastError)
}

// With discard-zero-changes, a split brain where one side wrote nothing is
// resolved by syncing from the side that did.
func TestSplitBrainPolicyDiscardZeroChanges(t *testing.T) {
	p := newPair(t, pairOpts{splitBrain: "discard-zero-changes"})
	mustIO(t, p.a.uri(), "write -P 0x51 0 1M")
	p.px.Drop(true)
	waitUntil(t, "disconnect", 10*time.Second, func() bool { return p.b.status().Conn == "Connecting" })
	if err := p.b.admin("promote"); err != nil {
		t.Fatal(err)
	}
	if err := p.b.admin("demote"); err != nil {
		t.Fatal(err)
	}
	mustIO(t, p.a.uri(), "write -P 0x52 2M 64k")
	p.px.Drop(false)
	p.waitSynced(t, 30*time.Second)
	if d := p.b.status().Decision; !strings.Contains(d, "resolved") {
		t.Fatalf("decision %q: not resolved by policy", d)
	}
	mustIO(t, p.a.uri(), "flush")
	if p.a.rawSum() != p.b.rawSum() {
		t.Fatal("replicas differ after policy resolution")
	}
}

// Sequential 4 KiB writes on the primary become large merged
// writes on the secondary (its engine's counters).
func TestSecondaryMergesFio(t *testing.T) {
	need(t, "fio")
	p := newPair(t, pairOpts{protocol: "C"})
	before := p.b.engine()
	out, err := exec.Command("fio", "--name=seq4k", "--ioengine=nbd", "--uri="+p.a.uri(), "--rw=write", "--bs=4k",
		"--iodepth=32", "--size=16M", "--numjobs=1", "--output-format=terse").CombinedOutput()
	if err != nil {
		t.Fatalf("fio: %v\n%s", err, out)
	}
	mustIO(t, p.a.uri(), "flush")
	after := p.b.engine()
	reqs, ops := after.Requests-before.Requests, after.BackendOps-before.BackendOps
	written := after.BytesWritten - before.BytesWritten
	wops := after.Raw.BackendOps.Write - before.Raw.BackendOps.Write
	pa := p.a.engine()
	// Mean backend write size over this workload only (write calls, not
	// flushes).
	mean := float64(written) / float64(max(wops, 1))
	t.Logf("primary engine: merge ratio %.1f; secondary: %d requests -> %d backend ops (ratio %.1f), %d bytes in %d write calls, mean write %.0f B",
		pa.MergeRatio, reqs, ops, float64(reqs)/float64(max(ops, 1)), written, wops, mean)
	if reqs < 4096 {
		t.Fatalf("secondary saw %d requests for 4096 writes", reqs)
	}
	if written < 16<<20 {
		t.Fatalf("secondary wrote %d bytes for 16 MiB of writes", written)
	}
	// Without merging every backend write is exactly 4 KiB. The threshold
	// is 3x that: it fails whenever the secondary stops merging (or merges
	// only now and then), yet stays below what runs show even on a loaded
	// machine, where fewer writes queue up on the secondary at once (seen:
	// 27-78 KiB; the merge ratio of 3.8 that once failed the old
	// "ratio >= 4" threshold is about 15 KiB).
	if mean < 12<<10 {
		t.Fatalf("secondary merged too little: mean backend write %.0f B (4096 = no merging) over %d write calls for %d requests", mean, wops, reqs)
	}
	if p.a.rawSum() != p.b.rawSum() {
		t.Fatal("replicas differ")
	}
}

// Online verify: a byte silently changed in the secondary's backing file is
// found by `verify`, reported, and resynced from the primary.
func TestOnlineVerify(t *testing.T) {
	p := newPair(t, pairOpts{size: "16M"})
	mustIO(t, p.a.uri(), "write -P 0x61 0 8M", "flush")
	raw := filepath.Join(p.b.dir, "volumes", volName+".raw")
	f, err := os.OpenFile(raw, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte{0x99}, 5<<20+123); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if p.a.rawSum() == p.b.rawSum() {
		t.Fatal("corruption did not take")
	}
	if err := p.a.admin("verify"); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "verify done", 30*time.Second, func() bool {
		st := p.a.status()
		return st.VerifiedBytes >= 16<<20 && st.Conn == "Connected" && st.OutOfSync == 0
	})
	st := p.a.status()
	t.Logf("verified %d B, mismatching %d B", st.VerifiedBytes, st.VerifyDiff)
	if st.VerifyDiff == 0 || st.VerifyDiff > 256<<10 {
		t.Fatalf("verify found %d mismatching bytes, want one 256 KiB block", st.VerifyDiff)
	}
	mustIO(t, p.a.uri(), "flush")
	if p.a.rawSum() != p.b.rawSum() {
		t.Fatal("replicas differ after verify + resync")
	}
}
