package backend_test

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/vmsan/vmsan/internal/backend"
)

// needTool fails in CI (a missing tool there is a broken environment) and
// skips locally.
func needTool(t *testing.T, name string) {
	t.Helper()
	if _, err := exec.LookPath(name); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("%s not installed (required in CI): %v", name, err)
		}
		t.Skipf("%s not installed", name)
	}
}

// loopMount formats a sparse image with mkfs, loop-mounts it and returns the
// mount point; t.Cleanup undoes it.
func loopMount(t *testing.T, mkfs string, size int64, args ...string) string {
	t.Helper()
	needTool(t, mkfs)
	needTool(t, "mount")
	if os.Geteuid() != 0 {
		if os.Getenv("CI") != "" {
			t.Fatal("loop mounts need root in CI")
		}
		t.Skip("loop mounts need root")
	}
	img := filepath.Join(diskDir(t), "fs.img")
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(img, size); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(mkfs, append(args, img)...).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", mkfs, err, out)
	}
	mnt := t.TempDir()
	if out, err := exec.Command("mount", "-o", "loop", img, mnt).CombinedOutput(); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("mount -o loop: %v\n%s", err, out)
		}
		t.Skipf("mount -o loop: %v\n%s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", mnt).CombinedOutput(); err != nil {
			exec.Command("umount", "-l", mnt).Run()
			t.Errorf("umount %s: %v\n%s", mnt, err, out)
		}
	})
	return mnt
}

// TestFilesystems runs the backend on ext4, xfs and btrfs (the seeds compare
// them): random operations against a model in writeback and cache=none, and
// punch-hole/zero-range visibility through Extents.
func TestFilesystems(t *testing.T) {
	for _, fs := range []struct {
		mkfs string
		size int64
		args []string
	}{
		{"mkfs.ext4", 256 << 20, []string{"-q", "-F"}},
		{"mkfs.xfs", 320 << 20, []string{"-q", "-f"}},
		{"mkfs.btrfs", 256 << 20, []string{"-q", "-f"}},
	} {
		t.Run(fs.mkfs[5:], func(t *testing.T) {
			mnt := loopMount(t, fs.mkfs, fs.size, fs.args...)
			for i, mode := range []backend.CacheMode{backend.CacheWriteback, backend.CacheNone} {
				p := filepath.Join(mnt, string(mode)+".raw")
				if err := backend.CreateFile(p, 8<<20); err != nil {
					t.Fatal(err)
				}
				f, err := backend.OpenFile(p, mode, false)
				if err != nil {
					t.Fatalf("%s: %v", mode, err)
				}
				conformance(t, f, uint64(10+i), 200)
				// A punched range must show as a hole (all three support it).
				data := bytes.Repeat([]byte{7}, 1<<20)
				if err := f.WritevAt([][]byte{data}, 1<<20, false); err != nil {
					t.Fatal(err)
				}
				if err := f.Trim(1<<20, 1<<20); err != nil {
					t.Fatal(err)
				}
				ext, err := f.Extents(1<<20, 1<<20)
				if err != nil || len(ext) != 1 || !ext[0].Hole {
					t.Fatalf("%s: extents after punch: %v %v", mode, ext, err)
				}
				// Fast zeroing without holes works (ZERO_RANGE, or punch +
				// allocate) or says ErrNotFast; either way no data changes
				// wrongly.
				if err := f.WritevAt([][]byte{data}, 3<<20, false); err != nil {
					t.Fatal(err)
				}
				err = f.WriteZeroes(3<<20, 1<<20, false, true)
				got := make([]byte, 1<<20)
				f.ReadvAt([][]byte{got}, 3<<20)
				switch {
				case err == nil && !bytes.Equal(got, make([]byte, 1<<20)):
					t.Fatalf("%s: fast zero succeeded but data remains", mode)
				case errors.Is(err, backend.ErrNotFast) && !bytes.Equal(got, data):
					t.Fatalf("%s: ErrNotFast but data changed", mode)
				case err != nil && !errors.Is(err, backend.ErrNotFast):
					t.Fatalf("%s: fast zero: %v", mode, err)
				}
				t.Logf("%s %s: fast zero without holes: %v; alignment %d", fs.mkfs[5:], mode, err, f.Alignment())
				if err := f.Close(); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}
