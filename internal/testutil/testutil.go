// Package testutil holds helpers shared by vmsan's tests: external-tool
// checks, disk-backed temp dirs, loop-mounted filesystems and TLS
// certificates. Only tests and test-support packages (exporttest,
// backendtest) import it; production code must not.
//
// Simplest use:
//
//	testutil.NeedTool(t, "qemu-img")       // t.Fatal in CI, t.Skip locally
//	dir := testutil.DiskTempDir(t)         // not tmpfs; O_DIRECT works
//	mnt := testutil.LoopMount(t, "mkfs.xfs", 320<<20, "-q", "-f")
//	certs := testutil.WriteTLSCerts(t, t.TempDir())
//
// The CI rule: CI sets the CI environment variable, and there a missing
// tool or a missing capability (root, loop devices) is a broken
// environment, so the test fails; on a developer machine it is skipped.
//
// Concurrency: every helper may be called from parallel tests; each works
// only on the directories it creates.
package testutil

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// InCI reports whether the tests run in CI, where missing tools fail.
func InCI() bool { return os.Getenv("CI") != "" }

// SkipOrFail fails the test in CI and skips it locally: for environment
// problems (a tool, root, loop devices) rather than bugs.
func SkipOrFail(t testing.TB, format string, args ...any) {
	t.Helper()
	if InCI() {
		t.Fatalf(format+" (required in CI)", args...)
	}
	t.Skipf(format, args...)
}

// NeedTool returns the path of the external program name. A missing program
// fails the test in CI and skips it locally.
func NeedTool(t testing.TB, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		SkipOrFail(t, "%s not installed", name)
	}
	return p
}

// BenchCheckEnv is the variable `make bench-check` sets.
const BenchCheckEnv = "VMSAN_BENCH_CHECK"

// NeedBenchCheck skips a test that compares vmsan's speed with another
// program's (a ratio, measured in the same run) unless it runs under `make
// bench-check`. Such a test measures the machine as much as the code: on
// CI's two shared cores a loaded full run made a 2x bound fail at 2.19x,
// so they run in their own target, with their assertions unchanged. This
// is a choice of target, not a missing tool, so it skips in CI too.
func NeedBenchCheck(t testing.TB) {
	t.Helper()
	if os.Getenv(BenchCheckEnv) == "" {
		t.Skipf("a same-run ratio against another program: runs under make bench-check (%s=1)", BenchCheckEnv)
	}
}

// NeedRoot fails (CI) or skips (locally) the test unless it runs as root.
func NeedRoot(t testing.TB, why string) {
	t.Helper()
	if os.Geteuid() != 0 {
		SkipOrFail(t, "%s need root", why)
	}
}

// DiskTempDir returns a temporary directory on a disk filesystem that
// accepts O_DIRECT: t.TempDir() if it qualifies, else a fresh directory
// under /var/tmp, else one in the current (package) directory. tmpfs,
// ramfs and overlayfs are refused because O_DIRECT, hole punching and
// extent reporting behave differently there. The directory is removed in
// t.Cleanup.
func DiskTempDir(t testing.TB) string {
	t.Helper()
	if d := t.TempDir(); diskLike(d) {
		return d
	}
	for _, parent := range []string{"/var/tmp", "."} {
		d, err := os.MkdirTemp(parent, "vmsan-test-")
		if err != nil {
			continue
		}
		t.Cleanup(func() { os.RemoveAll(d) })
		if diskLike(d) {
			return d
		}
	}
	t.Fatal("no disk filesystem with O_DIRECT found for the test (tried the temp dir, /var/tmp and the package dir)")
	return ""
}

// diskLike reports whether d is on a disk filesystem where O_DIRECT opens.
func diskLike(d string) bool {
	var st unix.Statfs_t
	if err := unix.Statfs(d, &st); err != nil {
		return false
	}
	switch int64(st.Type) {
	case unix.TMPFS_MAGIC, unix.RAMFS_MAGIC, unix.OVERLAYFS_SUPER_MAGIC:
		return false
	}
	p := filepath.Join(d, ".odirect-probe")
	f, err := os.OpenFile(p, os.O_CREATE|os.O_RDWR|unix.O_DIRECT, 0o600)
	if err != nil {
		return false
	}
	f.Close()
	os.Remove(p)
	return true
}

// LoopMount makes a sparse image file of the given size, formats it with
// mkfs (mkfsArgs come before the image path), loop-mounts it and returns the
// mount point; t.Cleanup unmounts it and removes the image. The image lives
// in $VMSAN_TEST_IMGDIR if set (lets a developer point at a real disk), else
// in DiskTempDir. Needs root, mkfs and mount: missing ones fail in CI and
// skip locally, and so does a failing loop mount (a container without loop
// devices).
func LoopMount(t testing.TB, mkfs string, size int64, mkfsArgs ...string) string {
	t.Helper()
	NeedTool(t, mkfs)
	NeedTool(t, "mount")
	NeedRoot(t, "loop mounts")
	base := os.Getenv("VMSAN_TEST_IMGDIR")
	if base == "" {
		base = DiskTempDir(t)
	}
	img := filepath.Join(base, "fs.img")
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(img) })
	if err := os.Truncate(img, size); err != nil {
		t.Fatal(err)
	}
	args := append(append([]string{}, mkfsArgs...), img)
	if out, err := exec.Command(mkfs, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", mkfs, err, out)
	}
	mnt := t.TempDir()
	if out, err := exec.Command("mount", "-o", "loop", img, mnt).CombinedOutput(); err != nil {
		SkipOrFail(t, "mount -o loop: %v\n%s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", mnt).CombinedOutput(); err != nil {
			// Lazy unmount so a leaked file handle does not leave the loop
			// device busy forever.
			exec.Command("umount", "-l", mnt).Run()
			t.Errorf("umount %s: %v\n%s", mnt, err, out)
		}
	})
	return mnt
}

// BuildVmsan builds cmd/vmsan into a fresh temp dir and returns the binary's
// path and a function that removes it. It takes no testing.TB so TestMain
// can call it; tests that want the binary only when needed call it once
// through a sync.Once. The build runs `go build` on the module's package
// path, so it works from any package directory of the module.
func BuildVmsan() (bin string, cleanup func(), err error) {
	dir, err := os.MkdirTemp("", "vmsan-test-bin-")
	if err != nil {
		return "", nil, err
	}
	cleanup = func() { os.RemoveAll(dir) }
	bin = filepath.Join(dir, "vmsan")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/vmsan/vmsan/cmd/vmsan").CombinedOutput(); err != nil {
		cleanup()
		return "", nil, fmt.Errorf("go build: %v\n%s", err, out)
	}
	return bin, cleanup, nil
}
