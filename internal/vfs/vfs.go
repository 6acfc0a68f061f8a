// Package vfs is the filesystem seam of metadata I/O: the volume store and
// atomicfile do their file operations through an FS, so that a test can
// run them on an in-memory filesystem that simulates a crash (NewMem,
// MemFS.CrashClone) or that fails chosen operations (Inject).
//
// Simplest use:
//
//	fsys := vfs.OS                      // production: the real filesystem
//	f, err := fsys.OpenFile(p, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
//	...
//	err = f.Sync()                      // the data is durable
//	err = fsys.SyncDir(filepath.Dir(p)) // and so is the name
//
// The durability contract every FS follows (and the one MemFS enforces):
// after a crash, a file's contents are those of its last Sync, and a
// directory's entries (creations, renames, removals in it) are those of
// its last SyncDir. Nothing else is promised. Code that is correct on
// MemFS's crash images is correct on any filesystem that keeps POSIX's
// fsync promises.
//
// What does not go through the seam: the I/O engine's data path (the
// backend opens raw files itself) and the few inode-level operations with
// no portable meaning (reflink, extents, xattrs, inode generations): code
// that needs them asks for the *os.File behind a File (OSFile) and falls
// back to something portable when there is none.
package vfs

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

// File is an open file. *os.File implements it.
type File interface {
	io.Reader
	io.Writer
	io.ReaderAt
	io.WriterAt
	io.Closer
	Name() string
	Stat() (fs.FileInfo, error)
	// Sync makes the file's contents and size durable (fsync).
	Sync() error
	Truncate(size int64) error
	Chmod(mode fs.FileMode) error
}

// FS is the set of filesystem operations the store's metadata code uses.
// Paths are OS paths (absolute or relative to the working directory).
type FS interface {
	OpenFile(name string, flag int, perm fs.FileMode) (File, error)
	Rename(oldpath, newpath string) error
	Remove(name string) error
	RemoveAll(name string) error
	// MkdirAll creates dir and missing parents. The new entries are
	// durable only after SyncDir of their parents (see MkdirAllSync).
	MkdirAll(dir string, perm fs.FileMode) error
	Stat(name string) (fs.FileInfo, error)
	Lstat(name string) (fs.FileInfo, error)
	ReadDir(name string) ([]fs.DirEntry, error)
	Chmod(name string, mode fs.FileMode) error
	// SyncDir makes the entries of directory dir durable.
	SyncDir(dir string) error
	// Lock takes an exclusive, non-blocking lock on path (a directory or
	// a file): an error wrapping ErrLocked when someone holds it. The lock
	// is gone when the returned Closer is closed or the process dies.
	Lock(path string) (io.Closer, error)
}

// ErrLocked: Lock found the path locked by someone else.
var ErrLocked = errors.New("vfs: locked by another process")

// OS is the real filesystem.
var OS FS = osFS{}

// OSFile returns the *os.File behind f, for inode-level operations the
// seam does not model (reflink, SEEK_DATA, xattrs); ok=false for a file of
// another FS.
func OSFile(f File) (*os.File, bool) {
	for {
		switch v := f.(type) {
		case *os.File:
			return v, true
		case interface{ Unwrap() File }:
			f = v.Unwrap()
		default:
			return nil, false
		}
	}
}

// InoOf returns the inode number of a file of an FS without *os.File
// (MemFS), looking through wrappers; ok=false when there is none.
func InoOf(f File) (uint64, bool) {
	for {
		switch v := f.(type) {
		case Inoder:
			return v.Ino(), true
		case interface{ Unwrap() File }:
			f = v.Unwrap()
		default:
			return 0, false
		}
	}
}

// Open opens name read-only.
func Open(fsys FS, name string) (File, error) { return fsys.OpenFile(name, os.O_RDONLY, 0) }

