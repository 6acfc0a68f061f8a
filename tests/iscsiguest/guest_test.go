package iscsiguest_test

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vmsan/vmsan/internal/testutil"
)

// guestMarker starts every line the guest reports on its serial console.
const guestMarker = "VMSAN-GUEST: "

var (
	guestOnce sync.Once
	guestDir  string
	guestErr  error
)

// buildGuest runs scripts/guest/build.sh --iscsi (idempotent, cached under
// .cache/guest-iscsi) once per test binary and returns its directory.
// VMSAN_GUEST_KERNEL=generic builds it with Debian's generic kernel instead
// of the cloud one (GUEST_KERNEL=generic: scsi_dh_alua, a bigger download),
// cached under .cache/guest-iscsi-generic.
func buildGuest(t *testing.T) string {
	t.Helper()
	for _, tool := range []string{"qemu-system-x86_64", "cpio", "iscsiadm", "iscsid", "multipath", "multipathd", "sg_inq", "bonnie++"} {
		testutil.NeedTool(t, tool)
	}
	guestOnce.Do(func() {
		name, kernel := "guest-iscsi", "cloud"
		if os.Getenv("VMSAN_GUEST_KERNEL") == "generic" {
			name, kernel = "guest-iscsi-generic", "generic"
		}
		dir := filepath.Join(repoRoot, ".cache", name)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, "bash", filepath.Join(repoRoot, "scripts", "guest", "build.sh"), "--iscsi", dir)
		cmd.Env = append(os.Environ(), "GUEST_KERNEL="+kernel)
		out, err := cmd.CombinedOutput()
		if err != nil {
			guestErr = fmt.Errorf("scripts/guest/build.sh --iscsi: %v\n%s", err, out)
			return
		}
		guestDir = dir
	})
	if guestErr != nil {
		testutil.SkipOrFail(t, "%v", guestErr)
	}
	return guestDir
}

// guestRun is one boot of the iSCSI guest.
type guestRun struct {
	Script string            // file under testdata/ that becomes /test.sh
	Env    map[string]string // written to /test.env as shell assignments
	// OnLine, if set, is called from the console reader for every
	// VMSAN-GUEST line (without the marker), in order, while the guest runs.
	OnLine func(line string)
	// Quiet, if set, keeps the lines it returns true for out of the test
	// log (they are still in Lines and passed to OnLine).
	Quiet func(line string) bool
	// Answer, if set, is called after OnLine for every VMSAN-GUEST line;
	// a non-empty return is typed into the guest's console as one line
	// (init-iscsi's ask reads it): the host tells the guest that an
	// action it asked for is done, with no race on timing.
	Answer  func(line string) string
	Timeout time.Duration
}

// guestResult is what a boot reported.
type guestResult struct {
	Lines   []string // VMSAN-GUEST lines, marker removed
	Console string   // the whole console output
	Elapsed time.Duration
}

// has reports whether a reported line starts with prefix.
func (r *guestResult) has(prefix string) bool { return r.line(prefix) != "" }

// line returns the first reported line starting with prefix, or "".
func (r *guestResult) line(prefix string) string {
	for _, l := range r.Lines {
		if strings.HasPrefix(l, prefix) {
			return l
		}
	}
	return ""
}

