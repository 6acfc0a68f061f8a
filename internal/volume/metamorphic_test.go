package volume

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand"
	"os"
	"testing"

	"github.com/vmsan/vmsan/internal/vfs"
)

// randomOp is one step of a random sequence: a store operation on
// names drawn from a small set, so that sequences hit existing and
// missing volumes, snapshots of resized volumes, clones of clones, ...
type randomOp struct {
	desc string
	run  func(s *Store) error
}

func genOp(rng *rand.Rand) randomOp {
	vols := []string{"a", "b", "c"}
	snaps := []string{"s1", "s2"}
	v := vols[rng.Intn(len(vols))]
	w := vols[rng.Intn(len(vols))]
	sn := snaps[rng.Intn(len(snaps))]
	size := int64(1+rng.Intn(4)) * 16 << 10
	switch rng.Intn(10) {
	case 9:
		// A client's write (what the backend does, then a flush).
		off, fill := int64(rng.Intn(4))*4096, byte(1+rng.Intn(255))
		return randomOp{fmt.Sprintf("write %s %d %#x", v, off, fill), func(s *Store) error {
			if _, err := s.Get(v); err != nil {
				return err
			}
			f, err := s.fs.OpenFile(s.RawPath(v), os.O_RDWR, 0)
			if err != nil {
				return err
			}
			defer f.Close()
			if _, err := f.WriteAt(bytes.Repeat([]byte{fill}, 4096), off); err != nil {
				return err
			}
			return f.Sync()
		}}
	case 0, 1:
		return randomOp{"create " + v, func(s *Store) error {
			_, err := s.Create(CreateOptions{Name: v, Size: size})
			return err
		}}
	case 2:
		return randomOp{fmt.Sprintf("resize %s %d", v, size), func(s *Store) error {
			_, err := s.Resize(v, size, true)
			return err
		}}
	case 3:
		d := fmt.Sprintf("d%d", rng.Intn(100))
		return randomOp{"update " + v, func(s *Store) error {
			_, err := s.Update(v, func(m *Meta) error { m.Description = d; return nil })
			return err
		}}
	case 4:
		return randomOp{"snapshot " + v + "@" + sn, func(s *Store) error {
			_, err := s.CreateSnapshot(v, sn, CloneOptions{Copy: true})
			return err
		}}
	case 5:
		return randomOp{"delete " + v + "@" + sn, func(s *Store) error { return s.DeleteSnapshot(v, sn) }}
	case 6:
		return randomOp{"delete " + v, func(s *Store) error { return s.Delete(v, true) }}
	case 7:
		src := v
		if rng.Intn(2) == 0 {
			src = v + "@" + sn
		}
		return randomOp{"clone " + src + " " + w, func(s *Store) error {
			_, err := s.Clone(src, w, CloneOptions{Copy: true})
			return err
		}}
	default:
		return randomOp{"rollback " + v + "@" + sn, func(s *Store) error {
			_, err := s.Rollback(v, sn, CloneOptions{Copy: true})
			return err
		}}
	}
}

// TestMetamorphicCrashes runs random operation sequences on a store and,
// side by side, on a reference store that never crashes. About one
// operation in three crashes at a random crash point (random write-back);
// the store restarted from the image must hold, object by object, the
// reference's state from before or after that operation; the operation
// is repeated there when it was not (entirely) done, and from then on
// both stores must agree after every operation and fail the same ones.
func TestMetamorphicCrashes(t *testing.T) {
	seeds := 40
	if testing.Short() {
		seeds = 10
	}
	for seed := int64(1); seed <= int64(seeds); seed++ {
		rng := rand.New(rand.NewSource(seed))
		ref, err := OpenFS(vfs.NewMem(), crashDir)
		if err != nil {
			t.Fatal(err)
		}
		a := &armedFS{mem: vfs.NewMem(), rng: rand.New(rand.NewSource(seed))}
		s, err := OpenFS(vfs.Inject(a.mem, a.hook), crashDir)
		if err != nil {
			t.Fatal(err)
		}
		ops := make([]randomOp, 24)
		for i := range ops {
			ops[i] = genOp(rng)
		}
		crashes := map[int]bool{}
		for i := range ops {
			crashes[i] = rng.Intn(3) == 0
		}
		var hist []string
		for i, op := range ops {
			hist = append(hist, op.desc)
			before := storeSig(t, ref)
			refErr := op.run(ref)
			after := storeSig(t, ref)
			if !crashes[i] {
				err := op.run(s)
				if (err == nil) != (refErr == nil) || (err != nil && errors.Is(refErr, ErrNotFound) != errors.Is(err, ErrNotFound)) {
					t.Fatalf("seed %d %v: store says %v, reference %v", seed, hist, err, refErr)
				}
				if got := storeSig(t, s); got.String() != after.String() {
					t.Fatalf("seed %d %v: store\n%s\nreference\n%s", seed, hist, got, after)
				}
				continue
			}
			// Count this operation's crash points on the reference run's
			// twin, then crash at a random one of them.
			a.mu.Lock()
			a.armed, a.n, a.crashAt, a.image, a.ops = true, 0, -1, nil, nil
			a.mu.Unlock()
			probe := a.mem.CrashClone(nil)
			pa := &armedFS{mem: probe, armed: true, crashAt: -1}
			ps, err := OpenFS(vfs.Inject(probe, pa.hook), crashDir)
			if err != nil {
				t.Fatal(err)
			}
			pa.mu.Lock()
			pa.n, pa.ops = 0, nil
			pa.mu.Unlock()
			op.run(ps)
			ps.Close()
			points := pa.n
			a.mu.Lock()
			a.crashAt = 1 + rng.Intn(points+1) // points+1: after it returned
			a.mu.Unlock()
			opErr := op.run(s)
			a.mu.Lock()
			a.armed = false
			img := a.image
			a.mu.Unlock()
			if img == nil {
				img = a.mem.CrashClone(a.rng)
			}
			s.Close()
			where := fmt.Sprintf("seed %d %v (crash at point %d of %d, op error %v)", seed, hist, a.crashAt, points, opErr)
			s, err = OpenFS(vfs.Inject(img, a.hook), crashDir)
			if err != nil {
				t.Fatalf("%s: restart: %v", where, err)
			}
			a.mem = img
			noTemps(t, img, where)
			got := storeSig(t, s)
			if !got.mixOf(before, after) {
				t.Fatalf("%s: restart finds\n%s\nbefore\n%s\nafter\n%s", where, got, before, after)
			}
			if got.String() != after.String() {
				op.run(s)
				if again := storeSig(t, s); again.String() != after.String() {
					t.Fatalf("%s: repeating gives\n%s\nwant\n%s", where, again, after)
				}
			}
		}
		s.Close()
		ref.Close()
	}
}
