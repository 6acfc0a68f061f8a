package volrt

import (
	"path/filepath"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// NoSpace records the ENOSPC (or EDQUOT) errors of one volume: a thin
// volume is larger than the free space of the filesystem under it, and
// when that runs out its writes fail. A guest sees I/O errors, so the
// operator must hear at once which volume it is and how much space is
// left; a counter in the metrics alone is found too late.
//
// The daemon keeps one NoSpace per volume name (so the record survives a
// reopen of the volume) and attaches it with Volume.SetNoSpace; the
// engine reports each failed request to it. Log is the rate limit of the
// daemon's WARN line and event for this volume.
//
// Concurrency: safe for concurrent use. Note runs on the engine's
// completion path with the engine's lock held: it only updates atomics and
// calls the notify function given to NewNoSpace, which must not block.
type NoSpace struct {
	errors atomic.Uint64
	last   atomic.Int64 // unix nanoseconds of the last error, 0 = none
	notify func()
	Log    RateLog
}

// NewNoSpace returns a record whose Note calls notify (may be nil).
// REQUIRES: notify does not block (a non-blocking channel send).
func NewNoSpace(notify func()) *NoSpace { return &NoSpace{notify: notify} }

// Note records one request failed for lack of space.
func (n *NoSpace) Note() {
	n.errors.Add(1)
	n.last.Store(time.Now().UnixNano())
	if n.notify != nil {
		n.notify()
	}
}

// NoSpaceStats is a NoSpace snapshot.
type NoSpaceStats struct {
	Errors uint64    `json:"errors"`
	Last   time.Time `json:"last"` // zero when Errors is 0
}

// Stats snapshots the record.
func (n *NoSpace) Stats() NoSpaceStats {
	s := NoSpaceStats{Errors: n.errors.Load()}
	if ns := n.last.Load(); ns != 0 {
		s.Last = time.Unix(0, ns)
	}
	return s
}

// SetNoSpace attaches the volume's ENOSPC record (nil detaches it). The
// engine's failed requests go to the record attached when they complete.
func (v *Volume) SetNoSpace(n *NoSpace) { v.noSpace.Store(n) }

// noteNoSpace is the engine's OnNoSpace (engine lock held: atomics only).
func (v *Volume) noteNoSpace() {
	if n := v.noSpace.Load(); n != nil {
		n.Note()
	}
}

// FreeSpace returns the bytes available to unprivileged writers on the
// filesystem holding path's directory (what a thin volume can still
// allocate) and the filesystem's size.
func FreeSpace(path string) (free, size int64, err error) {
	var st unix.Statfs_t
	if err := unix.Statfs(filepath.Dir(path), &st); err != nil {
		return 0, 0, err
	}
	return int64(st.Bavail) * st.Bsize, int64(st.Blocks) * st.Bsize, nil
}
