package driver

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"syscall"

	"github.com/vmsan/vmsan/internal/atomicfile"
	"github.com/vmsan/vmsan/internal/repl"
	"github.com/vmsan/vmsan/internal/replset"
	"github.com/vmsan/vmsan/internal/vfs"
	"github.com/vmsan/vmsan/internal/volume"
)

// Settings are a replicated volume's configuration (replset.Settings),
// stored as config.json in the volume's replication directory (Dir;
// written by `vmsan repl configure` or from the configuration file), with
// the node's NodeID.
type Settings = replset.Settings

// Dir is where a volume's replication files live: repl/ in the volume's
// state directory (volume.StatePath), so deleting the volume deletes them.
// REQUIRES: name passed volume.ValidateName (Configure checks it; other
// callers only read, and the store validates before acting).
func Dir(dataDir, name string) string {
	return filepath.Join(dataDir, volume.VolumesDir, name+volume.StateExt, "repl")
}

// LoadSettings reads config.json; os.ErrNotExist means "not replicated".
// A file written before settings were durations (tick_ms and counts of
// ticks) is read as the same times.
func LoadSettings(dir string) (Settings, error) {
	var s Settings
	b, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		return s, err
	}
	if s, err = DecodeSettings(b); err != nil {
		return s, fmt.Errorf("%s: %w", dir, err)
	}
	return s, validateStored(s)
}

// DecodeSettings decodes a config.json, either layout (without validating:
// LoadSettings does). It is replset.DecodeStored.
func DecodeSettings(b []byte) (Settings, error) { return replset.DecodeStored(b) }

// validateStored checks settings as stored: valid, and with a node id.
func validateStored(s Settings) error {
	if err := s.Validate(); err != nil {
		return err
	}
	if s.NodeID == 0 {
		return errors.New("repl: node_id must be set")
	}
	return nil
}

// SaveSettings writes config.json atomically.
func SaveSettings(dir string, s Settings) error {
	if err := validateStored(s); err != nil {
		return err
	}
	if err := vfs.MkdirAllSync(vfs.OS, dir, dirMode); err != nil {
		return err
	}
	b, _ := json.MarshalIndent(s, "", "  ")
	return atomicfile.WriteFile(filepath.Join(dir, "config.json"), append(b, '\n'), fileMode)
}

// Replication state is as private as the volume it describes (the volume
// store's modes; volume.Open tightens older files).
const (
	dirMode  = 0o700
	fileMode = 0o600
)

// checkDataID compares the data identity the persisted state was written
// for with the volume's current one (volume.Meta.DataID). If they differ,
// the raw file was replaced (deleted and recreated, swapped, repaired)
// while replication was not running: generations, bitmap and activity log
// describe data that is gone. The node then starts as a never-synced
// secondary (generation 0, Inconsistent), so the handshake makes it a full
// sync target of its peer (rule 20) instead of "UpToDate, 0 B out of sync".
// An empty recorded identity (state from before identities, or a first
// start) is adopted as is. The new identity is persisted with the reset
// state by the node's first metadata write; a crash before that repeats
// the reset, never skips it.
func checkDataID(m repl.Meta, words []uint64, al []int64, found bool, id string, log *slog.Logger) (repl.Meta, []uint64, []int64) {
	if id == "" {
		return m, words, al
	}
	if found && m.DataID != "" && m.DataID != id {
		log.Warn("the volume's data file was replaced since replication last ran: local data is Inconsistent and will be fully resynced from the peer",
			"data_id", id, "recorded_data_id", m.DataID, "gens_were", m.Gens.String(), "disk_was", m.Disk.String(), "role_was", m.Role.String())
		// Clean=false: the node rewrites bitmap and AL (now empty) at once.
		m = repl.Meta{NodeID: m.NodeID, Disk: repl.Inconsistent, Role: repl.Secondary}
		words, al = nil, nil
	}
	m.DataID = id
	return m, words, al
}

