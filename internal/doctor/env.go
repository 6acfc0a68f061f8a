package doctor

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/vmsan/vmsan/internal/backend"
	"github.com/vmsan/vmsan/internal/replset"
	"github.com/vmsan/vmsan/internal/volume"
)

// env is what several checks share: the data directory, its volumes, its
// mount and filesystem, gathered once per Run.
type env struct {
	h Host
	o Options

	dir      string // the data directory as given, made absolute
	probe    string // dir, or its nearest existing ancestor
	dirFound bool

	vols    []vol
	volErrs []string
	repls   []Repl

	mnt    *mountEntry
	mntErr error
	fs     FSStat
	fsErr  error

	peerProbe probe
}

// vol is one volume of the data directory.
type vol struct {
	meta  volume.Meta
	raw   string
	st    FileStat
	stErr error
}

// maxMetaSize bounds a metadata file read: a real one is a few hundred
// bytes, so anything larger is not ours.
const maxMetaSize = 1 << 20

func newEnv(h Host, o Options) *env {
	e := &env{h: h, o: o}
	dir := o.DataDir
	if dir == "" {
		dir = "."
	}
	if a, err := filepath.Abs(dir); err == nil {
		dir = a
	}
	if r, err := filepath.EvalSymlinks(dir); err == nil {
		dir = r
	}
	e.dir = dir
	// The device and filesystem checks still make sense before the data
	// directory exists (checking a host before installing): use the
	// filesystem it would be created on.
	e.probe = dir
	for {
		if fi, err := os.Stat(e.probe); err == nil && fi.IsDir() {
			break
		}
		parent := filepath.Dir(e.probe)
		if parent == e.probe {
			break
		}
		e.probe = parent
	}
	e.dirFound = e.probe == dir
	if e.dirFound {
		e.loadVolumes()
		e.loadRepl()
	}
	e.repls = append(e.repls, o.Repl...)
	e.mnt, e.mntErr = findMount(h, e.probe)
	if h.Statfs == nil {
		e.fsErr = errNotAvailable
	} else {
		e.fs, e.fsErr = h.Statfs(e.probe)
	}
	return e
}

var errNotAvailable = fmt.Errorf("not available on this platform")

func (e *env) loadVolumes() {
	names, _ := filepath.Glob(filepath.Join(e.dir, volume.VolumesDir, "*.json"))
	sort.Strings(names)
	for _, p := range names {
		var m volume.Meta
		if err := readJSON(p, &m); err != nil {
			e.volErrs = append(e.volErrs, fmt.Sprintf("%s: %v", filepath.Base(p), err))
			continue
		}
		// The raw file is named after the metadata file, not after the
		// name inside it: a damaged name must not point us elsewhere.
		base := strings.TrimSuffix(filepath.Base(p), ".json")
		if m.Name == "" {
			m.Name = base
		}
		v := vol{meta: m, raw: volume.RawFile(e.dir, base)}
		if e.h.Stat == nil {
			v.stErr = errNotAvailable
		} else {
			v.st, v.stErr = e.h.Stat(v.raw)
		}
		e.vols = append(e.vols, v)
	}
}

// loadRepl reads every volume's replication settings (config.json in
// repl/ of the volume's state directory, or in the old
// <data_dir>/repl/<volume> that the next `vmsan serve` moves there;
// replset.DecodeStored reads both the duration and the older tick
// layout), with the settings' defaults. Doctor reads the files the
// replication driver writes and imports no driver.
func (e *env) loadRepl() {
	type found struct{ vol, path string }
	var names []found
	seen := map[string]bool{}
	for _, v := range volume.StateVolumes(e.dir, filepath.Join("repl", "config.json")) {
		sd, err := volume.StatePath(e.dir, v)
		if err != nil {
			continue // StateVolumes lists only valid names
		}
		names = append(names, found{v, filepath.Join(sd, "repl", "config.json")})
		seen[v] = true
	}
	old, _ := filepath.Glob(filepath.Join(e.dir, "repl", "*", "config.json"))
	for _, p := range old {
		if v := filepath.Base(filepath.Dir(p)); !seen[v] {
			names = append(names, found{v, p})
		}
	}
	sort.Slice(names, func(i, j int) bool { return names[i].vol < names[j].vol })
	for _, f := range names {
		p := f.path
		b, err := readFile(p)
		var s replset.Settings
		if err == nil {
			s, err = replset.DecodeStored(b)
		}
		if err != nil {
			e.volErrs = append(e.volErrs, fmt.Sprintf("replication settings of %s: %v", f.vol, err))
			continue
		}
		s = s.WithDefaults()
		e.repls = append(e.repls, Repl{
			Volume:      f.vol,
			Listen:      s.Listen,
			Peer:        s.Peer,
			Protocol:    s.Protocol,
			PingTimeout: time.Duration(s.PingTimeout),
			KoTimeout:   time.Duration(s.KoTimeout),
			ResyncRate:  s.ResyncRate,
		})
	}
}

