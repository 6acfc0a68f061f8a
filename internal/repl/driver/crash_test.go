package driver

import (
	"fmt"
	"math/rand"
	"reflect"
	"slices"
	"testing"

	"github.com/vmsan/vmsan/internal/repl"
	"github.com/vmsan/vmsan/internal/vfs"
)

// replState is what load returns, for comparing crash images.
type replState struct {
	m     repl.Meta
	words []uint64
	al    []int64
}

func loadState(t *testing.T, fsys vfs.FS, dir string) replState {
	t.Helper()
	st := &state{fs: fsys, dir: dir}
	m, words, al, found, err := st.load()
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	if !found {
		t.Fatal("load: no state")
	}
	return replState{m, words, al}
}

// A promotion persists bitmap, activity log and metadata (Role Primary,
// CrashedPrimary, new generations) in one Persist. A crash before any of
// its mutating file operations leaves each file old or new, in the order
// persist promises: a new AL only with the new bitmap, new metadata only
// with both.
func TestPersistCrashPoints(t *testing.T) {
	const dir = "/data/volumes/vm1.state/repl"
	old := replState{
		m:     repl.Meta{NodeID: 1, Role: repl.Secondary, Disk: repl.UpToDate, Clean: true, DataID: "d1"},
		words: []uint64{0, 1},
		al:    []int64{3},
	}
	promoted := repl.Meta{NodeID: 1, Role: repl.Primary, Disk: repl.UpToDate, CrashedPrimary: true, PromotedAt: 42, DataID: "d1"}
	promoted.Gens.Current = 7
	neu := replState{m: promoted, words: []uint64{5, 1, 9}, al: []int64{3, 4}}
	setup := func(fsys vfs.FS) *state {
		if err := vfs.MkdirAllSync(fsys, dir, dirMode); err != nil {
			t.Fatal(err)
		}
		st := &state{fs: fsys, dir: dir}
		var err error
		if st.al, err = openALFileFS(fsys, dir); err != nil {
			t.Fatal(err)
		}
		m := old.m
		if err := st.persist(repl.Persist{Meta: &m, Bitmap: old.words, BitmapChanged: true, AL: old.al, ALChanged: true}); err != nil {
			t.Fatal(err)
		}
		return st
	}
	for _, random := range []bool{false, true} {
		for k := 1; ; k++ {
			mem := vfs.NewMem()
			setup(mem)
			var img *vfs.MemFS
			n := 0
			rng := rand.New(rand.NewSource(int64(k)))
			fsys := vfs.Inject(mem, func(op vfs.Op) error {
				if op.Kind.Mutates() {
					n++
					if n == k {
						if random {
							img = mem.CrashClone(rng)
						} else {
							img = mem.CrashClone(nil)
						}
					}
				}
				return nil
			})
			// The replica reopens its state with the seam's FS.
			st := &state{fs: fsys, dir: dir}
			var err error
			if st.al, err = openALFileFS(fsys, dir); err != nil {
				t.Fatal(err)
			}
			m := neu.m
			if err := st.persist(repl.Persist{Meta: &m, Bitmap: neu.words, BitmapChanged: true, AL: neu.al, ALChanged: true}); err != nil {
				t.Fatal(err)
			}
			st.al.close()
			past := img == nil
			if past {
				img = mem.CrashClone(nil)
			}
			where := fmt.Sprintf("crash at point %d/%d (random %v)", k, n, random)
			got := loadState(t, img, dir)
			newBM, newAL, newMeta := slices.Equal(got.words, neu.words), slices.Equal(got.al, neu.al), reflect.DeepEqual(got.m, neu.m)
			if !newBM && !slices.Equal(got.words, old.words) {
				t.Fatalf("%s: bitmap %v is neither old nor new", where, got.words)
			}
			if !newAL && !slices.Equal(got.al, old.al) {
				t.Fatalf("%s: AL %v is neither old nor new", where, got.al)
			}
			if !newMeta && !reflect.DeepEqual(got.m, old.m) {
				t.Fatalf("%s: meta %+v is neither old nor new", where, got.m)
			}
			if newAL && !newBM {
				t.Fatalf("%s: the new AL is durable without the bitmap covering it", where)
			}
			if newMeta && (!newAL || !newBM) {
				t.Fatalf("%s: the new metadata is durable before bitmap and AL", where)
			}
			if past && (!newMeta || !newAL || !newBM) {
				t.Fatalf("persist returned but a crash loses part of it")
			}
			if past {
				if n < 8 {
					t.Fatalf("only %d crash points", n)
				}
				break
			}
		}
	}
}

// A new al.bin's name is durable before persist relies on fdatasync of
// its slots: a crash right after the first AL write keeps it.
func TestALFileNameDurable(t *testing.T) {
	mem := vfs.NewMem()
	const dir = "/r"
	if err := vfs.MkdirAllSync(mem, dir, dirMode); err != nil {
		t.Fatal(err)
	}
	a, err := openALFileFS(mem, dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.write([]int64{1, 2}); err != nil {
		t.Fatal(err)
	}
	got, err := loadAL(mem.CrashClone(nil), dir)
	if err != nil || !slices.Equal(got, []int64{1, 2}) {
		t.Fatalf("after a crash the AL is %v (%v), want [1 2]", got, err)
	}
}
