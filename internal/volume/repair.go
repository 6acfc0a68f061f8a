package volume

import (
	"errors"
	"fmt"
	"io/fs"
	"os"

	"github.com/vmsan/vmsan/internal/vfs"
)

// RepairMode says how Repair makes a damaged volume servable again. Every
// mode gives the volume a new data identity, because the data was changed
// outside vmsan: a replicated volume then resyncs in full from its peer.
type RepairMode string

const (
	// RepairRecreate creates a missing raw file, empty (all zeroes) at the
	// metadata size.
	RepairRecreate RepairMode = "recreate"
	// RepairUseFileSize sets the metadata size to the raw file's size
	// (which must be a positive multiple of the logical block size). No
	// byte of the file is lost.
	RepairUseFileSize RepairMode = "use-file-size"
	// RepairUseMetadataSize extends (with zeroes) or cuts the raw file to
	// the metadata size; cutting destroys the data past it.
	RepairUseMetadataSize RepairMode = "use-metadata-size"
	// RepairNewIdentity only gives the volume a new data identity, for a
	// file changed in place behind vmsan's back (e.g. a snapshot restore),
	// which Open cannot detect.
	RepairNewIdentity RepairMode = "new-identity"
)

// Repair makes a damaged volume servable again (see the package doc and
// CheckRaw). It refuses modes that do not fit the damage, e.g. recreate
// when the raw file exists. It refuses while the volume is exported.
func (s *Store) Repair(name string, mode RepairMode) (Meta, error) {
	if err := ValidateName(name); err != nil {
		return Meta{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return Meta{}, errors.New("volume: store closed")
	}
	m, err := s.get(name)
	if err != nil {
		return Meta{}, err
	}
	if s.hooks.InUse != nil && s.hooks.InUse(name) {
		return Meta{}, fmt.Errorf("volume %s: %w", name, ErrInUse)
	}
	p := s.RawPath(name)
	st, err := s.fs.Lstat(p)
	missing := errors.Is(err, fs.ErrNotExist)
	if err != nil && !missing {
		return Meta{}, fmt.Errorf("volume %s: %w", name, err)
	}
	if !missing && !st.Mode().IsRegular() {
		return Meta{}, fmt.Errorf("volume %s: %s is not a regular file; move it away, then repair with --recreate: %w", name, p, ErrInvalid)
	}
	if missing && mode != RepairRecreate {
		return Meta{}, fmt.Errorf("volume %s: %s is missing; only --recreate can repair that: %w", name, p, ErrInvalid)
	}
	var f vfs.File
	switch mode {
	case RepairRecreate:
		if !missing {
			return Meta{}, fmt.Errorf("volume %s: %s exists; --recreate only replaces a missing file (see --use-file-size, --use-metadata-size): %w", name, p, ErrInvalid)
		}
		if f, err = s.fs.OpenFile(p, os.O_RDWR|os.O_CREATE|os.O_EXCL, fileMode); err == nil {
			err = f.Truncate(m.Size)
		}
	case RepairUseFileSize:
		if err = checkSize(st.Size(), m.LogicalBlockSize); err != nil {
			return Meta{}, fmt.Errorf("volume %s: the file's size cannot be the volume's (use --use-metadata-size): %w", name, err)
		}
		m.Size = st.Size()
		f, err = s.fs.OpenFile(p, os.O_RDWR, 0)
	case RepairUseMetadataSize:
		if f, err = s.fs.OpenFile(p, os.O_RDWR, 0); err == nil {
			err = f.Truncate(m.Size)
		}
	case RepairNewIdentity:
		if st.Size() != m.Size {
			return Meta{}, fmt.Errorf("volume %s: %s is %d bytes, the metadata says %d: repair the size first (--use-file-size or --use-metadata-size): %w", name, p, st.Size(), m.Size, ErrInvalid)
		}
		f, err = s.fs.OpenFile(p, os.O_RDWR, 0)
	default:
		return Meta{}, fmt.Errorf("volume %s: unknown repair mode %q: %w", name, mode, ErrInvalid)
	}
	if f != nil {
		defer f.Close()
	}
	if err == nil {
		err = f.Sync()
	}
	if err == nil {
		err = newIdentity(f, &m)
	}
	if err != nil {
		if mode == RepairRecreate && f != nil {
			s.fs.Remove(p)
		}
		return Meta{}, fmt.Errorf("volume %s: repair: %w", name, err)
	}
	m.ResizeFrom = 0
	if err := s.writeMeta(m); err != nil {
		return Meta{}, err
	}
	delete(s.unverified, name)
	s.idChanged[name] = true
	return m, nil
}
