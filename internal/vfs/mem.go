package vfs

import (
	"bytes"
	"errors"
	"io"
	"io/fs"
	"math/rand"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"
)

// MemFS is an in-memory FS that remembers what is durable, for crash
// tests. Every file keeps its current contents and the contents of its
// last Sync; every directory keeps its current entries and those of its
// last SyncDir. CrashClone returns the filesystem a crash would leave.
//
// Paths are slash-separated; a relative path is taken from the root.
// Permissions are recorded, not enforced. A file's mode changes are
// durable at once (they are not what crash tests are about).
//
// Concurrency: safe for concurrent use (one mutex).
type MemFS struct {
	mu      sync.Mutex
	root    *memNode
	nextIno uint64
	locks   map[*memNode]bool
}

type memNode struct {
	ino   uint64
	mode  fs.FileMode // includes fs.ModeDir for directories
	mtime time.Time
	// files
	data, synced []byte
	// directories
	kids, syncedKids map[string]*memNode
}

func (n *memNode) isDir() bool { return n.mode.IsDir() }

// NewMem returns an empty MemFS holding only the root directory (durable).
func NewMem() *MemFS {
	m := &MemFS{locks: map[*memNode]bool{}}
	m.root = m.newDir(0o755)
	return m
}

func (m *MemFS) newDir(perm fs.FileMode) *memNode {
	m.nextIno++
	return &memNode{ino: m.nextIno, mode: fs.ModeDir | perm.Perm(), mtime: time.Now(), kids: map[string]*memNode{}, syncedKids: map[string]*memNode{}}
}

func (m *MemFS) newFile(perm fs.FileMode) *memNode {
	m.nextIno++
	return &memNode{ino: m.nextIno, mode: perm.Perm(), mtime: time.Now()}
}

// CrashClone returns the filesystem a crash would leave now: with rng
// nil, exactly what was made durable (files at their last Sync,
// directories at their last SyncDir; everything else is lost). With rng,
// each file and each directory independently either keeps its current
// state or falls back to its durable one, as a real filesystem may have
// written some unsynced state back before the crash. Locks are not
// carried over (the process holding them died).
func (m *MemFS) CrashClone(rng *rand.Rand) *MemFS {
	m.mu.Lock()
	defer m.mu.Unlock()
	c := &MemFS{locks: map[*memNode]bool{}, nextIno: m.nextIno}
	seen := map[*memNode]*memNode{}
	var clone func(n *memNode) *memNode
	clone = func(n *memNode) *memNode {
		if cn, ok := seen[n]; ok {
			return cn
		}
		keepCurrent := rng != nil && rng.Intn(2) == 0
		cn := &memNode{ino: n.ino, mode: n.mode, mtime: n.mtime}
		seen[n] = cn
		if !n.isDir() {
			src := n.synced
			if keepCurrent {
				src = n.data
			}
			cn.data = bytes.Clone(src)
			cn.synced = bytes.Clone(src)
			return cn
		}
		src := n.syncedKids
		if keepCurrent {
			src = n.kids
		}
		cn.kids, cn.syncedKids = map[string]*memNode{}, map[string]*memNode{}
		for name, k := range src {
			ck := clone(k)
			cn.kids[name], cn.syncedKids[name] = ck, ck
		}
		return cn
	}
	c.root = clone(m.root)
	return c
}

// split cleans p into its components below the root.
func split(p string) []string {
	p = path.Clean("/" + filepath.ToSlash(p))
	if p == "/" {
		return nil
	}
	return strings.Split(p[1:], "/")
}

// lookup returns the node at p. REQUIRES: m.mu held.
func (m *MemFS) lookup(op, p string) (*memNode, error) {
	n := m.root
	for _, c := range split(p) {
		if !n.isDir() {
			return nil, &fs.PathError{Op: op, Path: p, Err: syscall.ENOTDIR}
		}
		k, ok := n.kids[c]
		if !ok {
			return nil, &fs.PathError{Op: op, Path: p, Err: fs.ErrNotExist}
		}
		n = k
	}
	return n, nil
}

