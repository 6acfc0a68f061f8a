package backend

import (
	"errors"
	"fmt"
	"io"
	"math/bits"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/vmsan/vmsan/internal/alignbuf"
)

// iovMax is the kernel's IOV_MAX: a vectored call with more buffers is split.
const iovMax = 1024

// ErrOutOfRange is returned for an access that goes past Size.
var ErrOutOfRange = fmt.Errorf("backend: access beyond end of device: %w", unix.EINVAL)

// ErrReadOnly is returned by modifying calls on a read-only backend.
var ErrReadOnly = fmt.Errorf("backend: read-only: %w", unix.EROFS)

// ErrDirectUnsupported is returned by OpenFile for CacheNone when the
// filesystem refuses O_DIRECT (e.g. tmpfs on older kernels, some FUSE).
var ErrDirectUnsupported = errors.New("backend: filesystem does not support O_DIRECT (cache=none); use cache=writeback or move the volume to a disk filesystem")

// File is a Backend storing a volume as a sparse raw file.
//
// The simplest use:
//
//	if err := backend.CreateFile(path, 10<<30); err != nil { ... }
//	f, err := backend.OpenFile(path, backend.CacheWriteback, false)
//	defer f.Close()
//	err = f.WritevAt([][]byte{buf}, 0, false)
//
// Concurrency: all methods except Close are safe for concurrent use; the
// caller orders overlapping operations. Reads and writes are vectored
// (preadv/pwritev), so one merged request from the I/O engine is one
// syscall.
type File struct {
	fd       int
	path     string
	mode     CacheMode
	readOnly bool
	direct   bool
	// offAlign is the offset/length alignment O_DIRECT needs (1 otherwise);
	// memAlign the buffer address alignment.
	offAlign int64
	memAlign uintptr
	size     atomic.Int64
	// noPwritev2 is set once pwritev2(RWF_DSYNC) was refused by the kernel,
	// so FUA falls back to pwritev+fdatasync from then on.
	noPwritev2 atomic.Bool
	// rmwMu serialises O_DIRECT read-modify-write of partial blocks (and
	// unaligned fallocate in direct mode): two writes to different bytes of
	// the same block do not overlap, so the engine may run them at once, but
	// each rewrites the whole block.
	rmwMu sync.Mutex
	iovs  sync.Pool // *[]unix.Iovec scratch, avoids an allocation per call
}

// CreateFile creates a new sparse file of size bytes. It fails (wrapping
// EEXIST) if the file exists, so an existing volume is never clobbered.
// The file is fsynced; the caller fsyncs the directory.
func CreateFile(path string, size int64) error {
	if size < 0 {
		return fmt.Errorf("backend: create %s: negative size", path)
	}
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return &os.PathError{Op: "create", Path: path, Err: err}
	}
	defer unix.Close(fd)
	if err := unix.Ftruncate(fd, size); err != nil {
		unix.Unlink(path)
		return &os.PathError{Op: "ftruncate", Path: path, Err: err}
	}
	if err := unix.Fsync(fd); err != nil {
		return &os.PathError{Op: "fsync", Path: path, Err: err}
	}
	return nil
}

