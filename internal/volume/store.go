// Package volume is the volume store: a data directory holding one sparse
// raw file per volume plus a JSON metadata file written atomically.
//
// Simplest use:
//
//	s, err := volume.Open("./vmsan-data")      // takes the directory lock
//	defer s.Close()
//	m, err := s.Create(volume.CreateOptions{Name: "vm1", Size: 20 << 30})
//	path := s.RawPath("vm1")                   // hand to backend.OpenFile
//
// Layout of a data directory:
//
//	<dir>/                    0700; flock(LOCK_EX) on the directory itself
//	<dir>/vmsan.lock          the owner's pid (information; also flocked)
//	<dir>/volumes/<name>.raw  the volume's bytes, a sparse (thin) raw file, 0600
//	<dir>/volumes/<name>.json metadata (Meta), replaced atomically, 0600
//	<dir>/volumes/<name>.state/ optional per-volume state for other subsystems
//	                          (replication: .state/repl/), see StateDir and
//	                          StatePath; deleted with the volume
//	<dir>/snapshots/<vol>/<snap>.raw, .json  snapshot VOL@SNAP, read-only
//	                          (snapshot.go: snapshots, clones, rollback)
//
// Permissions: volumes are VM disks, so everything the store creates is
// owner-only (files 0600, directories 0700) whatever the umask, and Open
// tightens what it finds wider (volumes/, the repl/ of older versions and
// their contents, and the data directory itself when we own it and it is
// not a shared sticky directory like /tmp), reporting each change in
// Notices.
//
// The metadata file is the commit point: a volume exists exactly when its
// .json exists. A .raw or .state/ without a .json is debris from a crash
// during Create or Delete and is replaced by the next Create of that name.
//
// The store never shrinks, extends or recreates a raw file on its own
// unless the metadata proves that vmsan itself was in the middle of doing
// so: Resize records the old size (Meta.ResizeFrom) with the new one before
// touching the file and clears it after. If a crash interrupts a resize,
// Open finds the file at the old size and converges without losing a byte:
// an interrupted grow is completed (extending adds zeroes), an interrupted
// shrink is rolled back (the metadata returns to the old size; the resize
// never returned success, so the operator repeats it). Any other
// disagreement (a raw file missing, or of a size vmsan never gave it) is
// damage from outside: the volume is not served (CheckRaw returns
// ErrDamaged naming the file, both sizes and the repair command) until the
// operator runs `vmsan volume repair` (Repair), which always gives the
// volume a new data identity (identity.go) so a replica resyncs in full.
//
// File I/O: every file operation goes through a vfs.FS (OpenFS; Open uses
// the real filesystem), so crash tests run the store on a vfs.MemFS and
// reopen it from what a crash at any point leaves (crash_test.go). Data
// readers other than the I/O engine read an Image (image.go).
//
// Concurrency: all methods are safe for concurrent use; they are serialised
// by one mutex. Only one process can open a data directory at a time
// (ErrLocked otherwise). Coordination with exports is through Hooks: the
// daemon tells the store whether a volume is in use and performs resizes on
// the open backend.
package volume

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/google/uuid"

	"github.com/vmsan/vmsan/internal/atomicfile"
	"github.com/vmsan/vmsan/internal/backend"
	"github.com/vmsan/vmsan/internal/vfs"
)

const (
	rawExt   = ".raw"
	metaExt  = ".json"
	stateExt = ".state"

	// StateExt ends the name of a volume's state directory
	// (volumes/<name>.state, see StatePath).
	StateExt = stateExt

	// LockFileName is the name of the data directory lock file.
	LockFileName = "vmsan.lock"
	// VolumesDir is the subdirectory holding volume files.
	VolumesDir = "volumes"

	// DefaultLogicalBlockSize and DefaultPhysicalBlockSize are used when
	// CreateOptions leaves them zero. 512/4096 is what a modern "512e" disk
	// reports and what QEMU assumes for a raw file.
	DefaultLogicalBlockSize  = 512
	DefaultPhysicalBlockSize = 4096

	// MaxSize bounds a volume: 2^60 bytes (1 EiB) keeps every offset+length
	// sum computed elsewhere far from int64 overflow.
	MaxSize = 1 << 60

	metaVersion = 1

	// MaxDescriptionLen bounds the free-text description, which is sent to
	// every NBD client that asks for NBD_INFO_DESCRIPTION.
	MaxDescriptionLen = 1024
)

