package interop

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/vmsan/vmsan/internal/testutil"
	"github.com/vmsan/vmsan/tests/interop/servers"
)

// TestQemuSequential4KWritesVsQemuNBD: QEMU's own NBD client writing
// sequential 4 KiB blocks at queue depth 32 (qemu-img bench) must not be
// much slower against vmsan than against qemu-nbd serving a raw file with
// the page cache, measured in the same test run on the same machine.
//
// This is the write-gathering worst case: QEMU's client keeps at most 16
// requests in flight and sends them out of offset order, so a window
// arrives as several runs with gaps, and on a loaded machine in pieces;
// every run the engine holds waits for its timed backstop. Only a ratio is
// asserted (never absolute times): about 4x qemu-nbd's time when each held
// run waited about 1.1 ms (a millisecond-granular Go timer, per-run
// backstops).
func TestQemuSequential4KWritesVsQemuNBD(t *testing.T) {
	testutil.NeedBenchCheck(t)
	need(t, "qemu-img", "qemu-nbd")
	if serverKind != servers.VMSAN {
		t.Skip("compares vmsan with qemu-nbd") // skip: variant
	}
	const size = 128 * MiB
	const count = 20000 // 78 MiB of 4 KiB writes
	// Both over unix sockets: the same transport for both servers (QEMU's
	// client to qemu-nbd over loopback TCP stalls on delayed ACKs).
	dir := diskDir(t)
	vsock := filepath.Join(dir, "vmsan.sock")
	vm := newTarget(t, size, serverArgs("--listen", "unix:"+vsock))
	vuri := "nbd+unix:///" + vm.name + "?socket=" + vsock

	file := filepath.Join(dir, "anchor.raw")
	f, err := os.Create(file)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	f.Close()
	qsock := filepath.Join(dir, "qemu-nbd.sock")
	qn := exec.Command("qemu-nbd", "-f", "raw", "-t", "-k", qsock, "-x", "anchor", "--cache=writeback", "--aio=threads", file)
	if err := qn.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { qn.Process.Kill(); qn.Wait() })
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if _, err := os.Stat(qsock); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("qemu-nbd did not create its socket")
		}
	}
	quri := "nbd+unix:///anchor?socket=" + qsock

	bench := func(uri string) time.Duration {
		t.Helper()
		start := time.Now()
		r := runCmd(t, 2*time.Minute, "qemu-img", "bench", "-f", "raw", "-t", "none", "-d", "32",
			"-s", "4096", "-c", strconv.Itoa(count), "-w", "--pattern=0x5a", uri)
		if r.code != 0 {
			t.Fatalf("qemu-img bench %s: exit %d\n%s\n%s", uri, r.code, tail(r.stdout), tail(r.stderr))
		}
		return time.Since(start)
	}
	// Interleaved rounds, best of each: a load spike on a shared machine
	// slows one run, not the comparison.
	best := func(d, cur time.Duration) time.Duration {
		if cur == 0 || d < cur {
			return d
		}
		return cur
	}
	var tv, tq time.Duration
	for round := 0; round < 3; round++ {
		tq = best(bench(quri), tq)
		tv = best(bench(vuri), tv)
	}
	ratio := float64(tv) / float64(tq)
	t.Logf("qemu-img bench seq 4 KiB QD32 x %d: vmsan %v, qemu-nbd %v (best of 3): %.2fx", count, tv, tq, ratio)
	// Measured after the fix: 0.9-1.55x (the higher on a quieter machine,
	// where qemu-nbd gains most); before: 4.2x at load 5, 1.9x at load 9.
	if ratio > 2 {
		t.Fatalf("vmsan took %.2fx qemu-nbd's time for sequential 4 KiB writes at QD32 (%v vs %v)", ratio, tv, tq)
	}
	// The data: a sample of the pattern, through a new connection.
	need(t, "qemu-io")
	mustQemuIO(t, vuri, fmt.Sprintf("read -P 0x5a 0 %d", 4*MiB), fmt.Sprintf("read -P 0x5a %d 1M", int64(count)*4*KiB-MiB))
}