// OpenFile opens an existing raw file as a Backend with the given cache mode.
// For CacheNone it returns an error wrapping ErrDirectUnsupported if the
// filesystem refuses O_DIRECT.
func OpenFile(path string, mode CacheMode, readOnly bool) (*File, error) {
	if _, err := ParseCacheMode(string(mode)); err != nil {
		return nil, err
	}
	if mode == "" {
		mode = CacheWriteback
	}
	flags := unix.O_CLOEXEC
	if readOnly {
		flags |= unix.O_RDONLY
	} else {
		flags |= unix.O_RDWR
	}
	switch mode {
	case CacheNone:
		flags |= unix.O_DIRECT
	case CacheWritethrough:
		flags |= unix.O_DSYNC
	}
	fd, err := unix.Open(path, flags, 0)
	if err != nil {
		if mode == CacheNone && errors.Is(err, unix.EINVAL) {
			return nil, fmt.Errorf("open %s: %w (%v)", path, ErrDirectUnsupported, err)
		}
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	f := &File{fd: fd, path: path, mode: mode, readOnly: readOnly, offAlign: 1, memAlign: 1}
	f.iovs.New = func() any { s := make([]unix.Iovec, 0, 64); return &s }
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, &os.PathError{Op: "fstat", Path: path, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		unix.Close(fd)
		return nil, fmt.Errorf("backend: %s is not a regular file", path)
	}
	f.size.Store(st.Size)
	if mode == CacheNone {
		if err := f.setupDirect(); err != nil {
			unix.Close(fd)
			return nil, err
		}
	}
	return f, nil
}

// setupDirect finds the O_DIRECT alignment and proves with one read that the
// filesystem really accepts O_DIRECT I/O (some accept the open flag but fail
// every I/O with EINVAL).
func (f *File) setupDirect() error {
	f.direct = true
	f.offAlign, f.memAlign = 4096, 4096 // safe default when statx cannot tell
	var sx unix.Statx_t
	if err := unix.Statx(f.fd, "", unix.AT_EMPTY_PATH, unix.STATX_DIOALIGN, &sx); err == nil && sx.Mask&unix.STATX_DIOALIGN != 0 {
		if sx.Dio_offset_align == 0 {
			return fmt.Errorf("open %s: %w", f.path, ErrDirectUnsupported)
		}
		f.offAlign = int64(sx.Dio_offset_align)
		f.memAlign = uintptr(sx.Dio_mem_align)
		if f.memAlign == 0 {
			f.memAlign = 1
		}
	}
	if f.size.Load() >= f.offAlign {
		buf := alignedBuf(int(f.offAlign), f.memAlign)
		if _, err := unix.Pread(f.fd, buf, 0); err != nil {
			if errors.Is(err, unix.EINVAL) {
				return fmt.Errorf("open %s: %w (probe read: %v)", f.path, ErrDirectUnsupported, err)
			}
			return &os.PathError{Op: "pread", Path: f.path, Err: err}
		}
	}
	return nil
}

// Path returns the file name.
func (f *File) Path() string { return f.path }

// Mode returns the cache mode.
func (f *File) Mode() CacheMode { return f.mode }

// Alignment is the offset/length granularity at which I/O needs no
// read-modify-write: the O_DIRECT block size for CacheNone, 1 otherwise.
// Front ends can advertise it as the preferred/minimum block size.
func (f *File) Alignment() int64 { return f.offAlign }

// Size returns the current size in bytes.
func (f *File) Size() int64 { return f.size.Load() }

func (f *File) check(off, length int64) error {
	if off < 0 || length < 0 || off > f.size.Load()-length {
		return ErrOutOfRange
	}
	return nil
}

func totalLen(bufs [][]byte) int64 {
	var n int64
	for _, b := range bufs {
		n += int64(len(b))
	}
	return n
}

// ReadvAt implements Backend.
func (f *File) ReadvAt(bufs [][]byte, off int64) error {
	n := totalLen(bufs)
	if err := f.check(off, n); err != nil {
		return err
	}
	if n == 0 {
		return nil
	}
	if f.direct && !f.aligned(bufs, off, n) {
		return f.bounceRead(bufs, off, n)
	}
	got, err := f.rawv(unix.SYS_PREADV, bufs, off, 0)
	if err != nil {
		return &os.PathError{Op: "preadv", Path: f.path, Err: err}
	}
	if got < n {
		// INVARIANT: the file is exactly Size bytes long, so a short read
		// means the file was truncated behind our back.
		return &os.PathError{Op: "preadv", Path: f.path, Err: io.ErrUnexpectedEOF}
	}
	return nil
}

// WritevAt implements Backend.
func (f *File) WritevAt(bufs [][]byte, off int64, fua bool) error {
	if f.readOnly {
		return ErrReadOnly
	}
	n := totalLen(bufs)
	if err := f.check(off, n); err != nil {
		return err
	}
	if n == 0 {
		return nil
	}
	// FUA needs work only where a returned write may still sit in a volatile
	// cache: the page cache (writeback) or the device cache (none).
	fua = fua && (f.mode == CacheWriteback || f.mode == CacheNone)
	if f.direct && !f.aligned(bufs, off, n) {
		return f.bounceWrite(bufs, off, n, fua)
	}
	return f.writev(bufs, off, n, fua)
}

func (f *File) writev(bufs [][]byte, off, n int64, fua bool) error {
	if fua && !f.noPwritev2.Load() {
		got, err := f.rawv(unix.SYS_PWRITEV2, bufs, off, unix.RWF_DSYNC)
		if err == nil {
			return shortWrite(f.path, got, n)
		}
		if !errors.Is(err, unix.ENOSYS) && !errors.Is(err, unix.EOPNOTSUPP) {
			return &os.PathError{Op: "pwritev2", Path: f.path, Err: err}
		}
		// Old kernel: fall back to pwritev + fdatasync.
		f.noPwritev2.Store(true)
	}
	got, err := f.rawv(unix.SYS_PWRITEV, bufs, off, 0)
	if err != nil {
		return &os.PathError{Op: "pwritev", Path: f.path, Err: err}
	}
	if err := shortWrite(f.path, got, n); err != nil {
		return err
	}
	if fua {
		if err := unix.Fdatasync(f.fd); err != nil {
			return &os.PathError{Op: "fdatasync", Path: f.path, Err: err}
		}
	}
	return nil
}

func shortWrite(path string, got, want int64) error {
	if got < want {
		return &os.PathError{Op: "pwritev", Path: path, Err: io.ErrShortWrite}
	}
	return nil
}

// rawv runs preadv/pwritev/pwritev2 over bufs, looping on short transfers and
// splitting at IOV_MAX. It returns the bytes transferred; it stops early only
// at EOF (a read returning 0) or on error. The iovec array comes from a pool
// so a call does not allocate.
func (f *File) rawv(trap uintptr, bufs [][]byte, off int64, flags int) (int64, error) {
	sp := f.iovs.Get().(*[]unix.Iovec)
	iov := (*sp)[:0]
	for _, b := range bufs {
		if len(b) == 0 {
			continue
		}
		iov = append(iov, unix.Iovec{Base: &b[0]})
		iov[len(iov)-1].SetLen(len(b))
	}
	var done int64
	var err error
	i := 0
	for i < len(iov) {
		cnt := len(iov) - i
		if cnt > iovMax {
			cnt = iovMax
		}
		lo := uintptr(off + done)
		hi := uintptr(uint64(off+done) >> (bits.UintSize - 1) >> 1)
		r, _, e := unix.Syscall6(trap, uintptr(f.fd), uintptr(unsafe.Pointer(&iov[i])), uintptr(cnt), lo, hi, uintptr(flags))
		if e == unix.EINTR {
			continue
		}
		if e != 0 {
			err = e
			break
		}
		if r == 0 {
			break // EOF on read; a write of 0 bytes with data left is reported as short
		}
		done += int64(r)
		// Advance past what was transferred, trimming a partial iovec in place
		// (iov is our private copy).
		left := uint64(r)
		for i < len(iov) && left >= iov[i].Len {
			left -= iov[i].Len
			i++
		}
		if left > 0 {
			iov[i].Base = (*byte)(unsafe.Add(unsafe.Pointer(iov[i].Base), left))
			iov[i].Len -= left
		}
	}
	runtime.KeepAlive(bufs)
	for j := range iov {
		iov[j] = unix.Iovec{} // drop references so the pool does not pin buffers
	}
	*sp = iov[:0]
	f.iovs.Put(sp)
	return done, err
}

// aligned reports whether an O_DIRECT transfer can go straight to the
// kernel: offset, every buffer's address and length aligned.
func (f *File) aligned(bufs [][]byte, off, n int64) bool {
	if off%f.offAlign != 0 || n%f.offAlign != 0 {
		return false
	}
	for _, b := range bufs {
		if len(b) == 0 {
			continue
		}
		if int64(len(b))%f.offAlign != 0 || uintptr(unsafe.Pointer(&b[0]))%f.memAlign != 0 {
			return false
		}
	}
	return true
}

func (f *File) alignOut(off, n int64) (aoff, aend int64) {
	aoff = off - off%f.offAlign
	aend = off + n
	if r := aend % f.offAlign; r != 0 {
		aend += f.offAlign - r
	}
	return aoff, aend
}

func (f *File) bounceRead(bufs [][]byte, off, n int64) error {
	aoff, aend := f.alignOut(off, n)
	bb := getBounce(int(aend-aoff), f.memAlign)
	defer putBounce(bb)
	buf := *bb
	got, err := f.rawv(unix.SYS_PREADV, [][]byte{buf}, aoff, 0)
	if err != nil {
		return &os.PathError{Op: "preadv", Path: f.path, Err: err}
	}
	// A short read here is fine past EOF when Size is not block-aligned.
	clear(buf[got:])
	if got < off-aoff+n {
		return &os.PathError{Op: "preadv", Path: f.path, Err: io.ErrUnexpectedEOF}
	}
	p := buf[off-aoff:]
	for _, b := range bufs {
		p = p[copy(b, p):]
	}
	return nil
}

func (f *File) bounceWrite(bufs [][]byte, off, n int64, fua bool) error {
	aoff, aend := f.alignOut(off, n)
	bb := getBounce(int(aend-aoff), f.memAlign)
	defer putBounce(bb)
	buf := *bb
	partial := aoff != off || aend != off+n
	if partial {
		f.rmwMu.Lock()
		defer f.rmwMu.Unlock()
		// Read only the edge blocks that the new data covers partially.
		if aoff != off {
			if err := f.readBlock(buf[:f.offAlign], aoff); err != nil {
				return err
			}
		}
		if aend != off+n && (aend-f.offAlign != aoff || aoff == off) {
			if err := f.readBlock(buf[int64(len(buf))-f.offAlign:], aend-f.offAlign); err != nil {
				return err
			}
		}
	}
	p := buf[off-aoff:]
	for _, b := range bufs {
		p = p[copy(p, b):]
	}
	if err := f.writev([][]byte{buf}, aoff, aend-aoff, fua); err != nil {
		return err
	}
	if size := f.size.Load(); aend > size {
		// The last block of a file whose size is not block-aligned was
		// written whole: cut the file back to its logical size.
		if err := unix.Ftruncate(f.fd, size); err != nil {
			return &os.PathError{Op: "ftruncate", Path: f.path, Err: err}
		}
	}
	return nil
}

func (f *File) readBlock(b []byte, off int64) error {
	got, err := f.rawv(unix.SYS_PREADV, [][]byte{b}, off, 0)
	if err != nil {
		return &os.PathError{Op: "preadv", Path: f.path, Err: err}
	}
	clear(b[got:]) // past EOF of an unaligned-size file
	return nil
}

// Sync implements Backend: fdatasync except in unsafe mode.
// In writethrough mode data writes are already durable, but fallocate
// (trim, zero) is not covered by O_DSYNC, so Sync still calls fdatasync.
func (f *File) Sync() error {
	if f.mode == CacheUnsafe || f.readOnly {
		return nil
	}
	if err := unix.Fdatasync(f.fd); err != nil {
		return &os.PathError{Op: "fdatasync", Path: f.path, Err: err}
	}
	return nil
}

func (f *File) fallocate(mode uint32, off, length int64) error {
	for {
		err := unix.Fallocate(f.fd, mode, off, length)
		if err != unix.EINTR {
			return err
		}
	}
}

// lockPartial takes rmwMu if a direct-mode fallocate touches a block only
// partly, since it would race with a read-modify-write of that block.
func (f *File) lockPartial(off, length int64) func() {
	if !f.direct || (off%f.offAlign == 0 && length%f.offAlign == 0) {
		return func() {}
	}
	f.rmwMu.Lock()
	return f.rmwMu.Unlock
}

// Trim implements Backend with fallocate(PUNCH_HOLE|KEEP_SIZE); if the
// filesystem cannot punch holes it writes zeroes, since callers rely on a
// trimmed range reading as zeroes.
func (f *File) Trim(off, length int64) error {
	if f.readOnly {
		return ErrReadOnly
	}
	if err := f.check(off, length); err != nil {
		return err
	}
	if length == 0 {
		return nil
	}
	unlock := f.lockPartial(off, length)
	err := f.fallocate(unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, length)
	unlock()
	if err == nil {
		return nil
	}
	if !errors.Is(err, unix.EOPNOTSUPP) {
		return &os.PathError{Op: "fallocate(punch)", Path: f.path, Err: err}
	}
	return f.writeZeroBufs(off, length)
}

// WriteZeroes implements Backend: punch (if mayTrim), else ZERO_RANGE, else
// punch followed by a plain allocate (keeps the range allocated), else, unless
// fast, write zero buffers.
func (f *File) WriteZeroes(off, length int64, mayTrim, fast bool) error {
	if f.readOnly {
		return ErrReadOnly
	}
	if err := f.check(off, length); err != nil {
		return err
	}
	if length == 0 {
		return nil
	}
	unlock := f.lockPartial(off, length)
	if mayTrim {
		if err := f.fallocate(unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, length); err == nil {
			unlock()
			return nil
		} else if !errors.Is(err, unix.EOPNOTSUPP) {
			unlock()
			return &os.PathError{Op: "fallocate(punch)", Path: f.path, Err: err}
		}
	}
	err := f.fallocate(unix.FALLOC_FL_ZERO_RANGE|unix.FALLOC_FL_KEEP_SIZE, off, length)
	if err != nil && errors.Is(err, unix.EOPNOTSUPP) {
		// e.g. filesystems without ZERO_RANGE: punch, then allocate again.
		if err = f.fallocate(unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, length); err == nil {
			err = f.fallocate(unix.FALLOC_FL_KEEP_SIZE, off, length)
			if errors.Is(err, unix.EOPNOTSUPP) {
				err = nil // zeroed, only left unallocated: acceptable
			}
		}
	}
	unlock()
	if err == nil {
		return nil
	}
	if !errors.Is(err, unix.EOPNOTSUPP) {
		return &os.PathError{Op: "fallocate(zero)", Path: f.path, Err: err}
	}
	if fast {
		return ErrNotFast
	}
	return f.writeZeroBufs(off, length)
}

// zeroChunk is a shared, never-written buffer of zeroes, aligned for
// O_DIRECT, used by the slow zeroing path.
var zeroChunk = alignedBuf(1<<20, 4096)

func (f *File) writeZeroBufs(off, length int64) error {
	for length > 0 {
		n := min(length, int64(len(zeroChunk)))
		if err := f.WritevAt([][]byte{zeroChunk[:n]}, off, false); err != nil {
			return err
		}
		off += n
		length -= n
	}
	return nil
}

// Extents implements Backend with SEEK_DATA/SEEK_HOLE. Holes are reported as
// Hole and Zero; data extents as neither (their content is not inspected).
func (f *File) Extents(off, length int64) ([]Extent, error) {
	if err := f.check(off, length); err != nil {
		return nil, err
	}
	var out []Extent
	add := func(start, end int64, hole bool) {
		if end <= start {
			return
		}
		if k := len(out); k > 0 && out[k-1].Hole == hole && out[k-1].Offset+out[k-1].Length == start {
			out[k-1].Length += end - start
			return
		}
		out = append(out, Extent{Offset: start, Length: end - start, Hole: hole, Zero: hole})
	}
	end := off + length
	pos := off
	for pos < end {
		data, err := unix.Seek(f.fd, pos, unix.SEEK_DATA)
		if err != nil {
			if errors.Is(err, unix.ENXIO) { // no data at or after pos
				add(pos, end, true)
				break
			}
			if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.EOPNOTSUPP) {
				add(pos, end, false) // filesystem cannot tell: all data
				break
			}
			return nil, &os.PathError{Op: "lseek(SEEK_DATA)", Path: f.path, Err: err}
		}
		if data > pos {
			add(pos, min(data, end), true)
			if data >= end {
				break
			}
		}
		hole, err := unix.Seek(f.fd, data, unix.SEEK_HOLE)
		if err != nil {
			if errors.Is(err, unix.ENXIO) { // raced with a shrink
				add(data, end, false)
				break
			}
			return nil, &os.PathError{Op: "lseek(SEEK_HOLE)", Path: f.path, Err: err}
		}
		add(data, min(hole, end), false)
		pos = hole
	}
	return out, nil
}