// Errors returned by Store methods (test with errors.Is).
var (
	ErrNotFound = errors.New("no such volume")
	ErrExists   = errors.New("volume already exists")
	ErrInUse    = errors.New("volume is exported (connected clients); use --force to override")
	ErrShrink   = errors.New("shrinking a volume destroys data at its end; use --force to override")
	ErrLocked   = errors.New("data directory is in use by another vmsan process")
	// ErrNoDataDir: OpenExisting found no data directory (see NoDataDirError).
	ErrNoDataDir = errors.New("no vmsan data directory")
	ErrBadSize   = errors.New("invalid volume size")
	ErrInvalid   = errors.New("invalid volume option")
	ErrReadOnly  = errors.New("volume is read-only; clear the flag first (vmsan volume set NAME --read-only=false)")
	// ErrDamaged: the raw file is missing or disagrees with the metadata in
	// a way no vmsan crash produces; the volume is not served until
	// `vmsan volume repair`.
	ErrDamaged = errors.New("raw file does not match the volume metadata")
)

// existsError is ErrExists naming what exists ("snapshot vm1@s1 already
// exists"): errors.Is(err, ErrExists) holds, and the message reads the
// same over the control socket.
type existsError struct{ what string }

func (e existsError) Error() string        { return e.what + " already exists" }
func (e existsError) Is(target error) bool { return target == ErrExists }

// SnapshotNotFound is ErrNotFound for the snapshot ref ("VOL@SNAP"):
// "no snapshot vm1@s1".
func SnapshotNotFound(ref string) error { return notFoundError{"snapshot " + ref} }

type notFoundError struct{ what string }

func (e notFoundError) Error() string        { return "no " + e.what }
func (e notFoundError) Is(target error) bool { return target == ErrNotFound }

// Meta is a volume's persistent metadata.
type Meta struct {
	Version           int               `json:"version"`
	Name              string            `json:"name"`
	UUID              string            `json:"uuid"`
	Size              int64             `json:"size"`
	LogicalBlockSize  uint32            `json:"logical_block_size"`
	PhysicalBlockSize uint32            `json:"physical_block_size"`
	Cache             backend.CacheMode `json:"cache"`
	Rotational        bool              `json:"rotational"`
	ReadOnly          bool              `json:"read_only"`
	Created           time.Time         `json:"created"`
	Description       string            `json:"description,omitempty"`
	// ResizeFrom is the size before a resize in progress: set (with the new
	// Size) before the raw file changes, cleared after. Found set at Open it
	// proves a crash interrupted the resize (see package doc).
	ResizeFrom int64 `json:"resize_from,omitempty"`
	// DataID names the raw file's data lineage (identity.go): it changes
	// when the store finds the file replaced, and on every repair.
	// Replication records it and resyncs in full when it changed.
	DataID   string `json:"data_id,omitempty"`
	DataFile FileID `json:"data_file,omitzero"`
	// Rollback is set while a rollback to a snapshot rewrites the raw file
	// (snapshot.go); found set at Open, the rollback is completed.
	Rollback *RollbackMark `json:"rollback,omitempty"`
}

// CreateOptions describes a new volume. Zero values get defaults: block
// sizes 512/4096, cache writeback.
type CreateOptions struct {
	Name              string
	Size              int64
	LogicalBlockSize  uint32
	PhysicalBlockSize uint32
	Cache             backend.CacheMode
	Rotational        bool
	ReadOnly          bool
	Description       string
}

// Hooks let the owner of the store (the daemon) take part in operations that
// affect live exports.
//
// REQUIRES: hooks are called with the store's mutex held, so they must not
// call Store methods, and must not block on anything that may be waiting for
// the store.
type Hooks struct {
	// InUse reports whether a volume is currently exported to a client.
	InUse func(name string) bool
	// Resize, if set, performs the size change of the raw file (e.g. via the
	// open backend so its cached size follows). If it returns handled=false
	// the store truncates the file itself.
	Resize func(name string, size int64) (handled bool, err error)
}

// Store is an open data directory.
type Store struct {
	dir  string
	vdir string
	// fs is the filesystem seam every file operation of the store goes
	// through (vfs.OS in production, a vfs.MemFS in crash tests).
	fs      vfs.FS
	lock    vfs.File  // vmsan.lock: the pid (information)
	lfLock  io.Closer // its flock, for older vmsan versions
	dirLock io.Closer // the data directory's flock: the lock that counts

	mu        sync.Mutex
	hooks     Hooks
	closed    bool
	notices   []Notice
	idChanged map[string]bool
	// unverified holds volumes whose data identity Open could not check or
	// record: they are not served (CheckRaw) rather than served unchecked.
	unverified map[string]error
}

