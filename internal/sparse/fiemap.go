package sparse

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"sort"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Extent is one mapping of a file's bytes to its filesystem's blocks, as
// the FS_IOC_FIEMAP ioctl reports it.
type Extent struct {
	Logical, Physical, Length int64
	Flags                     uint32
}

// FIEMAP extent flags this package looks at.
const (
	ExtentLast   = 0x1
	ExtentShared = 0x2000 // the blocks are shared with another file (reflink)
)

// plainFlags are the flags under which Physical is a real, comparable
// block address: anything else (unknown or delayed allocation, encoded or
// inline data, unaligned tails) makes an extent "not comparable".
const plainFlags = ExtentLast | ExtentShared

// MaxExtents bounds Extents' memory: a file fragmented further is
// reported as ErrTooFragmented (callers then fall back to reading).
const MaxExtents = 1 << 20

// ErrTooFragmented: the file has more than MaxExtents extents.
var ErrTooFragmented = errors.New("sparse: file has too many extents to map")

const (
	fsIocFiemap  = 0xC020660B // _IOWR('f', 11, struct fiemap)
	fiemapSync   = 0x1        // flush dirty data first, so addresses are real
	fiemapHeader = 32
	fiemapExtent = 56
	fiemapBatch  = 512
)

// Extents returns f's extents in logical order. A filesystem without
// FIEMAP returns an error (callers fall back to reading).
func Extents(f *os.File) ([]Extent, error) {
	var out []Extent
	buf := make([]byte, fiemapHeader+fiemapExtent*fiemapBatch)
	start := uint64(0)
	for {
		clear(buf)
		binary.NativeEndian.PutUint64(buf[0:], start)
		binary.NativeEndian.PutUint64(buf[8:], ^uint64(0)-start)
		binary.NativeEndian.PutUint32(buf[16:], fiemapSync)
		binary.NativeEndian.PutUint32(buf[24:], fiemapBatch)
		if _, _, e := unix.Syscall(unix.SYS_IOCTL, f.Fd(), fsIocFiemap, uintptr(unsafe.Pointer(&buf[0]))); e != 0 {
			return nil, fmt.Errorf("FIEMAP %s: %w", f.Name(), e)
		}
		n := int(binary.NativeEndian.Uint32(buf[20:]))
		if n == 0 || n > fiemapBatch {
			return out, nil
		}
		last := false
		for i := range n {
			e := buf[fiemapHeader+i*fiemapExtent:]
			x := Extent{
				Logical:  int64(binary.NativeEndian.Uint64(e[0:])),
				Physical: int64(binary.NativeEndian.Uint64(e[8:])),
				Length:   int64(binary.NativeEndian.Uint64(e[16:])),
				Flags:    binary.NativeEndian.Uint32(e[40:]),
			}
			if x.Length <= 0 || x.Logical < 0 || uint64(x.Logical) < start {
				return nil, fmt.Errorf("FIEMAP %s: bad extent %+v", f.Name(), x)
			}
			out = append(out, x)
			last = last || x.Flags&ExtentLast != 0
			start = uint64(x.Logical + x.Length)
		}
		if len(out) > MaxExtents {
			return nil, ErrTooFragmented
		}
		if last {
			return out, nil
		}
	}
}

// SameBlocks reports whether every byte of [off, off+n) is mapped, in
// both extent lists, to the same block address: the two files share
// those blocks (a reflink neither has written since), so their contents
// there are equal without reading them. Holes and extents whose address
// is not comparable (see plainFlags) give false.
func SameBlocks(a, b []Extent, off, n int64) bool {
	for end := off + n; off < end; {
		ea, ok1 := find(a, off)
		eb, ok2 := find(b, off)
		if !ok1 || !ok2 || ea.Flags&^plainFlags != 0 || eb.Flags&^plainFlags != 0 {
			return false
		}
		if ea.Physical+(off-ea.Logical) != eb.Physical+(off-eb.Logical) {
			return false
		}
		// INVARIANT: progress: both extents contain off, so the step is > 0.
		off = min(end, ea.Logical+ea.Length, eb.Logical+eb.Length)
	}
	return true
}

// find returns the extent of es (sorted by Logical) containing off.
func find(es []Extent, off int64) (Extent, bool) {
	i := sort.Search(len(es), func(i int) bool { return es[i].Logical+es[i].Length > off })
	if i == len(es) || es[i].Logical > off {
		return Extent{}, false
	}
	return es[i], true
}