// Resize implements Backend via ftruncate. Shrinking discards data past the
// new end; growing adds a hole.
func (f *File) Resize(size int64) error {
	if f.readOnly {
		return ErrReadOnly
	}
	if size < 0 {
		return ErrOutOfRange
	}
	if err := unix.Ftruncate(f.fd, size); err != nil {
		return &os.PathError{Op: "ftruncate", Path: f.path, Err: err}
	}
	f.size.Store(size)
	return nil
}

// Close syncs (unless unsafe or read-only) and closes the file.
func (f *File) Close() error {
	if f.fd < 0 {
		return nil
	}
	err := f.Sync()
	if cerr := unix.Close(f.fd); cerr != nil && err == nil {
		err = &os.PathError{Op: "close", Path: f.path, Err: cerr}
	}
	f.fd = -1
	return err
}

// --- aligned bounce buffers -------------------------------------------------

// AlignedBuf returns a zeroed n-byte slice whose first byte's address is a
// multiple of align, as O_DIRECT requires of memory buffers; align <= 1
// means no alignment. It is alignbuf.Aligned, kept here for the bench tool.
func AlignedBuf(n, align int) []byte { return alignbuf.Aligned(n, align) }

// alignedBuf is AlignedBuf with at least page alignment, whatever the
// device reports, so a buffer suits any O_DIRECT file.
func alignedBuf(n int, align uintptr) []byte {
	return AlignedBuf(n, max(int(align), alignbuf.Align))
}

// getBounce returns an aligned bounce buffer from the shared pool
// (alignbuf, the same size classes the front ends' payloads use). A device
// wanting more than page alignment gets an unpooled buffer (putBounce drops
// it: its capacity is no size class).
func getBounce(n int, align uintptr) *[]byte {
	if align > alignbuf.Align {
		b := alignedBuf(n, align)
		return &b
	}
	return alignbuf.Get(n)
}

func putBounce(p *[]byte) { alignbuf.Put(p) }

// Prefetch hints the kernel to read [off, off+length) into the page cache
// (NBD_CMD_CACHE). It is a no-op for cache=none, which bypasses that cache.
func (f *File) Prefetch(off, length int64) error {
	if err := f.check(off, length); err != nil {
		return err
	}
	if f.direct || length == 0 {
		return nil
	}
	if err := unix.Fadvise(f.fd, off, length, unix.FADV_WILLNEED); err != nil {
		return &os.PathError{Op: "fadvise", Path: f.path, Err: err}
	}
	return nil
}