// Notice is something Open did or found that the operator should see in
// the log (the store has no logger of its own; the daemon logs these).
type Notice struct {
	Volume string // "" for the data directory as a whole
	Warn   bool   // warning (data safety) rather than information
	Msg    string
}

// dirMode and fileMode are what the store creates: owner-only.
const (
	dirMode  = 0o700
	fileMode = 0o600
)

// NoDataDirError returns ErrNoDataDir naming dir and how a data directory
// comes to be, for commands that only read or change existing volumes: a
// typo'd --data-dir must fail, not leave an empty directory behind.
func NoDataDirError(dir string) error {
	return fmt.Errorf("%w at %s (create it with `vmsan serve` or `vmsan volume create`)", ErrNoDataDir, dir)
}

// DataDirExists says whether dir is a data directory (it has the volumes
// subdirectory every Open creates).
func DataDirExists(dir string) bool {
	st, err := os.Stat(filepath.Join(dir, VolumesDir))
	return err == nil && st.IsDir()
}

// OpenExisting is Open for a data directory that must already exist: it
// returns NoDataDirError instead of creating one.
func OpenExisting(dir string) (*Store, error) {
	if dir != "" && !DataDirExists(dir) {
		return nil, NoDataDirError(dir)
	}
	return Open(dir)
}

// Open opens (creating if needed) the data directory dir and takes its lock.
// It removes leftover temporary metadata files, tightens permissions,
// converges resizes interrupted by a crash and checks every volume's data
// identity (see package doc and identity.go). A volume whose raw file is
// damaged does not make Open fail: CheckRaw reports it, so the other
// volumes can still be served.
func Open(dir string) (*Store, error) { return OpenFS(vfs.OS, dir) }

// OpenFS is Open on the filesystem fsys (a vfs.MemFS in crash tests).
// Every file operation of the store, metadata and raw files alike, goes
// through fsys; only the inode-level extras (reflink, SEEK_DATA, xattrs,
// inode generations) need a real file and are skipped on others.
func OpenFS(fsys vfs.FS, dir string) (*Store, error) {
	if dir == "" {
		return nil, errors.New("volume: empty data directory path")
	}
	vdir := filepath.Join(dir, VolumesDir)
	// Durably: a volumes/ whose entry a crash loses takes every volume's
	// metadata with it.
	if err := vfs.MkdirAllSync(fsys, vdir, dirMode); err != nil {
		return nil, fmt.Errorf("volume: create data directory: %w", err)
	}
	// The lock is a flock on the directory itself: it cannot be unlinked
	// away (removing vmsan.lock used to let a second daemon in), and the
	// kernel drops it when the process dies, so a crashed daemon never
	// leaves the directory locked.
	lockErr := func(err error) error {
		if errors.Is(err, vfs.ErrLocked) {
			pid, _ := vfs.ReadFile(fsys, filepath.Join(dir, LockFileName))
			p := strings.TrimSpace(string(pid))
			if p == "" {
				p = "unknown"
			}
			return fmt.Errorf("%w: %s (pid %s)", ErrLocked, dir, p)
		}
		return fmt.Errorf("volume: lock %s: %w", dir, err)
	}
	dl, err := fsys.Lock(dir)
	if err != nil {
		return nil, lockErr(err)
	}
	lf, err := fsys.OpenFile(filepath.Join(dir, LockFileName), os.O_RDWR|os.O_CREATE, fileMode)
	if err != nil {
		dl.Close()
		return nil, fmt.Errorf("volume: %w", err)
	}
	// Also flock the pid file: a vmsan from before the directory lock only
	// knows this one.
	lfl, err := fsys.Lock(filepath.Join(dir, LockFileName))
	if err != nil {
		lf.Close()
		dl.Close()
		return nil, lockErr(err)
	}
	lf.Truncate(0)
	lf.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	s := &Store{fs: fsys, dir: dir, vdir: vdir, lock: lf, lfLock: lfl, dirLock: dl, idChanged: map[string]bool{}, unverified: map[string]error{}}
	s.tightenAll()
	atomicfile.RemoveTempsFS(s.fs, vdir)
	s.removeSnapshotDebris()
	if err := s.reconcile(); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// Notices returns what Open did or found (permission changes, converged
// resizes, changed data identities), for the caller to log.
func (s *Store) Notices() []Notice {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Notice(nil), s.notices...)
}

