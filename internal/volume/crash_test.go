package volume

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io/fs"
	"math/rand"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/vmsan/vmsan/internal/atomicfile"
	"github.com/vmsan/vmsan/internal/vfs"
)

// Crash-point tests: every store operation is run on a vfs.MemFS, a crash
// is simulated before each of its mutating file operations in turn (the
// crash points), and the store is reopened from the crash image. The next
// start must succeed and find every volume and snapshot in its state from
// before the operation or from after it (never in between, never damaged),
// with no temporary file left and nothing that blocks repeating the
// operation.

const crashDir = "/data"

// crashVolSize is small: MemFS files live in memory.
const crashVolSize = 64 << 10

// storeSig describes what a user can see of a store: volumes and snapshots
// with their settings and a hash of their data. Identifiers that are new
// on every run (UUIDs, data identities, creation times) are left out.
// Each object (volume or snapshot) has one line, keyed by its name.
type storeState map[string]string

func (st storeState) String() string {
	var ks []string
	for k := range st {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	var b strings.Builder
	for _, k := range ks {
		b.WriteString(st[k] + "\n")
	}
	return b.String()
}

// mixOf reports whether every object of st is as in before or as in
// after (absent counting as a state): an operation on several objects
// (a forced delete of a volume with snapshots) is atomic per object, and
// a crash may leave some objects done and others not.
func (st storeState) mixOf(before, after storeState) bool {
	keys := map[string]bool{}
	for _, m := range []storeState{st, before, after} {
		for k := range m {
			keys[k] = true
		}
	}
	for k := range keys {
		if st[k] != before[k] && st[k] != after[k] {
			return false
		}
	}
	return true
}

func storeSig(t *testing.T, s *Store) storeState {
	t.Helper()
	ms, err := s.List()
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	st := storeState{}
	for _, m := range ms {
		if err := s.CheckRaw(m.Name); err != nil {
			t.Fatalf("volume %s damaged: %v", m.Name, err)
		}
		st[m.Name] = fmt.Sprintf("vol %s size=%d ro=%v desc=%q resizefrom=%d rollback=%v data=%s",
			m.Name, m.Size, m.ReadOnly, m.Description, m.ResizeFrom, m.Rollback != nil, fileHash(t, s.fs, s.RawPath(m.Name)))
	}
	sms, err := s.ListSnapshots("")
	if err != nil {
		t.Fatalf("ListSnapshots: %v", err)
	}
	for _, sm := range sms {
		st[sm.Name] = fmt.Sprintf("snap %s size=%d temp=%v data=%s", sm.Name, sm.Size, sm.Temporary, fileHash(t, s.fs, s.SnapshotPath(sm.Volume, sm.Snapshot)))
	}
	return st
}

func fileHash(t *testing.T, fsys vfs.FS, p string) string {
	t.Helper()
	b, err := vfs.ReadFile(fsys, p)
	if err != nil {
		t.Fatalf("read %s: %v", p, err)
	}
	return fmt.Sprintf("%x", sha256.Sum256(b))[:12]
}

func writeRaw(t *testing.T, s *Store, name string, off int64, fill byte, n int) {
	t.Helper()
	f, err := s.fs.OpenFile(s.RawPath(name), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(bytes.Repeat([]byte{fill}, n), off); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
}

// crashSetup is the state every case starts from: volume a with data,
// its snapshot a@s0, and a's data changed after the snapshot.
func crashSetup(t *testing.T, s *Store) {
	t.Helper()
	if _, err := s.Create(CreateOptions{Name: "a", Size: crashVolSize}); err != nil {
		t.Fatal(err)
	}
	writeRaw(t, s, "a", 0, 0xaa, 4096)
	if _, err := s.CreateSnapshot("a", "s0", CloneOptions{Copy: true}); err != nil {
		t.Fatal(err)
	}
	writeRaw(t, s, "a", 8192, 0xbb, 4096)
}

type crashCase struct {
	name string
	// prep runs before the crash points are armed (after crashSetup).
	prep func(t *testing.T, s *Store)
	// redoPrep: a repeat of the operation after a crash needs prep again
	// (an import's temporary file is removed by the next start).
	redoPrep bool
	op       func(s *Store) error
}

func importFile(t *testing.T, s *Store) string {
	p := filepath.Join(s.vdir, atomicfile.TempPrefix+"import-test")
	f, err := s.fs.OpenFile(p, os.O_RDWR|os.O_CREATE|os.O_EXCL, fileMode)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteAt(bytes.Repeat([]byte{0xcc}, 4096), 0)
	f.Sync()
	f.Close()
	return p
}

var crashCases = []crashCase{
	{name: "create", op: func(s *Store) error {
		_, err := s.Create(CreateOptions{Name: "b", Size: crashVolSize})
		return err
	}},
	{name: "grow", op: func(s *Store) error {
		_, err := s.Resize("a", 2*crashVolSize, false)
		return err
	}},
	{name: "shrink", op: func(s *Store) error {
		_, err := s.Resize("a", crashVolSize/2, true)
		return err
	}},
	{name: "update", op: func(s *Store) error {
		_, err := s.Update("a", func(m *Meta) error { m.Description = "changed"; return nil })
		return err
	}},
	{name: "snapshot", op: func(s *Store) error {
		_, err := s.CreateSnapshot("a", "s1", CloneOptions{Copy: true})
		return err
	}},
	{name: "delete-snapshot", op: func(s *Store) error { return s.DeleteSnapshot("a", "s0") }},
	{name: "delete-with-snapshots", op: func(s *Store) error { return s.Delete("a", true) }},
	{name: "delete", prep: func(t *testing.T, s *Store) {
		if _, err := s.Create(CreateOptions{Name: "b", Size: crashVolSize}); err != nil {
			t.Fatal(err)
		}
		writeRaw(t, s, "b", 0, 0xdd, 512)
	}, op: func(s *Store) error { return s.Delete("b", false) }},
	{name: "clone", op: func(s *Store) error {
		_, err := s.Clone("a@s0", "c", CloneOptions{Copy: true})
		return err
	}},
	{name: "clone-volume", op: func(s *Store) error {
		_, err := s.Clone("a", "c", CloneOptions{Copy: true})
		return err
	}},
	{name: "rollback", op: func(s *Store) error {
		_, err := s.Rollback("a", "s0", CloneOptions{Copy: true})
		return err
	}},
	{name: "create-from-file", redoPrep: true, prep: func(t *testing.T, s *Store) { importFile(t, s) }, op: func(s *Store) error {
		_, err := s.CreateFromFile(CreateOptions{Name: "imp", Size: crashVolSize}, filepath.Join(s.vdir, atomicfile.TempPrefix+"import-test"))
		return err
	}},
}

// armedFS counts mutating operations while armed and takes a crash image
// before the one numbered crashAt.
type armedFS struct {
	mem     *vfs.MemFS
	mu      sync.Mutex
	armed   bool
	n       int
	crashAt int
	rng     *rand.Rand
	image   *vfs.MemFS
	ops     []string
}

func (a *armedFS) hook(op vfs.Op) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.armed || !op.Kind.Mutates() {
		return nil
	}
	a.n++
	a.ops = append(a.ops, op.String())
	if a.n == a.crashAt {
		a.image = a.mem.CrashClone(a.rng)
	}
	return nil
}

// noTemps fails if a temporary file is left anywhere in the data directory.
func noTemps(t *testing.T, fsys vfs.FS, where string) {
	t.Helper()
	vfs.WalkDir(fsys, crashDir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && atomicfile.IsTemp(d.Name()) {
			t.Errorf("%s: temporary file %s left after the next start", where, p)
		}
		return nil
	})
}

