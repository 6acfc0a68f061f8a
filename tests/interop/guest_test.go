package interop

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vmsan/vmsan/internal/testutil"
	"github.com/vmsan/vmsan/tests/interop/servers"
)

// guestSeq4K is how many sequential 4 KiB O_DIRECT writes the guest issues
// after the pattern (QD1: dd waits for each); guestSeqBuf how many buffered
// 4 KiB writes it then issues with its own merging disabled (many in flight:
// the replicated small-write workload). Both regions are verified too.
const (
	guestSeq4K  = 1024
	guestSeqBuf = 1024
)

// TestQEMUGuest boots a Debian cloud kernel with a busybox initramfs under
// TCG whose virtio disk is the export (cache=none: O_DIRECT on the QEMU
// side). The guest writes scripts/guest's 4 MiB random pattern at 1 MiB with
// O_DIRECT + fsync, reads it back with O_DIRECT, then writes 4 MiB as 4 KiB
// O_DIRECT writes at 8 MiB, then 4 MiB as buffered 4 KiB writes at 16 MiB
// with the guest's merging disabled, and powers off. The server is then stopped
// (SIGTERM), restarted, and both regions are read back through nbdcopy and
// compared with the pattern on the host.
func TestQEMUGuest(t *testing.T) {
	need(t, "qemu-system-x86_64", "nbdcopy", "cpio", "gzip")
	guest := buildGuest(t)
	tg := newTarget(t, 64*MiB)

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	console := filepath.Join(t.TempDir(), "console.log")
	cons, err := os.Create(console)
	if err != nil {
		t.Fatal(err)
	}
	defer cons.Close()
	args := []string{
		"-accel", "tcg", "-m", "512", "-nographic", "-no-reboot", "-nic", "none",
		"-kernel", filepath.Join(guest, "vmlinuz"),
		"-initrd", filepath.Join(guest, "initramfs.gz"),
		"-append", "console=ttyS0 panic=-1 quiet vmsan.off=1 vmsan.seq4k=" + strconv.Itoa(guestSeq4K) + " vmsan.seqbuf=" + strconv.Itoa(guestSeqBuf),
		"-drive", "file=" + tg.uri() + ",format=raw,if=virtio,cache=none",
	}
	cmd := exec.CommandContext(ctx, "qemu-system-x86_64", args...)
	cmd.Stdout, cmd.Stderr = cons, cons
	start := time.Now()
	runErr := cmd.Run()
	out, _ := os.ReadFile(console)
	var lines []string
	for _, l := range strings.Split(string(out), "\n") {
		if i := strings.Index(l, "VMSAN-GUEST:"); i >= 0 {
			lines = append(lines, strings.TrimSpace(l[i:]))
		}
	}
	t.Logf("guest ran %v; its report:\n  %s", time.Since(start).Round(time.Millisecond), strings.Join(lines, "\n  "))
	if ctx.Err() != nil {
		t.Fatalf("guest timed out after 3 min; console tail:\n%s", tail(string(out)))
	}
	if runErr != nil {
		t.Fatalf("qemu-system-x86_64: %v\nconsole tail:\n%s", runErr, tail(string(out)))
	}
	report := strings.Join(lines, "\n")
	for _, want := range []string{"PATTERN-OK", "SEQ4K-OK", "SEQBUF-OK", "DONE OK"} {
		if !strings.Contains(report, want) {
			t.Fatalf("guest did not report %s; console tail:\n%s", want, tail(string(out)))
		}
	}
	logServerStats(t, tg)

	// Restart: whatever the guest was told is on disk must survive a
	// graceful stop and a new server process.
	tg.restart()
	img := filepath.Join(t.TempDir(), "vol.raw")
	mustRun(t, time.Minute, "nbdcopy", tg.uri(), img)
	got, err := os.ReadFile(img)
	if err != nil {
		t.Fatal(err)
	}
	pattern, err := os.ReadFile(filepath.Join(guest, "pattern.bin"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got[1*MiB:5*MiB], pattern) {
		t.Fatalf("pattern at 1 MiB differs after restart (first difference at +%d)", firstDiff(got[1*MiB:5*MiB], pattern))
	}
	if n := int64(guestSeq4K) * 4 * KiB; !bytes.Equal(got[8*MiB:8*MiB+n], pattern[:n]) {
		t.Fatalf("sequential 4 KiB region at 8 MiB differs after restart (first difference at +%d)", firstDiff(got[8*MiB:8*MiB+n], pattern[:n]))
	}
	if n := int64(guestSeqBuf) * 4 * KiB; !bytes.Equal(got[16*MiB:16*MiB+n], pattern[:n]) {
		t.Fatalf("buffered 4 KiB region at 16 MiB differs after restart (first difference at +%d)", firstDiff(got[16*MiB:16*MiB+n], pattern[:n]))
	}
	// Nothing else was written: the rest reads as zeroes.
	if !allZero(got[:1*MiB]) || !allZero(got[5*MiB:8*MiB]) || !allZero(got[8*MiB+int64(guestSeq4K)*4*KiB:16*MiB]) ||
		!allZero(got[16*MiB+int64(guestSeqBuf)*4*KiB:]) {
		t.Fatalf("bytes outside the guest's writes are not zero")
	}
}

// buildGuest runs scripts/guest/build.sh (idempotent, cached under
// .cache/guest) and returns the directory with vmlinuz/initramfs.gz.
func buildGuest(t testing.TB) string {
	t.Helper()
	dir := filepath.Join(repoRoot, ".cache", "guest")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", filepath.Join(repoRoot, "scripts", "guest", "build.sh"), dir)
	out, err := cmd.CombinedOutput()
	if err != nil {
		testutil.SkipOrFail(t, "scripts/guest/build.sh failed: %v\n%s", err, out)
	}
	return dir
}

// vmsanEngine is the part of `vmsan status --json` the tests read.
type vmsanEngine struct {
	Requests       uint64  `json:"requests"`
	BackendOps     uint64  `json:"backend_ops"`
	BytesWritten   uint64  `json:"bytes_written"`
	MergeRatio     float64 `json:"merge_ratio"`
	MeanWriteBytes float64 `json:"mean_write_bytes"`
	Raw            struct {
		Requests struct {
			Write uint64 `json:"write"`
		} `json:"requests"`
	} `json:"raw"`
}

type vmsanStatus struct {
	Volumes []struct {
		Name   string       `json:"name"`
		Engine *vmsanEngine `json:"engine"`
	} `json:"volumes"`
	Server json.RawMessage `json:"server"`
}

// status runs `vmsan status --json` against the target's daemon.
func status(t testing.TB, tg *target) (*vmsanStatus, error) {
	t.Helper()
	r := runCmd(t, 30*time.Second, vmsanBin, "status", "--json", "--data-dir", tg.dir)
	if r.code != 0 {
		return nil, fmt.Errorf("vmsan status: exit %d: %s", r.code, strings.TrimSpace(r.stderr))
	}
	var st vmsanStatus
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil {
		return nil, fmt.Errorf("vmsan status --json: %v\n%s", err, tail(r.stdout))
	}
	return &st, nil
}

// engineStats returns the engine counters of the target's volume, failing
// the test if status is unavailable.
func engineStats(t testing.TB, tg *target) *vmsanEngine {
	t.Helper()
	st, err := status(t, tg)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range st.Volumes {
		if v.Name == tg.name {
			return v.Engine
		}
	}
	t.Fatalf("vmsan status lists no volume %q", tg.name)
	return nil
}

// logServerStats records what the server saw (request sizes, merging) if the
// server under test can report it. The replicated small-write case is about exactly this: whether a
// guest's sequential 4 KiB writes reach the disk as 4 KiB writes. It logs,
// never fails: these are observations (TestFioSequential4KMerged asserts).
func logServerStats(t testing.TB, tg *target) {
	t.Helper()
	if serverKind != servers.VMSAN {
		return
	}
	st, err := status(t, tg)
	if err != nil {
		t.Logf("%v", err)
		return
	}
	for _, v := range st.Volumes {
		if v.Engine == nil {
			continue
		}
		e := v.Engine
		meanReq := 0.0
		if e.Raw.Requests.Write > 0 {
			meanReq = float64(e.BytesWritten) / float64(e.Raw.Requests.Write)
		}
		t.Logf("volume %s after the guest: %d requests, %d backend ops, merge ratio %.2f, "+
			"%d write requests of mean %.0f B from the guest, mean backend write %.0f B",
			v.Name, e.Requests, e.BackendOps, e.MergeRatio, e.Raw.Requests.Write, meanReq, e.MeanWriteBytes)
	}
	if len(st.Server) > 0 {
		var b bytes.Buffer
		if json.Compact(&b, st.Server) == nil {
			t.Logf("NBD server stats: %s", tail(b.String()))
		}
	}
}

func firstDiff(a, b []byte) int {
	for i := range a {
		if i >= len(b) || a[i] != b[i] {
			return i
		}
	}
	return len(a)
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}