// IdentityChanged reports whether this Store found, at Open or through
// Repair, that the volume's raw file is not the one its metadata recorded
// and gave it a new DataID. (Replication does not rely on this: it keeps
// the DataID it last saw, which survives a crash between the two.)
func (s *Store) IdentityChanged(name string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.idChanged[name]
}

func (s *Store) notice(vol string, warn bool, format string, args ...any) {
	s.notices = append(s.notices, Notice{Volume: vol, Warn: warn, Msg: fmt.Sprintf(format, args...)})
}

// reconcile converges resizes that a crash interrupted and checks data
// identities (see package doc). It never changes a raw file's contents or
// length except to finish an interrupted grow. It is best-effort per
// volume: a volume it cannot check is left for CheckRaw to report, so one
// damaged volume does not keep the others from being served.
func (s *Store) reconcile() error {
	ms, err := s.list()
	if err != nil && ms == nil {
		return err
	}
	// Volumes with unreadable metadata are skipped here; List reports them.
	for _, m := range ms {
		s.reconcileOne(m)
	}
	return nil
}

func (s *Store) reconcileOne(m Meta) {
	m = s.reconcileRollback(m)
	if m.Rollback != nil {
		return // CheckRaw reports it
	}
	p := s.RawPath(m.Name)
	st, err := s.fs.Lstat(p)
	if err != nil || !st.Mode().IsRegular() {
		return // CheckRaw reports it
	}
	if m.ResizeFrom != 0 {
		switch {
		case st.Size() == m.Size:
			// The file was resized; only clearing the mark was lost.
		case st.Size() == m.ResizeFrom && m.Size > m.ResizeFrom:
			// Interrupted grow: extending adds zeroes, loses nothing.
			if err := vfs.TruncateSync(s.fs, p, m.Size); err != nil {
				return
			}
			s.notice(m.Name, false, "completed a grow interrupted by a crash: %s extended from %d to %d bytes", p, m.ResizeFrom, m.Size)
		case st.Size() == m.ResizeFrom && m.Size < m.ResizeFrom:
			// Interrupted shrink: keep every byte, go back to the old size.
			s.notice(m.Name, true, "a shrink from %d to %d bytes was interrupted by a crash before the file was cut; the volume keeps its old size %d (repeat the resize)", m.ResizeFrom, m.Size, m.ResizeFrom)
			m.Size = m.ResizeFrom
		default:
			return // neither size: damage, CheckRaw reports it
		}
		m.ResizeFrom = 0
		if s.writeMeta(m) != nil {
			return
		}
	}
	if st.Size() != m.Size {
		return // CheckRaw reports it
	}
	// From here on, failing to check or record the identity must not let
	// the volume be served unchecked: replication would trust stale state.
	unverified := func(err error) {
		s.unverified[m.Name] = fmt.Errorf("volume %s: %w: cannot check the data identity of %s: %v", m.Name, ErrDamaged, p, err)
	}
	f, err := vfs.Open(s.fs, p)
	if err != nil {
		unverified(err)
		return
	}
	defer f.Close()
	if m.DataID == "" {
		// Metadata from before data identities: adopt this file.
		if err := newIdentity(f, &m); err != nil {
			unverified(err)
		} else if err := s.writeMeta(m); err != nil {
			unverified(err)
		} else {
			s.notice(m.Name, false, "recorded a data identity for %s (%s)", p, m.DataID)
		}
		return
	}
	ok, why, err := identityMatches(f, m)
	if err != nil {
		unverified(err)
		return
	}
	if ok {
		return
	}
	old := m.DataID
	if err := newIdentity(f, &m); err != nil {
		unverified(err)
		return
	}
	if err := s.writeMeta(m); err != nil {
		unverified(err)
		return
	}
	s.idChanged[m.Name] = true
	s.notice(m.Name, true, "raw file %s is not the file this volume last used (%s): it was replaced or recreated while vmsan was down; new data identity %s (was %s); a replicated volume resyncs in full from its peer", p, why, m.DataID, old)
}

// CheckRaw reports whether a volume's raw file can be served: nil, or an
// error wrapping ErrDamaged that names the file, the sizes and the repair
// command. It changes nothing.
func (s *Store) CheckRaw(name string) error {
	if err := ValidateName(name); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	m, err := s.get(name)
	if err != nil {
		return err
	}
	return s.checkRaw(m)
}

