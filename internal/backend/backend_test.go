package backend_test

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/vmsan/vmsan/internal/backend"
	"github.com/vmsan/vmsan/internal/backend/backendtest"
	"github.com/vmsan/vmsan/internal/testutil"
)

var modes = []backend.CacheMode{backend.CacheNone, backend.CacheWritethrough, backend.CacheWriteback, backend.CacheUnsafe}

// conformance runs a random sequence of operations against b and a plain
// byte-slice model, checking every read (and the final image) against it.
// Offsets and lengths are deliberately unaligned half the time, and writes
// are split into several buffers of odd sizes, to exercise the vectored and
// O_DIRECT bounce paths.
func conformance(t *testing.T, b backend.Backend, seed uint64, steps int) {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 1))
	var key [32]byte
	key[0] = byte(seed)
	fill := rand.NewChaCha8(key)
	size := b.Size()
	model := make([]byte, size)
	rangeOf := func() (int64, int64) {
		var off, n int64
		if rng.IntN(2) == 0 {
			off = rng.Int64N(size/4096) * 4096
			n = (1 + rng.Int64N(64)) * 4096
		} else {
			off = rng.Int64N(size)
			n = 1 + rng.Int64N(100000)
		}
		if off+n > size {
			n = size - off
		}
		return off, n
	}
	for i := 0; i < steps; i++ {
		off, n := rangeOf()
		switch op := rng.IntN(10); {
		case op < 4: // write, as 1-4 buffers
			data := make([]byte, n)
			fill.Read(data)
			data[0] |= 1 // never all zeroes
			var bufs [][]byte
			rest := data
			for len(rest) > 0 {
				k := len(rest)
				if rng.IntN(2) == 0 && k > 1 {
					k = 1 + rng.IntN(k)
				}
				bufs = append(bufs, rest[:k])
				rest = rest[k:]
			}
			if err := b.WritevAt(bufs, off, rng.IntN(4) == 0); err != nil {
				t.Fatalf("step %d write %d+%d: %v", i, off, n, err)
			}
			copy(model[off:], data)
		case op < 6: // read, into two buffers
			got := make([]byte, n)
			k := rng.Int64N(n + 1)
			if err := b.ReadvAt([][]byte{got[:k], got[k:]}, off); err != nil {
				t.Fatalf("step %d read %d+%d: %v", i, off, n, err)
			}
			if !bytes.Equal(got, model[off:off+n]) {
				t.Fatalf("step %d read %d+%d: data differs from model", i, off, n)
			}
		case op < 7:
			if err := b.Trim(off, n); err != nil {
				t.Fatalf("step %d trim: %v", i, err)
			}
			clear(model[off : off+n])
		case op < 8:
			err := b.WriteZeroes(off, n, rng.IntN(2) == 0, false)
			if err != nil {
				t.Fatalf("step %d zero: %v", i, err)
			}
			clear(model[off : off+n])
		case op < 9:
			if err := b.Sync(); err != nil {
				t.Fatalf("step %d sync: %v", i, err)
			}
		default:
			ext, err := b.Extents(off, n)
			if err != nil {
				t.Fatalf("step %d extents: %v", i, err)
			}
			pos := off
			for _, e := range ext {
				if e.Offset != pos || e.Length <= 0 {
					t.Fatalf("step %d extents not contiguous: %+v", i, ext)
				}
				if e.Hole && !bytes.Equal(model[e.Offset:e.Offset+e.Length], make([]byte, e.Length)) {
					t.Fatalf("step %d: extent %+v reported as hole but model has data", i, e)
				}
				pos += e.Length
			}
			if pos != off+n {
				t.Fatalf("step %d extents cover %d..%d, want ..%d", i, off, pos, off+n)
			}
		}
	}
	got := make([]byte, size)
	if err := b.ReadvAt([][]byte{got}, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, model) {
		t.Fatal("final image differs from model")
	}
}

func TestMemConformance(t *testing.T) {
	conformance(t, backend.NewMem(8<<20), 1, 800)
}

func TestFileConformance(t *testing.T) {
	for _, m := range modes {
		t.Run(string(m), func(t *testing.T) {
			f, _ := backendtest.NewFile(t, 8<<20, m)
			steps := 600
			if m == backend.CacheWritethrough || m == backend.CacheNone {
				steps = 200 // every write is a device flush
			}
			conformance(t, f, 2, steps)
		})
	}
}

