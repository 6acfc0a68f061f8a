package volume

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// needTool fails in CI (a missing tool there is a broken environment) and
// skips locally.
func needTool(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("%s not installed (required in CI): %v", name, err)
		}
		t.Skipf("%s not installed", name)
	}
	return p
}

// loopMount makes a sparse image file of the given size, formats it with
// mkfs, loop-mounts it and returns the mount point; everything is undone in
// t.Cleanup. The image lives under a disk-backed directory: a loop device
// over a tmpfs file works too, but the point is to test the real filesystem.
func loopMount(t *testing.T, mkfs string, size int64, mkfsArgs ...string) string {
	t.Helper()
	needTool(t, mkfs)
	needTool(t, "mount")
	if os.Geteuid() != 0 {
		if os.Getenv("CI") != "" {
			t.Fatal("loop mounts need root in CI")
		}
		t.Skip("loop mounts need root")
	}
	base := os.Getenv("VMSAN_TEST_IMGDIR") // lets a developer point at a real disk
	if base == "" {
		base = t.TempDir()
	}
	img := filepath.Join(base, "fs.img")
	f, err := os.Create(img)
	if err != nil {
		t.Fatal(err)
	}
	f.Truncate(size)
	f.Close()
	t.Cleanup(func() { os.Remove(img) })
	args := append(append([]string{}, mkfsArgs...), img)
	if out, err := exec.Command(mkfs, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", mkfs, err, out)
	}
	mnt := t.TempDir()
	if out, err := exec.Command("mount", "-o", "loop", img, mnt).CombinedOutput(); err != nil {
		// In a container without loop devices this fails; that is an
		// environment problem, fatal in CI where it must work.
		if os.Getenv("CI") != "" {
			t.Fatalf("mount -o loop: %v\n%s", err, out)
		}
		t.Skipf("mount -o loop: %v\n%s", err, out)
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

func TestStoreOnExt4(t *testing.T) {
	mnt := loopMount(t, "mkfs.ext4", 256<<20, "-q", "-F")
	exerciseStore(t, filepath.Join(mnt, "data"))
}

func TestStoreOnXFS(t *testing.T) {
	mnt := loopMount(t, "mkfs.xfs", 320<<20, "-q", "-f")
	exerciseStore(t, filepath.Join(mnt, "data"))
}

func TestStoreOnBtrfs(t *testing.T) {
	mnt := loopMount(t, "mkfs.btrfs", 256<<20, "-q", "-f")
	exerciseStore(t, filepath.Join(mnt, "data"))
}
