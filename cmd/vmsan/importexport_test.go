package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vmsan/vmsan/internal/testutil"
)

var (
	vmsanBinOnce sync.Once
	vmsanBin     string
	vmsanBinErr  error
)

// binary builds cmd/vmsan once for the tests of this file.
func binary(t *testing.T) string {
	t.Helper()
	vmsanBinOnce.Do(func() { vmsanBin, _, vmsanBinErr = testutil.BuildVmsan() })
	if vmsanBinErr != nil {
		t.Fatal(vmsanBinErr)
	}
	return vmsanBin
}

func vmsan(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command(binary(t), args...).CombinedOutput()
	if err != nil {
		t.Fatalf("vmsan %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

func vmsanFails(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command(binary(t), args...).CombinedOutput()
	if err == nil {
		t.Fatalf("vmsan %s succeeded:\n%s", strings.Join(args, " "), out)
	}
	return string(out)
}

func sha(t *testing.T, path string) [32]byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	var s [32]byte
	copy(s[:], h.Sum(nil))
	return s
}

func allocatedBytes(t *testing.T, path string) int64 {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * 512
}

// sparseImage writes a 64 MiB raw image with 3 small data regions (and an
// all-zero written MiB) and returns its path.
func sparseImage(t *testing.T, dir string) string {
	t.Helper()
	p := filepath.Join(dir, "src.raw")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(64 << 20); err != nil {
		t.Fatal(err)
	}
	for i, off := range []int64{0, 10 << 20, 63 << 20} {
		if _, err := f.WriteAt(bytes.Repeat([]byte{byte(0x10 + i)}, 256<<10), off); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := f.WriteAt(make([]byte, 1<<20), 30<<20); err != nil {
		t.Fatal(err)
	}
	return p
}

// maxAlloc is what the 3 × 256 KiB of data may allocate (filesystem
// allocation granules and preallocation included); 64 MiB would mean the
// holes were filled.
const maxAlloc = 4 << 20

func compareImages(t *testing.T, a, b string) {
	t.Helper()
	out, err := exec.Command("qemu-img", "compare", a, b).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "identical") {
		t.Fatalf("qemu-img compare %s %s: %v\n%s", a, b, err, out)
	}
}

// TestImportExportImages: a qcow2 made by qemu-img imports to a volume
// whose bytes hash like the source and that keeps its holes; raw and qcow2
// exports compare identical; a raw import is sparse too.
func TestImportExportImages(t *testing.T) {
	testutil.NeedTool(t, "qemu-img")
	tmp := t.TempDir()
	data := filepath.Join(tmp, "data")
	src := sparseImage(t, tmp)
	qcow := filepath.Join(tmp, "src.qcow2")
	if out, err := exec.Command("qemu-img", "convert", "-f", "raw", "-O", "qcow2", src, qcow).CombinedOutput(); err != nil {
		t.Fatalf("qemu-img convert: %v\n%s", err, out)
	}
	vmsan(t, "volume", "import", "--data-dir", data, "q", qcow)
	vol := filepath.Join(data, "volumes", "q.raw")
	if sha(t, vol) != sha(t, src) {
		t.Fatal("imported qcow2: sha256 differs from the source")
	}
	if a := allocatedBytes(t, vol); a > maxAlloc {
		t.Fatalf("imported qcow2 allocates %d bytes: holes filled", a)
	}
	vmsan(t, "volume", "import", "--data-dir", data, "r", src)
	if sha(t, filepath.Join(data, "volumes", "r.raw")) != sha(t, src) {
		t.Fatal("imported raw: sha256 differs")
	}
	if a := allocatedBytes(t, filepath.Join(data, "volumes", "r.raw")); a > maxAlloc {
		t.Fatalf("imported raw allocates %d bytes: holes filled", a)
	}
	if out := vmsanFails(t, "volume", "import", "--data-dir", data, "r", src); !strings.Contains(out, "exists") {
		t.Fatalf("import over an existing volume: %s", out)
	}

	out := filepath.Join(tmp, "out.raw")
	vmsan(t, "volume", "export", "--data-dir", data, "q", out)
	compareImages(t, out, src)
	if a := allocatedBytes(t, out); a > maxAlloc {
		t.Fatalf("raw export allocates %d bytes: holes filled", a)
	}
	if msg := vmsanFails(t, "volume", "export", "--data-dir", data, "q", out); !strings.Contains(msg, "--force") {
		t.Fatalf("export over an existing file: %s", msg)
	}
	outq := filepath.Join(tmp, "out.qcow2")
	vmsan(t, "volume", "export", "--data-dir", data, "-O", "qcow2", "q", outq)
	compareImages(t, outq, src)
	// A snapshot exports too (offline: taken with --copy where needed).
	vmsan(t, "volume", "snapshot", "--data-dir", data, "--copy", "q", "s")
	vmsan(t, "volume", "export", "--data-dir", data, "q@s", filepath.Join(tmp, "snap.raw"))
	compareImages(t, filepath.Join(tmp, "snap.raw"), src)
	if l := vmsan(t, "volume", "list", "--data-dir", data, "--snapshots"); !strings.Contains(l, "q@s") {
		t.Fatalf("list --snapshots:\n%s", l)
	}
}

// TestImportNBD: import from an nbd+unix:// URL served by qemu-nbd.
func TestImportNBD(t *testing.T) {
	testutil.NeedTool(t, "qemu-nbd")
	tmp := t.TempDir()
	src := sparseImage(t, tmp)
	sock := filepath.Join(tmp, "q.sock")
	qn := exec.Command("qemu-nbd", "-r", "-f", "raw", "-x", "img", "-k", sock, "--persistent", src)
	if err := qn.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { qn.Process.Kill(); qn.Wait() }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := os.Stat(sock); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("qemu-nbd did not create its socket")
		}
		time.Sleep(20 * time.Millisecond)
	}
	data := filepath.Join(tmp, "data")
	vmsan(t, "volume", "import", "--data-dir", data, "n", "nbd+unix:///img?socket="+sock)
	vol := filepath.Join(data, "volumes", "n.raw")
	if sha(t, vol) != sha(t, src) {
		t.Fatal("import from NBD: sha256 differs")
	}
	if a := allocatedBytes(t, vol); a > maxAlloc {
		t.Fatalf("import from NBD allocates %d bytes: holes filled", a)
	}
}

