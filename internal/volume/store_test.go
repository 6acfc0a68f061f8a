package volume

import (
	"bytes"
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
// file from an interrupted atomic write and a raw file without metadata
// from an interrupted create; and a raw file whose length disagrees with
// the metadata without a resize mark, which no crash leaves: it must be
// reported, never "reconciled" by changing the file.
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
	os.Truncate(filepath.Join(vdir, "a.raw"), 3<<20) // changed outside vmsan

	s = openStore(t, dir)
	list, err := s.List()
	if err != nil || len(list) != 1 || list[0].Name != "a" || list[0].Size != 1<<20 {
		t.Fatalf("list after debris: %+v %v", list, err)
	}
	if st, _ := os.Stat(filepath.Join(vdir, "a.raw")); st.Size() != 3<<20 {
		t.Fatalf("raw file changed by Open: %d bytes", st.Size())
	}
	if err := s.CheckRaw("a"); !errors.Is(err, ErrDamaged) {
		t.Fatalf("CheckRaw of a raw file of the wrong size: %v", err)
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

func fillPattern(t *testing.T, path string, off int64, n int, b byte) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(bytes.Repeat([]byte{b}, n), off); err != nil {
		t.Fatal(err)
	}
}

// TestDamagedRawNotTouched: a raw file larger or smaller than the metadata
// (with no resize in progress) or missing is reported with the file, the
// sizes and the repair command, and Open neither cuts, extends nor
// recreates it. Before the fix, Open truncated a larger file to the
// metadata size (destroying its tail) and recreated a missing one.
func TestDamagedRawNotTouched(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir)
	for _, n := range []string{"big", "small", "gone"} {
		if _, err := s.Create(CreateOptions{Name: n, Size: 1 << 20}); err != nil {
			t.Fatal(err)
		}
	}
	big, small, gone := s.RawPath("big"), s.RawPath("small"), s.RawPath("gone")
	s.Close()
	fillPattern(t, big, 1<<20, 4096, 0xab) // data past the metadata size
	os.Truncate(small, 512<<10)
	os.Remove(gone)

	s = openStore(t, dir)
	if st, err := os.Stat(big); err != nil || st.Size() != 1<<20+4096 {
		t.Fatalf("larger raw file changed by Open: %v %d", err, st.Size())
	}
	if st, err := os.Stat(small); err != nil || st.Size() != 512<<10 {
		t.Fatalf("smaller raw file changed by Open: %v %d", err, st.Size())
	}
	if _, err := os.Stat(gone); !os.IsNotExist(err) {
		t.Fatalf("missing raw file recreated by Open: %v", err)
	}
	for name, want := range map[string][]string{
		"big":   {big, "1052672 bytes", "says 1048576", "vmsan volume repair big --use-file-size", "--use-metadata-size", "destroys"},
		"small": {small, "524288 bytes", "says 1048576", "vmsan volume repair small --use-file-size", "extended with zeroes"},
		"gone":  {gone, "missing", "1048576 bytes", "vmsan volume repair gone --recreate"},
	} {
		err := s.CheckRaw(name)
		if !errors.Is(err, ErrDamaged) {
			t.Fatalf("%s: CheckRaw = %v, want ErrDamaged", name, err)
		}
		for _, w := range want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: error %q does not mention %q", name, err, w)
			}
		}
	}

	// Resizing a damaged volume would cut or extend the file: refused.
	if _, err := s.Resize("big", 3<<19, false); !errors.Is(err, ErrDamaged) {
		t.Fatalf("resize of a damaged volume: %v", err)
	}
	if st, _ := os.Stat(big); st.Size() != 1<<20+4096 {
		t.Fatalf("resize changed a damaged file to %d bytes", st.Size())
	}
	// Repairs: each fits its damage, and each changes the data identity.
	ids := map[string]string{}
	for _, n := range []string{"big", "small", "gone"} {
		m, _ := s.Get(n)
		ids[n] = m.DataID
	}
	if _, err := s.Repair("gone", RepairUseFileSize); !errors.Is(err, ErrInvalid) {
		t.Fatalf("use-file-size on a missing file: %v", err)
	}
	if _, err := s.Repair("big", RepairRecreate); !errors.Is(err, ErrInvalid) {
		t.Fatalf("recreate over an existing file: %v", err)
	}
	m, err := s.Repair("big", RepairUseFileSize)
	if err != nil || m.Size != 1<<20+4096 {
		t.Fatalf("repair big: %+v %v", m, err)
	}
	b := make([]byte, 4096)
	f, _ := os.Open(big)
	f.ReadAt(b, 1<<20)
	f.Close()
	if !bytes.Equal(b, bytes.Repeat([]byte{0xab}, 4096)) {
		t.Fatal("use-file-size lost the data past the old size")
	}
	if m, err = s.Repair("small", RepairUseMetadataSize); err != nil || m.Size != 1<<20 {
		t.Fatalf("repair small: %+v %v", m, err)
	}
	if st, _ := os.Stat(small); st.Size() != 1<<20 {
		t.Fatalf("small not extended: %d", st.Size())
	}
	if m, err = s.Repair("gone", RepairRecreate); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(gone); err != nil || st.Size() != 1<<20 || st.Mode().Perm() != 0o600 {
		t.Fatalf("recreated file: %v %v", err, st)
	}
	for _, n := range []string{"big", "small", "gone"} {
		if err := s.CheckRaw(n); err != nil {
			t.Fatalf("%s after repair: %v", n, err)
		}
		m, _ := s.Get(n)
		if m.DataID == "" || m.DataID == ids[n] || !s.IdentityChanged(n) {
			t.Fatalf("%s: repair kept data identity %q (was %q)", n, m.DataID, ids[n])
		}
	}
	// ...and the repairs hold across a reopen (no spurious identity change).
	s.Close()
	s = openStore(t, dir)
	for _, n := range []string{"big", "small", "gone"} {
		if err := s.CheckRaw(n); err != nil || s.IdentityChanged(n) {
			t.Fatalf("%s after reopen: %v changed=%v", n, err, s.IdentityChanged(n))
		}
	}
}