// bootGuest boots the guest with the script and environment of run and
// waits for it to power off. The test fails if QEMU fails, the guest runs
// past the timeout or does not report "DONE OK".
func bootGuest(t *testing.T, guest string, run guestRun) *guestResult {
	t.Helper()
	dir := t.TempDir()
	script, err := os.ReadFile(filepath.Join("testdata", run.Script))
	if err != nil {
		t.Fatal(err)
	}
	var env strings.Builder
	keys := make([]string, 0, len(run.Env))
	for k := range run.Env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(&env, "%s=%s\n", k, shellQuote(run.Env[k]))
	}
	overlay, err := cpioGzip(map[string][]byte{"test.sh": script, "test.env": []byte(env.String())})
	if err != nil {
		t.Fatal(err)
	}
	base, err := os.ReadFile(filepath.Join(guest, "initramfs.gz"))
	if err != nil {
		t.Fatal(err)
	}
	// The kernel unpacks concatenated archives in order: /test.sh and
	// /test.env join the base image.
	initrd := filepath.Join(dir, "initrd.gz")
	if err := os.WriteFile(initrd, append(base, overlay...), 0o644); err != nil {
		t.Fatal(err)
	}
	timeout := run.Timeout
	if timeout == 0 {
		timeout = 3 * time.Minute
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "qemu-system-x86_64",
		"-accel", "tcg", "-m", "512", "-nographic", "-no-reboot",
		// User mode networking: no host interfaces, the host's loopback at
		// 10.0.2.2. No option ROM: iPXE would only slow the boot.
		"-netdev", "user,id=n0", "-device", "virtio-net-pci,netdev=n0,romfile=",
		"-kernel", filepath.Join(guest, "vmlinuz"),
		"-initrd", initrd,
		"-append", "console=ttyS0 panic=-1 quiet")
	// The console's input: -nographic multiplexes QEMU's stdin onto the
	// guest's serial port. It stays open (an EOF there is harmless, but
	// an answer must not find it closed) until QEMU exits.
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	res := &guestResult{}
	start := time.Now()
	var console bytes.Buffer
	readerDone := make(chan struct{})
	go func() {
		defer close(readerDone)
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			l := strings.TrimRight(sc.Text(), "\r")
			console.WriteString(l + "\n")
			if i := strings.Index(l, guestMarker); i >= 0 {
				msg := strings.TrimSpace(l[i+len(guestMarker):])
				res.Lines = append(res.Lines, msg)
				if run.Quiet == nil || !run.Quiet(msg) {
					t.Logf("guest +%v: %s", time.Since(start).Round(100*time.Millisecond), msg)
				}
				if run.OnLine != nil {
					run.OnLine(msg)
				}
				if run.Answer != nil {
					if a := run.Answer(msg); a != "" {
						t.Logf("host answers %q", a)
						io.WriteString(stdin, a+"\n")
					}
				}
			}
		}
		io.Copy(io.Discard, pr) // a line over 1 MiB: keep QEMU from blocking
	}()
	runErr := cmd.Run()
	pw.Close()
	<-readerDone
	res.Elapsed = time.Since(start)
	res.Console = console.String()
	// VMSAN_GUEST_CONSOLE_DIR keeps the console of every boot (the test's
	// temporary directory goes away when it passes).
	if keep := os.Getenv("VMSAN_GUEST_CONSOLE_DIR"); keep != "" {
		name := strings.NewReplacer("/", "_", " ", "_").Replace(t.Name()) + ".console.log"
		if err := os.WriteFile(filepath.Join(keep, name), console.Bytes(), 0o644); err != nil {
			t.Logf("VMSAN_GUEST_CONSOLE_DIR: %v", err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "console.log"), console.Bytes(), 0o644); err == nil {
		t.Logf("guest console: %s (%v)", filepath.Join(dir, "console.log"), res.Elapsed.Round(100*time.Millisecond))
	}
	if ctx.Err() != nil {
		t.Fatalf("guest still running after %v; console tail:\n%s", timeout, tail(res.Console, 60))
	}
	if runErr != nil {
		t.Fatalf("qemu-system-x86_64: %v; console tail:\n%s", runErr, tail(res.Console, 60))
	}
	if !res.has("DONE OK") {
		t.Fatalf("guest did not report DONE OK; console tail:\n%s", tail(res.Console, 80))
	}
	return res
}

// shellQuote quotes s for a POSIX shell assignment.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// cpioGzip returns a gzip'd newc cpio archive holding files (name ->
// content) at the archive root, mode 0644, owned by root.
func cpioGzip(files map[string][]byte) ([]byte, error) {
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	ino := 1
	entry := func(name string, mode uint32, data []byte) error {
		// newc: "070701" and 13 eight-digit hex fields, the NUL-terminated
		// name padded to 4 bytes (header included), the data padded to 4.
		hdr := fmt.Sprintf("070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
			ino, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(name)+1, 0)
		ino++
		buf := append([]byte(hdr), name...)
		buf = append(buf, 0)
		for len(buf)%4 != 0 {
			buf = append(buf, 0)
		}
		buf = append(buf, data...)
		for len(buf)%4 != 0 {
			buf = append(buf, 0)
		}
		_, err := zw.Write(buf)
		return err
	}
	for _, n := range names {
		if err := entry(n, 0o100644, files[n]); err != nil {
			return nil, err
		}
	}
	if err := entry("TRAILER!!!", 0, nil); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// tail returns the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