// state is the persisted replication state: meta.json and bitmap.bin,
// each replaced atomically (temp, fsync, rename, fsync dir), and the
// activity log al.bin, updated in place (see alFile) because it changes on
// the write path. All three go through the filesystem seam fs (nil: the
// real filesystem), so crash tests can run them on a vfs.MemFS.
type state struct {
	fs     vfs.FS
	dir    string
	al     *alFile
	lastBM []uint64 // last bitmap written (skip identical rewrites)
}

func (s *state) fsys() vfs.FS {
	if s.fs == nil {
		return vfs.OS
	}
	return s.fs
}

func (s *state) load() (m repl.Meta, words []uint64, al []int64, found bool, err error) {
	b, err := vfs.ReadFile(s.fsys(), filepath.Join(s.dir, "meta.json"))
	if errors.Is(err, os.ErrNotExist) {
		return m, nil, nil, false, nil
	}
	if err != nil {
		return m, nil, nil, false, err
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return m, nil, nil, false, fmt.Errorf("meta.json: %w", err)
	}
	if al, err = loadAL(s.fsys(), s.dir); err != nil {
		return m, nil, nil, false, err
	}
	if b, err := vfs.ReadFile(s.fsys(), filepath.Join(s.dir, "bitmap.bin")); err == nil {
		if len(b)%8 != 0 {
			return m, nil, nil, false, errors.New("bitmap.bin: length not a multiple of 8")
		}
		words = make([]uint64, len(b)/8)
		for i := range words {
			words[i] = binary.LittleEndian.Uint64(b[i*8:])
		}
	}
	return m, words, al, true, nil
}

// persist writes what p says changed. Order matters for crash safety: the
// bitmap before the AL (an AL that drops an extent must never be on disk
// without the bitmap covering that extent's dirty chunks), and meta last.
func (s *state) persist(p repl.Persist) error {
	if p.BitmapChanged && s.lastBM != nil && slices.Equal(s.lastBM, p.Bitmap) {
		p.BitmapChanged = false // e.g. AL retirement with nothing out of sync
	}
	if p.BitmapChanged {
		b := make([]byte, 8*len(p.Bitmap))
		for i, w := range p.Bitmap {
			binary.LittleEndian.PutUint64(b[i*8:], w)
		}
		if err := atomicfile.WriteFileFS(s.fsys(), filepath.Join(s.dir, "bitmap.bin"), b, fileMode); err != nil {
			return err
		}
		s.lastBM = p.Bitmap
	}
	if p.ALChanged {
		if err := s.al.write(p.AL); err != nil {
			return err
		}
	}
	if p.Meta != nil {
		b, _ := json.MarshalIndent(p.Meta, "", "  ")
		if err := atomicfile.WriteFileFS(s.fsys(), filepath.Join(s.dir, "meta.json"), b, fileMode); err != nil {
			return err
		}
	}
	return nil
}

// alFile is the activity log on disk: two fixed-size slots written
// alternately in place, each with a sequence number and a CRC, followed by
// one fdatasync. A torn write can only damage the slot being written; the
// other still holds the previous AL, which is a superset of what is safe to
// forget (the new AL is persisted before any write to a new extent). That
// is one small write + one fdatasync per AL change, instead of the
// temp+fsync+rename+dir-fsync of an atomic file replace.
//
// Slot: magic "VMAL" u32 | seq u64 | count u32 | overflow u8 | pad [3] |
// crc32c(entries) u32 | entries count × u64 (little endian).
type alFile struct {
	f   vfs.File
	seq uint64
}

const (
	alMagic      = 0x564d414c
	alSlotSize   = 64 << 10
	alHeader     = 24
	alMaxEntries = (alSlotSize - alHeader) / 8
)

var crcTable = crc32.MakeTable(crc32.Castagnoli)

func openALFile(dir string) (*alFile, error) { return openALFileFS(vfs.OS, dir) }

