package volume

import (
	"path/filepath"
	"testing"

	"github.com/vmsan/vmsan/internal/testutil"
)

func TestStoreOnExt4(t *testing.T) {
	mnt := testutil.LoopMount(t, "mkfs.ext4", 256<<20, "-q", "-F")
	exerciseStore(t, filepath.Join(mnt, "data"))
}

func TestStoreOnXFS(t *testing.T) {
	mnt := testutil.LoopMount(t, "mkfs.xfs", 320<<20, "-q", "-f")
	exerciseStore(t, filepath.Join(mnt, "data"))
}

func TestStoreOnBtrfs(t *testing.T) {
	mnt := testutil.LoopMount(t, "mkfs.btrfs", 256<<20, "-q", "-f")
	exerciseStore(t, filepath.Join(mnt, "data"))
}
