package vfs

import (
	"errors"
	"io"
	"io/fs"
	"os"
	"sync"
)

// OpKind names an operation of the seam, for Inject.
type OpKind string

// Operations Inject reports. The mutating ones (Mutates) are the crash
// points of a crash test: the state of the filesystem can only change
// there.
const (
	OpOpen      OpKind = "open"   // OpenFile without O_CREATE or O_TRUNC
	OpCreate    OpKind = "create" // OpenFile with O_CREATE or O_TRUNC
	OpRead      OpKind = "read"
	OpWrite     OpKind = "write"
	OpSync      OpKind = "sync"
	OpTruncate  OpKind = "truncate"
	OpChmod     OpKind = "chmod"
	OpClose     OpKind = "close"
	OpRename    OpKind = "rename"
	OpRemove    OpKind = "remove"
	OpRemoveAll OpKind = "removeall"
	OpMkdir     OpKind = "mkdir"
	OpStat      OpKind = "stat"
	OpReadDir   OpKind = "readdir"
	OpSyncDir   OpKind = "syncdir"
	OpLock      OpKind = "lock"
)

// Mutates reports whether an operation of kind k can change what a crash
// leaves behind.
func (k OpKind) Mutates() bool {
	switch k {
	case OpCreate, OpWrite, OpSync, OpTruncate, OpChmod, OpRename, OpRemove, OpRemoveAll, OpMkdir, OpSyncDir:
		return true
	}
	return false
}

// Op is one operation about to run.
type Op struct {
	Kind OpKind
	Path string // the file's name; for a rename, the old path
	New  string // a rename's new path
}

func (o Op) String() string {
	if o.New != "" {
		return string(o.Kind) + " " + o.Path + " -> " + o.New
	}
	return string(o.Kind) + " " + o.Path
}

// ErrInjected is the error FailNth injects.
var ErrInjected = errors.New("vfs: injected error")

// Inject wraps fsys so that before every operation fn is called with it:
// a non-nil error is returned by the operation instead of running it. fn
// may also just observe (count crash points, take a CrashClone).
// REQUIRES: fn is safe for concurrent use if fsys is used concurrently.
func Inject(fsys FS, fn func(Op) error) FS { return &injectFS{fs: fsys, fn: fn} }

// FailNth returns an Inject function failing the nth (from 1) operation
// of kind with an error wrapping ErrInjected, and only that one.
func FailNth(kind OpKind, n int) func(Op) error {
	var mu sync.Mutex
	seen := 0
	return func(op Op) error {
		if op.Kind != kind {
			return nil
		}
		mu.Lock()
		defer mu.Unlock()
		seen++
		if seen == n {
			return &fs.PathError{Op: string(op.Kind), Path: op.Path, Err: ErrInjected}
		}
		return nil
	}
}

type injectFS struct {
	fs FS
	fn func(Op) error
}

func (i *injectFS) OpenFile(name string, flag int, perm fs.FileMode) (File, error) {
	k := OpOpen
	if flag&(os.O_CREATE|os.O_TRUNC) != 0 {
		k = OpCreate
	}
	if err := i.fn(Op{Kind: k, Path: name}); err != nil {
		return nil, err
	}
	f, err := i.fs.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return i.wrap(f), nil
}

func (i *injectFS) Rename(o, n string) error {
	if err := i.fn(Op{Kind: OpRename, Path: o, New: n}); err != nil {
		return err
	}
	return i.fs.Rename(o, n)
}

func (i *injectFS) do(k OpKind, p string, f func() error) error {
	if err := i.fn(Op{Kind: k, Path: p}); err != nil {
		return err
	}
	return f()
}

