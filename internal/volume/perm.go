package volume

import (
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"github.com/vmsan/vmsan/internal/vfs"
)

// tightenAll makes what Open finds in the data directory owner-only (see
// the package doc), reporting each change in Notices. Symbolic links and
// sockets are left alone: the first are not ours to follow, the second
// are created with their own modes by their owners.
func (s *Store) tightenAll() {
	// The data directory itself: only when it is ours and not a shared
	// sticky directory (someone running with --data-dir /tmp must not make
	// /tmp private); volumes/ below it is private either way.
	if st, err := s.fs.Lstat(s.dir); err == nil && st.IsDir() {
		sys, _ := st.Sys().(*syscall.Stat_t)
		switch {
		case st.Mode()&os.ModeSticky != 0 || (sys != nil && int(sys.Uid) != os.Geteuid()):
			if st.Mode().Perm()&0o077 != 0 {
				s.notice("", true, "data directory %s is %v and shared or not ours: not changing it (its volumes/ and repl/ are private)", s.dir, st.Mode().Perm())
			}
		default:
			s.tighten(s.dir, st)
		}
	}
	if st, err := s.fs.Lstat(filepath.Join(s.dir, LockFileName)); err == nil {
		s.tighten(filepath.Join(s.dir, LockFileName), st)
	}
	for _, sub := range []string{VolumesDir, "repl", SnapshotsDir} {
		vfs.WalkDir(s.fs, filepath.Join(s.dir, sub), func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return nil
			}
			if st, err := s.fs.Lstat(p); err == nil {
				s.tighten(p, st)
			}
			return nil
		})
	}
}

// tighten removes group and other permission bits from p (a directory
// becomes 0700, a file keeps only its owner bits).
func (s *Store) tighten(p string, st fs.FileInfo) {
	mode := st.Mode()
	if !mode.IsDir() && !mode.IsRegular() {
		return
	}
	perm := mode.Perm()
	want := perm &^ 0o077
	if mode.IsDir() {
		want = dirMode
	}
	if perm&0o077 == 0 {
		return
	}
	if err := s.fs.Chmod(p, want); err != nil {
		s.notice("", true, "cannot tighten permissions of %s (%v): %v", p, perm, err)
		return
	}
	s.notice("", false, "tightened permissions of %s from %v to %v (data files are owner-only)", p, perm, want)
}