func (s *Store) checkRaw(m Meta) error {
	if err := s.unverified[m.Name]; err != nil {
		return err
	}
	p := s.RawPath(m.Name)
	st, err := s.fs.Lstat(p)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("volume %s: %w: %s is missing (the metadata says %d bytes); not serving it. "+
			"If its data is gone for good, create an empty (all-zero) file with: vmsan volume repair %s --recreate "+
			"(a replicated volume then resyncs in full from its peer)", m.Name, ErrDamaged, p, m.Size, m.Name)
	case err != nil:
		return fmt.Errorf("volume %s: %w: %s: %v", m.Name, ErrDamaged, p, err)
	case !st.Mode().IsRegular():
		return fmt.Errorf("volume %s: %w: %s is not a regular file (%s); not serving it", m.Name, ErrDamaged, p, st.Mode().Type())
	case st.Size() != m.Size:
		return fmt.Errorf("volume %s: %w: %s is %d bytes but the metadata says %d, which no interrupted vmsan operation leaves; not serving it. "+
			"Repair with one of: vmsan volume repair %s --use-file-size (the volume takes the file's size; no byte is lost), "+
			"or vmsan volume repair %s --use-metadata-size (the file is %s to %d bytes%s)",
			m.Name, ErrDamaged, p, st.Size(), m.Size, m.Name, m.Name,
			map[bool]string{true: "cut", false: "extended with zeroes"}[st.Size() > m.Size], m.Size,
			map[bool]string{true: ": destroys the data past that offset", false: ""}[st.Size() > m.Size])
	}
	return nil
}

// Close releases the directory lock.
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	// Closing the fds drops the flocks.
	err := s.lock.Close()
	if cerr := s.lfLock.Close(); err == nil {
		err = cerr
	}
	if cerr := s.dirLock.Close(); err == nil {
		err = cerr
	}
	return err
}

// Dir is the data directory.
func (s *Store) Dir() string { return s.dir }

// SetHooks installs h, replacing earlier hooks.
func (s *Store) SetHooks(h Hooks) {
	s.mu.Lock()
	s.hooks = h
	s.mu.Unlock()
}

// RawPath is the raw data file of a volume (whether or not it exists).
// REQUIRES: name passed ValidateName.
func (s *Store) RawPath(name string) string { return filepath.Join(s.vdir, name+rawExt) }

func (s *Store) metaPath(name string) string { return filepath.Join(s.vdir, name+metaExt) }

// StatePath is the per-volume state directory of volume name in the data
// directory dir (whether or not it exists), for tools that work without
// opening the store (e.g. `vmsan repl configure` while a daemon runs) and
// must agree with StateDir. It is deleted with the volume (Delete), and a
// leftover one without a volume is removed by Create.
func StatePath(dir, name string) (string, error) {
	if err := ValidateName(name); err != nil {
		return "", err
	}
	return filepath.Join(dir, VolumesDir, name+stateExt), nil
}

