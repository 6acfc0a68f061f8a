// Package atomicfile replaces small files (metadata, state) so that after a
// crash a reader sees either the complete old contents or the complete new
// contents, never a torn mix.
//
// Simplest use:
//
//	err := atomicfile.WriteFile("/data/volumes/vm1.json", buf, 0o644)
//
// How: the data goes to a temporary file in the same directory (so rename is
// atomic: same filesystem), which is fsynced, renamed over the target, and
// then the directory is fsynced so the rename itself is durable.
//
// Leftover temporary files (from a crash between create and rename) are named
// with TempPrefix and are safe to ignore or delete; IsTemp recognises them.
//
// Every function has an FS variant (WriteFileFS, ...) doing the same
// through the filesystem seam (package vfs), for crash tests; the plain
// ones use the real filesystem.
//
// Concurrency: concurrent WriteFile calls on the same path are safe in the
// sense that each produces a complete file and the last rename wins; callers
// that need "read-modify-write" ordering must serialise themselves.
package atomicfile

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/vmsan/vmsan/internal/vfs"
)

// TempPrefix starts the name of every temporary file WriteFile creates.
const TempPrefix = ".atomic-tmp-"

// IsTemp reports whether a directory entry name is a WriteFile temporary
// (possibly left behind by a crash).
func IsTemp(name string) bool { return strings.HasPrefix(name, TempPrefix) }

// WriteFile atomically replaces path with data.
//
// INVARIANT: when WriteFile returns nil, the new contents and the directory
// entry pointing at them are on stable storage; when it returns an error, path
// holds either its old contents or (if the error came from the final
// directory sync) possibly the new ones, but never a partial file.
func WriteFile(path string, data []byte, perm os.FileMode) error {
	return WriteFileFS(vfs.OS, path, data, perm)
}

// WriteFileFS is WriteFile on fsys. Its crash points, in order: create
// the temporary, chmod, write, fsync, rename, fsync the directory; a crash
// before the last leaves the old contents (and possibly a temporary).
func WriteFileFS(fsys vfs.FS, path string, data []byte, perm os.FileMode) (err error) {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	f, err := vfs.CreateTemp(fsys, dir, TempPrefix+base+"-*")
	if err != nil {
		return fmt.Errorf("atomicfile: %w", err)
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			f.Close()
			fsys.Remove(tmp)
		}
	}()
	if err = f.Chmod(perm); err != nil {
		return fmt.Errorf("atomicfile: %w", err)
	}
	if _, err = f.Write(data); err != nil {
		return fmt.Errorf("atomicfile: write %s: %w", tmp, err)
	}
	// The data must be durable before the rename makes it visible under the
	// real name; otherwise a crash could leave the new name pointing at an
	// empty or partial file (the classic ext4 delalloc zero-length problem).
	if err = f.Sync(); err != nil {
		return fmt.Errorf("atomicfile: fsync %s: %w", tmp, err)
	}
	if err = f.Close(); err != nil {
		return fmt.Errorf("atomicfile: close %s: %w", tmp, err)
	}
	if err = fsys.Rename(tmp, path); err != nil {
		return fmt.Errorf("atomicfile: %w", err)
	}
	return SyncDirFS(fsys, dir)
}

// SyncDir fsyncs a directory so that entries created, renamed or removed in
// it are durable.
func SyncDir(dir string) error { return SyncDirFS(vfs.OS, dir) }

// SyncDirFS is SyncDir on fsys.
func SyncDirFS(fsys vfs.FS, dir string) error {
	if err := fsys.SyncDir(dir); err != nil {
		return fmt.Errorf("atomicfile: fsync dir %s: %w", dir, err)
	}
	return nil
}

// RemoveTemps deletes leftover temporaries in dir and returns how many it
// removed. Call it only when no WriteFile can be running in dir (for example
// while holding the data directory lock at start-up).
func RemoveTemps(dir string) (int, error) { return RemoveTempsFS(vfs.OS, dir) }

// RemoveTempsFS is RemoveTemps on fsys. The removals are made durable
// (one directory sync), so a crash right after cannot bring them back.
func RemoveTempsFS(fsys vfs.FS, dir string) (int, error) {
	ents, err := fsys.ReadDir(dir)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, e := range ents {
		if IsTemp(e.Name()) {
			if err := fsys.Remove(filepath.Join(dir, e.Name())); err == nil {
				n++
			}
		}
	}
	if n > 0 {
		fsys.SyncDir(dir)
	}
	return n, nil
}
