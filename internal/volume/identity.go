package volume

import (
	"errors"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/google/uuid"

	"github.com/vmsan/vmsan/internal/vfs"
)

// Data identity.
//
// A volume's metadata can outlive its raw file: an operator (or a script,
// or a restore) may delete, replace or swap the .raw while vmsan is down.
// The store must notice, because replication trusts that the bytes on disk
// are the bytes it last wrote: a replica whose file was replaced would
// otherwise reconnect as "UpToDate, 0 B out of sync" holding other data.
//
// Each volume therefore has a data identity, Meta.DataID: a random UUID
// naming "this raw file, as vmsan last knew it". It is tied to the file in
// two independent ways, recorded in Meta.DataFile:
//
//   - the UUID itself, in the extended attribute user.vmsan.id of the raw
//     file, where the filesystem supports user xattrs (ext4, xfs, btrfs,
//     and tmpfs since Linux 6.6). A file created by someone else has no
//     such attribute; another volume's file has a different one;
//   - the inode: its number, its generation (FS_IOC_GETVERSION: ext4, xfs
//     and btrfs give every new inode a new one, so a deleted-and-recreated
//     file that reuses the inode number still differs) and its birth time
//     (statx), each compared only where the filesystem reports it both times.
//
// Open compares both with what the metadata recorded. Any difference, or a
// missing attribute that was set, means the file is not the one vmsan knew:
// Open gives the volume a new DataID (recorded durably before the volume is
// served) and reports it (Notices, IdentityChanged). The check is
// deliberately conservative: copying a data directory to another
// filesystem also counts as a new identity (new inodes), which costs a full
// resync of a replicated volume, never a wrong "in sync".
//
// What it cannot see: bytes changed in place inside the same file (writing
// to the .raw behind vmsan's back, restoring a filesystem snapshot that
// rolls the inode back with its xattrs). After such an operation run
// `vmsan volume repair NAME --new-identity`.

// dataIDXattr holds the DataID on the raw file.
const dataIDXattr = "user.vmsan.id"

// FileID fingerprints the inode of a volume's raw file (see Data identity).
// Zero fields were not reported by the filesystem and are not compared.
type FileID struct {
	Ino uint64 `json:"ino"`
	// Gen is the inode generation (FS_IOC_GETVERSION); HasGen says the
	// filesystem reported one.
	Gen    uint32 `json:"gen,omitempty"`
	HasGen bool   `json:"has_gen,omitempty"`
	// BirthNs is the inode's birth time (statx btime), 0 when unknown.
	BirthNs int64 `json:"birth_ns,omitempty"`
	// Xattr is true when the DataID was stored in the file's user.vmsan.id
	// extended attribute (the filesystem supports user xattrs).
	Xattr bool `json:"xattr,omitempty"`
}

// fsIocGetVersion is FS_IOC_GETVERSION, _IOR('v', 1, long) (asm-generic
// ioctl encoding: direction read = 2 in the top two bits). Architectures
// with another encoding just get ENOTTY and no generation.
var fsIocGetVersion = uint(2<<30 | uint(unsafe.Sizeof(uintptr(0)))<<16 | 'v'<<8 | 1)

// fingerprint reads f's inode identity (not the xattr flag).
func fingerprint(vf vfs.File) (FileID, error) {
	f, ok := vfs.OSFile(vf)
	if !ok {
		// A file of another FS (crash tests): its inode number, unique
		// for the life of that FS, is all there is.
		ino, ok := vfs.InoOf(vf)
		if !ok {
			return FileID{}, errors.New("volume: file has no inode identity")
		}
		return FileID{Ino: ino}, nil
	}
	fd := int(f.Fd())
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return FileID{}, err
	}
	id := FileID{Ino: st.Ino}
	if g, err := unix.IoctlGetUint32(fd, fsIocGetVersion); err == nil {
		id.Gen, id.HasGen = g, true
	}
	var sx unix.Statx_t
	if err := unix.Statx(fd, "", unix.AT_EMPTY_PATH, unix.STATX_BTIME, &sx); err == nil && sx.Mask&unix.STATX_BTIME != 0 {
		id.BirthNs = sx.Btime.Sec*1e9 + int64(sx.Btime.Nsec)
	}
	return id, nil
}

// readDataXattr returns the user.vmsan.id attribute; ok=false with a nil
// error means the filesystem does not support user xattrs.
func readDataXattr(vf vfs.File) (val string, supported bool, err error) {
	f, ok := vfs.OSFile(vf)
	if !ok {
		return "", false, nil // no xattrs on other filesystems
	}
	buf := make([]byte, 128)
	n, err := unix.Fgetxattr(int(f.Fd()), dataIDXattr, buf)
	switch {
	case err == nil:
		return string(buf[:n]), true, nil
	case errors.Is(err, unix.ENODATA):
		return "", true, nil
	case errors.Is(err, unix.ENOTSUP), errors.Is(err, unix.EOPNOTSUPP):
		return "", false, nil
	case errors.Is(err, unix.ERANGE):
		return "<oversized>", true, nil // not ours: no match
	}
	return "", false, err
}

// identityMatches reports whether f is the file m's identity describes.
// REQUIRES: m.DataID != "".
func identityMatches(f vfs.File, m Meta) (bool, string, error) {
	cur, err := fingerprint(f)
	if err != nil {
		return false, "", err
	}
	rec := m.DataFile
	switch {
	case cur.Ino != rec.Ino:
		return false, "inode number changed", nil
	case rec.HasGen && cur.HasGen && rec.Gen != cur.Gen:
		return false, "inode generation changed", nil
	case rec.BirthNs != 0 && cur.BirthNs != 0 && rec.BirthNs != cur.BirthNs:
		return false, "file birth time changed", nil
	}
	if rec.Xattr {
		v, _, err := readDataXattr(f)
		if err != nil {
			return false, "", err
		}
		if v != m.DataID {
			return false, "user.vmsan.id attribute is missing or differs", nil
		}
	}
	return true, "", nil
}

// newIdentity gives the file behind f a fresh DataID: the xattr first, then
// the caller writes the metadata. A crash in between leaves an xattr the
// metadata does not name, which the next Open treats as a mismatch and
// re-identifies again: it converges, erring on the side of "changed".
func newIdentity(f vfs.File, m *Meta) error {
	id := uuid.NewString()
	fid, err := fingerprint(f)
	if err != nil {
		return err
	}
	// Any failure to set the attribute (unsupported, or refused, e.g. a
	// filesystem mounted without user_xattr) leaves the inode fingerprint
	// alone to identify the file.
	if of, ok := vfs.OSFile(f); ok {
		if err := unix.Fsetxattr(int(of.Fd()), dataIDXattr, []byte(id), 0); err == nil {
			fid.Xattr = true
		}
	}
	if fid.Xattr {
		// The attribute must be durable before the metadata names it.
		if err := f.Sync(); err != nil {
			return err
		}
	}
	m.DataID, m.DataFile = id, fid
	return nil
}
