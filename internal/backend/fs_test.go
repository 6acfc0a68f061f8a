package backend_test

import (
	"bytes"
	"errors"
	"path/filepath"
	"testing"

	"github.com/vmsan/vmsan/internal/backend"
	"github.com/vmsan/vmsan/internal/testutil"
)

// TestFilesystems runs the backend on ext4, xfs and btrfs (users compare
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
			mnt := testutil.LoopMount(t, fs.mkfs, fs.size, fs.args...)
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
