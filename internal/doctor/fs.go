package doctor

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/vmsan/vmsan/internal/atomicfile"
	"github.com/vmsan/vmsan/internal/backend"
	"github.com/vmsan/vmsan/internal/volume"
)

// Filesystem magics (statfs f_type) the checks distinguish.
const (
	magicExt4    = 0xEF53
	magicXFS     = 0x58465342
	magicBtrfs   = 0x9123683E
	magicZFS     = 0x2FC12FC1
	magicF2FS    = 0xF2F52010
	magicTmpfs   = 0x01021994
	magicRamfs   = 0x858458F6
	magicOverlay = 0x794C7630
	magicNFS     = 0x6969
	magicCIFS    = 0xFF534D42
	magicSMB2    = 0xFE534D42
	magicFUSE    = 0x65735546
	magicCeph    = 0x00C36400
)

var fsNames = map[int64]string{
	magicExt4: "ext2/3/4", magicXFS: "xfs", magicBtrfs: "btrfs", magicZFS: "zfs", magicF2FS: "f2fs",
	magicTmpfs: "tmpfs", magicRamfs: "ramfs", magicOverlay: "overlay", magicNFS: "nfs",
	magicCIFS: "cifs", magicSMB2: "smb2", magicFUSE: "fuse", magicCeph: "ceph",
}

func fsName(t int64) string {
	if n, ok := fsNames[t]; ok {
		return n
	}
	return fmt.Sprintf("unknown (magic 0x%x)", t)
}

const gib = 1 << 30

func human(b int64) string {
	switch {
	case b >= 1<<40:
		return fmt.Sprintf("%.1f TiB", float64(b)/(1<<40))
	case b >= gib:
		return fmt.Sprintf("%.1f GiB", float64(b)/gib)
	case b >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20))
	}
	return fmt.Sprintf("%d KiB", b>>10)
}

func (e *env) fsChecks() []Result {
	return []Result{e.fsTypeCheck(), e.barrierCheck(), e.directIOCheck()}
}

func (e *env) fsTypeCheck() Result {
	r := Result{Check: "fs.type", Subject: e.probe, Status: OK}
	if e.fsErr != nil {
		return unreadable("fs.type", e.probe, e.fsErr)
	}
	name := fsName(e.fs.Type)
	r.Evidence = name
	switch e.fs.Type {
	case magicTmpfs, magicRamfs:
		r.Status = Fail
		r.Evidence += ": memory-backed, every volume is lost at reboot"
		r.Fix = "move the data directory to a disk filesystem (ext4 or xfs) and start vmsan with --data-dir there"
	case magicOverlay:
		r.Status = Warn
		r.Evidence += ": a container's writable layer (copy-up, no O_DIRECT on older kernels, lost with the container)"
		r.Fix = "mount a host directory or volume on ext4/xfs at the data directory (e.g. docker run -v /var/lib/vmsan:/var/lib/vmsan)"
	case magicNFS, magicCIFS, magicSMB2, magicFUSE, magicCeph:
		r.Status = Warn
		r.Evidence += ": a network or user-space filesystem under a SAN adds a second network hop and its own caching and locking semantics"
		r.Fix = "keep the data directory on a local disk filesystem (ext4 or xfs)"
	case magicBtrfs:
		r.Evidence += ": copy-on-write"
		var cow []string
		vdir := filepath.Join(e.dir, volume.VolumesDir)
		if e.h.NoCOW == nil {
			r.Status = Warn
			r.Evidence += "; cannot read file attributes: " + errNotAvailable.Error()
			r.Fix = "chattr +C " + vdir + " before creating volumes"
			return r
		}
		if nc, err := e.h.NoCOW(vdir); err == nil && nc {
			r.Evidence += "; " + vdir + " has +C (new volume files are created no-COW)"
		} else if len(e.vols) == 0 {
			cow = append(cow, vdir)
		}
		for _, v := range e.vols {
			if nc, err := e.h.NoCOW(v.raw); err != nil || !nc {
				cow = append(cow, v.meta.Name)
			}
		}
		if len(cow) > 0 {
			r.Status = Warn
			r.Evidence += "; without +C (nodatacow): " + strings.Join(cow, ", ") + ": every random guest write relocates a block, fragmenting the raw file, and checksums cost CPU"
			r.Fix = "chattr +C " + vdir + " (applies to files created afterwards; an existing volume must be copied into the +C directory while not exported: cp --sparse=always NAME.raw NAME.new && mv NAME.new NAME.raw)"
		}
	}
	return r
}