// ReadFile reads the whole file name.
func ReadFile(fsys FS, name string) ([]byte, error) {
	f, err := Open(fsys, name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(f)
}

// Truncate changes the size of file name (not durable until the file is
// synced: see TruncateSync).
func Truncate(fsys FS, name string, size int64) error {
	f, err := fsys.OpenFile(name, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	err = f.Truncate(size)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// TruncateSync changes the size of file name and makes it durable.
func TruncateSync(fsys FS, name string, size int64) error {
	f, err := fsys.OpenFile(name, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	err = f.Truncate(size)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

var tempSeq atomic.Uint64

// CreateTemp creates a new file in dir whose name is pattern with its last
// "*" replaced by a random string (os.CreateTemp's convention), 0600.
func CreateTemp(fsys FS, dir, pattern string) (File, error) {
	prefix, suffix := pattern, ""
	if i := strings.LastIndex(pattern, "*"); i >= 0 {
		prefix, suffix = pattern[:i], pattern[i+1:]
	}
	for try := 0; try < 100; try++ {
		r := strconv.FormatUint(uint64(time.Now().UnixNano())^tempSeq.Add(0x9e3779b97f4a7c15), 36)
		f, err := fsys.OpenFile(filepath.Join(dir, prefix+r+suffix), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
		if errors.Is(err, fs.ErrExist) {
			continue
		}
		return f, err
	}
	return nil, fmt.Errorf("vfs: create temporary file in %s: too many collisions", dir)
}

// MkdirAllSync is MkdirAll that also makes every directory it created
// durable (SyncDir of each new directory's parent).
func MkdirAllSync(fsys FS, dir string, perm fs.FileMode) error {
	dir = filepath.Clean(dir)
	var missing []string
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := fsys.Stat(d); err == nil {
			break
		}
		missing = append(missing, d)
		if filepath.Dir(d) == d {
			break
		}
	}
	if len(missing) == 0 {
		return nil
	}
	if err := fsys.MkdirAll(dir, perm); err != nil {
		return err
	}
	// Parents first, so each synced entry's parent is already durable.
	for i := len(missing) - 1; i >= 0; i-- {
		if err := fsys.SyncDir(filepath.Dir(missing[i])); err != nil {
			return err
		}
	}
	return nil
}

// WalkDir is filepath.WalkDir over fsys (lexical order, fn sees errors
// of ReadDir as filepath.WalkDir does; fs.SkipDir skips a directory).
func WalkDir(fsys FS, root string, fn fs.WalkDirFunc) error {
	st, err := fsys.Lstat(root)
	if err != nil {
		err = fn(root, nil, err)
	} else {
		err = walk(fsys, root, fs.FileInfoToDirEntry(st), fn)
	}
	if err == fs.SkipDir || err == fs.SkipAll {
		return nil
	}
	return err
}

func walk(fsys FS, p string, d fs.DirEntry, fn fs.WalkDirFunc) error {
	if err := fn(p, d, nil); err != nil || !d.IsDir() {
		if err == fs.SkipDir && d.IsDir() {
			err = nil
		}
		return err
	}
	ents, err := fsys.ReadDir(p)
	if err != nil {
		if err = fn(p, d, err); err != nil {
			if err == fs.SkipDir {
				err = nil
			}
			return err
		}
	}
	for _, e := range ents {
		if err := walk(fsys, filepath.Join(p, e.Name()), e, fn); err != nil {
			if err == fs.SkipDir {
				break
			}
			return err
		}
	}
	return nil
}

type osFS struct{}

func (osFS) OpenFile(name string, flag int, perm fs.FileMode) (File, error) {
	f, err := os.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err // not a typed nil in an interface
	}
	return f, nil
}
func (osFS) Rename(o, n string) error                    { return os.Rename(o, n) }
func (osFS) Remove(name string) error                    { return os.Remove(name) }
func (osFS) RemoveAll(name string) error                 { return os.RemoveAll(name) }
func (osFS) MkdirAll(dir string, perm fs.FileMode) error { return os.MkdirAll(dir, perm) }
func (osFS) Stat(name string) (fs.FileInfo, error)       { return os.Stat(name) }
func (osFS) Lstat(name string) (fs.FileInfo, error)      { return os.Lstat(name) }
func (osFS) ReadDir(name string) ([]fs.DirEntry, error)  { return os.ReadDir(name) }
func (osFS) Chmod(name string, mode fs.FileMode) error   { return os.Chmod(name, mode) }

func (osFS) SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// Lock is flock(LOCK_EX|LOCK_NB): the kernel drops it when the process
// dies, and it cannot be unlinked away.
func (osFS) Lock(path string) (io.Closer, error) {
	f, err := os.OpenFile(path, os.O_RDONLY, 0)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w: %s", ErrLocked, path)
		}
		return nil, err
	}
	return f, nil
}
