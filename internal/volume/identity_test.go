package volume

import (
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/vmsan/vmsan/internal/testutil"
)

func dataID(t *testing.T, s *Store, name string) string {
	t.Helper()
	m, err := s.Get(name)
	if err != nil {
		t.Fatal(err)
	}
	return m.DataID
}

// exerciseIdentity checks the data identity (identity.go) in dir: stable
// across reopens and resizes; new when the raw file was deleted and
// recreated, swapped with another volume's, or replaced by a copy.
func exerciseIdentity(t *testing.T, dir string) {
	s := openStore(t, dir)
	for _, n := range []string{"a", "b", "c", "d"} {
		if _, err := s.Create(CreateOptions{Name: n, Size: 1 << 20}); err != nil {
			t.Fatal(err)
		}
	}
	ids := map[string]string{}
	for _, n := range []string{"a", "b", "c", "d"} {
		ids[n] = dataID(t, s, n)
		if ids[n] == "" {
			t.Fatalf("%s: no data identity after create", n)
		}
	}
	m, _ := s.Get("a")
	t.Logf("fingerprint on this filesystem: %+v", m.DataFile)
	fillPattern(t, s.RawPath("a"), 0, 4096, 1) // writes are not identity changes
	if _, err := s.Resize("a", 2<<20, false); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s = openStore(t, dir)
	for _, n := range []string{"a", "b", "c", "d"} {
		if got := dataID(t, s, n); got != ids[n] || s.IdentityChanged(n) {
			t.Fatalf("%s: identity changed across a clean reopen: %s -> %s", n, ids[n], got)
		}
	}
	vdir := filepath.Join(dir, VolumesDir)
	raw := func(n string) string { return filepath.Join(vdir, n+".raw") }
	s.Close()

	// b: deleted and recreated at the same size (likely reusing the inode
	// number on ext4: the generation and the xattr still tell).
	os.Remove(raw("b"))
	f, err := os.OpenFile(raw("b"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	f.Truncate(1 << 20)
	f.Close()
	// c and d: swapped.
	os.Rename(raw("c"), raw("c")+".x")
	os.Rename(raw("d"), raw("c"))
	os.Rename(raw("c")+".x", raw("d"))
	// a: replaced by a copy of itself (same bytes, new file).
	if out, err := exec.Command("cp", "--preserve=all", raw("a"), raw("a")+".copy").CombinedOutput(); err != nil {
		t.Fatalf("cp: %v %s", err, out)
	}
	os.Rename(raw("a")+".copy", raw("a"))

	s = openStore(t, dir)
	for _, n := range []string{"a", "b", "c", "d"} {
		got := dataID(t, s, n)
		if got == ids[n] || got == "" || !s.IdentityChanged(n) {
			t.Errorf("%s: replaced raw file kept data identity %s (changed=%v)", n, got, s.IdentityChanged(n))
		}
		if err := s.CheckRaw(n); err != nil {
			t.Errorf("%s: %v", n, err)
		}
	}
	warned := 0
	for _, n := range s.Notices() {
		if n.Warn && n.Volume != "" {
			warned++
		}
	}
	if warned != 4 {
		t.Errorf("%d identity warnings, want 4: %+v", warned, s.Notices())
	}
	// The new identities are stable.
	now := map[string]string{}
	for _, n := range []string{"a", "b", "c", "d"} {
		now[n] = dataID(t, s, n)
	}
	s.Close()
	s = openStore(t, dir)
	for _, n := range []string{"a", "b", "c", "d"} {
		if dataID(t, s, n) != now[n] || s.IdentityChanged(n) {
			t.Errorf("%s: identity not stable after re-identification", n)
		}
	}
	// Metadata from before identities existed is adopted, not "changed".
	m, _ = s.Get("a")
	m.DataID, m.DataFile = "", FileID{}
	s.writeMeta(m)
	s.Close()
	s = openStore(t, dir)
	if dataID(t, s, "a") == "" || s.IdentityChanged("a") {
		t.Errorf("legacy metadata: id %q changed=%v", dataID(t, s, "a"), s.IdentityChanged("a"))
	}
	s.Close()
}

func TestDataIdentity(t *testing.T) { exerciseIdentity(t, t.TempDir()) }

func TestDataIdentityOnExt4(t *testing.T) {
	exerciseIdentity(t, filepath.Join(testutil.LoopMount(t, "mkfs.ext4", 64<<20, "-q", "-F"), "data"))
}

func TestDataIdentityOnXFS(t *testing.T) {
	exerciseIdentity(t, filepath.Join(testutil.LoopMount(t, "mkfs.xfs", 320<<20, "-q", "-f"), "data"))
}

func TestDataIdentityOnBtrfs(t *testing.T) {
	exerciseIdentity(t, filepath.Join(testutil.LoopMount(t, "mkfs.btrfs", 256<<20, "-q", "-f"), "data"))
}

func TestDataIdentityOnTmpfs(t *testing.T) {
	testutil.NeedRoot(t, "a tmpfs mount")
	mnt := t.TempDir()
	if err := syscall.Mount("tmpfs", mnt, "tmpfs", 0, "size=64m"); err != nil {
		testutil.SkipOrFail(t, "mount tmpfs: %v", err)
	}
	t.Cleanup(func() { syscall.Unmount(mnt, syscall.MNT_DETACH) })
	exerciseIdentity(t, filepath.Join(mnt, "data"))
}