// runCrashPoint runs case c with a crash before mutating operation k
// (or, when the operation has fewer, after it returned) and checks the
// next start. It reports whether k was past the last crash point.
func runCrashPoint(t *testing.T, c crashCase, k int, rng *rand.Rand) (past bool, ops []string) {
	t.Helper()
	a := &armedFS{mem: vfs.NewMem(), crashAt: k, rng: rng}
	s, err := OpenFS(vfs.Inject(a.mem, a.hook), crashDir)
	if err != nil {
		t.Fatal(err)
	}
	crashSetup(t, s)
	if c.prep != nil {
		c.prep(t, s)
	}
	before := storeSig(t, s)
	a.mu.Lock()
	a.armed = true
	a.mu.Unlock()
	if err := c.op(s); err != nil {
		t.Fatalf("%s: %v", c.name, err)
	}
	a.mu.Lock()
	a.armed = false
	image := a.image
	past = image == nil
	ops = a.ops
	a.mu.Unlock()
	after := storeSig(t, s)
	if before.String() == after.String() {
		t.Fatalf("%s changed nothing visible", c.name)
	}
	if past {
		image = a.mem.CrashClone(nil) // completed: must survive any crash
	}
	where := fmt.Sprintf("%s, crash before point %d/%d (%s, random %v)", c.name, k, len(ops), opAt(ops, k), rng != nil)

	s2, err := OpenFS(image, crashDir)
	if err != nil {
		t.Fatalf("%s: next start: %v", where, err)
	}
	defer s2.Close()
	noTemps(t, image, where)
	got := storeSig(t, s2)
	switch {
	case got.String() == after.String():
	case past:
		t.Fatalf("%s: the operation returned success but a crash after it does not keep its result:\n%s\nwant\n%s", where, got, after)
	case got.mixOf(before, after):
		// Not (all) done: repeating the operation must work and give
		// the new state.
		if c.redoPrep {
			c.prep(t, s2)
		}
		if err := c.op(s2); err != nil {
			t.Fatalf("%s: the store is in the old state but repeating %s fails: %v", where, c.name, err)
		}
		if again := storeSig(t, s2); again.String() != after.String() {
			t.Fatalf("%s: repeated %s gives\n%s\nwant\n%s", where, c.name, again, after)
		}
	default:
		t.Fatalf("%s: next start finds neither state:\n%s\nbefore:\n%s\nafter:\n%s", where, got, before, after)
	}
	for _, n := range s2.Notices() {
		if strings.Contains(n.Msg, "not the file this volume last used") && c.name != "rollback" {
			t.Errorf("%s: the next start changed a data identity: %s", where, n.Msg)
		}
	}
	// Nothing the crash left blocks new work under the names involved.
	for _, name := range []string{"b", "c", "imp", "probe"} {
		if _, err := s2.Get(name); err == nil {
			continue
		}
		if _, err := s2.Create(CreateOptions{Name: name, Size: crashVolSize}); err != nil {
			t.Fatalf("%s: create %s after the crash: %v", where, name, err)
		}
	}
	return past, ops
}