// TestFileReopen checks data written in each mode survives Close and reopen.
func TestFileReopen(t *testing.T) {
	for _, m := range modes {
		t.Run(string(m), func(t *testing.T) {
			f, p := backendtest.NewFile(t, 1<<20, m)
			want := bytes.Repeat([]byte("vmsan!"), 1000)
			if err := f.WritevAt([][]byte{want[:1000], want[1000:]}, 12345, true); err != nil {
				t.Fatal(err)
			}
			if err := f.Close(); err != nil {
				t.Fatal(err)
			}
			g, err := backend.OpenFile(p, backend.CacheWriteback, true)
			if err != nil {
				t.Fatal(err)
			}
			defer g.Close()
			got := make([]byte, len(want))
			if err := g.ReadvAt([][]byte{got}, 12345); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Fatal("data lost across reopen")
			}
			if err := g.WritevAt([][]byte{got}, 0, false); !errors.Is(err, syscall.EROFS) {
				t.Fatalf("write to read-only backend: %v, want EROFS", err)
			}
		})
	}
}

func TestFilePunchHoleExtents(t *testing.T) {
	f, _ := backendtest.NewFile(t, 4<<20, backend.CacheWriteback)
	data := bytes.Repeat([]byte{0xAB}, 2<<20)
	if err := f.WritevAt([][]byte{data}, 1<<20, false); err != nil {
		t.Fatal(err)
	}
	if err := f.Trim(2<<20, 512<<10); err != nil {
		t.Fatal(err)
	}
	ext, err := f.Extents(0, 4<<20)
	if err != nil {
		t.Fatal(err)
	}
	// Expect hole [0,1M) data [1M,2M) hole [2M,2.5M) data [2.5M,3M) hole [3M,4M).
	want := []backend.Extent{
		{0, 1 << 20, true, true},
		{1 << 20, 1 << 20, false, false},
		{2 << 20, 512 << 10, true, true},
		{2<<20 + 512<<10, 512 << 10, false, false},
		{3 << 20, 1 << 20, true, true},
	}
	if fmt.Sprint(ext) != fmt.Sprint(want) {
		t.Fatalf("extents after punch:\n got %v\nwant %v", ext, want)
	}
	got := make([]byte, 512<<10)
	if err := f.ReadvAt([][]byte{got}, 2<<20); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, make([]byte, len(got))) {
		t.Fatal("punched range does not read as zeroes")
	}
	// A sub-range query starting inside a hole and ending inside data.
	ext, err = f.Extents(512<<10, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	if len(ext) != 2 || !ext[0].Hole || ext[0].Length != 512<<10 || ext[1].Hole || ext[1].Length != 512<<10 {
		t.Fatalf("sub-range extents: %v", ext)
	}
}

func TestFileWriteZeroes(t *testing.T) {
	f, _ := backendtest.NewFile(t, 4<<20, backend.CacheWriteback)
	data := bytes.Repeat([]byte{0xCD}, 4<<20)
	if err := f.WritevAt([][]byte{data}, 0, false); err != nil {
		t.Fatal(err)
	}
	// NO_HOLE semantics, fast: ext4/xfs/btrfs do ZERO_RANGE or punch+alloc.
	if err := f.WriteZeroes(1<<20, 1<<20, false, true); err != nil {
		t.Fatalf("fast zero without trim: %v", err)
	}
	// Holes allowed: must punch, so Extents reports a hole.
	if err := f.WriteZeroes(3<<20, 512<<10, true, true); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 4<<20)
	if err := f.ReadvAt([][]byte{got}, 0); err != nil {
		t.Fatal(err)
	}
	clear(data[1<<20 : 2<<20])
	clear(data[3<<20 : 3<<20+512<<10])
	if !bytes.Equal(got, data) {
		t.Fatal("zeroed ranges wrong")
	}
	ext, _ := f.Extents(3<<20, 512<<10)
	if len(ext) != 1 || !ext[0].Hole {
		t.Fatalf("zero with mayTrim did not leave a hole: %v", ext)
	}
	// Unaligned zeroing must keep the neighbouring bytes.
	if err := f.WriteZeroes(100, 1000, false, false); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 1200)
	f.ReadvAt([][]byte{b}, 0)
	if b[99] != 0xCD || b[100] != 0 || b[1099] != 0 || b[1100] != 0xCD {
		t.Fatalf("unaligned zero: %x %x %x %x", b[99], b[100], b[1099], b[1100])
	}
}

