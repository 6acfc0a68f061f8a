package bench

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vmsan/vmsan/internal/testutil"
)

// loopDevice attaches img to a free loop device. When this environment
// cannot create loop devices (not root, an unprivileged container) it skips
// with the reason locally and fails in CI, like testutil.LoopMount.
func loopDevice(t *testing.T, img string) string {
	t.Helper()
	testutil.NeedTool(t, "losetup")
	testutil.NeedRoot(t, "loop devices")
	out, err := exec.Command("losetup", "--find", "--show", img).CombinedOutput()
	if err != nil {
		testutil.SkipOrFail(t, "cannot attach a loop device here: %v: %s", err, out)
	}
	dev := strings.TrimSpace(string(out))
	t.Cleanup(func() { exec.Command("losetup", "-d", dev).Run() })
	return dev
}

// TestBlockDeviceSafety: a device with a mounted filesystem is refused for
// writing even with --force; an unmounted device holding a filesystem needs
// --force; a blank device is benchmarked, with its queue settings recorded.
func TestBlockDeviceSafety(t *testing.T) {
	testutil.NeedTool(t, "mkfs.ext4")
	ctx := context.Background()
	dir := testutil.DiskTempDir(t)
	img := filepath.Join(dir, "dev.img")
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(img, 64<<20); err != nil {
		t.Fatal(err)
	}
	dev := loopDevice(t, img)

	// Blank device: fine, and described.
	tg, err := OpenTarget(ctx, dev, TargetOptions{Direct: true})
	if err != nil {
		t.Fatal(err)
	}
	in := tg.Info()
	if in.Kind != "blockdev" || in.Size != 64<<20 || in.Queue["logical_block_size"] == "" {
		t.Fatalf("info: %+v", in)
	}
	if _, err := RunProfile(ctx, tg, Options{Profile: ProfileJob, Job: JobSpec{RW: RandWrite, BS: 4096, QD: 4, MaxOps: 100}}, nil); err != nil {
		t.Fatal(err)
	}
	tg.Close()

	if out, err := exec.Command("mkfs.ext4", "-q", "-F", dev).CombinedOutput(); err != nil {
		t.Fatalf("mkfs: %v %s", err, out)
	}
	// Unmounted filesystem: needs --force.
	tg, err = OpenTarget(ctx, dev, TargetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = RunProfile(ctx, tg, quickOpts(ProfileCDM), nil)
	tg.Close()
	if !errors.Is(err, ErrNeedForce) {
		t.Fatalf("device with ext4: want ErrNeedForce, got %v", err)
	}
	// Mounted: refused outright, even with --force.
	mnt := filepath.Join(dir, "mnt")
	os.Mkdir(mnt, 0o755)
	if out, err := exec.Command("mount", dev, mnt).CombinedOutput(); err != nil {
		testutil.SkipOrFail(t, "cannot mount here: %v %s", err, out)
	}
	defer exec.Command("umount", mnt).Run()
	if tg, err := OpenTarget(ctx, dev, TargetOptions{Force: true}); err == nil {
		tg.Close()
		t.Fatal("opened a mounted device for writing")
	} else if !strings.Contains(err.Error(), "in use") {
		t.Fatalf("want an in-use error, got %v", err)
	}
	// Read-only benchmarking of a mounted device is allowed.
	tg, err = OpenTarget(ctx, dev, TargetOptions{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	o := quickOpts(ProfileGnome)
	o.ReadOnly = true
	if _, err := RunProfile(ctx, tg, o, nil); err != nil {
		t.Fatal(err)
	}
	tg.Close()
}
