package volume

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/google/uuid"
	"golang.org/x/sys/unix"

	"github.com/vmsan/vmsan/internal/atomicfile"
	"github.com/vmsan/vmsan/internal/sparse"
	"github.com/vmsan/vmsan/internal/vfs"
)

// Snapshots and clones.
//
// A snapshot is a read-only, point-in-time copy of a volume's raw file,
// named VOL@SNAP:
//
//	<dir>/snapshots/<vol>/<snap>.raw   the copy, 0600 (never written after creation)
//	<dir>/snapshots/<vol>/<snap>.json  SnapMeta, the commit point, 0600
//
// Copies are made by reflink (the FICLONE ioctl: instant, the blocks are
// shared with the volume until either side writes them) where the
// filesystem supports it (xfs with reflink=1, the mkfs default; btrfs).
// Elsewhere (ext4, tmpfs) the operations refuse with ErrNoReflink unless
// the caller asks for a full copy (Copy: data regions are copied, holes
// stay holes, all-zero blocks are not written).
//
// A clone is a new, independent read-write volume made the same way from
// a snapshot (or from a volume). A rollback makes a volume's contents
// those of one of its snapshots, in place (the inode stays, so a running
// daemon's open file sees the new contents): the mark Meta.Rollback is
// recorded before the raw file changes and cleared after, so a crash in
// between is completed by the next Open (rollback is idempotent).
//
// Every snapshot and clone gets its own data identity (a new DataID and
// its own user.vmsan.id), and a rollback gives the volume a new one:
// replication never mistakes one for another and resyncs in full after a
// rollback (the daemon refuses rollback on a replicated volume anyway).
//
// The store copies files; consistency with in-flight I/O is the caller's:
// the daemon flushes and holds new writes (volrt.Volume.Quiesce) around
// CreateSnapshot, Clone of a live volume and Rollback; without a daemon
// nothing writes, because the store holds the directory lock.

// SnapshotsDir is the subdirectory holding snapshots.
const SnapshotsDir = "snapshots"

// SnapSep separates a volume and a snapshot name: "VOL@SNAP". Volume names
// cannot contain it, so a snapshot reference is never a volume name.
const SnapSep = "@"

// Errors of snapshot operations (test with errors.Is).
var (
	// ErrNoReflink: the filesystem cannot share blocks between files; the
	// message names --copy, the full (hole-preserving) copy.
	ErrNoReflink = errors.New("the filesystem of the data directory cannot clone files by reflink (xfs with reflink=1 and btrfs can); use --copy for a full copy (holes are preserved)")
	// ErrHasSnapshots: deleting a volume would delete its snapshots.
	ErrHasSnapshots = errors.New("volume has snapshots")
)

// RollbackMark records a rollback in progress (Meta.Rollback).
type RollbackMark struct {
	Snapshot string `json:"snapshot"`
	Copy     bool   `json:"copy,omitempty"`
}

// SnapMeta is a snapshot's metadata. Meta is the volume's metadata as of
// the snapshot, with Name "VOL@SNAP", ReadOnly set and the snapshot's own
// UUID and data identity (so it can be served as a read-only export).
type SnapMeta struct {
	Meta
	Volume   string `json:"volume"`
	Snapshot string `json:"snapshot"`
	// Method is how the data was copied: "reflink" or "copy".
	Method string `json:"method"`
	// SourceDataID is the volume's DataID when the snapshot was taken.
	SourceDataID string `json:"source_data_id,omitempty"`
	// Temporary: taken for one command (a live export) and deleted by it;
	// Open removes one left behind (the command or the daemon died).
	Temporary bool `json:"temporary,omitempty"`
}

// Methods of SnapMeta.Method.
const (
	MethodReflink = "reflink"
	MethodCopy    = "copy"
)

// SplitRef splits "VOL@SNAP" into its parts (isSnap true) or validates a
// plain volume name (isSnap false).
func SplitRef(ref string) (vol, snap string, isSnap bool, err error) {
	vol, snap, isSnap = strings.Cut(ref, SnapSep)
	if err := ValidateName(vol); err != nil {
		return "", "", false, err
	}
	if !isSnap {
		return vol, "", false, nil
	}
	if err := ValidateName(snap); err != nil {
		return "", "", false, fmt.Errorf("snapshot name: %w", err)
	}
	return vol, snap, true, nil
}

