package interop

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmsan/vmsan/tests/interop/servers"
)

// qemuIO runs qemu-io with the given -c commands against uri in one
// connection and returns the output. ok reports whether every command
// succeeded: qemu-io's exit status alone is not enough on every version, so a
// failed pattern check or I/O error in the output also counts as failure.
func qemuIO(t testing.TB, uri string, cmds ...string) (out string, ok bool) {
	t.Helper()
	args := []string{"-f", "raw"}
	for _, c := range cmds {
		args = append(args, "-c", c)
	}
	args = append(args, uri)
	r := runCmd(t, 2*time.Minute, "qemu-io", args...)
	out = r.stdout + r.stderr
	failed := r.code != 0 ||
		strings.Contains(out, "Pattern verification failed") ||
		strings.Contains(out, "failed:") ||
		strings.Contains(out, "can't open")
	return out, !failed
}

func mustQemuIO(t testing.TB, uri string, cmds ...string) string {
	t.Helper()
	out, ok := qemuIO(t, uri, cmds...)
	if !ok {
		t.Fatalf("qemu-io %q on %s failed:\n%s", cmds, uri, tail(out))
	}
	return out
}

// TestQemuIOPatterns: write/read patterns, write -z, discard, and a negative
// control proving a wrong pattern is detected.
func TestQemuIOPatterns(t *testing.T) {
	t.Parallel()
	need(t, "qemu-io")
	tg := newTarget(t, 64*MiB)

	mustQemuIO(t, tg.uri(),
		"write -P 0xab 0 1M",
		"read -P 0xab 0 1M",
		"write -P 0xcd 1M 1M",
		"read -P 0xcd 1M 1M",
	)
	// Negative control: the check must be able to fail.
	if out, ok := qemuIO(t, tg.uri(), "read -P 0x00 0 4k"); ok {
		t.Fatalf("reading 0xab data with expected pattern 0x00 passed; the verification is broken:\n%s", out)
	}

	// write -z zeroes a range inside written data; neighbours stay intact.
	mustQemuIO(t, tg.uri(),
		"write -z 256k 256k",
		"read -P 0 256k 256k",
		"read -P 0xab 0 256k",
		"read -P 0xab 512k 512k",
	)
	// write -z with the "may unmap" flag (NBD WRITE_ZEROES without NO_HOLE).
	mustQemuIO(t, tg.uri(),
		"write -z -u 1M 512k",
		"read -P 0 1M 512k",
		"read -P 0xcd 1536k 512k",
	)
	// discard: vmsan punches a hole, so the range then reads as zeroes
	// (NBD only promises "unspecified" after TRIM; vmsan promises zeroes).
	mustQemuIO(t, tg.uri(),
		"discard 0 128k",
		"read -P 0 0 128k",
		"read -P 0xab 128k 128k",
	)
	// Unaligned small I/O is the client's problem in NBD only if the server
	// advertises a minimum block size > 1; vmsan accepts byte granularity.
	mustQemuIO(t, tg.uri(),
		"write -P 0x5a 4097 1000",
		"read -P 0x5a 4097 1000",
	)
}

// TestQemuIOAioBurstAndReconnect: 64 concurrent aio writes with distinct
// patterns, aio_flush, then verification from a new connection, and again
// after a graceful server restart.
func TestQemuIOAioBurstAndReconnect(t *testing.T) {
	t.Parallel()
	need(t, "qemu-io")
	tg := newTarget(t, 64*MiB)

	const n = 64
	const chunk = 64 * KiB
	var writes, reads []string
	for i := 0; i < n; i++ {
		// Interleave the submission order so neighbours are not submitted
		// back to back: a merging engine still sees adjacent requests.
		j := (i * 37) % n
		writes = append(writes, fmt.Sprintf("aio_write -P 0x%02x %d %d", j+1, int64(j)*chunk, chunk))
		reads = append(reads, fmt.Sprintf("read -P 0x%02x %d %d", i+1, int64(i)*chunk, chunk))
	}
	writes = append(writes, "aio_flush")
	mustQemuIO(t, tg.uri(), writes...)
	// A second burst of 4 KiB aio writes over a fresh range: many small
	// requests in flight at once, the pattern that must be merged.
	var small []string
	for i := 0; i < 256; i++ {
		small = append(small, fmt.Sprintf("aio_write -P 0x77 %d 4k", 8*MiB+int64(i)*4*KiB))
	}
	small = append(small, "aio_flush")
	mustQemuIO(t, tg.uri(), small...)

	verify := append(append([]string{}, reads...), "read -P 0x77 8M 1M", "read -P 0 9M 1M")
	mustQemuIO(t, tg.uri(), verify...) // new connection
	tg.restart()
	mustQemuIO(t, tg.uri(), verify...) // new process
}