func (i *injectFS) Remove(p string) error {
	return i.do(OpRemove, p, func() error { return i.fs.Remove(p) })
}
func (i *injectFS) RemoveAll(p string) error {
	return i.do(OpRemoveAll, p, func() error { return i.fs.RemoveAll(p) })
}
func (i *injectFS) MkdirAll(p string, perm fs.FileMode) error {
	return i.do(OpMkdir, p, func() error { return i.fs.MkdirAll(p, perm) })
}
func (i *injectFS) Chmod(p string, mode fs.FileMode) error {
	return i.do(OpChmod, p, func() error { return i.fs.Chmod(p, mode) })
}
func (i *injectFS) SyncDir(p string) error {
	return i.do(OpSyncDir, p, func() error { return i.fs.SyncDir(p) })
}

func (i *injectFS) Stat(p string) (fs.FileInfo, error) {
	if err := i.fn(Op{Kind: OpStat, Path: p}); err != nil {
		return nil, err
	}
	return i.fs.Stat(p)
}

func (i *injectFS) Lstat(p string) (fs.FileInfo, error) {
	if err := i.fn(Op{Kind: OpStat, Path: p}); err != nil {
		return nil, err
	}
	return i.fs.Lstat(p)
}

func (i *injectFS) ReadDir(p string) ([]fs.DirEntry, error) {
	if err := i.fn(Op{Kind: OpReadDir, Path: p}); err != nil {
		return nil, err
	}
	return i.fs.ReadDir(p)
}

func (i *injectFS) Lock(p string) (io.Closer, error) {
	if err := i.fn(Op{Kind: OpLock, Path: p}); err != nil {
		return nil, err
	}
	return i.fs.Lock(p)
}

type injectFile struct {
	f  File
	fn func(Op) error
}

// Unwrap returns the wrapped File (OSFile looks through it).
func (f *injectFile) Unwrap() File { return f.f }

func (f *injectFile) Name() string { return f.f.Name() }

func (f *injectFile) Read(b []byte) (int, error) {
	if err := f.fn(Op{Kind: OpRead, Path: f.f.Name()}); err != nil {
		return 0, err
	}
	return f.f.Read(b)
}

func (f *injectFile) ReadAt(b []byte, off int64) (int, error) {
	if err := f.fn(Op{Kind: OpRead, Path: f.f.Name()}); err != nil {
		return 0, err
	}
	return f.f.ReadAt(b, off)
}

func (f *injectFile) Write(b []byte) (int, error) {
	if err := f.fn(Op{Kind: OpWrite, Path: f.f.Name()}); err != nil {
		return 0, err
	}
	return f.f.Write(b)
}

func (f *injectFile) WriteAt(b []byte, off int64) (int, error) {
	if err := f.fn(Op{Kind: OpWrite, Path: f.f.Name()}); err != nil {
		return 0, err
	}
	return f.f.WriteAt(b, off)
}

func (f *injectFile) Stat() (fs.FileInfo, error) {
	if err := f.fn(Op{Kind: OpStat, Path: f.f.Name()}); err != nil {
		return nil, err
	}
	return f.f.Stat()
}

func (f *injectFile) Sync() error {
	if err := f.fn(Op{Kind: OpSync, Path: f.f.Name()}); err != nil {
		return err
	}
	return f.f.Sync()
}

func (f *injectFile) Truncate(size int64) error {
	if err := f.fn(Op{Kind: OpTruncate, Path: f.f.Name()}); err != nil {
		return err
	}
	return f.f.Truncate(size)
}

func (f *injectFile) Chmod(mode fs.FileMode) error {
	if err := f.fn(Op{Kind: OpChmod, Path: f.f.Name()}); err != nil {
		return err
	}
	return f.f.Chmod(mode)
}

// Close always closes the wrapped file (an injected error is returned
// after it), so an injected failure leaks nothing.
func (f *injectFile) Close() error {
	err := f.fn(Op{Kind: OpClose, Path: f.f.Name()})
	if cerr := f.f.Close(); err == nil {
		err = cerr
	}
	return err
}

func (i *injectFS) wrap(f File) File { return &injectFile{f: f, fn: i.fn} }
