package bench

import (
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"

	"github.com/vmsan/vmsan/internal/nbd/proto"
	"github.com/vmsan/vmsan/internal/volume"
)

// Leaving no test data behind on a thin target.
//
// A write benchmark over an existing sparse file or thin NBD volume turns
// holes into allocated blocks full of test patterns: the volume's
// allocation grows by the test size and the patterns stay readable. Unless
// --keep, Execute therefore records the target's holes before the run and,
// after it, deallocates the parts of those holes the run allocated (holes
// before minus holes after): fallocate(PUNCH_HOLE) on files, TRIM on NBD
// exports (vmsan's server punches the backing file). Ranges that held data
// before are not touched: the run overwrote them (that is what --force
// allowed) and their old contents cannot be brought back.
//
// INVARIANT: only ranges that were holes before the run are punched, so a
// range that held data before the run is never deallocated.
// REQUIRES: nothing else writes into the target's holes during the run; a
// concurrent writer's new blocks there would be punched too (benchmarking a
// volume in use already needs --force and destroys data).

// Range is a byte range [Off, Off+Len).
type Range struct{ Off, Len int64 }

// sparseTarget is implemented by targets whose allocation can be read and
// undone: regular files and NBD exports with base:allocation.
type sparseTarget interface {
	// Holes lists the unallocated ranges, sorted and disjoint. ok=false
	// means the target cannot tell (block device, no block status).
	Holes() (hs []Range, ok bool, err error)
	// Punch deallocates [off, off+n); the range reads as zeroes afterwards
	// (NBD: as the server's TRIM leaves it).
	Punch(off, n int64) error
}

// maxHoles bounds the hole map kept in memory (16 bytes a range, 16 MiB):
// a target fragmented beyond that is not restored (a note says so) rather
// than costing unbounded memory.
const maxHoles = 1 << 20

var errTooFragmented = fmt.Errorf("more than %d holes", maxHoles)

// fileHoles walks f with SEEK_DATA/SEEK_HOLE. Filesystems without hole
// support report everything as data, which yields no holes: then nothing
// is punched, which is safe.
func fileHoles(f *os.File, size int64) ([]Range, error) {
	fd := int(f.Fd())
	var hs []Range
	for off := int64(0); off < size; {
		data, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			data = size // no data after off: a hole to the end
		} else if err != nil {
			return nil, err
		}
		if data > size {
			data = size
		}
		if data > off {
			if len(hs) == maxHoles {
				return nil, errTooFragmented
			}
			hs = append(hs, Range{off, data - off})
		}
		if data >= size {
			break
		}
		hole, err := unix.Seek(fd, data, unix.SEEK_HOLE)
		if err != nil {
			return nil, err
		}
		if hole <= data { // cannot happen per lseek(2); guards the loop
			return nil, fmt.Errorf("SEEK_HOLE at %d returned %d", data, hole)
		}
		off = hole
	}
	return hs, nil
}

func (t *fileTarget) Holes() ([]Range, bool, error) {
	if t.info.Kind != "file" {
		return nil, false, nil // block devices have no SEEK_HOLE map
	}
	hs, err := fileHoles(t.f, t.size)
	return hs, err == nil, err
}

func (t *fileTarget) Punch(off, n int64) error {
	return unix.Fallocate(int(t.f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, n)
}

func (t *nbdTarget) Holes() ([]Range, bool, error) {
	if !t.c.Export().HasAlloc {
		return nil, false, nil
	}
	size := t.c.Size()
	var hs []Range
	for off := int64(0); off < size; {
		ex, err := t.c.BlockStatus(off, size-off)
		if err != nil {
			return nil, false, err
		}
		if len(ex) == 0 {
			return nil, false, errors.New("empty block status reply")
		}
		for _, e := range ex {
			if e.Length <= 0 {
				return nil, false, errors.New("block status extent of length 0")
			}
			end := min(e.Offset+e.Length, size)
			if e.Hole && end > e.Offset {
				if n := len(hs); n > 0 && hs[n-1].Off+hs[n-1].Len == e.Offset {
					hs[n-1].Len = end - hs[n-1].Off // merge adjacent
				} else {
					if n == maxHoles {
						return nil, false, errTooFragmented
					}
					hs = append(hs, Range{e.Offset, end - e.Offset})
				}
			}
			off = end
		}
	}
	return hs, true, nil
}

func (t *nbdTarget) Punch(off, n int64) error {
	if !t.c.Export().Has(proto.FlagSendTrim) {
		return errors.New("the server does not support TRIM")
	}
	return t.c.Trim(off, n)
}

// subtract returns the parts of a not covered by b (both sorted, disjoint):
// the holes of before that are no longer holes after.
func subtract(a, b []Range) []Range {
	var out []Range
	j := 0
	for _, r := range a {
		off, end := r.Off, r.Off+r.Len
		for j < len(b) && b[j].Off+b[j].Len <= off {
			j++
		}
		for k := j; k < len(b) && b[k].Off < end && off < end; k++ {
			if b[k].Off > off {
				out = append(out, Range{off, b[k].Off - off})
			}
			off = max(off, b[k].Off+b[k].Len)
		}
		if off < end {
			out = append(out, Range{off, end - off})
		}
	}
	return out
}

// holeSnapshot is the target's hole map before a run.
type holeSnapshot struct {
	t     sparseTarget
	holes []Range
}

// snapshotHoles records t's holes; nil with a note when t cannot be
// restored (the run then goes ahead, and the note tells the user).
func snapshotHoles(t Target) (*holeSnapshot, string) {
	st, ok := t.(sparseTarget)
	if !ok {
		return nil, ""
	}
	hs, ok, err := st.Holes()
	if err != nil {
		return nil, "holes not restored: reading the allocation map before the run: " + err.Error()
	}
	if !ok || len(hs) == 0 {
		return nil, "" // nothing sparse to restore
	}
	return &holeSnapshot{t: st, holes: hs}, ""
}

// restore punches what the run allocated in former holes and says what it
// did. The target must be flushed first so that the allocation map is
// current.
func (s *holeSnapshot) restore() (string, error) {
	if f, ok := s.t.(interface{ Flush() error }); ok {
		if err := f.Flush(); err != nil {
			return "", err
		}
	}
	after, ok, err := s.t.Holes()
	if err != nil || !ok {
		if err == nil {
			err = io.ErrUnexpectedEOF
		}
		return "", fmt.Errorf("reading the allocation map after the run: %w", err)
	}
	var total int64
	for _, r := range subtract(s.holes, after) {
		if err := s.t.Punch(r.Off, r.Len); err != nil {
			return "", fmt.Errorf("punching [%d,+%d): %w", r.Off, r.Len, err)
		}
		total += r.Len
	}
	if total == 0 {
		return "", nil
	}
	return fmt.Sprintf("holes restored: deallocated %s the run allocated in formerly unallocated ranges (--keep keeps them)", volume.HumanSize(total)), nil
}