// parent returns the directory holding p and p's last component.
// REQUIRES: m.mu held.
func (m *MemFS) parent(op, p string) (*memNode, string, error) {
	cs := split(p)
	if len(cs) == 0 {
		return nil, "", &fs.PathError{Op: op, Path: p, Err: syscall.EINVAL}
	}
	d, err := m.lookup(op, "/"+strings.Join(cs[:len(cs)-1], "/"))
	if err != nil {
		return nil, "", err
	}
	if !d.isDir() {
		return nil, "", &fs.PathError{Op: op, Path: p, Err: syscall.ENOTDIR}
	}
	return d, cs[len(cs)-1], nil
}

// OpenFile implements FS.
func (m *MemFS) OpenFile(name string, flag int, perm fs.FileMode) (File, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	d, base, err := m.parent("open", name)
	if err != nil {
		return nil, err
	}
	n, ok := d.kids[base]
	switch {
	case ok && flag&os.O_CREATE != 0 && flag&os.O_EXCL != 0:
		return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrExist}
	case !ok && flag&os.O_CREATE == 0:
		return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrNotExist}
	case !ok:
		n = m.newFile(perm)
		d.kids[base] = n
		d.mtime = time.Now()
	}
	writable := flag&(os.O_WRONLY|os.O_RDWR) != 0
	if n.isDir() && writable {
		return nil, &fs.PathError{Op: "open", Path: name, Err: syscall.EISDIR}
	}
	if flag&os.O_TRUNC != 0 && writable {
		n.data = nil
	}
	return &memFile{fs: m, n: n, name: name, flag: flag}, nil
}

// Rename implements FS (replacing a file, or an empty directory with a
// directory, like rename(2)).
func (m *MemFS) Rename(oldpath, newpath string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	od, ob, err := m.parent("rename", oldpath)
	if err != nil {
		return err
	}
	n, ok := od.kids[ob]
	if !ok {
		return &os.LinkError{Op: "rename", Old: oldpath, New: newpath, Err: fs.ErrNotExist}
	}
	nd, nb, err := m.parent("rename", newpath)
	if err != nil {
		return err
	}
	if t, ok := nd.kids[nb]; ok {
		if t == n {
			return nil
		}
		switch {
		case t.isDir() && !n.isDir():
			return &os.LinkError{Op: "rename", Old: oldpath, New: newpath, Err: syscall.EISDIR}
		case !t.isDir() && n.isDir():
			return &os.LinkError{Op: "rename", Old: oldpath, New: newpath, Err: syscall.ENOTDIR}
		case t.isDir() && len(t.kids) > 0:
			return &os.LinkError{Op: "rename", Old: oldpath, New: newpath, Err: syscall.ENOTEMPTY}
		}
	}
	if n.isDir() {
		// A directory cannot move below itself.
		for a := split(newpath); len(a) > 0; a = a[:len(a)-1] {
			if x, err := m.lookup("rename", "/"+strings.Join(a, "/")); err == nil && x == n {
				return &os.LinkError{Op: "rename", Old: oldpath, New: newpath, Err: syscall.EINVAL}
			}
		}
	}
	delete(od.kids, ob)
	nd.kids[nb] = n
	od.mtime, nd.mtime = time.Now(), time.Now()
	return nil
}

// Remove implements FS.
func (m *MemFS) Remove(name string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	d, b, err := m.parent("remove", name)
	if err != nil {
		return err
	}
	n, ok := d.kids[b]
	if !ok {
		return &fs.PathError{Op: "remove", Path: name, Err: fs.ErrNotExist}
	}
	if n.isDir() && len(n.kids) > 0 {
		return &fs.PathError{Op: "remove", Path: name, Err: syscall.ENOTEMPTY}
	}
	delete(d.kids, b)
	d.mtime = time.Now()
	return nil
}

// RemoveAll implements FS: like os.RemoveAll, a missing path is no error.
// Only the top entry is unlinked: what lies below goes with it, and a
// crash before its parent is synced brings the whole tree back.
func (m *MemFS) RemoveAll(name string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	d, b, err := m.parent("removeall", name)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	delete(d.kids, b)
	d.mtime = time.Now()
	return nil
}

// MkdirAll implements FS.
func (m *MemFS) MkdirAll(dir string, perm fs.FileMode) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := m.root
	for _, c := range split(dir) {
		k, ok := n.kids[c]
		if !ok {
			k = m.newDir(perm)
			n.kids[c] = k
			n.mtime = time.Now()
		} else if !k.isDir() {
			return &fs.PathError{Op: "mkdir", Path: dir, Err: syscall.ENOTDIR}
		}
		n = k
	}
	return nil
}

