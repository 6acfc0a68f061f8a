package volume

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/vmsan/vmsan/internal/atomicfile"
	"github.com/vmsan/vmsan/internal/testutil"
)

// fiemapShared reports how many bytes of path's extents carry
// FIEMAP_EXTENT_SHARED (blocks shared with another file: a reflink).
func fiemapShared(t *testing.T, path string) (shared, total int64) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	const (
		fsIocFiemap   = 0xC020660B // _IOWR('f', 11, struct fiemap)
		fiemapSync    = 0x1
		extentShared  = 0x2000
		extentLast    = 0x1
		headerSize    = 32
		extentSize    = 56
		extentsPerReq = 64
	)
	start := uint64(0)
	for {
		buf := make([]byte, headerSize+extentSize*extentsPerReq)
		binary.NativeEndian.PutUint64(buf[0:], start)
		binary.NativeEndian.PutUint64(buf[8:], ^uint64(0)-start)
		binary.NativeEndian.PutUint32(buf[16:], fiemapSync)
		binary.NativeEndian.PutUint32(buf[24:], extentsPerReq)
		if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, f.Fd(), fsIocFiemap, uintptr(unsafe.Pointer(&buf[0]))); e != 0 {
			t.Fatalf("FIEMAP %s: %v", path, e)
		}
		n := binary.NativeEndian.Uint32(buf[20:])
		if n == 0 {
			return
		}
		last := false
		for i := range int(n) {
			e := buf[headerSize+i*extentSize:]
			logical := binary.NativeEndian.Uint64(e[0:])
			length := binary.NativeEndian.Uint64(e[16:])
			flags := binary.NativeEndian.Uint32(e[40:])
			total += int64(length)
			if flags&extentShared != 0 {
				shared += int64(length)
			}
			start = logical + length
			last = last || flags&extentLast != 0
		}
		if last {
			return
		}
	}
}

func writeAt(t *testing.T, path string, b []byte, off int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
}

