package doctor

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/vmsan/vmsan/internal/backend"
	"github.com/vmsan/vmsan/internal/ioengine"
)

// blockDev is the block device stack under the data directory: top is the
// whole device the filesystem sits on (a disk, dm-N or mdN; a partition is
// replaced by its disk), leaves are the devices at the bottom of any
// device-mapper or md stack (the disks that really do the I/O). Both are
// sysfs directories below Host.Root.
type blockDev struct {
	part   string // partition name, "" when the filesystem is on a whole device
	top    string
	leaves []string
}

func devName(sysdir string) string { return filepath.Base(sysdir) }

// readSys reads a sysfs attribute by its already-resolved path.
func readSys(p string) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, 64<<10))
	return strings.TrimSpace(string(b)), err
}

// resolveBlock finds the device under the data directory: st_dev →
// /sys/dev/block/MAJ:MIN; when that is an anonymous device (major 0:
// btrfs subvolumes, overlay, tmpfs, NFS) the mount's source device is used
// when it is a /dev path.
func (e *env) resolveBlock() (*blockDev, error) {
	var major, minor uint32
	if e.h.Stat != nil {
		if st, err := e.h.Stat(e.probe); err == nil {
			major, minor = st.Major, st.Minor
		}
	}
	if major == 0 && e.mnt != nil {
		major, minor = e.mnt.Major, e.mnt.Minor
	}
	var dir string
	if major != 0 {
		if d, err := filepath.EvalSymlinks(e.h.path(fmt.Sprintf("/sys/dev/block/%d:%d", major, minor))); err == nil {
			dir = d
		}
	}
	if dir == "" && e.mnt != nil && strings.HasPrefix(e.mnt.Source, "/dev/") {
		name := filepath.Base(e.mnt.Source)
		if strings.HasPrefix(e.mnt.Source, "/dev/mapper/") {
			name = e.dmByName(name)
		}
		if d, err := filepath.EvalSymlinks(e.h.path("/sys/class/block/" + name)); err == nil && name != "" {
			dir = d
		}
	}
	if dir == "" {
		src := "unknown"
		if e.mnt != nil {
			src = fmt.Sprintf("%s from %q", e.mnt.FSType, e.mnt.Source)
		} else if e.mntErr != nil {
			src = e.mntErr.Error()
		}
		return nil, fmt.Errorf("no block device under %s (device %d:%d, %s)", e.probe, major, minor, src)
	}
	b := &blockDev{top: dir}
	if _, err := os.Stat(filepath.Join(dir, "partition")); err == nil {
		b.part = devName(dir)
		b.top = filepath.Dir(dir)
	}
	seen := map[string]bool{}
	b.leaves = slaves(b.top, 0, seen)
	return b, nil
}

// dmByName maps a /dev/mapper name to its dm-N by reading dm/name of every
// dm device.
func (e *env) dmByName(name string) string {
	ds, _ := filepath.Glob(e.h.path("/sys/block/dm-*"))
	for _, d := range ds {
		if n, err := readSys(filepath.Join(d, "dm", "name")); err == nil && n == name {
			return filepath.Base(d)
		}
	}
	return ""
}

// slaves returns the bottom devices under dir (dir itself when it has no
// slaves). Depth and a seen set bound the walk on a malformed tree.
func slaves(dir string, depth int, seen map[string]bool) []string {
	if seen[dir] {
		return nil
	}
	seen[dir] = true
	ents, _ := os.ReadDir(filepath.Join(dir, "slaves"))
	if len(ents) == 0 || depth >= 8 {
		return []string{dir}
	}
	var out []string
	for _, en := range ents {
		d, err := filepath.EvalSymlinks(filepath.Join(dir, "slaves", en.Name()))
		if err != nil {
			continue
		}
		if _, err := os.Stat(filepath.Join(d, "partition")); err == nil {
			d = filepath.Dir(d)
		}
		out = append(out, slaves(d, depth+1, seen)...)
	}
	if len(out) == 0 {
		return []string{dir}
	}
	return out
}

