package volume

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/vmsan/vmsan/internal/testutil"
	"github.com/vmsan/vmsan/internal/vfs"
)

// exerciseImages: OpenImage reads a volume and its snapshot through the
// store (data regions, contents, allocation), refuses a damaged volume
// and an unknown ref; on a reflink filesystem the snapshot's extents
// share the volume's blocks.
func exerciseImages(t *testing.T, dir string, reflink bool) {
	s := openStore(t, dir)
	if _, err := s.Create(CreateOptions{Name: "v", Size: 8 << 20}); err != nil {
		t.Fatal(err)
	}
	fillPattern(t, s.RawPath("v"), 1<<20, 64<<10, 0x5a)
	if f, err := os.OpenFile(s.RawPath("v"), os.O_RDWR, 0); err == nil {
		f.Sync()
		f.Close()
	}
	if _, err := s.CreateSnapshot("v", "s", CloneOptions{Copy: !reflink}); err != nil {
		t.Fatal(err)
	}
	for _, ref := range []string{"v", "v@s"} {
		img, err := s.OpenImage(ref)
		if err != nil {
			t.Fatalf("%s: %v", ref, err)
		}
		if img.Size() != 8<<20 || img.Path() == "" {
			t.Fatalf("%s: size %d path %q", ref, img.Size(), img.Path())
		}
		start, end, ok, err := img.Data(0)
		if err != nil || !ok || start > 1<<20 || end < 1<<20+64<<10 {
			t.Fatalf("%s: first data region [%d, %d) %v %v, want one covering the pattern", ref, start, end, ok, err)
		}
		b := make([]byte, 64<<10)
		if _, err := img.ReadAt(b, 1<<20); err != nil || !bytes.Equal(b, bytes.Repeat([]byte{0x5a}, 64<<10)) {
			t.Fatalf("%s: contents differ (%v)", ref, err)
		}
		if a, err := img.Allocated(); err != nil || a <= 0 || a >= 8<<20 {
			t.Fatalf("%s: allocated %d (%v), want thin", ref, a, err)
		}
		img.Close()
	}
	if reflink {
		v, _ := s.OpenImage("v")
		sn, _ := s.OpenImage("v@s")
		ve, err1 := v.Extents()
		se, err2 := sn.Extents()
		if err1 != nil || err2 != nil {
			t.Fatal(err1, err2)
		}
		if !SameBlocks(ve, se, 1<<20, 64<<10) {
			t.Fatal("a reflinked snapshot does not share the volume's blocks")
		}
		v.Close()
		sn.Close()
	}
	if _, err := s.OpenImage("v@nope"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("unknown snapshot: %v", err)
	}
	os.Truncate(s.RawPath("v"), 4<<20)
	if _, err := s.OpenImage("v"); !errors.Is(err, ErrDamaged) {
		t.Fatalf("damaged volume: %v", err)
	}
	// OpenImageFile: the same reader by path (commands next to a daemon).
	img, err := OpenImageFile(s.SnapshotPath("v", "s"))
	if err != nil {
		t.Fatal(err)
	}
	if img.Size() != 8<<20 {
		t.Fatalf("size %d", img.Size())
	}
	img.Close()
	if RawFile(dir, "v") != s.RawPath("v") {
		t.Fatalf("RawFile %s, RawPath %s", RawFile(dir, "v"), s.RawPath("v"))
	}
}

func TestImages(t *testing.T) { exerciseImages(t, t.TempDir(), false) }

func TestImagesOnXFS(t *testing.T) {
	mnt := testutil.LoopMount(t, "mkfs.xfs", 320<<20, "-q", "-f")
	exerciseImages(t, filepath.Join(mnt, "data"), true)
}

// On a MemFS (no hole information, no extents) images still read, and
// report all of themselves as data.
func TestImagesOnMemFS(t *testing.T) {
	s, err := OpenFS(vfs.NewMem(), "/data")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Create(CreateOptions{Name: "v", Size: 64 << 10}); err != nil {
		t.Fatal(err)
	}
	img, err := s.OpenImage("v")
	if err != nil {
		t.Fatal(err)
	}
	defer img.Close()
	if st, end, ok, err := img.Data(0); err != nil || !ok || st != 0 || end != 64<<10 {
		t.Fatalf("data %d %d %v %v", st, end, ok, err)
	}
	if _, err := img.Extents(); err == nil {
		t.Fatal("a MemFS image reported extents")
	}
}
