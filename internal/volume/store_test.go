package volume

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/vmsan/vmsan/internal/atomicfile"
)

// allocated returns the bytes actually allocated to path (st_blocks * 512).
func allocated(t *testing.T, path string) int64 {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * 512
}

func openStore(t *testing.T, dir string) *Store {
	t.Helper()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// exerciseStore runs the store's whole life cycle in dir; it is shared by
// the plain test and the per-filesystem tests.
func exerciseStore(t *testing.T, dir string) {
	s := openStore(t, dir)
	const size = 4 << 30
	m, err := s.Create(CreateOptions{Name: "vm1", Size: size, Description: "test"})
	if err != nil {
		t.Fatal(err)
	}
	if m.UUID == "" || m.Size != size || m.LogicalBlockSize != 512 || m.PhysicalBlockSize != 4096 || m.Cache != "writeback" || m.Created.IsZero() {
		t.Fatalf("bad meta %+v", m)
	}
	raw := s.RawPath("vm1")
	st, err := os.Stat(raw)
	if err != nil || st.Size() != size {
		t.Fatalf("raw file: %v size %d", err, st.Size())
	}
	// Thin: a 4 GiB volume allocates (almost) nothing.
	if a := allocated(t, raw); a > 64<<10 {
		t.Fatalf("new 4 GiB volume allocates %d bytes; want a sparse file", a)
	}
	// Writing 1 MiB in the middle allocates about 1 MiB, not the whole file.
	f, err := os.OpenFile(raw, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 1<<20)
	for i := range buf {
		buf[i] = byte(i)
	}
	if _, err := f.WriteAt(buf, 2<<30); err != nil {
		t.Fatal(err)
	}
	f.Sync()
	f.Close()
	if a := allocated(t, raw); a < 1<<20 || a > 8<<20 {
		t.Fatalf("after writing 1 MiB, allocated %d bytes", a)
	}

	if _, err := s.Create(CreateOptions{Name: "vm1", Size: size}); !errors.Is(err, ErrExists) {
		t.Fatalf("duplicate create: %v", err)
	}
	if _, err := s.Create(CreateOptions{Name: "odd", Size: 1000}); !errors.Is(err, ErrBadSize) {
		t.Fatalf("size not multiple of 512: %v", err)
	}
	if _, err := s.Create(CreateOptions{Name: "big4k", Size: 4096 + 512, LogicalBlockSize: 4096}); !errors.Is(err, ErrBadSize) {
		t.Fatalf("size not multiple of 4096 logical block: %v", err)
	}
	if _, err := s.Create(CreateOptions{Name: "../evil", Size: 4096}); !errors.Is(err, ErrInvalidName) {
		t.Fatalf("bad name: %v", err)
	}
	if _, err := s.Create(CreateOptions{Name: "c", Size: 4096, Cache: "bogus"}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("bogus cache mode: %v", err)
	}
	if _, err := s.Create(CreateOptions{Name: "c", Size: 4096, Description: strings.Repeat("x", MaxDescriptionLen+1)}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("oversized description: %v", err)
	}
	if _, err := s.Create(CreateOptions{Name: "c", Size: 4096, LogicalBlockSize: 1000}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("bad block size: %v", err)
	}
	if _, err := s.Create(CreateOptions{Name: "vm2", Size: 1 << 20, Cache: "none", ReadOnly: true, Rotational: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Resize("vm2", 2<<20, false); !errors.Is(err, ErrReadOnly) {
		t.Fatalf("resize of read-only volume: %v", err)
	}
	list, err := s.List()
	if err != nil || len(list) != 2 || list[0].Name != "vm1" || list[1].Name != "vm2" || !list[1].ReadOnly || !list[1].Rotational || list[1].Cache != "none" {
		t.Fatalf("list = %+v, %v", list, err)
	}

	// Grow keeps data and stays sparse.
	m, err = s.Resize("vm1", 8<<30, false)
	if err != nil || m.Size != 8<<30 {
		t.Fatalf("grow: %+v %v", m, err)
	}
	if st, _ := os.Stat(raw); st.Size() != 8<<30 {
		t.Fatalf("raw after grow: %d", st.Size())
	}
	if a := allocated(t, raw); a > 8<<20 {
		t.Fatalf("grow allocated data: %d", a)
	}
	got := make([]byte, len(buf))
	f, _ = os.Open(raw)
	f.ReadAt(got, 2<<30)
	f.Close()
	if string(got) != string(buf) {
		t.Fatal("data changed by grow")
	}
	// Shrink needs force.
	if _, err := s.Resize("vm1", 1<<30, false); !errors.Is(err, ErrShrink) {
		t.Fatalf("shrink without force: %v", err)
	}
	if m, _ := s.Get("vm1"); m.Size != 8<<30 {
		t.Fatalf("failed shrink changed size to %d", m.Size)
	}
	if _, err := s.Resize("vm1", 1<<30, true); err != nil {
		t.Fatal(err)
	}
	if st, _ := os.Stat(raw); st.Size() != 1<<30 {
		t.Fatalf("raw after shrink: %d", st.Size())
	}
	if _, err := s.Resize("vm1", 1<<30+1, true); !errors.Is(err, ErrBadSize) {
		t.Fatalf("misaligned resize: %v", err)
	}
	if _, err := s.Resize("nope", 1<<30, false); !errors.Is(err, ErrNotFound) {
		t.Fatalf("resize missing: %v", err)
	}

	// Delete refuses while in use.
	inUse := true
	s.SetHooks(Hooks{InUse: func(n string) bool { return inUse && n == "vm1" }})
	if err := s.Delete("vm1", false); !errors.Is(err, ErrInUse) {
		t.Fatalf("delete in use: %v", err)
	}
	if _, err := s.StateDir("vm1"); err != nil {
		t.Fatal(err)
	}
	inUse = false
	if err := s.Delete("vm1", false); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get("vm1"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("get after delete: %v", err)
	}
	ents, _ := os.ReadDir(filepath.Join(dir, VolumesDir))
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), "vm1") {
			t.Fatalf("leftover after delete: %s", e.Name())
		}
	}
	if err := s.Delete("vm1", false); !errors.Is(err, ErrNotFound) {
		t.Fatalf("delete missing: %v", err)
	}
}