func (e *env) blockChecks() []Result {
	b, err := e.resolveBlock()
	if err != nil {
		return []Result{{Check: "block.device", Subject: e.probe, Status: Warn, Evidence: err.Error(),
			Fix: "keep the data directory on a local disk's filesystem (ext4 or xfs) so the device can be tuned; the block.* checks are skipped"}}
	}
	var leafNames []string
	for _, l := range b.leaves {
		leafNames = append(leafNames, devName(l))
	}
	ev := devName(b.top)
	if b.part != "" {
		ev = b.part + " on " + ev
	}
	if dm, err := readSys(filepath.Join(b.top, "dm", "name")); err == nil {
		ev += " (" + dm + ")"
	}
	if len(b.leaves) > 1 || b.leaves[0] != b.top {
		ev += " over " + strings.Join(leafNames, ", ")
	}
	for _, l := range b.leaves {
		if bf, err := readSys(filepath.Join(l, "loop", "backing_file")); err == nil {
			ev += "; " + devName(l) + " is a loop device over " + bf + " (its queue settings matter less than those of the disk under that file)"
		}
	}
	rs := []Result{{Check: "block.device", Subject: e.probe, Status: OK, Evidence: ev}}
	for _, l := range b.leaves {
		rs = append(rs, e.rotationalCheck(l), e.schedulerCheck(l))
	}
	rs = append(rs, e.readAheadCheck(b.top))
	for _, l := range b.leaves {
		rs = append(rs, e.nrRequestsCheck(l), e.maxSectorsCheck(l), e.writeCacheCheck(l))
	}
	return rs
}

func isRotational(dir string) (bool, string, error) {
	s, err := readSys(filepath.Join(dir, "queue", "rotational"))
	return s == "1", s, err
}

func unreadable(check, dev string, err error) Result {
	return Result{Check: check, Subject: dev, Status: Warn, Evidence: "cannot read: " + err.Error(),
		Fix: "run vmsan doctor on the host itself (not in a container without /sys) to check this"}
}

func (e *env) rotationalCheck(dir string) Result {
	dev := devName(dir)
	rot, s, err := isRotational(dir)
	if err != nil {
		return unreadable("block.rotational", dev, err)
	}
	r := Result{Check: "block.rotational", Subject: dev, Status: OK, Evidence: "queue/rotational=" + s}
	var wrong []string
	for _, v := range e.vols {
		if v.meta.Rotational != rot {
			wrong = append(wrong, v.meta.Name)
		}
	}
	if len(wrong) == 0 {
		if len(e.vols) > 0 {
			r.Evidence += fmt.Sprintf("; every volume advertises rotational=%v", rot)
		}
		return r
	}
	r.Status = Warn
	r.Evidence += fmt.Sprintf("; volume(s) %s advertise rotational=%v: the guest picks its I/O scheduler and merging for the wrong kind of disk",
		strings.Join(wrong, ", "), !rot)
	var fixes []string
	for _, n := range wrong {
		fixes = append(fixes, fmt.Sprintf("vmsan volume set %s --rotational=%v", n, rot))
	}
	r.Fix = strings.Join(fixes, "; ") + " (the guest sees it at its next connect)"
	return r
}

// activeScheduler parses "[mq-deadline] kyber bfq none".
func activeScheduler(s string) (active string, avail []string) {
	for _, f := range strings.Fields(s) {
		if strings.HasPrefix(f, "[") && strings.HasSuffix(f, "]") {
			f = strings.Trim(f, "[]")
			active = f
		}
		avail = append(avail, f)
	}
	if active == "" && len(avail) == 1 {
		active = avail[0]
	}
	return active, avail
}

func udevRule(dev, attr, val string) string {
	return fmt.Sprintf(`persist with a udev rule: ACTION=="add|change", KERNEL=="%s", ATTR{queue/%s}="%s"`, dev, attr, val)
}