// TestInterruptedResizeConverges: the states a crash mid-resize leaves
// (metadata with the resize mark, file still at the old size) converge
// without losing data: a grow is completed, a shrink rolled back.
func TestInterruptedResizeConverges(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir)
	for _, n := range []string{"grow", "shrink", "done"} {
		if _, err := s.Create(CreateOptions{Name: n, Size: 1 << 20}); err != nil {
			t.Fatal(err)
		}
	}
	fillPattern(t, s.RawPath("shrink"), 1<<20-4096, 4096, 0xcd)
	// What Resize writes before it touches the file.
	for n, size := range map[string]int64{"grow": 2 << 20, "shrink": 512 << 10, "done": 2 << 20} {
		m, _ := s.Get(n)
		m.Size, m.ResizeFrom = size, m.Size
		if err := s.writeMeta(m); err != nil {
			t.Fatal(err)
		}
	}
	os.Truncate(s.RawPath("done"), 2<<20) // crashed after the file, before clearing the mark
	s.Close()
	s = openStore(t, dir)
	want := map[string]int64{"grow": 2 << 20, "shrink": 1 << 20, "done": 2 << 20}
	for n, size := range want {
		m, err := s.Get(n)
		if err != nil || m.Size != size || m.ResizeFrom != 0 {
			t.Fatalf("%s: %+v %v", n, m, err)
		}
		if err := s.CheckRaw(n); err != nil {
			t.Fatalf("%s: %v", n, err)
		}
		if s.IdentityChanged(n) {
			t.Fatalf("%s: a converged resize changed the data identity", n)
		}
	}
	b := make([]byte, 4096)
	f, _ := os.Open(s.RawPath("shrink"))
	f.ReadAt(b, 1<<20-4096)
	f.Close()
	if b[0] != 0xcd {
		t.Fatal("interrupted shrink lost data")
	}
	// A completed Resize leaves no mark.
	if m, err := s.Resize("grow", 4<<20, false); err != nil || m.ResizeFrom != 0 {
		t.Fatalf("resize: %+v %v", m, err)
	}
	if m, _ := s.Get("grow"); m.ResizeFrom != 0 {
		t.Fatalf("mark left on disk: %+v", m)
	}
}

// StatePath agrees with StateDir; StateVolumes lists the volumes whose
// state directory holds a file; RemoveStateDebris removes the state of a
// volume that does not exist and leaves an existing one's alone.
func TestStateDirHelpers(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, n := range []string{"b", "a"} {
		if _, err := s.Create(CreateOptions{Name: n, Size: 1 << 20}); err != nil {
			t.Fatal(err)
		}
	}
	sd, err := s.StateDir("a")
	if err != nil {
		t.Fatal(err)
	}
	if p, err := StatePath(dir, "a"); err != nil || p != sd {
		t.Fatalf("StatePath %q %v, StateDir %q", p, err, sd)
	}
	if _, err := StatePath(dir, "../x"); !errors.Is(err, ErrInvalidName) {
		t.Fatalf("StatePath of a bad name: %v", err)
	}
	for _, n := range []string{"a", "b", "gone"} {
		p, _ := StatePath(dir, n)
		os.MkdirAll(filepath.Join(p, "sub"), 0o700)
		os.WriteFile(filepath.Join(p, "sub", "f"), nil, 0o600)
	}
	if got := StateVolumes(dir, filepath.Join("sub", "f")); strings.Join(got, ",") != "a,b,gone" {
		t.Fatalf("StateVolumes: %v", got)
	}
	if err := s.RemoveStateDebris("a"); err != nil {
		t.Fatal(err)
	}
	if err := s.RemoveStateDebris("gone"); err != nil {
		t.Fatal(err)
	}
	if got := StateVolumes(dir, filepath.Join("sub", "f")); strings.Join(got, ",") != "a,b" {
		t.Fatalf("after RemoveStateDebris: %v", got)
	}
}