func readAll(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func freeBytes(t *testing.T, dir string) int64 {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	return int64(st.Bfree) * st.Bsize
}

func TestSnapshotReflinkXFS(t *testing.T) {
	exerciseReflink(t, filepath.Join(testutil.LoopMount(t, "mkfs.xfs", 320<<20, "-q", "-f", "-m", "reflink=1"), "data"))
}

func TestSnapshotReflinkBtrfs(t *testing.T) {
	exerciseReflink(t, filepath.Join(testutil.LoopMount(t, "mkfs.btrfs", 256<<20, "-q", "-f"), "data"))
}

// exerciseReflink: on a reflink filesystem a snapshot is instant and
// shares its blocks (FIEMAP shared flag; free space unchanged), keeps the
// data of snapshot time while the volume is rewritten, has its own data
// identity, and rollback and clone restore it.
func exerciseReflink(t *testing.T, dir string) {
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { s.Close() }()
	const size = 64 << 20
	m, err := s.Create(CreateOptions{Name: "v", Size: size})
	if err != nil {
		t.Fatal(err)
	}
	old := bytes.Repeat([]byte{0xaa}, 16<<20)
	writeAt(t, s.RawPath("v"), old, 8<<20)
	free := freeBytes(t, dir)

	sm, err := s.CreateSnapshot("v", "s1", CloneOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if sm.Method != MethodReflink || sm.Name != "v@s1" || !sm.ReadOnly || sm.SourceDataID != m.DataID {
		t.Fatalf("snapshot meta: %+v", sm)
	}
	if sm.DataID == "" || sm.DataID == m.DataID || sm.UUID == m.UUID {
		t.Fatalf("snapshot must have its own identity: volume %s/%s, snapshot %s/%s", m.DataID, m.UUID, sm.DataID, sm.UUID)
	}
	if used := free - freeBytes(t, dir); used > 2<<20 {
		t.Errorf("reflink snapshot of 16 MiB of data used %d bytes of free space; want (nearly) none", used)
	}
	shared, total := fiemapShared(t, s.SnapshotPath("v", "s1"))
	if total != int64(len(old)) || shared != total {
		t.Errorf("snapshot extents: %d of %d bytes shared, want all %d", shared, total, len(old))
	}
	if st, _ := os.Stat(s.SnapshotPath("v", "s1")); st.Mode().Perm() != 0o400 {
		t.Errorf("snapshot raw file mode %v, want 0400", st.Mode().Perm())
	}
	// Rewriting the volume unshares its blocks; the snapshot keeps the old data.
	writeAt(t, s.RawPath("v"), bytes.Repeat([]byte{0xbb}, 1<<20), 8<<20)
	snapData := readAll(t, s.SnapshotPath("v", "s1"))
	if !bytes.Equal(snapData[8<<20:24<<20], old) {
		t.Fatal("snapshot changed when the volume was written")
	}
	if _, err := s.CreateSnapshot("v", "s1", CloneOptions{}); !errors.Is(err, ErrExists) {
		t.Fatalf("second snapshot of the same name: %v, want ErrExists", err)
	}

	// Clone: an independent read-write volume with the snapshot's data.
	cm, err := s.Clone("v@s1", "c", CloneOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if cm.ReadOnly || cm.DataID == sm.DataID || cm.DataID == m.DataID || cm.Size != size {
		t.Fatalf("clone meta: %+v", cm)
	}
	if !bytes.Equal(readAll(t, s.RawPath("c")), snapData) {
		t.Fatal("clone differs from the snapshot")
	}
	if err := s.CheckRaw("c"); err != nil {
		t.Fatal(err)
	}

	// Rollback: contents back, new data identity, even after a grow.
	if _, err := s.Resize("v", size*2, false); err != nil {
		t.Fatal(err)
	}
	before, _ := s.Get("v")
	rm, err := s.Rollback("v", "s1", CloneOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if rm.Size != size || rm.DataID == before.DataID || rm.Rollback != nil {
		t.Fatalf("after rollback: %+v", rm)
	}
	if !bytes.Equal(readAll(t, s.RawPath("v")), snapData) {
		t.Fatal("rollback did not restore the snapshot's contents")
	}
	// The data identity survives a reopen (xattr and inode agree).
	s.Close()
	if s, err = Open(dir); err != nil {
		t.Fatal(err)
	}
	if s.IdentityChanged("v") || s.IdentityChanged("c") {
		t.Fatal("reopen found a changed identity after rollback/clone")
	}

	l, err := s.ListSnapshots("")
	if err != nil || len(l) != 1 || l[0].Name != "v@s1" {
		t.Fatalf("ListSnapshots = %v, %v", l, err)
	}
	// A volume with snapshots is deleted only with force, which takes them.
	if err := s.Delete("v", false); !errors.Is(err, ErrHasSnapshots) || !strings.Contains(err.Error(), "--force") || !strings.Contains(err.Error(), "v@s1") {
		t.Fatalf("delete with snapshots: %v", err)
	}
	if err := s.Delete("v", true); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, SnapshotsDir, "v")); !os.IsNotExist(err) {
		t.Fatalf("snapshots of a force-deleted volume remain: %v", err)
	}
	if _, err := s.Create(CreateOptions{Name: "v", Size: size}); err != nil {
		t.Fatal(err)
	}
	if l, _ := s.ListSnapshots("v"); len(l) != 0 {
		t.Fatalf("a new volume inherited snapshots: %v", l)
	}
}

// TestSnapshotExt4NeedsCopy: ext4 cannot reflink: the operations refuse
// naming --copy and change nothing; --copy makes full copies that keep
// holes.
func TestSnapshotExt4NeedsCopy(t *testing.T) {
	dir := filepath.Join(testutil.LoopMount(t, "mkfs.ext4", 256<<20, "-q", "-F"), "data")
	exerciseCopy(t, dir)
}

// TestSnapshotCopyTmpDir runs the same on whatever the temp dir is (tmpfs
// or ext4 on CI runners; on xfs/btrfs reflink succeeds and the refusal
// part is skipped).
func TestSnapshotCopyTmpDir(t *testing.T) {
	exerciseCopy(t, t.TempDir())
}

func exerciseCopy(t *testing.T, dir string) {
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const size = 32 << 20
	if _, err := s.Create(CreateOptions{Name: "v", Size: size}); err != nil {
		t.Fatal(err)
	}
	data := bytes.Repeat([]byte{0x5a}, 1<<20)
	writeAt(t, s.RawPath("v"), data, 4<<20)
	writeAt(t, s.RawPath("v"), data[:4096], 20<<20)
	// An all-zero written block: data on disk, but no need to copy it.
	writeAt(t, s.RawPath("v"), make([]byte, 1<<20), 24<<20)

	_, err = s.CreateSnapshot("v", "s", CloneOptions{})
	reflinks := err == nil
	if !reflinks {
		if !errors.Is(err, ErrNoReflink) || !strings.Contains(err.Error(), "--copy") {
			t.Fatalf("snapshot without reflink: %v, want ErrNoReflink naming --copy", err)
		}
		if l, _ := s.ListSnapshots("v"); len(l) != 0 {
			t.Fatalf("refused snapshot left %v", l)
		}
		ents, _ := os.ReadDir(filepath.Join(dir, VolumesDir))
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), ".") {
				t.Fatalf("refused snapshot left %s", e.Name())
			}
		}
		sm, err := s.CreateSnapshot("v", "s", CloneOptions{Copy: true})
		if err != nil {
			t.Fatal(err)
		}
		if sm.Method != MethodCopy {
			t.Fatalf("method %q", sm.Method)
		}
	} else {
		t.Logf("%s reflinks: only the --copy paths are exercised", dir)
		if err := s.DeleteSnapshot("v", "s"); err != nil {
			t.Fatal(err)
		}
		if _, err := s.CreateSnapshot("v", "s", CloneOptions{Copy: true}); err != nil {
			t.Fatal(err)
		}
	}
	want := readAll(t, s.RawPath("v"))
	if !bytes.Equal(readAll(t, s.SnapshotPath("v", "s")), want) {
		t.Fatal("snapshot differs from the volume")
	}
	if !reflinks {
		// Holes preserved: 1 MiB + 4 KiB of data, the zero MiB not copied.
		if a := allocated(t, s.SnapshotPath("v", "s")); a > 1<<20+64<<10 {
			t.Errorf("--copy snapshot allocates %d bytes, want about %d (holes and zero blocks not copied)", a, 1<<20+4096)
		}
	}
	// Rollback by copy.
	writeAt(t, s.RawPath("v"), bytes.Repeat([]byte{0x77}, 2<<20), 0)
	if !reflinks {
		if _, err := s.Rollback("v", "s", CloneOptions{}); !errors.Is(err, ErrNoReflink) {
			t.Fatalf("rollback without reflink or --copy: %v", err)
		}
		if b := readAll(t, s.RawPath("v")); b[0] != 0x77 {
			t.Fatal("a refused rollback changed the volume")
		}
		if m, _ := s.Get("v"); m.Rollback != nil {
			t.Fatal("a refused rollback left its mark")
		}
	}
	if _, err := s.Rollback("v", "s", CloneOptions{Copy: true}); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(readAll(t, s.RawPath("v")), want) {
		t.Fatal("rollback --copy did not restore the snapshot")
	}
	if !reflinks {
		if a := allocated(t, s.RawPath("v")); a > 1<<20+64<<10 {
			t.Errorf("volume after rollback --copy allocates %d bytes: holes not restored", a)
		}
	}
	if _, err := s.Clone("v@s", "c", CloneOptions{Copy: true}); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(readAll(t, s.RawPath("c")), want) {
		t.Fatal("clone --copy differs")
	}
}

