// Package nospace reports thin volumes out of space: the ENOSPC records
// of the daemon's volumes (volrt.NoSpace), the rate-limited WARN line and
// "no-space" event, and what `vmsan status` and the event snapshot show.
package nospace

import (
	"context"
	"log/slog"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/vmsan/vmsan/internal/control"
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

// Watch holds the ENOSPC records by volume name, so they survive a
// reopen of the volume (resize, settings) and go with a delete.
type Watch struct {
	store  *volume.Store
	log    *slog.Logger
	events *events.Bus

	mu   sync.Mutex
	vols map[string]*volrt.NoSpace
	ch   chan string // names of volumes with a new error (lossy)
}

// New is the watch of store's volumes, logging to log and publishing on
// bus.
func New(store *volume.Store, log *slog.Logger, bus *events.Bus) *Watch {
	return &Watch{store: store, log: log, events: bus, vols: map[string]*volrt.NoSpace{}, ch: make(chan string, 64)}
}

// get returns name's record, creating it.
func (w *Watch) get(name string) *volrt.NoSpace {
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
func (w *Watch) lookup(name string) *volrt.NoSpace {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.vols[name]
}

// Attach gives every volume of m its record and drops the records of
// volumes no longer in m. REQUIRES: the daemon's mu held or New (m is
// the next volume snapshot).
func (w *Watch) Attach(m map[string]*volrt.Volume) {
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

// Run logs and publishes ENOSPC reports until ctx is done.
func (d *Watch) Run(ctx context.Context) {
	pending := map[string]bool{} // suppressed by the rate limit, not yet reported
	tick := time.NewTicker(noSpaceInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case name := <-d.ch:
			if !d.report(name) {
				pending[name] = true
			} else {
				delete(pending, name)
			}
		case <-tick.C:
			for name := range pending {
				if d.report(name) {
					delete(pending, name)
				}
			}
		}
	}
}

// report writes the WARN line and event for name unless the rate
// limit holds it back (false).
func (d *Watch) report(name string) bool {
	n := d.lookup(name)
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

// Status is name's record for Status, nil when it had no error.
func (d *Watch) Status(name string) *control.NoSpaceStatus {
	n := d.lookup(name)
	if n == nil {
		return nil
	}
	st := n.Stats()
	if st.Errors == 0 {
		return nil
	}
	s := &control.NoSpaceStatus{NoSpaceStats: st}
	s.FSFreeBytes, s.FSSizeBytes, _ = volrt.FreeSpace(d.store.RawPath(name))
	return s
}

// Events are the "exists" lines of the volumes of vols that had ENOSPC
// errors.
func (d *Watch) Events(vols map[string]*volrt.Volume) []events.Event {
	names := make([]string, 0, len(vols))
	for name := range vols {
		names = append(names, name)
	}
	sort.Strings(names)
	var out []events.Event
	for _, name := range names {
		if s := d.Status(name); s != nil {
			out = append(out, events.New(events.Exists, events.NoSpace, noSpaceAttrs(name, s.NoSpaceStats, s.FSFreeBytes, true)...))
		}
	}
	return out
}