// Stat implements FS (there are no symbolic links: Stat is Lstat).
func (m *MemFS) Stat(name string) (fs.FileInfo, error) { return m.stat("stat", name) }

// Lstat implements FS.
func (m *MemFS) Lstat(name string) (fs.FileInfo, error) { return m.stat("lstat", name) }

func (m *MemFS) stat(op, name string) (fs.FileInfo, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	n, err := m.lookup(op, name)
	if err != nil {
		return nil, err
	}
	return n.info(path.Base("/" + filepath.ToSlash(name))), nil
}

// ReadDir implements FS (entries sorted by name).
func (m *MemFS) ReadDir(name string) ([]fs.DirEntry, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	n, err := m.lookup("readdir", name)
	if err != nil {
		return nil, err
	}
	if !n.isDir() {
		return nil, &fs.PathError{Op: "readdir", Path: name, Err: syscall.ENOTDIR}
	}
	out := make([]fs.DirEntry, 0, len(n.kids))
	for k, c := range n.kids {
		out = append(out, fs.FileInfoToDirEntry(c.info(k)))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name() < out[j].Name() })
	return out, nil
}

// Chmod implements FS.
func (m *MemFS) Chmod(name string, mode fs.FileMode) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	n, err := m.lookup("chmod", name)
	if err != nil {
		return err
	}
	n.mode = n.mode&fs.ModeType | mode.Perm()
	return nil
}

// SyncDir implements FS: dir's current entries become its durable ones.
func (m *MemFS) SyncDir(dir string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	n, err := m.lookup("sync", dir)
	if err != nil {
		return err
	}
	if !n.isDir() {
		return &fs.PathError{Op: "sync", Path: dir, Err: syscall.ENOTDIR}
	}
	n.syncedKids = make(map[string]*memNode, len(n.kids))
	for k, c := range n.kids {
		n.syncedKids[k] = c
	}
	return nil
}

// Lock implements FS.
func (m *MemFS) Lock(p string) (io.Closer, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	n, err := m.lookup("lock", p)
	if err != nil {
		return nil, err
	}
	if m.locks[n] {
		return nil, &fs.PathError{Op: "lock", Path: p, Err: ErrLocked}
	}
	m.locks[n] = true
	return &memLock{fs: m, n: n}, nil
}

type memLock struct {
	fs   *MemFS
	n    *memNode
	once sync.Once
}

func (l *memLock) Close() error {
	l.once.Do(func() {
		l.fs.mu.Lock()
		delete(l.fs.locks, l.n)
		l.fs.mu.Unlock()
	})
	return nil
}

type memInfo struct {
	name  string
	size  int64
	mode  fs.FileMode
	mtime time.Time
	ino   uint64
}

func (n *memNode) info(name string) *memInfo {
	return &memInfo{name: name, size: int64(len(n.data)), mode: n.mode, mtime: n.mtime, ino: n.ino}
}

func (i *memInfo) Name() string       { return i.name }
func (i *memInfo) Size() int64        { return i.size }
func (i *memInfo) Mode() fs.FileMode  { return i.mode }
func (i *memInfo) ModTime() time.Time { return i.mtime }
func (i *memInfo) IsDir() bool        { return i.mode.IsDir() }
func (i *memInfo) Sys() any           { return nil }

// Ino is the inode number: unique for the life of the MemFS (and kept by
// CrashClone), so a removed and recreated file has a new one.
func (i *memInfo) Ino() uint64 { return i.ino }

// Inoder is implemented by the FileInfo of MemFS files (and by their
// File), for code that fingerprints inodes without syscall.Stat_t.
type Inoder interface{ Ino() uint64 }

type memFile struct {
	fs     *MemFS
	n      *memNode
	name   string
	flag   int
	off    int64
	closed bool
}

var errClosed = fs.ErrClosed