func (e *env) schedulerCheck(dir string) Result {
	dev := devName(dir)
	s, err := readSys(filepath.Join(dir, "queue", "scheduler"))
	if err != nil {
		return Result{Check: "block.scheduler", Subject: dev, Status: OK, Evidence: "no queue/scheduler (bio-based device, no I/O scheduler)"}
	}
	rot, _, _ := isRotational(dir)
	active, avail := activeScheduler(s)
	r := Result{Check: "block.scheduler", Subject: dev, Status: OK, Evidence: "scheduler " + s}
	if bf, err := readSys(filepath.Join(dir, "loop", "backing_file")); err == nil {
		// A loop device hands its I/O to a file; the disk under that file
		// does the scheduling that matters.
		r.Evidence += "; loop device over " + bf + ": the disk under that file schedules the I/O"
		return r
	}
	want := ""
	switch {
	case rot && active == "none":
		// A disk that seeks needs its requests sorted and merged; with
		// several guests interleaving sequential streams "none" turns them
		// into random I/O.
		want = "mq-deadline"
		if !contains(avail, want) && contains(avail, "bfq") {
			want = "bfq"
		}
		r.Evidence += "; rotational disk without an I/O scheduler: interleaved guest streams reach the disk unsorted"
	case !rot && active == "bfq":
		// bfq's per-request accounting caps a flash device's IOPS; vmsan's
		// engine already merges and the guests schedule their own I/O.
		want = "none"
		r.Evidence += "; bfq on a non-rotational device costs CPU per request and caps IOPS"
	}
	if want == "" {
		return r
	}
	r.Status = Warn
	r.Fix = fmt.Sprintf("echo %s > /sys/block/%s/queue/scheduler; %s", want, dev, udevRule(dev, "scheduler", want))
	return r
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

func readInt(p string) (int64, string, error) {
	s, err := readSys(p)
	if err != nil {
		return 0, s, err
	}
	n, err := strconv.ParseInt(s, 10, 64)
	return n, s, err
}

// Read-ahead bounds. Above maxReadAheadKB every small random guest read
// through the page cache (cache=writeback/writethrough) can drag in that
// much; below minReadAheadKB a rotational disk serves a sequential guest
// read as many small I/Os.
const (
	maxReadAheadKB = 4096
	minReadAheadKB = 128
)

func (e *env) readAheadCheck(dir string) Result {
	dev := devName(dir)
	ra, s, err := readInt(filepath.Join(dir, "queue", "read_ahead_kb"))
	if err != nil {
		return unreadable("block.read_ahead_kb", dev, err)
	}
	r := Result{Check: "block.read_ahead_kb", Subject: dev, Status: OK, Evidence: "read_ahead_kb=" + s}
	var cached []string
	for _, v := range e.vols {
		if cacheOf(v.meta) != backend.CacheNone {
			cached = append(cached, v.meta.Name)
		}
	}
	if len(e.vols) > 0 && len(cached) == 0 {
		r.Evidence += "; every volume uses cache=none (O_DIRECT bypasses read-ahead)"
		return r
	}
	rot, _, _ := isRotational(dir)
	want := int64(0)
	switch {
	case ra > maxReadAheadKB:
		want = 512
		if !rot {
			want = 128
		}
		r.Evidence += fmt.Sprintf("; above %d KiB, each random guest read through the page cache can read %d KiB from the disk", maxReadAheadKB, ra)
	case rot && ra < minReadAheadKB:
		want = 512
		r.Evidence += "; a rotational disk serves sequential guest reads through the page cache as small I/Os"
	}
	if want == 0 {
		return r
	}
	r.Status = Warn
	r.Fix = fmt.Sprintf("echo %d > /sys/block/%s/queue/read_ahead_kb (or blockdev --setra %d /dev/%s); %s",
		want, dev, want*2, dev, udevRule(dev, "read_ahead_kb", strconv.FormatInt(want, 10)))
	return r
}

// minNrRequests: vmsan's engine keeps several requests per volume in
// flight and merges adjacent ones; a shallower queue serialises them.
const minNrRequests = 32

func (e *env) nrRequestsCheck(dir string) Result {
	dev := devName(dir)
	n, s, err := readInt(filepath.Join(dir, "queue", "nr_requests"))
	if err != nil {
		return unreadable("block.nr_requests", dev, err)
	}
	r := Result{Check: "block.nr_requests", Subject: dev, Status: OK, Evidence: "nr_requests=" + s}
	if n >= minNrRequests {
		return r
	}
	r.Status = Warn
	r.Evidence += fmt.Sprintf("; below %d, concurrent guest I/O waits for a request slot instead of reaching the disk's queue", minNrRequests)
	r.Fix = fmt.Sprintf("echo 128 > /sys/block/%s/queue/nr_requests; %s", dev, udevRule(dev, "nr_requests", "128"))
	return r
}

// wantMaxSectorsKB is the engine's default merge limit (1 MiB): a smaller
// max_sectors_kb splits every merged request again.
const wantMaxSectorsKB = ioengine.DefaultMaxMergeBytes >> 10

func (e *env) maxSectorsCheck(dir string) Result {
	dev := devName(dir)
	n, s, err := readInt(filepath.Join(dir, "queue", "max_sectors_kb"))
	if err != nil {
		return unreadable("block.max_sectors_kb", dev, err)
	}
	r := Result{Check: "block.max_sectors_kb", Subject: dev, Status: OK, Evidence: "max_sectors_kb=" + s}
	want := int64(wantMaxSectorsKB)
	if hw, hs, err := readInt(filepath.Join(dir, "queue", "max_hw_sectors_kb")); err == nil {
		r.Evidence += ", max_hw_sectors_kb=" + hs
		if hw < want {
			want = hw
		}
	}
	if n >= want {
		return r
	}
	r.Status = Warn
	r.Evidence += fmt.Sprintf("; the engine merges up to %d KiB, the kernel splits at %d KiB", wantMaxSectorsKB, n)
	r.Fix = fmt.Sprintf("echo %d > /sys/block/%s/queue/max_sectors_kb; %s", want, dev, udevRule(dev, "max_sectors_kb", strconv.FormatInt(want, 10)))
	return r
}

// writeCacheCheck compares the disk's write cache with the volumes' cache
// modes. A volatile ("write back") cache is safe with every mode but
// unsafe, because vmsan turns a guest FLUSH into fdatasync, which the
// kernel turns into a cache flush. The cost is the point here:
// cache=writethrough opens the file O_DSYNC, so every single write waits
// for a flush of that cache, which on a spinning disk is a rotation or
// more per write.
func (e *env) writeCacheCheck(dir string) Result {
	dev := devName(dir)
	wc, err := readSys(filepath.Join(dir, "queue", "write_cache"))
	if err != nil {
		return unreadable("block.write_cache", dev, err)
	}
	r := Result{Check: "block.write_cache", Subject: dev, Status: OK, Evidence: "write_cache=" + wc}
	if wc != "write back" {
		r.Evidence += "; no volatile cache: writes are stable when the disk completes them"
		return r
	}
	r.Evidence += "; volatile cache, emptied by the FLUSH vmsan issues on a guest FLUSH/FUA"
	rot, _, _ := isRotational(dir)
	var wt, unsafe []string
	for _, v := range e.vols {
		switch cacheOf(v.meta) {
		case backend.CacheWritethrough:
			wt = append(wt, v.meta.Name)
		case backend.CacheUnsafe:
			unsafe = append(unsafe, v.meta.Name)
		}
	}
	var fixes []string
	if len(unsafe) > 0 {
		r.Status = Warn
		r.Evidence += fmt.Sprintf("; %s use cache=unsafe, so a guest FLUSH never reaches this cache", strings.Join(unsafe, ", "))
		for _, n := range unsafe {
			fixes = append(fixes, fmt.Sprintf("vmsan volume set %s --cache writeback", n))
		}
	}
	if rot && len(wt) > 0 {
		r.Status = Warn
		r.Evidence += fmt.Sprintf("; %s use cache=writethrough: every write waits for a flush of this rotational disk's cache (~100 writes/s)", strings.Join(wt, ", "))
		for _, n := range wt {
			fixes = append(fixes, fmt.Sprintf("vmsan volume set %s --cache none", n))
		}
	}
	r.Fix = strings.Join(fixes, "; ")
	return r
}