func TestStoreLifecycle(t *testing.T) { exerciseStore(t, t.TempDir()) }

func TestStoreLock(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir)
	if _, err := Open(dir); !errors.Is(err, ErrLocked) {
		t.Fatalf("second open: %v", err)
	}
	// Another process is locked out too (flock is per open file description,
	// so this also holds across processes); check with flock(1) if present.
	if p, err := exec.LookPath("flock"); err == nil {
		out, err := exec.Command(p, "-n", filepath.Join(dir, LockFileName), "true").CombinedOutput()
		if err == nil {
			t.Fatalf("flock(1) acquired a held lock: %s", out)
		}
	}
	s.Close()
	s2, err := Open(dir)
	if err != nil {
		t.Fatalf("reopen after close: %v", err)
	}
	s2.Close()
}

// TestCrashDebris simulates the states a crash can leave: a temp metadata
// file from an interrupted atomic write, a raw file without metadata from an
// interrupted create, and a raw file whose length disagrees with the
// metadata from an interrupted resize.
func TestCrashDebris(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir)
	if _, err := s.Create(CreateOptions{Name: "a", Size: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	s.Close()
	vdir := filepath.Join(dir, VolumesDir)
	os.WriteFile(filepath.Join(vdir, atomicfile.TempPrefix+"a.json-999"), []byte(`{"name":"a","si`), 0o644)
	os.WriteFile(filepath.Join(vdir, "orphan.raw"), []byte("junk"), 0o644)
	os.Truncate(filepath.Join(vdir, "a.raw"), 3<<20) // interrupted grow

	s = openStore(t, dir)
	list, err := s.List()
	if err != nil || len(list) != 1 || list[0].Name != "a" || list[0].Size != 1<<20 {
		t.Fatalf("list after debris: %+v %v", list, err)
	}
	if st, _ := os.Stat(filepath.Join(vdir, "a.raw")); st.Size() != 1<<20 {
		t.Fatalf("raw not reconciled to metadata size: %d", st.Size())
	}
	if _, err := os.Stat(filepath.Join(vdir, atomicfile.TempPrefix+"a.json-999")); !os.IsNotExist(err) {
		t.Fatal("temp debris not removed")
	}
	// Create over an orphan raw file: the orphan is replaced by a hole.
	if _, err := s.Create(CreateOptions{Name: "orphan", Size: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 4)
	f, _ := os.Open(s.RawPath("orphan"))
	f.ReadAt(b, 0)
	f.Close()
	if string(b) != "\x00\x00\x00\x00" {
		t.Fatalf("orphan data visible in new volume: %q", b)
	}
	// Corrupt metadata is a clear error, not a panic.
	os.WriteFile(filepath.Join(vdir, "bad.json"), []byte("{not json"), 0o644)
	if _, err := s.Get("bad"); err == nil || !strings.Contains(err.Error(), "corrupt metadata") {
		t.Fatalf("corrupt metadata: %v", err)
	}
	// ...and does not hide the other volumes, or stop the store opening.
	list, err = s.List()
	if err == nil || len(list) != 2 || list[0].Name != "a" || list[1].Name != "orphan" {
		t.Fatalf("list with a corrupt entry: %+v, %v", list, err)
	}
	s.Close()
	s = openStore(t, dir)
	if list, _ := s.List(); len(list) != 2 {
		t.Fatalf("reopen with a corrupt entry: %+v", list)
	}
}