// TestQemuImg: info, convert a qcow2 image into the volume and back out,
// compare, and a hole in qemu-img map after discard.
func TestQemuImg(t *testing.T) {
	t.Parallel()
	need(t, "qemu-img", "qemu-io")
	const size = 64 * MiB
	tg := newTarget(t, size)
	work := t.TempDir()

	// info: the export's size is the volume's size.
	var info struct {
		VirtualSize int64  `json:"virtual-size"`
		Format      string `json:"format"`
	}
	out := mustRun(t, time.Minute, "qemu-img", "info", "-f", "raw", "--output=json", tg.uri())
	if err := json.Unmarshal([]byte(out), &info); err != nil {
		t.Fatalf("qemu-img info json: %v\n%s", err, out)
	}
	if info.VirtualSize != size || info.Format != "raw" {
		t.Fatalf("qemu-img info: virtual-size %d format %q, want %d raw", info.VirtualSize, info.Format, size)
	}

	// A qcow2 source with data in two places and holes elsewhere.
	src := filepath.Join(work, "src.qcow2")
	mustRun(t, time.Minute, "qemu-img", "create", "-q", "-f", "qcow2", src, fmt.Sprint(size))
	mustQemuIOFile(t, "qcow2", src, "write -P 0x5a 0 4M", "write -P 0x33 32M 1M", "write -P 0x44 63M 1M")

	mustRun(t, 2*time.Minute, "qemu-img", "convert", "-n", "-f", "qcow2", "-O", "raw", src, tg.uri())
	mustRun(t, 2*time.Minute, "qemu-img", "compare", "-f", "qcow2", "-F", "raw", src, tg.uri())

	// Back out, to qcow2 and to raw, from a new connection.
	outQ := filepath.Join(work, "out.qcow2")
	mustRun(t, 2*time.Minute, "qemu-img", "convert", "-f", "raw", "-O", "qcow2", tg.uri(), outQ)
	mustRun(t, 2*time.Minute, "qemu-img", "compare", "-f", "qcow2", "-F", "qcow2", src, outQ)

	// Negative control: after changing one byte range in the volume,
	// compare must report a difference (exit 1).
	mustQemuIO(t, tg.uri(), "write -P 0x01 40M 512")
	if r := runCmd(t, 2*time.Minute, "qemu-img", "compare", "-f", "qcow2", "-F", "raw", src, tg.uri()); r.code != 1 {
		t.Fatalf("qemu-img compare after modification: exit %d, want 1 (images differ)\n%s%s", r.code, r.stdout, r.stderr)
	}

	// map: write 8 MiB of data at 16M, discard the middle 2 MiB, and
	// expect qemu-img map (NBD block status, base:allocation) to show a
	// hole there and data around it.
	mustQemuIO(t, tg.uri(), "write -P 0x11 16M 8M", "aio_flush", "discard 19M 2M")
	out = mustRun(t, time.Minute, "qemu-img", "map", "-f", "raw", "--output=json", tg.uri())
	var m []struct {
		Start, Length int64
		Zero, Data    bool
	}
	if err := json.Unmarshal([]byte(out), &m); err != nil {
		t.Fatalf("qemu-img map json: %v\n%s", err, out)
	}
	check := func(off, length int64, wantData bool) {
		t.Helper()
		for p := off; p < off+length; {
			found := false
			for _, e := range m {
				if e.Start <= p && p < e.Start+e.Length {
					if e.Data != wantData || e.Zero == wantData {
						t.Fatalf("qemu-img map at %d: data=%v zero=%v, want data=%v zero=%v\n%s", p, e.Data, e.Zero, wantData, !wantData, out)
					}
					p = e.Start + e.Length
					found = true
					break
				}
			}
			if !found {
				t.Fatalf("qemu-img map has no extent covering %d\n%s", p, out)
			}
		}
	}
	check(19*MiB, 2*MiB, false) // discarded: hole
	check(16*MiB, 3*MiB, true)  // data before it
	check(21*MiB, 3*MiB, true)  // data after it
	check(48*MiB, 8*MiB, false) // never written: hole
	mustQemuIO(t, tg.uri(), "read -P 0 19M 2M", "read -P 0x11 16M 3M", "read -P 0x11 21M 3M")
}

func mustQemuIOFile(t testing.TB, format, file string, cmds ...string) {
	t.Helper()
	args := []string{"-f", format}
	for _, c := range cmds {
		args = append(args, "-c", c)
	}
	mustRun(t, time.Minute, "qemu-io", append(args, file)...)
}

// TestUnixSocketListener: vmsan listens on TCP and a Unix socket at once
// (--listen is repeatable); data written through one is read through the
// other, by qemu-io and nbdinfo using nbd+unix:// URIs.
func TestUnixSocketListener(t *testing.T) {
	t.Parallel()
	need(t, "qemu-io", "nbdinfo")
	if serverKind != servers.VMSAN {
		t.Skip("the anchors are started with a TCP listener only") // skip: variant
	}
	// Unix socket paths are limited to 108 bytes: keep it short.
	sockDir, err := os.MkdirTemp("", "vi")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sockDir) })
	sock := filepath.Join(sockDir, "nbd.sock")
	tg := newTarget(t, 16*MiB, serverArgs("--listen", "unix:"+sock))
	unixURI := "nbd+unix:///" + tg.name + "?socket=" + sock

	mustQemuIO(t, unixURI, "write -P 0x3c 0 1M", "aio_flush")
	mustQemuIO(t, tg.uri(), "read -P 0x3c 0 1M", "write -P 0x3d 1M 1M", "aio_flush")
	mustQemuIO(t, unixURI, "read -P 0x3d 1M 1M", "read -P 0 2M 1M")
	if got := strings.TrimSpace(mustRun(t, 30*time.Second, "nbdinfo", "--size", unixURI)); got != fmt.Sprint(16*MiB) {
		t.Fatalf("nbdinfo --size over the Unix socket: %s, want %d", got, 16*MiB)
	}
}