// StateVolumes returns the names of the volumes whose state directory holds
// rel (a path relative to it, e.g. "repl/config.json"), sorted. Volumes
// are not checked to exist: debris of a crashed Delete is listed too.
func StateVolumes(dir, rel string) []string {
	ents, err := os.ReadDir(filepath.Join(dir, VolumesDir))
	if err != nil {
		return nil
	}
	var out []string
	for _, e := range ents {
		name, ok := strings.CutSuffix(e.Name(), stateExt)
		if !ok || !e.IsDir() || ValidateName(name) != nil {
			continue
		}
		if _, err := os.Lstat(filepath.Join(dir, VolumesDir, e.Name(), rel)); err == nil {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out
}

// RemoveStateDebris removes the state directory of a volume that does not
// exist (after Delete, a subsystem that was still running may have written
// into it again; the daemon calls this once its plugins let go of the
// volume). It does nothing for an existing volume.
func (s *Store) RemoveStateDebris(name string) error {
	if err := ValidateName(name); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, err := s.fs.Stat(s.metaPath(name)); err == nil {
		return nil
	}
	return s.fs.RemoveAll(filepath.Join(s.vdir, name+stateExt))
}

// StateDir returns (creating it) a directory for other subsystems' per-volume
// state, e.g. replication bitmaps. It is deleted with the volume.
func (s *Store) StateDir(name string) (string, error) {
	if err := ValidateName(name); err != nil {
		return "", err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, err := s.get(name); err != nil {
		return "", err
	}
	d := filepath.Join(s.vdir, name+stateExt)
	if err := vfs.MkdirAllSync(s.fs, d, dirMode); err != nil {
		return "", err
	}
	return d, nil
}

func checkSize(size int64, lbs uint32) error {
	if size <= 0 {
		return fmt.Errorf("%w: %d bytes (must be > 0)", ErrBadSize, size)
	}
	if size > MaxSize {
		return fmt.Errorf("%w: %d bytes exceeds the maximum of 1 EiB", ErrBadSize, size)
	}
	if size%int64(lbs) != 0 {
		return fmt.Errorf("%w: %d bytes is not a multiple of the logical block size %d", ErrBadSize, size, lbs)
	}
	return nil
}

// sizeErr turns "the filesystem cannot hold a file this large" (EFBIG,
// or EINVAL from ftruncate) into ErrBadSize: a size within MaxSize can
// still be too large for the filesystem (ext4's limit is 16 TiB), and that
// is bad input, not a server failure.
func sizeErr(err error, size int64) error {
	if errors.Is(err, syscall.EFBIG) || errors.Is(err, syscall.EINVAL) {
		return fmt.Errorf("%w: the filesystem cannot hold a file of %d bytes (%s): %v", ErrBadSize, size, HumanSize(size), err)
	}
	return err
}

func validBlockSize(n uint32) bool { return n >= 512 && n <= 64<<10 && n&(n-1) == 0 }

// newMeta validates o and returns the metadata of a new volume.
func newMeta(o CreateOptions) (Meta, error) {
	if err := ValidateName(o.Name); err != nil {
		return Meta{}, err
	}
	if o.LogicalBlockSize == 0 {
		o.LogicalBlockSize = DefaultLogicalBlockSize
	}
	if o.PhysicalBlockSize == 0 {
		o.PhysicalBlockSize = DefaultPhysicalBlockSize
		if o.PhysicalBlockSize < o.LogicalBlockSize {
			o.PhysicalBlockSize = o.LogicalBlockSize
		}
	}
	if !validBlockSize(o.LogicalBlockSize) || !validBlockSize(o.PhysicalBlockSize) || o.PhysicalBlockSize < o.LogicalBlockSize {
		return Meta{}, fmt.Errorf("%w: block sizes %d/%d: want powers of two in [512, 65536] with logical <= physical", ErrInvalid, o.LogicalBlockSize, o.PhysicalBlockSize)
	}
	if err := checkSize(o.Size, o.LogicalBlockSize); err != nil {
		return Meta{}, err
	}
	cache, err := backend.ParseCacheMode(string(o.Cache))
	if err != nil {
		return Meta{}, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if len(o.Description) > MaxDescriptionLen {
		return Meta{}, fmt.Errorf("%w: description is %d bytes, at most %d allowed", ErrInvalid, len(o.Description), MaxDescriptionLen)
	}
	m := Meta{
		Version:           metaVersion,
		Name:              o.Name,
		UUID:              uuid.NewString(),
		Size:              o.Size,
		LogicalBlockSize:  o.LogicalBlockSize,
		PhysicalBlockSize: o.PhysicalBlockSize,
		Cache:             cache,
		Rotational:        o.Rotational,
		ReadOnly:          o.ReadOnly,
		Created:           time.Now().UTC().Truncate(time.Second),
		Description:       o.Description,
	}
	return m, nil
}

// Create makes a new thin volume: a sparse raw file of o.Size bytes (no
// blocks allocated) and its metadata.
func (s *Store) Create(o CreateOptions) (Meta, error) {
	m, err := newMeta(o)
	if err != nil {
		return Meta{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.prepareNewLocked(o.Name); err != nil {
		return Meta{}, err
	}
	f, err := s.fs.OpenFile(s.RawPath(o.Name), os.O_RDWR|os.O_CREATE|os.O_EXCL, fileMode)
	if err != nil {
		return Meta{}, fmt.Errorf("volume: create %s: %w", o.Name, err)
	}
	// Truncate (ftruncate) extends with a hole: thin provisioning for free.
	err = f.Truncate(o.Size)
	if err == nil {
		err = newIdentity(f, &m) // syncs
	}
	if err == nil {
		err = f.Sync()
	}
	f.Close()
	if err != nil {
		s.fs.Remove(s.RawPath(o.Name))
		return Meta{}, fmt.Errorf("volume: create %s: %w", o.Name, sizeErr(err, o.Size))
	}
	if err := s.writeMeta(m); err != nil {
		s.fs.Remove(s.RawPath(o.Name))
		return Meta{}, err
	}
	return m, nil
}

// prepareNewLocked checks that no volume name exists and removes the
// debris of an earlier one of that name. REQUIRES: s.mu held.
func (s *Store) prepareNewLocked(name string) error {
	if s.closed {
		return errors.New("volume: store closed")
	}
	if _, err := s.fs.Stat(s.metaPath(name)); err == nil {
		return fmt.Errorf("%w: %s", ErrExists, name)
	}
	// A raw file without metadata is crash debris (see package doc).
	// Remove it rather than reuse it (O_TRUNC): the new volume gets a new
	// inode (a new data identity), and the debris's mode does not carry over.
	s.fs.Remove(s.RawPath(name))
	// Likewise a state directory without metadata (a crash between Delete's
	// metadata removal and its state removal): a new volume must not inherit
	// a deleted one's replication settings or generations.
	if err := s.fs.RemoveAll(filepath.Join(s.vdir, name+stateExt)); err != nil {
		return fmt.Errorf("volume: create %s: remove leftover state: %w", name, err)
	}
	return nil
}

func (s *Store) writeMeta(m Meta) error {
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	b = append(b, '\n')
	if err := atomicfile.WriteFileFS(s.fs, s.metaPath(m.Name), b, fileMode); err != nil {
		return fmt.Errorf("volume %s: write metadata: %w", m.Name, err)
	}
	return nil
}

// maxMetaBytes bounds a metadata file read; real ones are ~400 bytes.
const maxMetaBytes = 1 << 20

func (s *Store) get(name string) (Meta, error) {
	p := s.metaPath(name)
	f, err := vfs.Open(s.fs, p)
	if errors.Is(err, fs.ErrNotExist) {
		return Meta{}, fmt.Errorf("%w: %s", ErrNotFound, name)
	}
	if err != nil {
		return Meta{}, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return Meta{}, err
	}
	if st.Size() > maxMetaBytes {
		return Meta{}, fmt.Errorf("volume %s: metadata file %s is %d bytes, larger than the %d allowed", name, p, st.Size(), maxMetaBytes)
	}
	b := make([]byte, st.Size())
	if _, err := f.ReadAt(b, 0); err != nil && st.Size() > 0 {
		return Meta{}, err
	}
	var m Meta
	if err := json.Unmarshal(b, &m); err != nil {
		return Meta{}, fmt.Errorf("volume %s: corrupt metadata %s: %w", name, p, err)
	}
	if m.Name != name {
		return Meta{}, fmt.Errorf("volume %s: metadata %s names volume %q", name, p, m.Name)
	}
	if m.LogicalBlockSize == 0 || checkSize(m.Size, m.LogicalBlockSize) != nil {
		return Meta{}, fmt.Errorf("volume %s: metadata %s has invalid size %d / block size %d", name, p, m.Size, m.LogicalBlockSize)
	}
	return m, nil
}

// Get returns a volume's metadata.
func (s *Store) Get(name string) (Meta, error) {
	if err := ValidateName(name); err != nil {
		return Meta{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.get(name)
}

func (s *Store) list() ([]Meta, error) {
	ents, err := s.fs.ReadDir(s.vdir)
	if err != nil {
		return nil, err
	}
	out := []Meta{}
	var errs []error
	for _, e := range ents {
		n := e.Name()
		if atomicfile.IsTemp(n) || !strings.HasSuffix(n, metaExt) || e.IsDir() {
			continue
		}
		name := strings.TrimSuffix(n, metaExt)
		if ValidateName(name) != nil {
			continue // not ours
		}
		m, err := s.get(name)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out = append(out, m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, errors.Join(errs...)
}

// List returns all volumes in name order. If some volumes' metadata cannot
// be read, it returns the readable ones together with an error naming the
// others (one bad file must not hide, or stop serving, every other volume);
// the slice is nil only when the directory itself cannot be read.
func (s *Store) List() ([]Meta, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.list()
}

// Resize changes a volume's size. Growing is always allowed (clients see the
// new size when they reconnect: NBD has no resize notification). Shrinking
// requires force.
func (s *Store) Resize(name string, size int64, force bool) (Meta, error) {
	if err := ValidateName(name); err != nil {
		return Meta{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	m, err := s.get(name)
	if err != nil {
		return Meta{}, err
	}
	if err := checkSize(size, m.LogicalBlockSize); err != nil {
		return Meta{}, err
	}
	if size == m.Size {
		return m, nil
	}
	if m.ReadOnly {
		// The daemon opens read-only volumes read-only, so it could not
		// resize the open file; refuse the same way with or without it.
		return Meta{}, fmt.Errorf("volume %s: %w", name, ErrReadOnly)
	}
	if size < m.Size && !force {
		return Meta{}, fmt.Errorf("volume %s: %w (%d -> %d bytes)", name, ErrShrink, m.Size, size)
	}
	// A damaged volume's file is not the size the metadata says: resizing
	// it would cut or extend bytes nobody asked about. Repair it first.
	if err := s.checkRaw(m); err != nil {
		return Meta{}, err
	}
	old := m
	m.Size, m.ResizeFrom = size, old.Size
	// Metadata first, with the old size: it is the commit point, and the
	// mark lets Open tell an interrupted resize from damage.
	if err := s.writeMeta(m); err != nil {
		return Meta{}, err
	}
	handled := false
	if s.hooks.Resize != nil {
		handled, err = s.hooks.Resize(name, size)
	}
	if err == nil && !handled {
		err = vfs.TruncateSync(s.fs, s.RawPath(name), size)
	} else if err == nil {
		// The new size must be durable before the mark is cleared: a
		// crash that kept the cleared mark but lost the size change
		// would leave a file of a size no vmsan operation gives it.
		err = s.syncFile(s.RawPath(name))
	}
	if err != nil {
		// Put the old size back so metadata and file agree again.
		s.writeMeta(old)
		return Meta{}, fmt.Errorf("volume %s: resize: %w", name, sizeErr(err, size))
	}
	m.ResizeFrom = 0
	// If clearing the mark fails, the file already has the new size and
	// Open clears it (size == Size): the resize did happen.
	s.writeMeta(m)
	return m, nil
}

// syncFile fsyncs the file p (an fsync through any descriptor makes the
// inode's size durable, whoever changed it).
func (s *Store) syncFile(p string) error {
	f, err := vfs.Open(s.fs, p)
	if err != nil {
		return err
	}
	err = f.Sync()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// Update changes mutable metadata fields (cache mode, rotational, read-only,
// description) through fn. Name, UUID, size, block sizes, creation time and
// data identity cannot be changed this way. Open exports keep their old settings until the
// volume is reopened.
func (s *Store) Update(name string, fn func(*Meta) error) (Meta, error) {
	if err := ValidateName(name); err != nil {
		return Meta{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	m, err := s.get(name)
	if err != nil {
		return Meta{}, err
	}
	n := m
	if err := fn(&n); err != nil {
		return Meta{}, err
	}
	n.Name, n.UUID, n.Size, n.LogicalBlockSize, n.PhysicalBlockSize, n.Created, n.Version =
		m.Name, m.UUID, m.Size, m.LogicalBlockSize, m.PhysicalBlockSize, m.Created, m.Version
	n.ResizeFrom, n.DataID, n.DataFile, n.Rollback = m.ResizeFrom, m.DataID, m.DataFile, m.Rollback
	if n.Cache, err = backend.ParseCacheMode(string(n.Cache)); err != nil {
		return Meta{}, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if len(n.Description) > MaxDescriptionLen {
		return Meta{}, fmt.Errorf("%w: volume %s: description is %d bytes, at most %d allowed", ErrInvalid, name, len(n.Description), MaxDescriptionLen)
	}
	if err := s.writeMeta(n); err != nil {
		return Meta{}, err
	}
	return n, nil
}

// Delete removes a volume and its data. It refuses (ErrInUse) while the
// volume is exported, unless force.
func (s *Store) Delete(name string, force bool) error {
	if err := ValidateName(name); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, err := s.get(name); err != nil {
		return err
	}
	if !force && s.hooks.InUse != nil && s.hooks.InUse(name) {
		return fmt.Errorf("volume %s: %w", name, ErrInUse)
	}
	if err := s.snapshotsBlockDelete(name, force); err != nil {
		return err
	}
	// Metadata first: once it is gone the volume does not exist, whatever
	// else a crash leaves behind.
	if err := s.fs.Remove(s.metaPath(name)); err != nil {
		return fmt.Errorf("volume %s: %w", name, err)
	}
	if err := atomicfile.SyncDirFS(s.fs, s.vdir); err != nil {
		return err
	}
	s.fs.Remove(s.RawPath(name))
	s.fs.RemoveAll(filepath.Join(s.vdir, name+stateExt))
	delete(s.unverified, name)
	delete(s.idChanged, name)
	return nil
}

// ReadMeta reads a volume's metadata from the data directory dir without
// opening the store or taking its lock: for tools that only need to know
// that a volume exists (e.g. `vmsan repl configure`) while a daemon may be
// running. Safe because metadata files are only ever replaced atomically.
func ReadMeta(dir, name string) (Meta, error) {
	if err := ValidateName(name); err != nil {
		return Meta{}, err
	}
	s := &Store{fs: vfs.OS, dir: dir, vdir: filepath.Join(dir, VolumesDir)}
	return s.get(name)
}