func TestFileResize(t *testing.T) {
	f, p := backendtest.NewFile(t, 1<<20, backend.CacheWriteback)
	if err := f.WritevAt([][]byte{bytes.Repeat([]byte{1}, 1<<20)}, 0, false); err != nil {
		t.Fatal(err)
	}
	if err := f.Resize(3 << 20); err != nil {
		t.Fatal(err)
	}
	if f.Size() != 3<<20 {
		t.Fatalf("size %d", f.Size())
	}
	ext, _ := f.Extents(1<<20, 2<<20)
	if len(ext) != 1 || !ext[0].Hole {
		t.Fatalf("grown area is not a hole: %v", ext)
	}
	if err := f.Resize(512 << 10); err != nil {
		t.Fatal(err)
	}
	st, _ := os.Stat(p)
	if st.Size() != 512<<10 {
		t.Fatalf("file size after shrink: %d", st.Size())
	}
	if err := f.ReadvAt([][]byte{make([]byte, 1)}, 512<<10); !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("read past end: %v, want EINVAL", err)
	}
}

func TestOpenFileErrors(t *testing.T) {
	dir := testutil.DiskTempDir(t)
	if _, err := backend.OpenFile(filepath.Join(dir, "nope"), backend.CacheWriteback, false); !errors.Is(err, syscall.ENOENT) {
		t.Fatalf("open missing: %v", err)
	}
	if _, err := backend.OpenFile(dir, backend.CacheWriteback, true); err == nil {
		t.Fatal("opening a directory succeeded")
	}
	if _, err := backend.OpenFile(filepath.Join(dir, "x"), "bogus", false); err == nil {
		t.Fatal("bogus cache mode accepted")
	}
	p := filepath.Join(dir, "v")
	if err := backend.CreateFile(p, 4096); err != nil {
		t.Fatal(err)
	}
	if err := backend.CreateFile(p, 4096); !errors.Is(err, syscall.EEXIST) {
		t.Fatalf("CreateFile over existing: %v, want EEXIST", err)
	}
}

// TestDirectOnTmpfs: on tmpfs, cache=none either works (kernels that support
// O_DIRECT there) or fails at open with ErrDirectUnsupported — never later.
func TestDirectOnTmpfs(t *testing.T) {
	var st unix.Statfs_t
	if err := unix.Statfs("/dev/shm", &st); err != nil || st.Type != unix.TMPFS_MAGIC {
		testutil.SkipOrFail(t, "no tmpfs at /dev/shm")
	}
	d, err := os.MkdirTemp("/dev/shm", "vmsan-test-")
	if err != nil {
		testutil.SkipOrFail(t, "no writable /dev/shm: %v", err)
	}
	defer os.RemoveAll(d)
	p := filepath.Join(d, "v")
	if err := backend.CreateFile(p, 1<<20); err != nil {
		t.Fatal(err)
	}
	f, err := backend.OpenFile(p, backend.CacheNone, false)
	if err != nil {
		if !errors.Is(err, backend.ErrDirectUnsupported) {
			t.Fatalf("want ErrDirectUnsupported, got %v", err)
		}
		return
	}
	defer f.Close()
	conformance(t, f, 3, 100)
}

// TestDirectConcurrentPartialBlocks: under cache=none, unaligned writes go
// through read-modify-write of whole blocks. Writes to different bytes of
// one block do not overlap, so the engine may issue them concurrently; the
// backend must not lose any of them.
func TestDirectConcurrentPartialBlocks(t *testing.T) {
	f, _ := backendtest.NewFile(t, 64<<10, backend.CacheNone)
	if f.Alignment() < 512 {
		t.Fatalf("cache=none alignment %d, want >= 512", f.Alignment())
	}
	const piece = 100
	n := int(64<<10) / piece
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := g; i < n; i += 8 {
				if err := f.WritevAt([][]byte{bytes.Repeat([]byte{byte(i%251 + 1)}, piece)}, int64(i*piece), false); err != nil {
					t.Error(err)
					return
				}
			}
		}(g)
	}
	wg.Wait()
	got := make([]byte, n*piece)
	if err := f.ReadvAt([][]byte{got}, 0); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < n; i++ {
		if !bytes.Equal(got[i*piece:(i+1)*piece], bytes.Repeat([]byte{byte(i%251 + 1)}, piece)) {
			t.Fatalf("piece %d lost by a concurrent read-modify-write", i)
		}
	}
}