// SnapshotPath is the raw file of a snapshot (whether or not it exists).
// REQUIRES: vol and snap passed ValidateName.
func (s *Store) SnapshotPath(vol, snap string) string {
	return filepath.Join(s.dir, SnapshotsDir, vol, snap+rawExt)
}

func (s *Store) snapMetaPath(vol, snap string) string {
	return filepath.Join(s.dir, SnapshotsDir, vol, snap+metaExt)
}

// CloneOptions choose how data is copied.
type CloneOptions struct {
	// Copy allows a full copy where reflink is not supported; without it
	// such a filesystem gets ErrNoReflink.
	Copy bool
	// Progress, when set, is called during a full copy (see sparse.Options).
	Progress func(done int64)
	// Temporary marks a snapshot (CreateSnapshot only) as a command's
	// scratch copy, such as the one a live export reads: Open removes
	// it, so one whose command died with it does not stay (SnapMeta.Temporary).
	Temporary bool
}

// reflinkUnsupported reports whether a FICLONE error means "this
// filesystem (or this pair of files) cannot share blocks" rather than an
// I/O failure.
func reflinkUnsupported(err error) bool {
	for _, e := range []error{unix.EOPNOTSUPP, unix.ENOTSUP, unix.EXDEV, unix.EINVAL, unix.ENOTTY, unix.ENOSYS, unix.EPERM} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// copyData makes dst (empty, or to be overwritten) hold src's size bytes:
// by reflink, or (o.Copy) by a sparse copy. It returns the method used.
// dst's old blocks are dropped first in the copy case.
func copyData(dst vfs.File, src *fileImage, size int64, o CloneOptions) (string, error) {
	// Reflink needs two real files; a file of another FS (crash tests)
	// takes the full copy like a filesystem without reflink.
	err := error(unix.EOPNOTSUPP)
	od, ok1 := vfs.OSFile(dst)
	if os_ := src.osFile(); ok1 && os_ != nil {
		err = unix.IoctlFileClone(int(od.Fd()), int(os_.Fd()))
	}
	if err == nil {
		return MethodReflink, dst.Sync()
	}
	if !reflinkUnsupported(err) {
		return "", fmt.Errorf("reflink: %w", err)
	}
	if !o.Copy {
		return "", fmt.Errorf("%w (FICLONE: %v)", ErrNoReflink, err)
	}
	// Empty the destination, then give it the size as one hole.
	if err := dst.Truncate(0); err != nil {
		return "", err
	}
	if err := dst.Truncate(size); err != nil {
		return "", sizeErr(err, size)
	}
	if err := sparse.Copy(context.Background(), dst, src, size, sparse.Options{Data: src.Data, Progress: o.Progress}); err != nil {
		return "", err
	}
	return MethodCopy, dst.Sync()
}

// tempRaw creates a temporary file in the volumes directory: same
// filesystem as every raw file (rename and reflink work), and named so
// that Open removes it if a crash leaves it behind.
func (s *Store) tempRaw() (vfs.File, error) {
	return s.fs.OpenFile(filepath.Join(s.vdir, atomicfile.TempPrefix+"clone-"+uuid.NewString()), os.O_RDWR|os.O_CREATE|os.O_EXCL, fileMode)
}

// cloneToTemp copies srcPath (size bytes) into a new temporary file and
// returns it (the caller renames or removes it) with the method used.
func (s *Store) cloneToTemp(srcPath string, size int64, o CloneOptions) (vfs.File, string, error) {
	src, err := openFileImage(s.fs, srcPath)
	if err != nil {
		return nil, "", err
	}
	defer src.Close()
	if src.Size() != size {
		return nil, "", fmt.Errorf("%w: %s is %d bytes, the metadata says %d", ErrDamaged, srcPath, src.Size(), size)
	}
	tmp, err := s.tempRaw()
	if err != nil {
		return nil, "", err
	}
	method, err := copyData(tmp, src, size, o)
	if err != nil {
		tmp.Close()
		s.fs.Remove(tmp.Name())
		return nil, "", err
	}
	return tmp, method, nil
}

// CreateSnapshot takes a snapshot VOL@SNAP of a volume's raw file as it
// is now (see "Snapshots and clones" for consistency with live I/O).
func (s *Store) CreateSnapshot(vol, snap string, o CloneOptions) (SnapMeta, error) {
	if err := ValidateName(vol); err != nil {
		return SnapMeta{}, err
	}
	if err := ValidateName(snap); err != nil {
		return SnapMeta{}, fmt.Errorf("snapshot name: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	m, err := s.get(vol)
	if err != nil {
		return SnapMeta{}, err
	}
	if err := s.checkRaw(m); err != nil {
		return SnapMeta{}, err
	}
	if _, err := s.fs.Stat(s.snapMetaPath(vol, snap)); err == nil {
		return SnapMeta{}, existsError{"snapshot " + vol + SnapSep + snap}
	}
	d := filepath.Join(s.dir, SnapshotsDir, vol)
	if err := vfs.MkdirAllSync(s.fs, d, dirMode); err != nil {
		return SnapMeta{}, err
	}
	s.fs.Chmod(filepath.Join(s.dir, SnapshotsDir), dirMode)
	tmp, method, err := s.cloneToTemp(s.RawPath(vol), m.Size, o)
	if err != nil {
		return SnapMeta{}, fmt.Errorf("snapshot %s%s%s: %w", vol, SnapSep, snap, err)
	}
	defer tmp.Close()
	sm := SnapMeta{Meta: m, Volume: vol, Snapshot: snap, Method: method, SourceDataID: m.DataID, Temporary: o.Temporary}
	sm.Name = vol + SnapSep + snap
	sm.UUID = uuid.NewString()
	sm.ReadOnly = true
	sm.Created = time.Now().UTC().Truncate(time.Second)
	sm.ResizeFrom, sm.Rollback = 0, nil
	if err := newIdentity(tmp, &sm.Meta); err != nil {
		s.fs.Remove(tmp.Name())
		return SnapMeta{}, err
	}
	// A snapshot is never written: make that visible on the file too.
	tmp.Chmod(0o400)
	if err := s.fs.Rename(tmp.Name(), s.SnapshotPath(vol, snap)); err != nil {
		s.fs.Remove(tmp.Name())
		return SnapMeta{}, err
	}
	if err := s.writeSnapMeta(sm); err != nil {
		s.fs.Remove(s.SnapshotPath(vol, snap))
		return SnapMeta{}, err
	}
	return sm, nil
}

func (s *Store) writeSnapMeta(sm SnapMeta) error {
	b, err := json.MarshalIndent(sm, "", "  ")
	if err != nil {
		return err
	}
	if err := atomicfile.WriteFileFS(s.fs, s.snapMetaPath(sm.Volume, sm.Snapshot), append(b, '\n'), fileMode); err != nil {
		return fmt.Errorf("snapshot %s: write metadata: %w", sm.Name, err)
	}
	return nil
}

func (s *Store) getSnapshot(vol, snap string) (SnapMeta, error) {
	p := s.snapMetaPath(vol, snap)
	b, err := s.readBounded(p)
	if errors.Is(err, fs.ErrNotExist) {
		return SnapMeta{}, SnapshotNotFound(vol + SnapSep + snap)
	}
	if err != nil {
		return SnapMeta{}, err
	}
	var sm SnapMeta
	if err := json.Unmarshal(b, &sm); err != nil {
		return SnapMeta{}, fmt.Errorf("snapshot %s%s%s: corrupt metadata %s: %w", vol, SnapSep, snap, p, err)
	}
	if sm.Volume != vol || sm.Snapshot != snap || sm.LogicalBlockSize == 0 || checkSize(sm.Size, sm.LogicalBlockSize) != nil {
		return SnapMeta{}, fmt.Errorf("snapshot %s%s%s: metadata %s does not describe it", vol, SnapSep, snap, p)
	}
	return sm, nil
}

func (s *Store) readBounded(p string) ([]byte, error) {
	f, err := vfs.Open(s.fs, p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if st.Size() > maxMetaBytes {
		return nil, fmt.Errorf("metadata file %s is %d bytes, larger than the %d allowed", p, st.Size(), maxMetaBytes)
	}
	b := make([]byte, st.Size())
	if _, err := f.ReadAt(b, 0); err != nil && st.Size() > 0 {
		return nil, err
	}
	return b, nil
}

// GetSnapshot returns a snapshot's metadata.
func (s *Store) GetSnapshot(vol, snap string) (SnapMeta, error) {
	if _, _, _, err := SplitRef(vol + SnapSep + snap); err != nil {
		return SnapMeta{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.getSnapshot(vol, snap)
}

func (s *Store) listSnapshots(vol string) ([]SnapMeta, error) {
	ents, err := s.fs.ReadDir(filepath.Join(s.dir, SnapshotsDir, vol))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []SnapMeta
	var errs []error
	for _, e := range ents {
		n := e.Name()
		if e.IsDir() || atomicfile.IsTemp(n) || !strings.HasSuffix(n, metaExt) {
			continue
		}
		snap := strings.TrimSuffix(n, metaExt)
		if ValidateName(snap) != nil {
			continue
		}
		sm, err := s.getSnapshot(vol, snap)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out = append(out, sm)
	}
	sort.Slice(out, func(i, j int) bool {
		if !out[i].Created.Equal(out[j].Created) {
			return out[i].Created.Before(out[j].Created)
		}
		return out[i].Snapshot < out[j].Snapshot
	})
	return out, errors.Join(errs...)
}

// ListSnapshots returns a volume's snapshots (vol == "": every volume's),
// oldest first within a volume. Like List, unreadable metadata is
// reported in the error beside the readable snapshots.
func (s *Store) ListSnapshots(vol string) ([]SnapMeta, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if vol != "" {
		if err := ValidateName(vol); err != nil {
			return nil, err
		}
		if _, err := s.get(vol); err != nil {
			return nil, err
		}
		return s.listSnapshots(vol)
	}
	ents, err := s.fs.ReadDir(filepath.Join(s.dir, SnapshotsDir))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []SnapMeta
	var errs []error
	for _, e := range ents {
		if !e.IsDir() || ValidateName(e.Name()) != nil {
			continue
		}
		l, err := s.listSnapshots(e.Name())
		out = append(out, l...)
		if err != nil {
			errs = append(errs, err)
		}
	}
	return out, errors.Join(errs...)
}

// DeleteSnapshot removes a snapshot (the caller makes sure nobody is
// reading it: the daemon refuses while it is exported).
func (s *Store) DeleteSnapshot(vol, snap string) error {
	if _, _, _, err := SplitRef(vol + SnapSep + snap); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, err := s.getSnapshot(vol, snap); err != nil {
		return err
	}
	return s.deleteSnapshot(vol, snap)
}

func (s *Store) deleteSnapshot(vol, snap string) error {
	// Metadata first: the commit point, as for volumes.
	if err := s.fs.Remove(s.snapMetaPath(vol, snap)); err != nil {
		return fmt.Errorf("snapshot %s%s%s: %w", vol, SnapSep, snap, err)
	}
	d := filepath.Join(s.dir, SnapshotsDir, vol)
	// The removal must be durable before success is reported: a crash
	// must not bring back a snapshot the user was told is gone.
	if err := atomicfile.SyncDirFS(s.fs, d); err != nil {
		return fmt.Errorf("snapshot %s%s%s: %w", vol, SnapSep, snap, err)
	}
	s.fs.Remove(s.SnapshotPath(vol, snap))
	s.fs.Remove(d) // only if empty
	return nil
}

// snapshotsBlockDelete is Delete's check: a volume with snapshots is only
// deleted with force, and then its snapshots go first (so a crash never
// leaves snapshots of a volume that no longer exists, which a new volume
// of the same name would inherit). REQUIRES: s.mu held.
func (s *Store) snapshotsBlockDelete(vol string, force bool) error {
	l, err := s.listSnapshots(vol)
	if len(l) == 0 && err == nil {
		return nil
	}
	if !force {
		names := make([]string, 0, len(l))
		for _, sm := range l {
			names = append(names, sm.Name)
		}
		if err != nil {
			names = append(names, "(some unreadable)")
		}
		return fmt.Errorf("volume %s: %w (%s): delete them first (vmsan volume delete %s@SNAP) or use --force to delete the volume with its snapshots",
			vol, ErrHasSnapshots, strings.Join(names, ", "), vol)
	}
	for _, sm := range l {
		if err := s.deleteSnapshot(vol, sm.Snapshot); err != nil {
			return err
		}
	}
	// Unreadable snapshot metadata: remove the whole directory.
	if err := s.fs.RemoveAll(filepath.Join(s.dir, SnapshotsDir, vol)); err != nil {
		return fmt.Errorf("volume %s: remove snapshots: %w", vol, err)
	}
	return nil
}

// Clone creates the new volume newName from src, "VOL@SNAP" (a snapshot)
// or "VOL" (a volume as it is now: the daemon quiesces it first). The
// clone has the source's size, block sizes and settings, is read-write,
// and has its own UUID and data identity.
func (s *Store) Clone(src, newName string, o CloneOptions) (Meta, error) {
	vol, snap, isSnap, err := SplitRef(src)
	if err != nil {
		return Meta{}, err
	}
	if err := ValidateName(newName); err != nil {
		return Meta{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var base Meta
	var srcPath string
	if isSnap {
		sm, err := s.getSnapshot(vol, snap)
		if err != nil {
			return Meta{}, err
		}
		base, srcPath = sm.Meta, s.SnapshotPath(vol, snap)
	} else {
		m, err := s.get(vol)
		if err != nil {
			return Meta{}, err
		}
		if err := s.checkRaw(m); err != nil {
			return Meta{}, err
		}
		base, srcPath = m, s.RawPath(vol)
	}
	if _, err := s.fs.Stat(s.metaPath(newName)); err == nil {
		return Meta{}, fmt.Errorf("%w: %s", ErrExists, newName)
	}
	tmp, _, err := s.cloneToTemp(srcPath, base.Size, o)
	if err != nil {
		return Meta{}, fmt.Errorf("clone %s to %s: %w", src, newName, err)
	}
	defer tmp.Close()
	m := base
	m.Version = metaVersion
	m.Name = newName
	m.UUID = uuid.NewString()
	m.ReadOnly = false
	m.Created = time.Now().UTC().Truncate(time.Second)
	m.ResizeFrom, m.Rollback = 0, nil
	tmp.Chmod(fileMode)
	if err := newIdentity(tmp, &m); err != nil {
		s.fs.Remove(tmp.Name())
		return Meta{}, err
	}
	// A raw file without metadata is crash debris (package doc).
	s.fs.Remove(s.RawPath(newName))
	if err := s.fs.Rename(tmp.Name(), s.RawPath(newName)); err != nil {
		s.fs.Remove(tmp.Name())
		return Meta{}, err
	}
	if err := s.writeMeta(m); err != nil {
		s.fs.Remove(s.RawPath(newName))
		return Meta{}, err
	}
	return m, nil
}

// Rollback makes volume vol's contents (and size) those of its snapshot
// snap, in place. resize, when set, is called with the new size after the
// raw file changed (the daemon resizes its open backend); it runs with the
// store mutex held (see Hooks' REQUIRES). Refusing while clients are
// connected, or for a replicated volume, is the caller's.
func (s *Store) Rollback(vol, snap string, o CloneOptions) (Meta, error) {
	if _, _, _, err := SplitRef(vol + SnapSep + snap); err != nil {
		return Meta{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	m, err := s.get(vol)
	if err != nil {
		return Meta{}, err
	}
	if m.ReadOnly {
		return Meta{}, fmt.Errorf("volume %s: %w", vol, ErrReadOnly)
	}
	if err := s.checkRaw(m); err != nil {
		return Meta{}, err
	}
	sm, err := s.getSnapshot(vol, snap)
	if err != nil {
		return Meta{}, err
	}
	if sm.LogicalBlockSize != m.LogicalBlockSize {
		return Meta{}, fmt.Errorf("%w: snapshot %s has logical block size %d, the volume %d", ErrInvalid, sm.Name, sm.LogicalBlockSize, m.LogicalBlockSize)
	}
	mark := &RollbackMark{Snapshot: snap, Copy: o.Copy}
	if !o.Copy {
		// Probe reflink on a scratch file before touching the volume: a
		// filesystem without it must be refused with nothing changed.
		tmp, _, err := s.cloneToTemp(s.SnapshotPath(vol, snap), sm.Size, CloneOptions{})
		if err != nil {
			return Meta{}, fmt.Errorf("rollback %s to %s: %w", vol, sm.Name, err)
		}
		tmp.Close()
		s.fs.Remove(tmp.Name())
	}
	m.Rollback = mark
	if err := s.writeMeta(m); err != nil {
		return Meta{}, err
	}
	nm, err := s.finishRollback(m, o.Progress)
	if err != nil {
		return Meta{}, fmt.Errorf("rollback %s to %s: %w (the volume is marked: the next start of vmsan completes the rollback)", vol, sm.Name, err)
	}
	return nm, nil
}

// finishRollback does (or redoes: it is idempotent) the rollback m.Rollback
// names and clears the mark. REQUIRES: s.mu held, m.Rollback != nil.
func (s *Store) finishRollback(m Meta, progress func(int64)) (Meta, error) {
	sm, err := s.getSnapshot(m.Name, m.Rollback.Snapshot)
	if err != nil {
		return Meta{}, err
	}
	src, err := openFileImage(s.fs, s.SnapshotPath(m.Name, sm.Snapshot))
	if err != nil {
		return Meta{}, err
	}
	defer src.Close()
	dst, err := s.fs.OpenFile(s.RawPath(m.Name), os.O_RDWR, 0)
	if err != nil {
		return Meta{}, err
	}
	defer dst.Close()
	if !m.Rollback.Copy {
		// FICLONE replaces the blocks it covers; a tail past the
		// snapshot's end must go first (and an unaligned end is only
		// accepted when it reaches the destination's end).
		if st, err := dst.Stat(); err != nil {
			return Meta{}, err
		} else if st.Size() > sm.Size {
			if err := dst.Truncate(sm.Size); err != nil {
				return Meta{}, err
			}
		}
	}
	if _, err := copyData(dst, src, sm.Size, CloneOptions{Copy: m.Rollback.Copy, Progress: progress}); err != nil {
		return Meta{}, err
	}
	if s.hooks.Resize != nil && sm.Size != m.Size {
		if _, err := s.hooks.Resize(m.Name, sm.Size); err != nil {
			return Meta{}, err
		}
	}
	m.Size = sm.Size
	if err := newIdentity(dst, &m); err != nil {
		return Meta{}, err
	}
	m.Rollback = nil
	if err := s.writeMeta(m); err != nil {
		return Meta{}, err
	}
	return m, nil
}

// removeSnapshotDebris removes what a crash during CreateSnapshot can
// leave in snapshots/: a raw file renamed into place whose metadata (the
// commit point) was never written, and atomic-write temporaries. Called
// by Open; best effort (what it cannot remove is only wasted space).
func (s *Store) removeSnapshotDebris() {
	vols, err := s.fs.ReadDir(filepath.Join(s.dir, SnapshotsDir))
	if err != nil {
		return
	}
	for _, v := range vols {
		if !v.IsDir() || ValidateName(v.Name()) != nil {
			continue
		}
		d := filepath.Join(s.dir, SnapshotsDir, v.Name())
		atomicfile.RemoveTempsFS(s.fs, d)
		ents, err := s.fs.ReadDir(d)
		if err != nil {
			continue
		}
		for _, e := range ents {
			snap, ok := strings.CutSuffix(e.Name(), rawExt)
			if !ok || ValidateName(snap) != nil {
				continue
			}
			if _, err := s.fs.Lstat(s.snapMetaPath(v.Name(), snap)); errors.Is(err, fs.ErrNotExist) {
				if s.fs.Remove(filepath.Join(d, e.Name())) == nil {
					s.notice(v.Name(), false, "removed %s: a snapshot whose creation a crash interrupted", filepath.Join(d, e.Name()))
				}
				continue
			}
			// A temporary snapshot outlived its command (an export whose
			// process, or whose daemon, stopped before deleting it).
			// Whoever holds the directory lock now has no command using
			// it: commands take temporary snapshots through the daemon
			// that held the lock then.
			if sm, err := s.getSnapshot(v.Name(), snap); err == nil && (sm.Temporary || legacyExportSnapshot.MatchString(snap)) {
				if err := s.deleteSnapshot(v.Name(), snap); err == nil {
					s.notice(v.Name(), true, "removed the temporary snapshot %s left by a command that did not finish", sm.Name)
				} else {
					s.notice(v.Name(), true, "cannot remove the temporary snapshot %s: %v", sm.Name, err)
				}
			}
		}
	}
}

// legacyExportSnapshot is the name live exports gave their temporary
// snapshot before it was marked Temporary (export-TIME-ID): leftovers
// from then are removed like marked ones.
var legacyExportSnapshot = regexp.MustCompile(`^export-[0-9]{8}T[0-9]{6}-[0-9a-f]{8}$`)

// reconcileRollback completes a rollback a crash interrupted (Open).
// REQUIRES: s.mu held or Open in progress.
func (s *Store) reconcileRollback(m Meta) Meta {
	if m.Rollback == nil {
		return m
	}
	nm, err := s.finishRollback(m, nil)
	if err != nil {
		s.unverified[m.Name] = fmt.Errorf("volume %s: %w: a rollback to snapshot %s was interrupted and cannot be completed: %v", m.Name, ErrDamaged, m.Rollback.Snapshot, err)
		return m
	}
	s.idChanged[m.Name] = true
	s.notice(m.Name, true, "completed a rollback to snapshot %s%s%s interrupted by a crash (new data identity %s)", m.Name, SnapSep, m.Rollback.Snapshot, nm.DataID)
	return nm
}

// TempImportPath is a new name for a temporary file in the volumes
// directory of the data directory dataDir, for an import to fill before
// CreateFromFile adopts it: same filesystem as the volume it becomes, and
// removed by Open if a crash leaves it behind.
func TempImportPath(dataDir string) string {
	return filepath.Join(dataDir, VolumesDir, atomicfile.TempPrefix+"import-"+uuid.NewString())
}

// CreateFromFile creates a volume whose raw file is path, a file the
// caller filled (TempImportFile). It is extended with zeroes to o.Size
// when shorter (o.Size is rounded up by the caller to the block size);
// longer is refused. The file is renamed into place; on error it is left
// for the caller to remove.
func (s *Store) CreateFromFile(o CreateOptions, path string) (Meta, error) {
	// Only adopt our own temporary files: the control API must not become
	// a way to move arbitrary files into the store.
	if !strings.HasPrefix(filepath.Base(path), atomicfile.TempPrefix) || !s.sameDir(filepath.Dir(path), s.vdir) {
		return Meta{}, fmt.Errorf("%w: import file %s is not a temporary file of this data directory (%s)", ErrInvalid, path, s.vdir)
	}
	st, err := s.fs.Lstat(path)
	if err != nil {
		return Meta{}, err
	}
	if !st.Mode().IsRegular() {
		return Meta{}, fmt.Errorf("%w: import file %s is not a regular file", ErrInvalid, path)
	}
	if st.Size() > o.Size {
		return Meta{}, fmt.Errorf("%w: import file is %d bytes, more than the volume size %d", ErrBadSize, st.Size(), o.Size)
	}
	m, err := newMeta(o) // validates everything
	if err != nil {
		return Meta{}, err
	}
	// The metadata, written last, is the commit point: a daemon stopped
	// or killed anywhere before it leaves no volume (only a temporary
	// file, or a raw file without metadata: debris Open and the next
	// create of the name remove), so an import that failed created
	// nothing.
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.prepareNewLocked(o.Name); err != nil {
		return Meta{}, err
	}
	f, err := s.fs.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return Meta{}, err
	}
	defer f.Close()
	f.Chmod(fileMode)
	if err := f.Truncate(o.Size); err != nil {
		return Meta{}, sizeErr(err, o.Size)
	}
	if err := newIdentity(f, &m); err != nil {
		return Meta{}, err
	}
	if err := f.Sync(); err != nil {
		return Meta{}, err
	}
	if err := s.fs.Rename(path, s.RawPath(o.Name)); err != nil {
		return Meta{}, err
	}
	if err := s.writeMeta(m); err != nil {
		s.fs.Remove(s.RawPath(o.Name))
		return Meta{}, err
	}
	return m, nil
}

func (s *Store) sameDir(a, b string) bool {
	sa, err1 := s.fs.Stat(a)
	sb, err2 := s.fs.Stat(b)
	if err1 != nil || err2 != nil {
		return false
	}
	ia, ok1 := sa.(vfs.Inoder)
	ib, ok2 := sb.(vfs.Inoder)
	if ok1 && ok2 {
		return ia.Ino() == ib.Ino()
	}
	return os.SameFile(sa, sb)
}