// barrierCheck: with nobarrier the filesystem drops the cache flushes
// that make fdatasync durable, so every cache mode behaves like unsafe on
// a disk with a volatile write cache.
func (e *env) barrierCheck() Result {
	if e.mnt == nil {
		return unreadable("fs.barrier", e.probe, e.mntErr)
	}
	r := Result{Check: "fs.barrier", Subject: e.mnt.Point, Status: OK,
		Evidence: fmt.Sprintf("%s %s on %s", e.mnt.FSType, e.mnt.Source, e.mnt.Point)}
	if o := e.mnt.hasOption("nobarrier", "barrier=0"); o != "" {
		r.Status = Fail
		r.Evidence += ", mounted " + o + ": fdatasync no longer flushes the disk's write cache, so a guest FLUSH is acknowledged before the data is stable"
		r.Fix = fmt.Sprintf("mount -o remount,barrier %s (ext4: barrier=1) and remove %s from its /etc/fstab line", e.mnt.Point, o)
		return r
	}
	r.Evidence += " (flushes reach the disk)"
	return r
}

// directIOCheck: cache=none opens volume files with O_DIRECT, which some
// filesystems refuse (EINVAL at open), so such a volume cannot be
// exported at all.
func (e *env) directIOCheck() Result {
	var none []vol
	for _, v := range e.vols {
		if cacheOf(v.meta) == backend.CacheNone {
			none = append(none, v)
		}
	}
	r := Result{Check: "fs.o_direct", Subject: e.probe, Status: OK}
	if e.h.DirectIO == nil {
		return unreadable("fs.o_direct", e.probe, errNotAvailable)
	}
	if len(none) == 0 && !e.dirFound {
		// Probing would mean creating a file outside any data directory.
		r.Evidence = "no data directory yet: not probed"
		return r
	}
	var err error
	if len(none) > 0 {
		r.Subject = none[0].meta.Name
		err = e.h.DirectIO(none[0].raw, false)
	} else {
		err = e.h.DirectIO(e.dir, true)
	}
	if err == nil {
		if len(none) > 0 {
			r.Evidence = fmt.Sprintf("O_DIRECT open and aligned read work (%d volume(s) use cache=none)", len(none))
		} else {
			r.Evidence = "O_DIRECT works here (no volume uses cache=none yet)"
		}
		return r
	}
	r.Evidence = "O_DIRECT: " + err.Error()
	if len(none) > 0 {
		r.Status = Fail
		var names, fixes []string
		for _, v := range none {
			names = append(names, v.meta.Name)
			fixes = append(fixes, fmt.Sprintf("vmsan volume set %s --cache writeback", v.meta.Name))
		}
		r.Evidence += "; cache=none volumes cannot be opened: " + strings.Join(names, ", ")
		r.Fix = strings.Join(fixes, "; ") + " (or move the data directory to ext4/xfs)"
		return r
	}
	r.Status = Warn
	r.Evidence += "; volumes here cannot use cache=none"
	r.Fix = "create volumes with --cache writeback, or move the data directory to ext4/xfs"
	return r
}

// maxExtentsPerGiB: past this (an average extent under 4 MiB) sequential
// guest I/O turns into seeks on a rotational disk and into more metadata
// lookups everywhere. A file written sequentially on ext4/xfs has well
// under 16 extents per GiB.
const (
	maxExtentsPerGiB = 256
	minFragAllocated = 256 << 20 // below this the ratio says nothing
)

func (e *env) volumeChecks() []Result {
	if len(e.vols) == 0 {
		return []Result{
			{Check: "volume.fragmentation", Status: OK, Evidence: "no volumes"},
			{Check: "volume.cache", Status: OK, Evidence: "no volumes"},
		}
	}
	var rs []Result
	for _, v := range e.vols {
		rs = append(rs, e.fragCheck(v))
	}
	for _, v := range e.vols {
		rs = append(rs, e.cacheCheck(v))
	}
	return rs
}

