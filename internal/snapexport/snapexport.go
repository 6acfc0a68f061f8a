// Package snapexport serves snapshots read-only under the export name
// VOL@SNAP: opened on the first connection, kept open until the snapshot
// is deleted or the daemon stops. They get no plugin wrapping
// (replication never sees them) and are not in the daemon's volume map,
// so the default export and the volume list are unchanged by them. The
// daemon's export registry hands VOL@SNAP names to Exports.Open.
package snapexport

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"

	"github.com/vmsan/vmsan/internal/backend"
	"github.com/vmsan/vmsan/internal/export"
	"github.com/vmsan/vmsan/internal/ioengine"
	"github.com/vmsan/vmsan/internal/volrt"
	"github.com/vmsan/vmsan/internal/volume"
)

// Exports are the open read-only exports of snapshots.
type Exports struct {
	store      *volume.Store
	log        *slog.Logger
	engine     ioengine.Config
	maxPayload uint32

	mu sync.Mutex
	m  map[string]*volrt.Volume // by "VOL@SNAP"
}

// New serves the snapshots of store with the engine settings ecfg.
func New(store *volume.Store, log *slog.Logger, ecfg ioengine.Config, maxPayload uint32) *Exports {
	return &Exports{store: store, log: log, engine: ecfg, maxPayload: maxPayload}
}

// Open is the registry's Open for "VOL@SNAP" names.
func (d *Exports) Open(ref string) (export.Device, error) {
	vol, snap, isSnap, err := volume.SplitRef(ref)
	if err != nil || !isSnap {
		return nil, export.ErrNotFound
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if v := d.m[ref]; v != nil {
		return v.Acquire(nil)
	}
	sm, err := d.store.GetSnapshot(vol, snap)
	if err != nil {
		return nil, export.ErrNotFound
	}
	be, err := backend.OpenFile(d.store.SnapshotPath(vol, snap), sm.Cache, true)
	if err != nil {
		d.log.Error("cannot open snapshot for export", "snapshot", ref, "err", err)
		return nil, export.ErrNotFound
	}
	if be.Size() != sm.Size {
		be.Close()
		d.log.Error("snapshot raw file does not match its metadata; not exporting it", "snapshot", ref, "size", be.Size(), "metadata_size", sm.Size)
		return nil, export.ErrNotFound
	}
	v := volrt.New(sm.Meta, be, d.engine, d.maxPayload)
	if d.m == nil {
		d.m = map[string]*volrt.Volume{}
	}
	d.m[ref] = v
	d.log.Info("snapshot exported read-only", "snapshot", ref)
	return v.Acquire(nil)
}

// List lists the snapshots as exports (NBD_OPT_LIST), from
// their metadata: listing does not open them.
func (d *Exports) List() []export.Info {
	l, _ := d.store.ListSnapshots("")
	out := make([]export.Info, 0, len(l))
	for _, sm := range l {
		desc := sm.Description
		if desc == "" {
			desc = "snapshot of " + sm.Volume
		}
		out = append(out, export.Info{Name: sm.Name, Description: desc, UUID: sm.UUID, Size: sm.Size,
			ReadOnly: true, CanMultiConn: true, Cache: sm.Cache})
	}
	return out
}

// Refs is the number of clients of a snapshot's export.
func (d *Exports) Refs(ref string) int64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	if v := d.m[ref]; v != nil {
		return v.Refs()
	}
	return 0
}

// Drop ends a snapshot's export (its files are gone): clients
// get EIO, the engine closes when the last one leaves.
func (d *Exports) Drop(ref string) {
	d.mu.Lock()
	v := d.m[ref]
	delete(d.m, ref)
	d.mu.Unlock()
	if v != nil {
		v.BeginDelete()
		v.MarkGone()
	}
}

// DropVolume drops the exports of every snapshot of vol (a volume
// deleted with --force takes its snapshots with it).
func (d *Exports) DropVolume(vol string) {
	d.mu.Lock()
	var refs []string
	for ref := range d.m {
		if v, _, _ := strings.Cut(ref, volume.SnapSep); v == vol {
			refs = append(refs, ref)
		}
	}
	d.mu.Unlock()
	for _, r := range refs {
		d.Drop(r)
	}
}

// Close closes every snapshot export (shutdown, after the front
// ends drained).
func (d *Exports) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	var errs []error
	for ref, v := range d.m {
		if err := v.Close(); err != nil {
			errs = append(errs, fmt.Errorf("snapshot %s: close: %w", ref, err))
		}
	}
	d.m = nil
	return errors.Join(errs...)
}

// BeginDelete marks ref's export (if open) as being deleted: refused
// while it has clients unless force. abort undoes it when the delete
// fails; Drop ends the export once the files are gone.
func (d *Exports) BeginDelete(ref string, force bool) (abort func(), err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	v := d.m[ref]
	if v != nil && v.BeginDelete() && !force {
		v.AbortDelete()
		return nil, fmt.Errorf("snapshot %s: %w", ref, volume.ErrInUse)
	}
	return func() {
		if v != nil {
			v.AbortDelete()
		}
	}, nil
}