// openALFileFS opens (creating) al.bin on fsys. A new file's name is made
// durable at once: a later fdatasync of its slots would not cover it.
func openALFileFS(fsys vfs.FS, dir string) (*alFile, error) {
	p := filepath.Join(dir, "al.bin")
	_, statErr := fsys.Stat(p)
	f, err := fsys.OpenFile(p, os.O_RDWR|os.O_CREATE, fileMode)
	if err != nil {
		return nil, err
	}
	if errors.Is(statErr, os.ErrNotExist) {
		if err := fsys.SyncDir(dir); err != nil {
			f.Close()
			return nil, err
		}
	}
	a := &alFile{f: f}
	if _, seq, ok := readALSlots(f); ok {
		a.seq = seq
	}
	return a, nil
}

func (a *alFile) write(ext []int64) error {
	a.seq++
	b := make([]byte, alHeader+8*min(len(ext), alMaxEntries))
	binary.LittleEndian.PutUint32(b[0:], alMagic)
	binary.LittleEndian.PutUint64(b[4:], a.seq)
	n := min(len(ext), alMaxEntries)
	binary.LittleEndian.PutUint32(b[12:], uint32(n))
	if len(ext) > alMaxEntries {
		b[16] = 1 // overflow: after a crash, treat the whole volume as hot
	}
	for i := 0; i < n; i++ {
		binary.LittleEndian.PutUint64(b[alHeader+8*i:], uint64(ext[i]))
	}
	binary.LittleEndian.PutUint32(b[20:], crc32.Checksum(b[alHeader:], crcTable))
	if _, err := a.f.WriteAt(b, int64(a.seq%2)*alSlotSize); err != nil {
		// A retry (transient error: metahold.go) must rewrite this slot,
		// not the other, which holds the last good AL.
		a.seq--
		return err
	}
	var err error
	if of, ok := vfs.OSFile(a.f); ok {
		err = syscall.Fdatasync(int(of.Fd()))
	} else {
		err = a.f.Sync()
	}
	if err != nil {
		a.seq--
	}
	return err
}

func (a *alFile) close() error { return a.f.Close() }

// readALSlots returns the newest valid slot's extents (nil extents and
// overflow=true are reported as a single -1 entry).
func readALSlots(f vfs.File) (ext []int64, seq uint64, ok bool) {
	for slot := int64(0); slot < 2; slot++ {
		h := make([]byte, alHeader)
		if _, err := f.ReadAt(h, slot*alSlotSize); err != nil {
			continue
		}
		if binary.LittleEndian.Uint32(h[0:]) != alMagic {
			continue
		}
		s := binary.LittleEndian.Uint64(h[4:])
		n := binary.LittleEndian.Uint32(h[12:])
		if n > alMaxEntries || (ok && s <= seq) {
			continue
		}
		body := make([]byte, 8*int(n))
		if _, err := f.ReadAt(body, slot*alSlotSize+alHeader); err != nil && n > 0 {
			continue
		}
		if crc32.Checksum(body, crcTable) != binary.LittleEndian.Uint32(h[20:]) {
			continue
		}
		e := make([]int64, n)
		for i := range e {
			e[i] = int64(binary.LittleEndian.Uint64(body[8*i:]))
		}
		if h[16] == 1 {
			e = []int64{-1}
		}
		ext, seq, ok = e, s, true
	}
	return ext, seq, ok
}

// LoadAL returns the persisted activity log's extents (4 MiB each). A
// single -1 means the AL overflowed: the whole volume counts as hot.
func LoadAL(dir string) ([]int64, error) { return loadAL(vfs.OS, dir) }

func loadAL(fsys vfs.FS, dir string) ([]int64, error) {
	f, err := vfs.Open(fsys, filepath.Join(dir, "al.bin"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	ext, _, _ := readALSlots(f)
	return ext, nil
}
