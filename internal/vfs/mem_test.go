package vfs

import (
	"errors"
	"io/fs"
	"math/rand"
	"os"
	"testing"
)

func write(t *testing.T, fsys FS, p, data string, sync bool) {
	t.Helper()
	f, err := fsys.OpenFile(p, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write([]byte(data)); err != nil {
		t.Fatal(err)
	}
	if sync {
		if err := f.Sync(); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

func content(t *testing.T, fsys FS, p string) (string, bool) {
	t.Helper()
	b, err := ReadFile(fsys, p)
	if errors.Is(err, fs.ErrNotExist) {
		return "", false
	}
	if err != nil {
		t.Fatal(err)
	}
	return string(b), true
}

func TestMemCrashLosesUnsyncedData(t *testing.T) {
	m := NewMem()
	if err := MkdirAllSync(m, "/d", 0o700); err != nil {
		t.Fatal(err)
	}
	write(t, m, "/d/a", "synced", true)
	if err := m.SyncDir("/d"); err != nil {
		t.Fatal(err)
	}
	// Overwritten without a sync: the crash brings the old bytes back.
	write(t, m, "/d/a", "later", false)
	if got, _ := content(t, m, "/d/a"); got != "later" {
		t.Fatalf("before crash: %q", got)
	}
	c := m.CrashClone(nil)
	if got, ok := content(t, c, "/d/a"); !ok || got != "synced" {
		t.Fatalf("after crash: %q %v, want the synced contents", got, ok)
	}
}

func TestMemCrashLosesUnsyncedDirEntries(t *testing.T) {
	m := NewMem()
	if err := MkdirAllSync(m, "/d", 0o700); err != nil {
		t.Fatal(err)
	}
	// Data synced but the directory not: the name is lost.
	write(t, m, "/d/new", "x", true)
	if _, ok := content(t, m.CrashClone(nil), "/d/new"); ok {
		t.Fatal("a file whose directory was never synced survived the crash")
	}
	// Directory synced but not the data: the name survives, empty (the
	// delayed-allocation zero-length file).
	write(t, m, "/d/empty", "lost", false)
	m.SyncDir("/d")
	if got, ok := content(t, m.CrashClone(nil), "/d/empty"); !ok || got != "" {
		t.Fatalf("got %q %v, want an empty file", got, ok)
	}
	// A directory created without syncing its parent is lost with all it holds.
	m.MkdirAll("/e", 0o700)
	write(t, m, "/e/f", "x", true)
	m.SyncDir("/e")
	if _, err := m.CrashClone(nil).Stat("/e"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("unsynced directory survived: %v", err)
	}
}

func TestMemCrashRenameNeedsDirSync(t *testing.T) {
	m := NewMem()
	MkdirAllSync(m, "/d", 0o700)
	write(t, m, "/d/f", "old", true)
	m.SyncDir("/d")
	write(t, m, "/d/tmp", "new", true)
	if err := m.Rename("/d/tmp", "/d/f"); err != nil {
		t.Fatal(err)
	}
	c := m.CrashClone(nil)
	if got, _ := content(t, c, "/d/f"); got != "old" {
		t.Fatalf("rename without directory sync survived: %q", got)
	}
	if _, ok := content(t, c, "/d/tmp"); ok {
		t.Fatal("a temporary never made durable came back")
	}
	m.SyncDir("/d")
	c = m.CrashClone(nil)
	if got, _ := content(t, c, "/d/f"); got != "new" {
		t.Fatalf("synced rename lost: %q", got)
	}
	// Remove likewise needs the directory sync.
	m.Remove("/d/f")
	if _, ok := content(t, m.CrashClone(nil), "/d/f"); !ok {
		t.Fatal("unsynced remove survived")
	}
	m.SyncDir("/d")
	if _, ok := content(t, m.CrashClone(nil), "/d/f"); ok {
		t.Fatal("synced remove undone")
	}
}

func TestMemCrashTruncateNeedsSync(t *testing.T) {
	m := NewMem()
	write(t, m, "/f", "abcdef", true)
	m.SyncDir("/")
	if err := Truncate(m, "/f", 2); err != nil {
		t.Fatal(err)
	}
	if st, _ := m.CrashClone(nil).Stat("/f"); st.Size() != 6 {
		t.Fatalf("unsynced truncate survived: size %d", st.Size())
	}
	if err := TruncateSync(m, "/f", 2); err != nil {
		t.Fatal(err)
	}
	if st, _ := m.CrashClone(nil).Stat("/f"); st.Size() != 2 {
		t.Fatalf("synced truncate lost: size %d", st.Size())
	}
}

func TestMemCrashCloneIsIndependentAndUnlocked(t *testing.T) {
	m := NewMem()
	write(t, m, "/f", "a", true)
	m.SyncDir("/")
	l, err := m.Lock("/")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Lock("/"); !errors.Is(err, ErrLocked) {
		t.Fatalf("second lock: %v", err)
	}
	c := m.CrashClone(nil)
	cl, err := c.Lock("/")
	if err != nil {
		t.Fatalf("the crashed process's lock survived: %v", err)
	}
	cl.Close()
	write(t, c, "/f", "changed", true)
	if got, _ := content(t, m, "/f"); got != "a" {
		t.Fatalf("clone shares state with the original: %q", got)
	}
	l.Close()
	if l2, err := m.Lock("/"); err != nil {
		t.Fatalf("lock after unlock: %v", err)
	} else {
		l2.Close()
	}
}

// With a random source, every crash image is one a real filesystem could
// leave: each file either current or durable, never anything else.
func TestMemCrashRandomKeepsOnlyStatesThatExisted(t *testing.T) {
	m := NewMem()
	write(t, m, "/f", "durable", true)
	m.SyncDir("/")
	write(t, m, "/f", "current", false)
	seen := map[string]bool{}
	for i := int64(0); i < 64; i++ {
		got, ok := content(t, m.CrashClone(rand.New(rand.NewSource(i))), "/f")
		if !ok || (got != "durable" && got != "current") {
			t.Fatalf("crash image has %q %v", got, ok)
		}
		seen[got] = true
	}
	if len(seen) != 2 {
		t.Fatalf("64 random crashes gave only %v", seen)
	}
}

func TestMemErrors(t *testing.T) {
	m := NewMem()
	write(t, m, "/f", "x", true)
	if _, err := m.OpenFile("/f", os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600); !errors.Is(err, fs.ErrExist) {
		t.Fatalf("O_EXCL on existing: %v", err)
	}
	if _, err := m.OpenFile("/nope/f", os.O_RDWR|os.O_CREATE, 0o600); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("create in missing dir: %v", err)
	}
	m.MkdirAll("/d/e", 0o700)
	if err := m.Remove("/d"); err == nil {
		t.Fatal("removed a non-empty directory")
	}
	if err := m.Rename("/d", "/d/e/x"); err == nil {
		t.Fatal("moved a directory below itself")
	}
	if err := m.RemoveAll("/missing"); err != nil {
		t.Fatalf("RemoveAll of a missing path: %v", err)
	}
	if err := m.RemoveAll("/d"); err != nil {
		t.Fatal(err)
	}
	f, _ := Open(m, "/f")
	if _, err := f.Write([]byte("y")); err == nil {
		t.Fatal("wrote to a read-only file")
	}
	f.Close()
	if _, err := f.ReadAt(make([]byte, 1), 0); !errors.Is(err, fs.ErrClosed) {
		t.Fatalf("read after close: %v", err)
	}
}

func TestInjectFailNth(t *testing.T) {
	m := NewMem()
	fsys := Inject(m, FailNth(OpSync, 2))
	write(t, fsys, "/a", "1", true) // first sync passes
	f, _ := fsys.OpenFile("/b", os.O_RDWR|os.O_CREATE, 0o600)
	if err := f.Sync(); !errors.Is(err, ErrInjected) {
		t.Fatalf("second sync: %v, want injected", err)
	}
	if err := f.Sync(); err != nil {
		t.Fatalf("third sync: %v", err)
	}
	f.Close()
	// Injected failures stop the operation: nothing happened.
	fsys = Inject(m, FailNth(OpRename, 1))
	if err := fsys.Rename("/a", "/c"); !errors.Is(err, ErrInjected) {
		t.Fatal(err)
	}
	if _, ok := content(t, m, "/a"); !ok {
		t.Fatal("failed rename moved the file")
	}
	if !OpRename.Mutates() || OpStat.Mutates() {
		t.Fatal("Mutates")
	}
}

func TestOSFSBasics(t *testing.T) {
	d := t.TempDir()
	if err := MkdirAllSync(OS, d+"/x/y", 0o700); err != nil {
		t.Fatal(err)
	}
	write(t, OS, d+"/x/y/f", "z", true)
	if err := OS.SyncDir(d + "/x/y"); err != nil {
		t.Fatal(err)
	}
	f, err := Open(OS, d+"/x/y/f")
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := OSFile(Inject(OS, func(Op) error { return nil }).(*injectFS).wrap(f)); !ok {
		t.Fatal("OSFile does not look through the injecting wrapper")
	}
	f.Close()
	l, err := OS.Lock(d)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := OS.Lock(d); !errors.Is(err, ErrLocked) {
		t.Fatalf("second flock: %v", err)
	}
	l.Close()
	var walked []string
	WalkDir(OS, d, func(p string, _ fs.DirEntry, err error) error {
		walked = append(walked, p)
		return err
	})
	if len(walked) != 4 {
		t.Fatalf("walked %v", walked)
	}
}