// TestExportLiveVolume: with `vmsan serve` running, export goes through a
// temporary snapshot that is deleted afterwards; where the filesystem
// cannot reflink it refuses naming --copy, and --copy works.
func TestExportLiveVolume(t *testing.T) {
	testutil.NeedTool(t, "qemu-img")
	tmp := t.TempDir()
	data := filepath.Join(tmp, "data")
	src := sparseImage(t, tmp)
	vmsan(t, "volume", "import", "--data-dir", data, "v", src)
	sock := filepath.Join(tmp, "nbd.sock")
	srv := exec.Command(binary(t), "serve", "--data-dir", data, "--listen", "unix:"+sock)
	var log bytes.Buffer
	srv.Stdout, srv.Stderr = &log, &log
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		srv.Process.Signal(syscall.SIGTERM)
		srv.Wait()
	}()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := os.Stat(filepath.Join(data, "control.sock")); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("vmsan serve did not start:\n%s", log.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	out := filepath.Join(tmp, "live.raw")
	cmd := exec.Command(binary(t), "volume", "export", "--data-dir", data, "v", out)
	msg, err := cmd.CombinedOutput()
	if err != nil {
		if !strings.Contains(string(msg), "--copy") {
			t.Fatalf("live export refused without naming --copy: %s", msg)
		}
		vmsan(t, "volume", "export", "--data-dir", data, "--copy", "v", out)
	}
	compareImages(t, out, src)
	if l := vmsan(t, "volume", "list", "--data-dir", data, "--snapshots", "--json"); strings.Contains(l, "export-") {
		t.Fatalf("the temporary export snapshot was left behind:\n%s", l)
	}
}