func opAt(ops []string, k int) string {
	if k-1 < len(ops) {
		return ops[k-1]
	}
	return "after the last"
}

func TestCrashPoints(t *testing.T) {
	for _, c := range crashCases {
		t.Run(c.name, func(t *testing.T) {
			points := 0
			for k := 1; ; k++ {
				past, ops := runCrashPoint(t, c, k, nil)
				for seed := int64(0); seed < 3; seed++ {
					runCrashPoint(t, c, k, rand.New(rand.NewSource(seed*1000+int64(k))))
				}
				if past {
					points = len(ops)
					if testing.Verbose() {
						t.Logf("%d crash points: %s", points, strings.Join(ops, "; "))
					}
					break
				}
			}
			if points < 3 {
				t.Fatalf("only %d crash points: the operation does not go through the seam", points)
			}
		})
	}
}

// TestCrashDuringRecovery crashes the first operation, then crashes the
// next start itself at each of its crash points: the start after that
// must still converge.
func TestCrashDuringRecovery(t *testing.T) {
	for _, c := range crashCases {
		t.Run(c.name, func(t *testing.T) {
			for k := 1; k < 64; k++ {
				a := &armedFS{mem: vfs.NewMem(), crashAt: k}
				s, err := OpenFS(vfs.Inject(a.mem, a.hook), crashDir)
				if err != nil {
					t.Fatal(err)
				}
				crashSetup(t, s)
				if c.prep != nil {
					c.prep(t, s)
				}
				before := storeSig(t, s)
				a.armed = true
				if err := c.op(s); err != nil {
					t.Fatal(err)
				}
				a.armed = false
				after := storeSig(t, s)
				if a.image == nil {
					break
				}
				for j := 1; j < 64; j++ {
					r := &armedFS{mem: a.image.CrashClone(nil), crashAt: j, armed: true}
					s2, err := OpenFS(vfs.Inject(r.mem, r.hook), crashDir)
					if err != nil {
						t.Fatalf("crash at %d: first restart: %v", k, err)
					}
					s2.Close()
					img := r.image
					if img == nil {
						break
					}
					s3, err := OpenFS(img, crashDir)
					if err != nil {
						t.Fatalf("crash at %d, then at %d of the restart: %v", k, j, err)
					}
					if got := storeSig(t, s3); !got.mixOf(before, after) {
						t.Fatalf("crash at %d, then at %d of the restart: neither state:\n%s", k, j, got)
					}
					noTemps(t, img, fmt.Sprintf("%s: crash at %d then %d", c.name, k, j))
					s3.Close()
				}
			}
		})
	}
}