// readFile reads a small metadata file, refusing one larger than
// maxMetaSize.
func readFile(p string) ([]byte, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxMetaSize+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxMetaSize {
		return nil, fmt.Errorf("larger than %d bytes", maxMetaSize)
	}
	return b, nil
}

func readJSON(p string, v any) error {
	b, err := readFile(p)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}

func orString(v, d string) string {
	if v == "" {
		return d
	}
	return v
}

// cacheOf returns a volume's effective cache mode ("" means writeback, as
// in backend.ParseCacheMode).
func cacheOf(m volume.Meta) backend.CacheMode {
	if m.Cache == "" {
		return backend.CacheWriteback
	}
	return m.Cache
}

func (e *env) dataDirCheck() Result {
	r := Result{Check: "datadir", Subject: e.dir, Status: OK}
	if !e.dirFound {
		r.Evidence = fmt.Sprintf("does not exist; device and filesystem checks use %s, where it would be created", e.probe)
		if e.o.DataDirGiven {
			// Named on purpose: most likely a typo, and every check of
			// volumes would pass vacuously on it.
			r.Status = Fail
			r.Evidence = "does not exist (no volumes to check)"
			r.Fix = "check the path (vmsan serve --data-dir DIR or vmsan volume create --data-dir DIR creates a data directory); without --data-dir doctor checks the host for ./vmsan-data before it exists"
		}
		return r
	}
	var caches []string
	for _, v := range e.vols {
		caches = append(caches, v.meta.Name+"="+string(cacheOf(v.meta)))
	}
	r.Evidence = fmt.Sprintf("%d volume(s)", len(e.vols))
	if len(caches) > 0 {
		r.Evidence += " (" + strings.Join(caches, ", ") + ")"
	}
	if len(e.repls) > 0 {
		r.Evidence += fmt.Sprintf(", %d replication setting(s)", len(e.repls))
	}
	if len(e.volErrs) > 0 {
		r.Status = Warn
		r.Evidence += "; unreadable: " + strings.Join(e.volErrs, "; ")
		r.Fix = "inspect or restore the unreadable metadata files (vmsan ignores a volume whose .json it cannot parse)"
	}
	return r
}

// mountEntry is one line of /proc/self/mountinfo.
type mountEntry struct {
	Major, Minor uint32
	Point        string
	FSType       string
	Source       string
	Options      string // per-mount and per-superblock options, comma-joined
}

// findMount returns the mount whose mount point is the longest prefix of
// path, from <Root>/proc/self/mountinfo.
func findMount(h Host, path string) (*mountEntry, error) {
	s, err := h.readFileN("/proc/self/mountinfo", 4<<20)
	if err != nil {
		return nil, err
	}
	var best *mountEntry
	for _, line := range strings.Split(s, "\n") {
		m, ok := parseMountinfo(line)
		if !ok || !pathWithin(path, m.Point) {
			continue
		}
		// Later lines win ties: a mount stacked on the same point hides
		// the earlier one.
		if best == nil || len(m.Point) >= len(best.Point) {
			mm := m
			best = &mm
		}
	}
	if best == nil {
		return nil, fmt.Errorf("no mount contains %s", path)
	}
	return best, nil
}

func pathWithin(p, dir string) bool {
	if dir == "/" {
		return strings.HasPrefix(p, "/")
	}
	return p == dir || strings.HasPrefix(p, dir+"/")
}

// parseMountinfo parses "36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3
// /dev/root rw,errors=continue" (proc(5)).
func parseMountinfo(line string) (mountEntry, bool) {
	f := strings.Fields(line)
	sep := -1
	for i, x := range f {
		if x == "-" && i >= 6 {
			sep = i
			break
		}
	}
	if sep < 0 || len(f) < sep+3 {
		return mountEntry{}, false
	}
	var m mountEntry
	mm := strings.SplitN(f[2], ":", 2)
	if len(mm) != 2 {
		return m, false
	}
	a, err1 := strconv.ParseUint(mm[0], 10, 32)
	b, err2 := strconv.ParseUint(mm[1], 10, 32)
	if err1 != nil || err2 != nil {
		return m, false
	}
	m.Major, m.Minor = uint32(a), uint32(b)
	m.Point = unescapeMount(f[4])
	m.FSType = f[sep+1]
	m.Source = unescapeMount(f[sep+2])
	m.Options = f[5]
	if len(f) > sep+3 {
		m.Options += "," + f[sep+3]
	}
	return m, true
}

// unescapeMount undoes the kernel's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func (m *mountEntry) hasOption(opts ...string) string {
	for _, o := range strings.Split(m.Options, ",") {
		for _, want := range opts {
			if o == want {
				return o
			}
		}
	}
	return ""
}

// readFileN is readFile with a caller-chosen bound (mountinfo can be long
// on a host with many containers).
func (h Host) readFileN(p string, limit int64) (string, error) {
	f, err := os.Open(h.path(p))
	if err != nil {
		return "", err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, limit))
	return string(b), err
}
