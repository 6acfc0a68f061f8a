package daemon

import (
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/vmsan/vmsan/internal/config"
	"github.com/vmsan/vmsan/internal/testutil"
	"github.com/vmsan/vmsan/internal/volume"
)

// TestSnapshotCopyProgress: a snapshot --copy through the daemon (ext4:
// no reflink, so a full copy) reports its progress as copy events, which
// FollowCopy turns into rising done/total figures ending at the volume's
// size, the figures `vmsan volume snapshot --copy` draws its bar from.
func TestSnapshotCopyProgress(t *testing.T) {
	mnt := testutil.LoopMount(t, "mkfs.ext4", 128<<20, "-q", "-F")
	dir := filepath.Join(mnt, "data")
	start(t, dir, func(c *config.Config) { c.NoDefaultVolume = true })
	c, err := Dial(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const size = 48 << 20
	if _, err := c.Create(volume.CreateOptions{Name: "v1", Size: size}); err != nil {
		t.Fatal(err)
	}
	// Data to copy: 32 MiB of non-zero bytes in the raw file.
	f, err := os.OpenFile(filepath.Join(dir, "volumes", "v1.raw"), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 1<<20)
	for i := range buf {
		buf[i] = byte(i) | 1
	}
	for off := int64(0); off < 32<<20; off += 1 << 20 {
		if _, err := f.WriteAt(buf, off); err != nil {
			t.Fatal(err)
		}
	}
	f.Close()
	var mu sync.Mutex
	var seen [][2]int64
	stop := FollowCopy(c, "v1@s1", func(done, total int64) {
		mu.Lock()
		seen = append(seen, [2]int64{done, total})
		mu.Unlock()
	})
	si, err := c.CreateSnapshot("v1", "s1", true)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the final copy event", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(seen) > 0 && seen[len(seen)-1][0] == size
	})
	stop()
	if si.Method != volume.MethodCopy {
		t.Fatalf("snapshot method %q, want a copy", si.Method)
	}
	mu.Lock()
	defer mu.Unlock()
	for i, s := range seen {
		if s[1] != size || s[0] < 0 || s[0] > size || i > 0 && s[0] < seen[i-1][0] {
			t.Fatalf("copy progress %v", seen)
		}
	}
	t.Logf("%d progress events", len(seen))
	// Without a daemon (the copy runs in-process) there is nothing to follow.
	direct, viaDaemon, err := OpenVolumeOps(t.TempDir())
	if err != nil || viaDaemon {
		t.Fatalf("OpenVolumeOps on an empty directory: via daemon %v, %v", viaDaemon, err)
	}
	defer direct.Close()
	FollowCopy(direct, "v1@s1", func(int64, int64) { t.Error("called without a daemon") })()
}