func (e *env) defragFix(raw string) string {
	switch e.fs.Type {
	case magicExt4:
		return "e4defrag " + raw
	case magicXFS:
		return "xfs_fsr -v " + raw
	case magicBtrfs:
		return "btrfs filesystem defragment " + raw + " (breaks reflinks/snapshot sharing); chattr +C keeps it from recurring"
	}
	return fmt.Sprintf("copy it while not exported: cp --sparse=always %s %s.new && mv %s.new %s", raw, raw, raw, raw)
}

func (e *env) fragCheck(v vol) Result {
	r := Result{Check: "volume.fragmentation", Subject: v.meta.Name, Status: OK}
	if v.stErr != nil {
		return unreadable(r.Check, v.meta.Name, v.stErr)
	}
	if e.h.Extents == nil {
		return unreadable(r.Check, v.meta.Name, errNotAvailable)
	}
	n, err := e.h.Extents(v.raw)
	if err != nil {
		return unreadable(r.Check, v.meta.Name, err)
	}
	r.Evidence = fmt.Sprintf("%d extents in %s allocated (of %s)", n, human(v.st.Allocated), human(v.meta.Size))
	if v.st.Allocated < minFragAllocated {
		r.Evidence += "; too little allocated to judge"
		return r
	}
	per := float64(n) / (float64(v.st.Allocated) / gib)
	r.Evidence += fmt.Sprintf(" = %.0f per GiB (average extent %s)", per, human(v.st.Allocated/int64(max(n, 1))))
	if per <= maxExtentsPerGiB {
		return r
	}
	r.Status = Warn
	r.Evidence += fmt.Sprintf("; above %d per GiB, sequential guest I/O becomes scattered disk I/O", maxExtentsPerGiB)
	r.Fix = e.defragFix(v.raw) + "; to avoid it for a new volume, preallocate: fallocate -l SIZE " + v.raw
	return r
}

// cacheCheck: what a guest's FLUSH means for each volume.
func (e *env) cacheCheck(v vol) Result {
	c := cacheOf(v.meta)
	r := Result{Check: "volume.cache", Subject: v.meta.Name, Status: OK, Evidence: "cache=" + string(c)}
	switch c {
	case backend.CacheNone:
		r.Evidence += ": O_DIRECT, a guest FLUSH becomes fdatasync (durable, no host page cache)"
	case backend.CacheWritethrough:
		r.Evidence += ": O_DSYNC, every write is durable when acknowledged"
	case backend.CacheWriteback:
		r.Evidence += ": host page cache, a guest FLUSH becomes fdatasync (durable once the guest flushes)"
	case backend.CacheUnsafe:
		if v.meta.ReadOnly {
			r.Evidence += " (read-only, nothing to lose)"
			return r
		}
		r.Status = Warn
		r.Evidence += ": FLUSH and FUA are ignored; a host crash or power loss can lose or corrupt data the guest believes is on disk"
		r.Fix = fmt.Sprintf("vmsan volume set %s --cache writeback (keep unsafe only for scratch volumes and benchmarks)", v.meta.Name)
		return r
	default:
		r.Status = Warn
		r.Evidence += ": unknown cache mode"
		r.Fix = fmt.Sprintf("vmsan volume set %s --cache writeback", v.meta.Name)
		return r
	}
	for _, rp := range e.repls {
		if rp.Volume == v.meta.Name && strings.EqualFold(rp.Protocol, "A") {
			r.Status = Warn
			r.Evidence += "; replicated with protocol A: a write is acknowledged before the peer has it, so losing this node loses the writes in flight"
			r.Fix = fmt.Sprintf("vmsan repl configure %s ... --protocol C (or accept the loss window deliberately)", v.meta.Name)
		}
	}
	return r
}

func (e *env) thinChecks() []Result {
	return []Result{e.overcommitCheck(), e.trendCheck()}
}

