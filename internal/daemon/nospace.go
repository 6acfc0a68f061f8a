package daemon

import (
	"context"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/vmsan/vmsan/internal/events"
	"github.com/vmsan/vmsan/internal/volrt"
	"github.com/vmsan/vmsan/internal/volume"
)

// A thin volume out of space. Volumes are sparse files, so a volume can be
// larger than the free space of the filesystem under it; when that runs
// out, the guest's writes fail with ENOSPC. Counting them in the metrics
// is not enough: the daemon logs a WARN line naming the volume and the
// filesystem's free space, publishes a "no-space" event, and `vmsan
// status` shows each volume's error count and last time.
//
// The engine reports every failed request (volrt.NoSpace.Note, engine lock
// held: a non-blocking send of the volume's name); watchNoSpace does the
// slow part (statfs, log, event) at most once per noSpaceInterval per
// volume. Errors suppressed by the rate limit are reported (with their
// count) by the next line, or when the interval has passed.

// noSpaceInterval is the shortest time between two WARN lines (and
// events) for one volume.
var noSpaceInterval = 10 * time.Second

// noSpaceWatch holds the ENOSPC records by volume name, so they survive a
// reopen of the volume (resize, settings) and go with a delete.
type noSpaceWatch struct {
	mu   sync.Mutex
	vols map[string]*volrt.NoSpace
	ch   chan string // names of volumes with a new error (lossy)
}

func (w *noSpaceWatch) init() {
	w.vols = map[string]*volrt.NoSpace{}
	w.ch = make(chan string, 64)
}

// get returns name's record, creating it.
func (w *noSpaceWatch) get(name string) *volrt.NoSpace {
	w.mu.Lock()
	defer w.mu.Unlock()
	if n := w.vols[name]; n != nil {
		return n
	}
	n := volrt.NewNoSpace(func() {
		select {
		case w.ch <- name:
		default: // the watcher is behind; it sees the count anyway
		}
	})
	n.Log.Interval = noSpaceInterval
	w.vols[name] = n
	return n
}

// lookup returns name's record or nil.
func (w *noSpaceWatch) lookup(name string) *volrt.NoSpace {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.vols[name]
}

// attach gives every volume of m its record and drops the records of
// volumes no longer in m. REQUIRES: d.mu held or New (m is the next
// volume snapshot).
func (w *noSpaceWatch) attach(m map[string]*volrt.Volume) {
	for name, v := range m {
		v.SetNoSpace(w.get(name))
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for name := range w.vols {
		if _, ok := m[name]; !ok {
			delete(w.vols, name)
		}
	}
}

// watchNoSpace logs and publishes ENOSPC reports until ctx is done.
func (d *Daemon) watchNoSpace(ctx context.Context) {
	pending := map[string]bool{} // suppressed by the rate limit, not yet reported
	tick := time.NewTicker(noSpaceInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case name := <-d.noSpace.ch:
			if !d.reportNoSpace(name) {
				pending[name] = true
			} else {
				delete(pending, name)
			}
		case <-tick.C:
			for name := range pending {
				if d.reportNoSpace(name) {
					delete(pending, name)
				}
			}
		}
	}
}

// reportNoSpace writes the WARN line and event for name unless the rate
// limit holds it back (false).
func (d *Daemon) reportNoSpace(name string) bool {
	n := d.noSpace.lookup(name)
	if n == nil {
		return true // deleted meanwhile
	}
	ok, suppressed := n.Log.Allow()
	if !ok {
		return false
	}
	st := n.Stats()
	raw := d.store.RawPath(name)
	free, size, err := volrt.FreeSpace(raw)
	attrs := []any{"volume", name, "errors", st.Errors}
	if suppressed > 0 {
		attrs = append(attrs, "not_logged", suppressed)
	}
	if err == nil {
		attrs = append(attrs, "fs_free", volume.HumanSize(free), "fs_size", volume.HumanSize(size))
	} else {
		attrs = append(attrs, "statfs_err", err)
	}
	attrs = append(attrs, "dir", filepath.Dir(raw))
	d.log.Warn("volume out of space: writes fail with ENOSPC (the filesystem under this thin volume is full; free space there or move the volume)", attrs...)
	d.events.Publish(events.New(events.Change, events.NoSpace, noSpaceAttrs(name, st, free, err == nil)...))
	return true
}

func noSpaceAttrs(name string, st volrt.NoSpaceStats, free int64, haveFree bool) []string {
	kv := []string{"volume", name, "errors", strconv.FormatUint(st.Errors, 10), "last", st.Last.UTC().Format(time.RFC3339Nano)}
	if haveFree {
		kv = append(kv, "fs_free_bytes", strconv.FormatInt(free, 10))
	}
	return kv
}

// noSpaceStatus is name's record for Status, nil when it had no error.
func (d *Daemon) noSpaceStatus(name string) *NoSpaceStatus {
	n := d.noSpace.lookup(name)
	if n == nil {
		return nil
	}
	st := n.Stats()
	if st.Errors == 0 {
		return nil
	}
	s := &NoSpaceStatus{NoSpaceStats: st}
	s.FSFreeBytes, s.FSSizeBytes, _ = volrt.FreeSpace(d.store.RawPath(name))
	return s
}

// noSpaceEvents are the "exists" lines of volumes that had ENOSPC errors.
func (d *Daemon) noSpaceEvents() []events.Event {
	vols := *d.vols.Load()
	names := make([]string, 0, len(vols))
	for name := range vols {
		names = append(names, name)
	}
	sort.Strings(names)
	var out []events.Event
	for _, name := range names {
		if s := d.noSpaceStatus(name); s != nil {
			out = append(out, events.New(events.Exists, events.NoSpace, noSpaceAttrs(name, s.NoSpaceStats, s.FSFreeBytes, true)...))
		}
	}
	return out
}