// TestInjectedErrorsLeaveOldOrNew fails each mutating operation of each
// case in turn (an I/O error instead of a crash): the operation returns an
// error or succeeds, and the store, still open, then restarted, shows the
// old or the new state.
func TestInjectedErrorsLeaveOldOrNew(t *testing.T) {
	kinds := []vfs.OpKind{vfs.OpCreate, vfs.OpWrite, vfs.OpSync, vfs.OpTruncate, vfs.OpRename, vfs.OpRemove, vfs.OpRemoveAll, vfs.OpSyncDir, vfs.OpMkdir}
	for _, c := range crashCases {
		after := expectedAfter(t, c)
		for _, kind := range kinds {
			for n := 1; n <= 8; n++ {
				mem := vfs.NewMem()
				var mu sync.Mutex
				armed := false
				fail := vfs.FailNth(kind, n)
				s, err := OpenFS(vfs.Inject(mem, func(op vfs.Op) error {
					mu.Lock()
					on := armed
					mu.Unlock()
					if !on {
						return nil
					}
					return fail(op)
				}), crashDir)
				if err != nil {
					t.Fatal(err)
				}
				crashSetup(t, s)
				if c.prep != nil {
					c.prep(t, s)
				}
				before := storeSig(t, s)
				mu.Lock()
				armed = true
				mu.Unlock()
				opErr := c.op(s)
				mu.Lock()
				armed = false
				mu.Unlock()
				where := fmt.Sprintf("%s, %s #%d fails (op: %v)", c.name, kind, n, opErr)
				if opErr != nil && !errors.Is(opErr, vfs.ErrInjected) {
					t.Fatalf("%s: error does not wrap the I/O error", where)
				}
				s.Close()
				img := mem.CrashClone(nil)
				s2, err := OpenFS(img, crashDir)
				if err != nil {
					t.Fatalf("%s: restart: %v", where, err)
				}
				got := storeSig(t, s2)
				if opErr == nil && got.String() != after.String() {
					t.Fatalf("%s: returned success but the new state is not durable:\n%s", where, got)
				}
				if !got.mixOf(before, after) {
					t.Fatalf("%s: neither state:\n%s", where, got)
				}
				noTemps(t, img, where)
				s2.Close()
			}
		}
	}
}

// expectedAfter is the state case c leaves when nothing fails.
func expectedAfter(t *testing.T, c crashCase) storeState {
	t.Helper()
	s, err := OpenFS(vfs.NewMem(), crashDir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	crashSetup(t, s)
	if c.prep != nil {
		c.prep(t, s)
	}
	if err := c.op(s); err != nil {
		t.Fatal(err)
	}
	return storeSig(t, s)
}

// A resize done by the hook (the daemon resizes its open backend, which
// only truncates) is made durable by the store before the mark is
// cleared.
func TestCrashPointsResizeHook(t *testing.T) {
	for k := 1; ; k++ {
		a := &armedFS{mem: vfs.NewMem(), crashAt: k}
		s, err := OpenFS(vfs.Inject(a.mem, a.hook), crashDir)
		if err != nil {
			t.Fatal(err)
		}
		crashSetup(t, s)
		s.SetHooks(Hooks{Resize: func(name string, size int64) (bool, error) {
			// What backend.File.Resize does: ftruncate, no fsync.
			return true, vfs.Truncate(s.fs, s.RawPath(name), size)
		}})
		before := storeSig(t, s)
		a.armed = true
		if _, err := s.Resize("a", 2*crashVolSize, false); err != nil {
			t.Fatal(err)
		}
		a.armed = false
		after := storeSig(t, s)
		img := a.image
		if img == nil {
			img = a.mem.CrashClone(nil)
		}
		s2, err := OpenFS(img, crashDir)
		if err != nil {
			t.Fatal(err)
		}
		if got := storeSig(t, s2); got.String() != before.String() && got.String() != after.String() {
			t.Fatalf("crash at %d: neither state:\n%s", k, got)
		}
		s2.Close()
		if a.image == nil {
			break
		}
	}
}
