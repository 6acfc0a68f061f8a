// Package sparse copies disk images without filling their holes: the data
// regions of the source (SEEK_DATA/SEEK_HOLE where the source is a file)
// are read in chunks, all-zero blocks inside them are skipped, and only
// non-zero blocks are written to a destination that starts as a hole of
// the right size. A thin volume copied, imported or exported this way
// stays thin.
//
// Simplest use:
//
//	dst.Truncate(size)                     // all hole
//	err := sparse.Copy(ctx, dst, src, size, sparse.Options{Data: sparse.FileData(src)})
//
// Concurrency: Copy uses one goroutine; callers give it exclusive use of
// dst for the duration.
package sparse

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"

	"github.com/vmsan/vmsan/internal/alignbuf"
	"golang.org/x/sys/unix"
)

// Block is the zero-detection granule: a block of this many all-zero
// bytes is not written (it stays a hole in the destination). 4 KiB is the
// page and filesystem block size, the smallest unit a hole can have.
const Block = 4096

// chunk is how much is read at a time: big enough to keep a disk or an
// NBD connection busy, small enough to bound memory.
const chunk = 1 << 20

// DataFunc returns the next data region at or after off: [start, end).
// ok=false means there is no data from off to the end. A source with no
// hole information returns (off, size, true).
type DataFunc func(off int64) (start, end int64, ok bool, err error)

// Options tune Copy; the zero value copies everything as data (skipping
// zero blocks) and reports no progress.
type Options struct {
	// Data enumerates the source's data regions (FileData for a file);
	// nil treats the whole source as data.
	Data DataFunc
	// Progress, when set, is called after each chunk with the number of
	// source bytes dealt with so far (holes count as dealt with).
	Progress func(done int64)
}

// FileData returns the DataFunc of a file, from SEEK_DATA and SEEK_HOLE.
// Where lseek refuses them (EINVAL: block devices, very old kernels) the
// whole source is data.
func FileData(f *os.File) DataFunc {
	fd := int(f.Fd())
	return func(off int64) (int64, int64, bool, error) {
		start, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			return 0, 0, false, nil // only a hole from off to EOF
		}
		if errors.Is(err, unix.EINVAL) {
			// No hole information (a block device, an old kernel): all
			// data to the end, which Copy bounds by its size.
			return off, math.MaxInt64, true, nil
		}
		if err != nil {
			return 0, 0, false, err
		}
		end, err := unix.Seek(fd, start, unix.SEEK_HOLE)
		if err != nil {
			return 0, 0, false, err
		}
		return start, end, true, nil
	}
}

// Copy copies the first size bytes of src to dst at the same offsets,
// writing only non-zero Blocks of src's data regions.
//
// REQUIRES: dst reads as zeroes over [0, size) before the call (a file
// freshly truncated to size, or punched): Copy leaves the skipped ranges
// as they are.
func Copy(ctx context.Context, dst io.WriterAt, src io.ReaderAt, size int64, o Options) error {
	if size < 0 {
		return fmt.Errorf("sparse: negative size %d", size)
	}
	data := o.Data
	if data == nil {
		data = func(off int64) (int64, int64, bool, error) { return off, size, off < size, nil }
	}
	buf := make([]byte, chunk)
	for off := int64(0); off < size; {
		start, end, ok, err := data(off)
		if err != nil {
			return fmt.Errorf("sparse: find data at %d: %w", off, err)
		}
		if !ok || start >= size {
			break
		}
		// INVARIANT: progress: start >= off, and each pass below moves
		// off past at least one byte, or the loop ends.
		start = max(start, off)
		end = min(end, size)
		if end <= start {
			break
		}
		for p := start; p < end; {
			if err := ctx.Err(); err != nil {
				return err
			}
			n := int(min(int64(chunk), end-p))
			// Keep reads Block-aligned after the first so zero detection
			// sees whole blocks.
			if a := int(p % Block); a != 0 && n > Block-a {
				n = min(n, chunk-a)
			}
			b := buf[:n]
			got, err := src.ReadAt(b, p)
			if err != nil && !errors.Is(err, io.EOF) {
				return fmt.Errorf("sparse: read at %d: %w", p, err)
			}
			// A source shorter than size reads as zeroes past its end
			// (never the previous chunk's bytes).
			clear(b[got:])
			if err := writeNonZero(dst, b, p); err != nil {
				return err
			}
			p += int64(n)
			if o.Progress != nil {
				o.Progress(p)
			}
		}
		off = end
	}
	if o.Progress != nil {
		o.Progress(size)
	}
	return nil
}

// writeNonZero writes the runs of non-zero Block-sized pieces of b (b
// starts at offset off; pieces are aligned to Block in the file).
func writeNonZero(dst io.WriterAt, b []byte, off int64) error {
	runStart := -1
	flush := func(end int) error {
		if runStart < 0 {
			return nil
		}
		if _, err := dst.WriteAt(b[runStart:end], off+int64(runStart)); err != nil {
			return fmt.Errorf("sparse: write at %d: %w", off+int64(runStart), err)
		}
		runStart = -1
		return nil
	}
	for i := 0; i < len(b); {
		// Piece ends at the next Block boundary of the file offset.
		j := min(len(b), i+Block-int((off+int64(i))%Block))
		if alignbuf.IsZero(b[i:j]) {
			if err := flush(i); err != nil {
				return err
			}
		} else if runStart < 0 {
			runStart = i
		}
		i = j
	}
	return flush(len(b))
}

// Allocated is the bytes a file has allocated on its filesystem
// (st_blocks * 512): what holes save shows here, not in the size.
func Allocated(path string) (int64, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return 0, err
	}
	return st.Blocks * 512, nil
}
