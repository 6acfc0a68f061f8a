package volume

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"

	"github.com/vmsan/vmsan/internal/sparse"
	"github.com/vmsan/vmsan/internal/vfs"
)

// Images.
//
// An Image is the data of a volume or a snapshot as the store keeps it,
// read through the store's knowledge of the layout rather than by opening
// volumes/NAME.raw behind its back: export, incremental export, snapshot
// and clone read Images. Every image today is a sparse raw file
// (fileImage: SEEK_DATA/SEEK_HOLE for its data regions, FIEMAP for its
// extents, st_blocks for its allocation); a store with another layout
// (a log tier, another backend) gives Images of its own, and its readers
// do not change.
//
// The I/O engine's data path is not an Image reader: it opens the file
// through the backend (volrt), which owns caching, O_DIRECT and resizes.

// Image is a read-only view of a volume's or snapshot's data.
//
// Concurrency: ReadAt is safe for concurrent use; the rest may be called
// from one goroutine at a time.
type Image interface {
	io.ReaderAt
	io.Closer
	// Path is the file holding the image, for tools that need one
	// (qemu-img); "" when the image is not a plain file.
	Path() string
	// Size is the image's size in bytes (the file's, which CheckRaw
	// keeps equal to the metadata's for a servable volume).
	Size() int64
	// Data returns the next data region at or after off (see
	// sparse.DataFunc); an image without hole information reports all
	// of itself as data.
	Data(off int64) (start, end int64, ok bool, err error)
	// Extents returns the physical extent map (see sparse.Extents), or
	// an error when the image or filesystem has none (callers then treat
	// nothing as shared).
	Extents() ([]sparse.Extent, error)
	// Allocated is how many bytes of storage the image uses (thin
	// volumes: less than Size).
	Allocated() (int64, error)
}

// SameBlocks reports whether the images a and b (with their extent maps
// ae and be, from Extents) share the physical blocks of [off, off+n):
// reflinks of the same data neither side has written since. Equal
// without reading. Nil maps share nothing.
func SameBlocks(ae, be []sparse.Extent, off, n int64) bool {
	return sparse.SameBlocks(ae, be, off, n)
}

// OpenImageFile opens the image stored in the raw file path read-only,
// for commands that got the path from a daemon's volume or snapshot info
// (the store is locked by the daemon, so they cannot open it).
func OpenImageFile(path string) (Image, error) { return openFileImage(vfs.OS, path) }

// RawFile is the raw file of volume name in data directory dataDir,
// for readers of a data directory without the store (doctor). REQUIRES:
// name is a volume name found in the directory.
func RawFile(dataDir, name string) string {
	return filepath.Join(dataDir, VolumesDir, name+rawExt)
}

// OpenImage opens the image of ref, "VOL" or "VOL@SNAP", read-only. A
// volume must be servable (CheckRaw); the image's size is its metadata's.
// Readers of a live volume see its bytes as they are on disk: quiescing
// around the read is the caller's (see "Snapshots and clones").
func (s *Store) OpenImage(ref string) (Image, error) {
	vol, snap, isSnap, err := SplitRef(ref)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var p string
	var size int64
	if isSnap {
		sm, err := s.getSnapshot(vol, snap)
		if err != nil {
			return nil, err
		}
		p, size = s.SnapshotPath(vol, snap), sm.Size
	} else {
		m, err := s.get(vol)
		if err != nil {
			return nil, err
		}
		if err := s.checkRaw(m); err != nil {
			return nil, err
		}
		p, size = s.RawPath(vol), m.Size
	}
	img, err := openFileImage(s.fs, p)
	if err != nil {
		return nil, err
	}
	if img.Size() != size {
		img.Close()
		return nil, fmt.Errorf("%w: %s is %d bytes, the metadata says %d", ErrDamaged, p, img.Size(), size)
	}
	return img, nil
}

// fileImage is an Image kept in a sparse raw file.
type fileImage struct {
	f    vfs.File
	path string
	size int64
	data sparse.DataFunc
}

func openFileImage(fsys vfs.FS, p string) (*fileImage, error) {
	f, err := vfs.Open(fsys, p)
	if err != nil {
		return nil, err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	if !st.Mode().IsRegular() {
		f.Close()
		return nil, fmt.Errorf("%s is not a regular file", p)
	}
	img := &fileImage{f: f, path: p, size: st.Size()}
	if of, ok := vfs.OSFile(f); ok {
		img.data = sparse.FileData(of)
	} else {
		size := img.size
		img.data = func(off int64) (int64, int64, bool, error) { return off, size, off < size, nil }
	}
	return img, nil
}

func (i *fileImage) ReadAt(b []byte, off int64) (int, error) { return i.f.ReadAt(b, off) }
func (i *fileImage) Close() error                            { return i.f.Close() }
func (i *fileImage) Path() string                            { return i.path }
func (i *fileImage) Size() int64                             { return i.size }

func (i *fileImage) Data(off int64) (int64, int64, bool, error) { return i.data(off) }

// errNoExtents: the image's file is not a real file (crash tests' MemFS).
var errNoExtents = errors.New("volume: image has no extent map")

func (i *fileImage) Extents() ([]sparse.Extent, error) {
	of, ok := vfs.OSFile(i.f)
	if !ok {
		return nil, errNoExtents
	}
	return sparse.Extents(of)
}

func (i *fileImage) Allocated() (int64, error) {
	st, err := i.f.Stat()
	if err != nil {
		return 0, err
	}
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		return sys.Blocks * 512, nil
	}
	return st.Size(), nil
}

// osFile is the *os.File behind the image, for reflink (nil: none).
func (i *fileImage) osFile() *os.File {
	of, _ := vfs.OSFile(i.f)
	return of
}