// TestRollbackInterruptedIsCompleted: a crash after the rollback mark was
// written (raw file half rewritten) is completed by the next Open.
func TestRollbackInterruptedIsCompleted(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Create(CreateOptions{Name: "v", Size: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	writeAt(t, s.RawPath("v"), []byte("before"), 0)
	if _, err := s.CreateSnapshot("v", "s", CloneOptions{Copy: true}); err != nil {
		t.Fatal(err)
	}
	writeAt(t, s.RawPath("v"), []byte("after!"), 0)
	m, _ := s.Get("v")
	m.Rollback = &RollbackMark{Snapshot: "s", Copy: true}
	if err := s.writeMeta(m); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s, err = Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if got := readAll(t, s.RawPath("v"))[:6]; string(got) != "before" {
		t.Fatalf("after Open: %q, want the snapshot's contents", got)
	}
	m2, _ := s.Get("v")
	if m2.Rollback != nil || m2.DataID == m.DataID || !s.IdentityChanged("v") {
		t.Fatalf("rollback not completed cleanly: %+v", m2)
	}
	if err := s.CheckRaw("v"); err != nil {
		t.Fatal(err)
	}
}

func TestSnapshotNamesAndErrors(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Create(CreateOptions{Name: "v", Size: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"", "../x", "a@b", "x.raw"} {
		if _, err := s.CreateSnapshot("v", bad, CloneOptions{Copy: true}); !errors.Is(err, ErrInvalidName) {
			t.Errorf("snapshot name %q: %v, want ErrInvalidName", bad, err)
		}
	}
	if _, err := s.CreateSnapshot("nope", "s", CloneOptions{Copy: true}); !errors.Is(err, ErrNotFound) {
		t.Errorf("snapshot of a missing volume: %v", err)
	}
	if _, err := s.Clone("v@missing", "c", CloneOptions{Copy: true}); !errors.Is(err, ErrNotFound) {
		t.Errorf("clone of a missing snapshot: %v", err)
	}
	if _, err := s.Clone("v", "v", CloneOptions{Copy: true}); !errors.Is(err, ErrExists) {
		t.Errorf("clone onto an existing volume: %v", err)
	}
	if err := s.DeleteSnapshot("v", "missing"); !errors.Is(err, ErrNotFound) {
		t.Errorf("delete of a missing snapshot: %v", err)
	}
	for ref, want := range map[string][3]string{"v": {"v", "", "f"}, "v@s": {"v", "s", "t"}} {
		v, sn, is, err := SplitRef(ref)
		if err != nil || v != want[0] || sn != want[1] || is != (want[2] == "t") {
			t.Errorf("SplitRef(%q) = %q %q %v %v", ref, v, sn, is, err)
		}
	}
	for _, bad := range []string{"@s", "v@", "v@s@t", "../v@s"} {
		if _, _, _, err := SplitRef(bad); err == nil {
			t.Errorf("SplitRef(%q) accepted", bad)
		}
	}
	// Import: only the store's own temporary files are adopted.
	other := filepath.Join(t.TempDir(), atomicfile.TempPrefix+"x")
	os.WriteFile(other, nil, 0o600)
	if _, err := s.CreateFromFile(CreateOptions{Name: "i", Size: 1 << 20}, other); !errors.Is(err, ErrInvalid) {
		t.Errorf("CreateFromFile outside the store: %v", err)
	}
	p := TempImportPath(s.Dir())
	if err := os.WriteFile(p, []byte("hello"), 0o644); err != nil {
		t.Fatal(err)
	}
	m, err := s.CreateFromFile(CreateOptions{Name: "i", Size: 1 << 20}, p)
	if err != nil {
		t.Fatal(err)
	}
	if b := readAll(t, s.RawPath("i")); len(b) != 1<<20 || string(b[:5]) != "hello" {
		t.Fatalf("imported volume: %d bytes, %q", len(b), b[:5])
	}
	if st, _ := os.Stat(s.RawPath("i")); st.Mode().Perm() != 0o600 || m.DataID == "" {
		t.Fatalf("imported volume mode %v, data id %q", st.Mode().Perm(), m.DataID)
	}
}

// TestSnapshotDebrisRemoved: a snapshot raw file without metadata (a crash
// between the rename and the metadata write) is removed by Open; complete
// snapshots stay.
func TestSnapshotDebrisRemoved(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Create(CreateOptions{Name: "v", Size: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateSnapshot("v", "keep", CloneOptions{Copy: true}); err != nil {
		t.Fatal(err)
	}
	debris := s.SnapshotPath("v", "half")
	if err := os.WriteFile(debris, []byte("x"), 0o400); err != nil {
		t.Fatal(err)
	}
	s.Close()
	if s, err = Open(dir); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := os.Stat(debris); !os.IsNotExist(err) {
		t.Fatalf("snapshot debris survived Open: %v", err)
	}
	if _, err := os.Stat(s.SnapshotPath("v", "keep")); err != nil {
		t.Fatalf("a complete snapshot was removed: %v", err)
	}
}

// Open removes temporary snapshots (a command's, left when it or its
// daemon died) and the unmarked ones older exports named export-TIME-ID,
// and keeps every other snapshot.
func TestOpenRemovesTemporarySnapshots(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Create(CreateOptions{Name: "v", Size: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		tmp  bool
	}{{"tmp-export-x", true}, {"export-20260101T000000-0123abcd", false}, {"export-mine", false}, {"keep", false}} {
		if _, err := s.CreateSnapshot("v", c.name, CloneOptions{Copy: true, Temporary: c.tmp}); err != nil {
			t.Fatal(err)
		}
	}
	s.Close()
	s, err = Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	l, err := s.ListSnapshots("v")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, sm := range l {
		names = append(names, sm.Snapshot)
	}
	sort.Strings(names)
	if strings.Join(names, ",") != "export-mine,keep" {
		t.Fatalf("snapshots after Open: %v, want export-mine and keep", names)
	}
	n := 0
	for _, no := range s.Notices() {
		if strings.Contains(no.Msg, "removed the temporary snapshot") {
			n++
		}
	}
	if n != 2 {
		t.Fatalf("%d removal notices, want 2: %v", n, s.Notices())
	}
}