// overcommitCheck: a sparse volume can grow up to its size; when the sum
// of what the volumes can still grow exceeds the free space, guests
// writing into holes get ENOSPC, which they see as I/O errors.
func (e *env) overcommitCheck() Result {
	r := Result{Check: "thin.overcommit", Subject: e.probe, Status: OK}
	if e.fsErr != nil {
		return unreadable(r.Check, e.probe, e.fsErr)
	}
	free := int64(e.fs.Bavail) * e.fs.Bsize
	total := int64(e.fs.Blocks) * e.fs.Bsize
	var size, alloc, growth int64
	for _, v := range e.vols {
		size += v.meta.Size
		if v.stErr == nil {
			alloc += v.st.Allocated
			if g := v.meta.Size - v.st.Allocated; g > 0 {
				growth += g
			}
		} else {
			growth += v.meta.Size // unknown allocation: assume it can all grow
		}
	}
	r.Evidence = fmt.Sprintf("%d volume(s): %s provisioned, %s allocated; %s free of %s",
		len(e.vols), human(size), human(alloc), human(free), human(total))
	if growth == 0 {
		return r
	}
	ratio := float64(growth) / float64(max(free, 1))
	r.Evidence += fmt.Sprintf("; the volumes can still grow by %s (%.2f× free space)", human(growth), ratio)
	if ratio <= e.o.OvercommitWarn {
		return r
	}
	r.Status = Warn
	if growth > free && total > 0 && free*20 < total {
		r.Status = Fail
		r.Evidence += "; less than 5% free: guests writing into unallocated space will get I/O errors soon"
	}
	r.Fix = fmt.Sprintf("add space to the filesystem under %s or move volumes elsewhere; to guarantee one volume its space, preallocate it (keeps its data): fallocate -l SIZE %s/volumes/NAME.raw", e.probe, e.dir)
	return r
}

// HistoryFile is the name, in the data directory, of the free-space
// samples kept for thin.trend when Options.History is set.
const HistoryFile = "doctor-history.json"

type sample struct {
	T     time.Time `json:"t"`
	Avail int64     `json:"avail"`
}

const (
	maxSamples     = 200
	minSampleGap   = time.Minute // repeated runs within a minute add no sample
	minTrendSpan   = time.Hour   // shorter spans say nothing about a trend
	trendWindow    = 30 * 24 * time.Hour
	trendWarnAhead = 30 * 24 * time.Hour
	trendFailAhead = 3 * 24 * time.Hour
)

func (e *env) trendCheck() Result {
	r := Result{Check: "thin.trend", Subject: e.dir, Status: OK}
	if !e.o.History {
		r.Evidence = "history disabled"
		return r
	}
	if !e.dirFound {
		r.Evidence = "no data directory to keep history in"
		return r
	}
	if e.fsErr != nil {
		return unreadable(r.Check, e.dir, e.fsErr)
	}
	p := filepath.Join(e.dir, HistoryFile)
	var hist []sample
	if err := readJSON(p, &hist); err != nil {
		hist = nil // missing or damaged: start again
	}
	now := e.h.now()
	avail := int64(e.fs.Bavail) * e.fs.Bsize
	if n := len(hist); n == 0 || now.Sub(hist[n-1].T) >= minSampleGap {
		hist = append(hist, sample{T: now, Avail: avail})
	}
	if len(hist) > maxSamples {
		hist = hist[len(hist)-maxSamples:]
	}
	b, _ := json.Marshal(hist)
	werr := atomicfile.WriteFile(p, b, 0o600)
	var old *sample
	for i := range hist {
		if now.Sub(hist[i].T) <= trendWindow {
			old = &hist[i]
			break
		}
	}
	span := time.Duration(0)
	if old != nil {
		span = now.Sub(old.T)
	}
	if span < minTrendSpan {
		r.Evidence = fmt.Sprintf("%d sample(s) over %v: run vmsan doctor again later (e.g. daily from cron) to see a trend", len(hist), span.Round(time.Second))
		if werr != nil {
			r.Status = Warn
			r.Evidence += "; cannot record a sample: " + werr.Error()
			r.Fix = "run vmsan doctor as the user owning " + e.dir
		}
		return r
	}
	used := old.Avail - avail
	perDay := float64(used) / span.Hours() * 24
	r.Evidence = fmt.Sprintf("free %s now, %s on %s: ", human(avail), human(old.Avail), old.T.UTC().Format("2006-01-02 15:04"))
	if used <= 0 {
		r.Evidence += "free space stable or growing"
		return r
	}
	left := time.Duration(float64(avail) / perDay * float64(24*time.Hour))
	r.Evidence += fmt.Sprintf("%s used per day, full in about %.1f days", human(int64(perDay)), left.Hours()/24)
	switch {
	case left < trendFailAhead:
		r.Status = Fail
	case left < trendWarnAhead:
		r.Status = Warn
	default:
		return r
	}
	r.Fix = fmt.Sprintf("add space to the filesystem under %s, move volumes elsewhere, or trim inside the guests (fstrim; vmsan punches holes on TRIM)", e.dir)
	return r
}
