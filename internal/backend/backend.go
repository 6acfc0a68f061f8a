// Package backend is the storage seam under the I/O engine: a Backend is a
// byte-addressed store of fixed (but resizable) size. The file implementation
// stores a volume as a sparse raw file; test implementations inject faults,
// delays and simulated crashes.
//
// The simplest use:
//
//	err := backend.CreateFile("vol.raw", 10<<30)              // sparse, 10 GiB
//	f, err := backend.OpenFile("vol.raw", backend.CacheWriteback, false)
//	defer f.Close()
//	err = f.WritevAt([][]byte{hdr, payload}, off, false)     // one pwritev
//	err = f.Sync()                                           // fdatasync
//
// NewMem gives an in-memory backend for tests; package backendtest has
// counting, delaying, fault-injecting and crash-simulating wrappers.
//
// Errors from the file implementation wrap the syscall errno (as
// *os.PathError), so callers can map them with errors.Is(err,
// syscall.ENOSPC) and the like; ErrOutOfRange wraps EINVAL and ErrReadOnly
// wraps EROFS.
//
// Concurrency: every method may be called from many goroutines at once,
// except Close, which must not race with anything else. Ordering between
// overlapping operations is the caller's (the I/O engine's) job.
package backend

import (
	"errors"
	"strings"
)

// CacheMode selects how writes reach stable storage, modelled on QEMU's
// -drive cache= option.
type CacheMode string

const (
	// CacheNone opens the file with O_DIRECT (bypassing the host page cache);
	// FLUSH still issues fdatasync so that the device's volatile cache is
	// flushed, exactly as QEMU's cache=none does.
	CacheNone CacheMode = "none"
	// CacheWritethrough opens with O_DSYNC: every write is durable when it
	// returns; FLUSH is a no-op that still orders.
	CacheWritethrough CacheMode = "writethrough"
	// CacheWriteback uses the page cache; FLUSH and FUA call fdatasync.
	CacheWriteback CacheMode = "writeback"
	// CacheUnsafe ignores FLUSH and FUA. For benchmarks and scratch volumes
	// only: an acknowledged FLUSH gives no guarantee at all.
	CacheUnsafe CacheMode = "unsafe"
)

// ParseCacheMode validates a cache mode string and returns its canonical
// (lower-case) form: "WriteBack" and "NONE" are accepted, as QEMU users type
// them either way.
func ParseCacheMode(s string) (CacheMode, error) {
	switch m := CacheMode(strings.ToLower(strings.TrimSpace(s))); m {
	case CacheNone, CacheWritethrough, CacheWriteback, CacheUnsafe:
		return m, nil
	case "":
		return CacheWriteback, nil
	}
	return "", errors.New("backend: unknown cache mode " + `"` + s + `"` + " (want none, writethrough, writeback or unsafe)")
}

// Extent is one run of a block-status answer.
type Extent struct {
	Offset int64
	Length int64
	Hole   bool // not allocated in the backing file
	Zero   bool // reads as zeroes (always true for a hole)
}

// ErrNotFast is returned by WriteZeroes with fast=true when zeroing the range
// cannot be done without writing data (NBD_FLAG_FAST_ZERO semantics).
var ErrNotFast = errors.New("backend: zeroing this range would not be fast")

// Backend is the interface the I/O engine drives.
type Backend interface {
	// ReadvAt fills bufs in order with consecutive bytes starting at off.
	// Reads past Size are an error; the engine never issues them.
	ReadvAt(bufs [][]byte, off int64) error
	// WritevAt writes bufs in order as consecutive bytes starting at off.
	// If fua is set the data is durable (per cache mode) when it returns.
	WritevAt(bufs [][]byte, off int64, fua bool) error
	// Sync makes every write that has returned durable (per cache mode).
	Sync() error
	// Trim deallocates the range (it then reads as zeroes).
	Trim(off, length int64) error
	// WriteZeroes makes the range read as zeroes. If mayTrim the range may be
	// deallocated; otherwise it must stay allocated. If fast is set and this
	// cannot be done cheaply, it returns ErrNotFast without changing data.
	WriteZeroes(off, length int64, mayTrim, fast bool) error
	// Extents describes allocation of [off, off+length) as consecutive
	// extents covering the whole range.
	Extents(off, length int64) ([]Extent, error)
	// Size is the current size in bytes.
	Size() int64
	// Resize changes the size (growing adds a hole).
	Resize(size int64) error
	// Close syncs and releases the backend.
	Close() error
}