// TestExportIncremental: --since writes a qcow2 overlay on the base
// snapshot's full export holding only the changed blocks (including ones
// that became zero), which reads as the new state and restores by import.
func TestExportIncremental(t *testing.T) {
	testutil.NeedTool(t, "qemu-img")
	testutil.NeedTool(t, "qemu-nbd")
	testutil.NeedTool(t, "qemu-io")
	tmp := t.TempDir()
	data := filepath.Join(tmp, "data")
	vmsan(t, "volume", "import", "--data-dir", data, "v", sparseImage(t, tmp))
	raw := filepath.Join(data, "volumes", "v.raw")
	// More data so that "only the changes" is visibly less than everything.
	if out, err := exec.Command("qemu-io", "-f", "raw", "-c", "write -P 0x44 16M 16M", raw).CombinedOutput(); err != nil {
		t.Fatalf("qemu-io: %v\n%s", err, out)
	}
	vmsan(t, "volume", "snapshot", "--data-dir", data, "--copy", "v", "mon")
	vmsan(t, "volume", "export", "--data-dir", data, "v@mon", filepath.Join(tmp, "mon.raw"))
	// Changes: new data, overwritten data, data that became zero, and a
	// write of the same bytes (no change).
	if out, err := exec.Command("qemu-io", "-f", "raw",
		"-c", "write -P 0x55 1M 256k", "-c", "write -P 0x66 20M 512k", "-c", "write -z 24M 1M", "-c", "write -P 0x44 28M 1M", raw).CombinedOutput(); err != nil {
		t.Fatalf("qemu-io: %v\n%s", err, out)
	}
	vmsan(t, "volume", "snapshot", "--data-dir", data, "--copy", "v", "tue")
	full := filepath.Join(tmp, "tue.raw")
	vmsan(t, "volume", "export", "--data-dir", data, "v@tue", full)
	inc := filepath.Join(tmp, "tue.qcow2")
	if msg := vmsanFails(t, "volume", "export", "--data-dir", data, "v@tue", inc, "--since", "mon"); !strings.Contains(msg, "--backing") {
		t.Fatalf("--since without --backing: %s", msg)
	}
	vmsan(t, "volume", "export", "--data-dir", data, "v@tue", inc, "--since", "mon", "--backing", "mon.raw")
	compareImages(t, inc, full)
	out, err := exec.Command("qemu-img", "info", "--output=json", inc).Output()
	if err != nil {
		t.Fatal(err)
	}
	var info struct {
		ActualSize  int64  `json:"actual-size"`
		BackingFile string `json:"backing-filename"`
	}
	if err := json.Unmarshal(out, &info); err != nil {
		t.Fatal(err)
	}
	// 1.75 MiB changed (the zeroed MiB costs only metadata); a full copy
	// would be 16+ MiB.
	if info.ActualSize > 6<<20 || info.BackingFile != "mon.raw" {
		t.Fatalf("overlay: %d bytes, backing %q; want only the changes on mon.raw", info.ActualSize, info.BackingFile)
	}
	vmsan(t, "volume", "import", "--data-dir", data, "restored", inc)
	if sha(t, filepath.Join(data, "volumes", "restored.raw")) != sha(t, full) {
		t.Fatal("restore from the incremental export differs")
	}
}

// TestExportIncrementalReflink: on xfs the base and the new snapshot are
// reflinks of the volume, so the blocks nobody wrote since the base are
// shared and not even read: only the rewritten region is compared.
func TestExportIncrementalReflink(t *testing.T) {
	testutil.NeedTool(t, "qemu-img")
	testutil.NeedTool(t, "qemu-nbd")
	testutil.NeedTool(t, "qemu-io")
	tmp := t.TempDir()
	data := filepath.Join(testutil.LoopMount(t, "mkfs.xfs", 320<<20, "-q", "-f", "-m", "reflink=1"), "data")
	vmsan(t, "volume", "create", "--data-dir", data, "v", "--size", "64M")
	raw := filepath.Join(data, "volumes", "v.raw")
	qio := func(cmds ...string) {
		t.Helper()
		args := []string{"-f", "raw"}
		for _, c := range cmds {
			args = append(args, "-c", c)
		}
		if out, err := exec.Command("qemu-io", append(args, raw)...).CombinedOutput(); err != nil {
			t.Fatalf("qemu-io: %v\n%s", err, out)
		}
	}
	qio("write -P 0x44 0 32M")
	vmsan(t, "volume", "snapshot", "--data-dir", data, "v", "mon")
	vmsan(t, "volume", "export", "--data-dir", data, "v@mon", filepath.Join(tmp, "mon.raw"))
	qio("write -P 0x55 4M 1M", "write -z 8M 1M")
	vmsan(t, "volume", "snapshot", "--data-dir", data, "v", "tue")
	inc := filepath.Join(tmp, "tue.qcow2")
	out := vmsan(t, "volume", "export", "--data-dir", data, "v@tue", inc, "--since", "mon", "--backing", "mon.raw")
	var changed, read int64
	i := strings.Index(out, "incremental export: ")
	if i < 0 {
		t.Fatalf("no summary in:\n%s", out)
	}
	if _, err := fmt.Sscanf(out[i:], "incremental export: %d bytes changed since the base (%d bytes read", &changed, &read); err != nil {
		t.Fatalf("summary %q: %v", out[i:], err)
	}
	if changed != 2<<20 || read > 4<<20 {
		t.Fatalf("changed %d bytes (want %d), read %d to compare (want only the rewritten MiBs, not 32 MiB)", changed, 2<<20, read)
	}
	full := filepath.Join(tmp, "tue.raw")
	vmsan(t, "volume", "export", "--data-dir", data, "v@tue", full)
	compareImages(t, inc, full)
}
