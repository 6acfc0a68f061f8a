package sparse

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/vmsan/vmsan/internal/alignbuf"
)

// memWriter records every write, to check what Copy skips.
type memWriter struct {
	buf    []byte
	writes [][2]int64
}

func (m *memWriter) WriteAt(p []byte, off int64) (int, error) {
	copy(m.buf[off:], p)
	m.writes = append(m.writes, [2]int64{off, int64(len(p))})
	return len(p), nil
}

// TestCopySkipsZeroBlocks: the destination gets the source's bytes, and
// only the Blocks that hold non-zero bytes are written, at any alignment
// of the data regions.
func TestCopySkipsZeroBlocks(t *testing.T) {
	const size = 3<<20 + 512
	src := make([]byte, size)
	src[5] = 1                              // block 0
	src[Block*3+Block-1] = 2                // block 3
	copy(src[1<<20-100:], []byte("across")) // straddles a chunk and block boundary
	src[size-1] = 3                         // last, partial block
	// Data regions deliberately unaligned: [1, size-1) then the last byte.
	regions := [][2]int64{{1, size - 1}, {size - 1, size}}
	data := func(off int64) (int64, int64, bool, error) {
		for _, r := range regions {
			if r[1] > off {
				return max(r[0], off), r[1], true, nil
			}
		}
		return 0, 0, false, nil
	}
	var done int64
	w := &memWriter{buf: make([]byte, size)}
	if err := Copy(context.Background(), w, bytes.NewReader(src), size, Options{Data: data, Progress: func(n int64) { done = n }}); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(w.buf, src) {
		t.Fatal("destination differs from source")
	}
	var written int64
	for _, wr := range w.writes {
		written += wr[1]
	}
	// Blocks 0, 3, the two the string straddles and the last one: at most
	// 5 blocks (the first region starts at 1, so block 0 is a short write).
	if written > 5*Block {
		t.Fatalf("wrote %d bytes in %v; want only the non-zero blocks", written, w.writes)
	}
	if done != size {
		t.Fatalf("progress ended at %d, want %d", done, size)
	}
}

// TestCopyFileHoles: a file source's holes (SEEK_DATA/SEEK_HOLE) are not
// read, and a file destination stays sparse.
func TestCopyFileHoles(t *testing.T) {
	dir := t.TempDir()
	sp, dp := filepath.Join(dir, "s"), filepath.Join(dir, "d")
	s, err := os.Create(sp)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s.Truncate(16 << 20)
	s.WriteAt(bytes.Repeat([]byte{7}, 64<<10), 8<<20)
	d, err := os.Create(dp)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	d.Truncate(16 << 20)
	if err := Copy(context.Background(), d, s, 16<<20, Options{Data: FileData(s)}); err != nil {
		t.Fatal(err)
	}
	a, _ := os.ReadFile(sp)
	b, _ := os.ReadFile(dp)
	if !bytes.Equal(a, b) {
		t.Fatal("copy differs")
	}
	if n, _ := Allocated(dp); n > 1<<20 {
		t.Fatalf("destination allocates %d bytes for 64 KiB of data", n)
	}
}

func TestCopyCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	w := &memWriter{buf: make([]byte, 1<<20)}
	if err := Copy(ctx, w, bytes.NewReader(make([]byte, 1<<20)), 1<<20, Options{}); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled copy: %v", err)
	}
	if err := Copy(context.Background(), w, bytes.NewReader(nil), -1, Options{}); err == nil {
		t.Fatal("negative size accepted")
	}
}

// TestCopyShortSource: past the end of a shorter source the destination
// reads as zeroes, not as bytes left in the buffer by the previous chunk.
func TestCopyShortSource(t *testing.T) {
	src := bytes.Repeat([]byte{9}, chunk+100) // one full chunk of 9s, then 100
	w := &memWriter{buf: make([]byte, 2*chunk)}
	if err := Copy(context.Background(), w, bytes.NewReader(src), 2*chunk, Options{}); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(w.buf[:len(src)], src) || !alignbuf.IsZero(w.buf[len(src):]) {
		t.Fatal("bytes past the end of the source are not zero")
	}
}

func TestSameBlocks(t *testing.T) {
	a := []Extent{{0, 1000, 100, 0}, {200, 5000, 100, ExtentShared}}
	b := []Extent{{0, 1000, 50, ExtentShared}, {50, 1050, 50, 0}, {200, 5000, 50, 0}, {250, 9000, 50, 0}}
	for _, c := range []struct {
		off, n int64
		want   bool
	}{
		{0, 100, true},    // split differently, same addresses
		{10, 20, true},    // inside
		{90, 20, false},   // runs into a hole
		{200, 50, true},   // shared part
		{200, 100, false}, // b moved its second half (rewritten)
		{150, 10, false},  // hole in both: not "shared"
	} {
		if got := SameBlocks(a, b, c.off, c.n); got != c.want {
			t.Errorf("SameBlocks(%d, %d) = %v, want %v", c.off, c.n, got, c.want)
		}
	}
	if SameBlocks([]Extent{{0, 0, 10, 0x8}}, []Extent{{0, 0, 10, 0x8}}, 0, 10) {
		t.Error("extents with an unknown address (flag 0x8) compared equal")
	}
}
