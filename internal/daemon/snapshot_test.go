package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vmsan/vmsan/internal/config"
	"github.com/vmsan/vmsan/internal/nbd/client"
	"github.com/vmsan/vmsan/internal/nbd/proto"
	"github.com/vmsan/vmsan/internal/testutil"
	"github.com/vmsan/vmsan/internal/volume"
)

// TestSnapshotUnderLoad takes a reflink snapshot through the running
// daemon (on a loop-mounted xfs) while an NBD client keeps writing: every
// write acknowledged before the snapshot request is in it, none started
// after it returned is, and no block is half-written. The snapshot is then
// served read-only as VOL@SNAP (writes get EPERM, the content equals the
// file), rollback is refused while a client is connected, and deleting an
// exported snapshot needs --force.
func TestSnapshotUnderLoad(t *testing.T) {
	testutil.NeedTool(t, "nbdinfo")
	testutil.NeedTool(t, "qemu-img")
	testutil.NeedTool(t, "qemu-io")
	dir := filepath.Join(testutil.LoopMount(t, "mkfs.xfs", 400<<20, "-q", "-f", "-m", "reflink=1"), "d")
	r := start(t, dir, func(c *config.Config) { c.NoDefaultVolume = true })
	c, err := Dial(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Create(volume.CreateOptions{Name: "v", Size: 64 << 20}); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "nbd.sock")
	url := func(e string) string { return "nbd+unix:///" + e + "?socket=" + sock }

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	nc, err := client.Dial(ctx, url("v"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()

	// The writer fills 64 KiB blocks from 8 MiB on, block i with byte
	// i%251+1, one write at a time, counting acknowledgements.
	const blk = 64 << 10
	const base = 8 << 20
	const nblk = 256 // 16 MiB
	var acked, started atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var werr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		buf := make([]byte, blk)
		for i := int64(0); i < nblk; i++ {
			select {
			case <-stop:
				return
			default:
			}
			for j := range buf {
				buf[j] = byte(i%251 + 1)
			}
			started.Store(i + 1)
			if _, err := nc.WriteAt(buf, base+i*blk); err != nil {
				werr = err
				return
			}
			acked.Store(i + 1)
			time.Sleep(time.Millisecond)
		}
	}()
	waitFor(t, "some writes", func() bool { return acked.Load() >= 20 })
	ackedBefore := acked.Load()
	flushes := func() uint64 { return (*r.d.vols.Load())["v"].EngineStats().BackendOps.Flush }
	f0 := flushes()
	si, err := c.CreateSnapshot("v", "s1", false)
	if err != nil {
		t.Fatal(err)
	}
	startedAfter := started.Load() // every write started later is not in it
	if flushes() == f0 {
		t.Fatal("the snapshot did not flush the volume's engine (no quiesce)")
	}
	// Some writes complete after the snapshot (they must not be in it),
	// unless the writer was done already.
	waitFor(t, "writes after the snapshot", func() bool { return acked.Load() >= min(startedAfter+5, nblk) })
	close(stop)
	wg.Wait()
	if werr != nil {
		t.Fatal(werr)
	}
	if si.Method != volume.MethodReflink || si.Path == "" {
		t.Fatalf("snapshot info %+v", si)
	}
	snap, err := os.ReadFile(si.Path)
	if err != nil {
		t.Fatal(err)
	}
	for i := int64(0); i < nblk; i++ {
		b := snap[base+i*blk : base+(i+1)*blk]
		want := bytes.Repeat([]byte{byte(i%251 + 1)}, blk)
		zero := make([]byte, blk)
		switch {
		case i < ackedBefore && !bytes.Equal(b, want):
			t.Fatalf("block %d was acknowledged before the snapshot but is not in it", i)
		case i >= startedAfter && !bytes.Equal(b, zero):
			t.Fatalf("block %d was written after the snapshot returned but is in it", i)
		case !bytes.Equal(b, want) && !bytes.Equal(b, zero):
			t.Fatalf("block %d is torn in the snapshot", i)
		}
	}
	t.Logf("snapshot under load: %d writes acked before, %d started by the end of the snapshot", ackedBefore, startedAfter)

	// Read-only export of the snapshot.
	var info []map[string]any
	var doc map[string]any
	if err := json.Unmarshal([]byte(run(t, "nbdinfo", "--json", url("v@s1"))), &doc); err != nil {
		t.Fatal(err)
	}
	if b, _ := json.Marshal(doc["exports"]); json.Unmarshal(b, &info) != nil || len(info) != 1 || info[0]["is_read_only"] != true {
		t.Fatalf("nbdinfo of the snapshot export: %v", doc)
	}
	if out := run(t, "nbdinfo", "--list", "--json", "nbd+unix:///?socket="+sock); !strings.Contains(out, `"export-name": "v@s1"`) {
		t.Fatalf("nbdinfo --list does not show the snapshot:\n%s", out)
	}
	if out := run(t, "qemu-img", "compare", "-f", "raw", "-F", "raw", si.Path, url("v@s1")); !strings.Contains(out, "identical") {
		t.Fatalf("qemu-img compare: %s", out)
	}
	sc, err := client.Dial(ctx, url("v@s1"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sc.WriteAt(make([]byte, 4096), 0); !errors.Is(err, proto.EPERM) {
		t.Fatalf("write to the snapshot export: %v, want EPERM", err)
	}
	// qemu-io is refused too (it opens the export read-write).
	if out, err := exec.Command("qemu-io", "-f", "raw", "-c", "write 0 4k", url("v@s1")).CombinedOutput(); err == nil || !strings.Contains(string(out), "Permission denied") {
		t.Fatalf("qemu-io write to the snapshot: %v: %s (want it refused: Permission denied)", err, out)
	}
	if l, err := c.ListSnapshots("v"); err != nil || len(l) != 1 || l[0].Exports < 1 {
		t.Fatalf("ListSnapshots = %+v, %v", l, err)
	}
	if err := c.DeleteSnapshot("v", "s1", false); !errors.Is(err, volume.ErrInUse) {
		t.Fatalf("delete of an exported snapshot: %v, want ErrInUse", err)
	}

	// Rollback: refused with a client connected, allowed with force.
	if _, err := c.Rollback("v", "s1", false, false); !errors.Is(err, volume.ErrInUse) || !strings.Contains(err.Error(), "--force") {
		t.Fatalf("rollback with a client: %v", err)
	}
	if _, err := nc.WriteAt(bytes.Repeat([]byte{0xee}, 4096), 0); err != nil {
		t.Fatal(err)
	}
	vi, err := c.Rollback("v", "s1", true, false)
	if err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(snap))
	if _, err := nc.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, snap) {
		t.Fatal("after rollback the connected client does not read the snapshot's contents")
	}
	if vi.DataID == si.DataID || vi.DataID == si.SourceDataID {
		t.Fatalf("rollback kept a data identity: %s", vi.DataID)
	}

	// Clone the snapshot into a new exported volume.
	if _, err := c.Clone("v@s1", "c", false); err != nil {
		t.Fatal(err)
	}
	if out := run(t, "qemu-img", "compare", "-f", "raw", "-F", "raw", si.Path, url("c")); !strings.Contains(out, "identical") {
		t.Fatalf("clone: qemu-img compare: %s", out)
	}

	// A volume with snapshots is deleted only with force; that ends the
	// snapshot's export (its client gets errors).
	nc.Close()
	waitFor(t, "the client to go", func() bool { vi, err := c.Info("v"); return err == nil && vi.Exports == 0 })
	if err := c.Delete("v", false); !errors.Is(err, volume.ErrHasSnapshots) {
		t.Fatalf("delete volume with snapshots: %v", err)
	}
	if err := c.Delete("v", true); err != nil {
		t.Fatal(err)
	}
	if _, err := sc.ReadAt(make([]byte, 4096), 0); err == nil {
		t.Fatal("the export of a deleted snapshot still reads")
	}
	sc.Close()
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
}

// TestRollbackRefusedReplicated: a volume that replication knows (its
// resize check says ErrReplicated) is not rolled back, with the reason.
func TestRollbackRefusedReplicated(t *testing.T) {
	dir := t.TempDir()
	hooks := VolumeHooks{Resize: []ResizeCheck{func(_, name string, _ int64) error {
		return fmt.Errorf("volume %s is replicated (peer x): %w", name, ErrReplicated)
	}}}
	ops, _, err := OpenVolumeOps(dir, hooks)
	if err != nil {
		t.Fatal(err)
	}
	defer ops.Close()
	if _, err := ops.Create(volume.CreateOptions{Name: "v", Size: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	sops := ops.(SnapshotOps)
	if _, err := sops.CreateSnapshot("v", "s", true); err != nil {
		t.Fatal(err)
	}
	_, err = sops.Rollback("v", "s", true, true)
	if !errors.Is(err, ErrReplicated) || !strings.Contains(err.Error(), "peer would keep") {
		t.Fatalf("rollback of a replicated volume: %v", err)
	}
}