func (f *memFile) check(op string, write bool) error {
	if f.closed {
		return &fs.PathError{Op: op, Path: f.name, Err: errClosed}
	}
	if write && f.flag&(os.O_WRONLY|os.O_RDWR) == 0 {
		return &fs.PathError{Op: op, Path: f.name, Err: syscall.EBADF}
	}
	if !write && f.flag&os.O_WRONLY != 0 {
		return &fs.PathError{Op: op, Path: f.name, Err: syscall.EBADF}
	}
	return nil
}

func (f *memFile) Name() string { return f.name }
func (f *memFile) Ino() uint64  { return f.n.ino }

func (f *memFile) Read(b []byte) (int, error) {
	n, err := f.ReadAt(b, f.off)
	f.fs.mu.Lock()
	f.off += int64(n)
	f.fs.mu.Unlock()
	if err == io.EOF && n > 0 {
		err = nil
	}
	return n, err
}

func (f *memFile) ReadAt(b []byte, off int64) (int, error) {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if err := f.check("read", false); err != nil {
		return 0, err
	}
	if f.n.isDir() {
		return 0, &fs.PathError{Op: "read", Path: f.name, Err: syscall.EISDIR}
	}
	if off < 0 {
		return 0, &fs.PathError{Op: "read", Path: f.name, Err: syscall.EINVAL}
	}
	if off >= int64(len(f.n.data)) {
		return 0, io.EOF
	}
	n := copy(b, f.n.data[off:])
	if n < len(b) {
		return n, io.EOF
	}
	return n, nil
}

func (f *memFile) Write(b []byte) (int, error) {
	f.fs.mu.Lock()
	off := f.off
	if f.flag&os.O_APPEND != 0 {
		off = int64(len(f.n.data))
	}
	f.fs.mu.Unlock()
	n, err := f.WriteAt(b, off)
	f.fs.mu.Lock()
	f.off = off + int64(n)
	f.fs.mu.Unlock()
	return n, err
}

// maxMemFile bounds a MemFS file: crash tests use small files, and a
// WriteAt or Truncate far out must not allocate gigabytes.
const maxMemFile = 64 << 20

func (f *memFile) WriteAt(b []byte, off int64) (int, error) {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if err := f.check("write", true); err != nil {
		return 0, err
	}
	if off < 0 || off+int64(len(b)) > maxMemFile {
		return 0, &fs.PathError{Op: "write", Path: f.name, Err: syscall.EFBIG}
	}
	if end := off + int64(len(b)); end > int64(len(f.n.data)) {
		f.n.data = append(f.n.data, make([]byte, end-int64(len(f.n.data)))...)
	}
	copy(f.n.data[off:], b)
	f.n.mtime = time.Now()
	return len(b), nil
}

func (f *memFile) Stat() (fs.FileInfo, error) {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if f.closed {
		return nil, &fs.PathError{Op: "stat", Path: f.name, Err: errClosed}
	}
	return f.n.info(path.Base("/" + filepath.ToSlash(f.name))), nil
}

func (f *memFile) Sync() error {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if f.closed {
		return &fs.PathError{Op: "sync", Path: f.name, Err: errClosed}
	}
	if f.n.isDir() {
		f.n.syncedKids = make(map[string]*memNode, len(f.n.kids))
		for k, c := range f.n.kids {
			f.n.syncedKids[k] = c
		}
		return nil
	}
	f.n.synced = bytes.Clone(f.n.data)
	if f.n.synced == nil {
		f.n.synced = []byte{}
	}
	return nil
}

func (f *memFile) Truncate(size int64) error {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if err := f.check("truncate", true); err != nil {
		return err
	}
	if size < 0 || size > maxMemFile {
		return &fs.PathError{Op: "truncate", Path: f.name, Err: syscall.EFBIG}
	}
	if size <= int64(len(f.n.data)) {
		f.n.data = f.n.data[:size:size]
	} else {
		f.n.data = append(f.n.data, make([]byte, size-int64(len(f.n.data)))...)
	}
	f.n.mtime = time.Now()
	return nil
}

func (f *memFile) Chmod(mode fs.FileMode) error {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if f.closed {
		return &fs.PathError{Op: "chmod", Path: f.name, Err: errClosed}
	}
	f.n.mode = f.n.mode&fs.ModeType | mode.Perm()
	return nil
}

func (f *memFile) Close() error {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if f.closed {
		return &fs.PathError{Op: "close", Path: f.name, Err: errClosed}
	}
	f.closed = true
	return nil
}
