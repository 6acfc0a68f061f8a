package atomicfile

import (
	"math/rand"
	"testing"

	"github.com/vmsan/vmsan/internal/vfs"
)

// At every crash point of WriteFileFS the file holds its complete old or
// complete new contents, and after RemoveTempsFS no temporary is left;
// once WriteFileFS returned, the new contents survive any crash.
func TestWriteFileCrashPoints(t *testing.T) {
	for _, random := range []bool{false, true} {
		for k := 1; ; k++ {
			m := vfs.NewMem()
			if err := vfs.MkdirAllSync(m, "/d", 0o700); err != nil {
				t.Fatal(err)
			}
			if err := WriteFileFS(m, "/d/f", []byte("old contents"), 0o600); err != nil {
				t.Fatal(err)
			}
			var crashed *vfs.MemFS
			n := 0
			rng := rand.New(rand.NewSource(int64(k)))
			fsys := vfs.Inject(m, func(op vfs.Op) error {
				if op.Kind.Mutates() {
					n++
					if n == k {
						if random {
							crashed = m.CrashClone(rng)
						} else {
							crashed = m.CrashClone(nil)
						}
					}
				}
				return nil
			})
			if err := WriteFileFS(fsys, "/d/f", []byte("the new contents"), 0o600); err != nil {
				t.Fatal(err)
			}
			done := crashed == nil
			if done {
				crashed = m.CrashClone(nil) // after the last point
			}
			b, err := vfs.ReadFile(crashed, "/d/f")
			if err != nil {
				t.Fatalf("crash at point %d: %v", k, err)
			}
			if got := string(b); got != "old contents" && got != "the new contents" {
				t.Fatalf("crash at point %d (random %v): torn file %q", k, random, got)
			}
			if done && string(b) != "the new contents" {
				t.Fatalf("crash after WriteFileFS returned lost the new contents: %q", b)
			}
			if _, err := RemoveTempsFS(crashed, "/d"); err != nil {
				t.Fatal(err)
			}
			ents, _ := crashed.ReadDir("/d")
			if len(ents) != 1 {
				t.Fatalf("crash at point %d: leftovers %v", k, ents)
			}
			if done {
				if k < 5 {
					t.Fatalf("only %d crash points", k)
				}
				break
			}
		}
	}
}
