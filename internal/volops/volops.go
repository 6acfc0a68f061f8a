// Package volops is the running daemon's volume operations (create,
// resize, settings, delete; snapshots, clones, rollback, import) against
// the volume store and the open volumes: the control API's handlers call
// them through the daemon (control.Ops), reload through the daemon too.
// The daemon gives the open volumes through Runtime; every change runs
// under the daemon's mu, which serialises changes to the volume map.
package volops

import (
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"

	"github.com/vmsan/vmsan/internal/control"
	"github.com/vmsan/vmsan/internal/events"
	"github.com/vmsan/vmsan/internal/snapexport"
	"github.com/vmsan/vmsan/internal/volrt"
	"github.com/vmsan/vmsan/internal/volume"
)

// Runtime is what the daemon gives the volume operations: its open
// volumes and how to open, publish and let go of them.
type Runtime interface {
	// Volume is the open volume name, nil when not open.
	Volume(name string) *volrt.Volume
	// Publish replaces the volume map snapshot. REQUIRES: mu held.
	Publish(fn func(m map[string]*volrt.Volume))
	// Open opens m with the daemon's engine settings for it.
	Open(m volume.Meta) (*volrt.Volume, error)
	// Clients is the number of clients of the open v (volume name);
	// VolumeClients the same by name (0 when not open).
	Clients(name string, v *volrt.Volume) int64
	VolumeClients(name string) int64
	// ReleaseIdle lets the front ends' idle holds on name go.
	ReleaseIdle(name string)
	// Deleted tells the plugins that name was deleted.
	Deleted(name string)
}

// Ops are the volume operations over a store and the daemon's Runtime.
type Ops struct {
	mu      *sync.Mutex
	store   *volume.Store
	log     *slog.Logger
	events  *events.Bus
	hooks   control.VolumeHooks
	dataDir string
	snaps   *snapexport.Exports
	rt      Runtime
}

// New is the operations on store; mu is the daemon's mutex that
// serialises changes to its volume map.
func New(mu *sync.Mutex, store *volume.Store, log *slog.Logger, bus *events.Bus, hooks control.VolumeHooks, dataDir string, snaps *snapexport.Exports, rt Runtime) *Ops {
	return &Ops{mu: mu, store: store, log: log, events: bus, hooks: hooks, dataDir: dataDir, snaps: snaps, rt: rt}
}

// VolumeAttrs are a volume's attributes in events.
func VolumeAttrs(m volume.Meta) []string {
	return []string{"name", m.Name, "size", strconv.FormatInt(m.Size, 10), "cache", string(m.Cache),
		"read_only", strconv.FormatBool(m.ReadOnly)}
}

// publishVolume publishes kind for the volume m.
func (d *Ops) publishVolume(kind string, m volume.Meta) {
	d.events.Publish(events.New(kind, events.Volume, VolumeAttrs(m)...))
}

// List is every volume of the store.
func (d *Ops) List() ([]control.VolumeInfo, error) {
	list, err := d.store.List()
	if list == nil {
		return nil, err
	}
	out := make([]control.VolumeInfo, 0, len(list))
	for _, m := range list {
		out = append(out, d.InfoOf(m))
	}
	return out, err
}

// Info is the volume name.
func (d *Ops) Info(name string) (control.VolumeInfo, error) {
	m, err := d.store.Get(name)
	if err != nil {
		return control.VolumeInfo{}, err
	}
	return d.InfoOf(m), nil
}

// CreateSnapshot is CreateSnapshotOpts with the control API's flags.
func (d *Ops) CreateSnapshot(vol, snap string, copyData, temporary bool) (control.SnapshotInfo, error) {
	return d.CreateSnapshotOpts(vol, snap, volume.CloneOptions{Copy: copyData, Temporary: temporary})
}

// settingsErr marks a failure to open a volume with the settings a request
// asked for (cache=none where the filesystem refuses O_DIRECT, a damaged
// raw file) as the client's to fix (4xx), keeping the reason.
func settingsErr(err error) error {
	if err == nil || errors.Is(err, volume.ErrDamaged) {
		return err
	}
	return fmt.Errorf("%w: cannot open the volume with these settings: %v", volume.ErrInvalid, err)
}

func (d *Ops) InfoOf(m volume.Meta) control.VolumeInfo {
	vi := control.VolumeInfo{Meta: m, Path: d.store.RawPath(m.Name), Allocated: control.AllocatedBytes(d.store.RawPath(m.Name))}
	if v := d.rt.Volume(m.Name); v != nil {
		vi.Open = true
		vi.Exports = d.rt.Clients(m.Name, v)
	} else if err := d.store.CheckRaw(m.Name); err != nil {
		vi.Problem = err.Error()
	}
	return vi
}

// CreateVolume creates a volume and starts exporting it.
func (d *Ops) CreateVolume(o volume.CreateOptions) (control.VolumeInfo, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	m, err := d.store.Create(o)
	if err != nil {
		return control.VolumeInfo{}, err
	}
	v, err := d.rt.Open(m)
	if err != nil {
		// Do not leave a volume the daemon cannot serve (e.g. cache=none on
		// tmpfs): the user gets the reason and can retry with other settings.
		d.store.Delete(m.Name, true)
		return control.VolumeInfo{}, settingsErr(err)
	}
	d.rt.Publish(func(mm map[string]*volrt.Volume) { mm[m.Name] = v })
	d.log.Info("volume created", "volume", m.Name, "size", m.Size)
	d.publishVolume(events.Create, m)
	return d.InfoOf(m), nil
}

// ResizeVolume resizes a volume online; connected clients see the new size
// when they reconnect.
func (d *Ops) ResizeVolume(name string, size int64, force bool) (control.VolumeInfo, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := control.CheckResize(d.hooks.Resize, d.dataDir, name, size); err != nil {
		return control.VolumeInfo{}, err
	}
	m, err := d.store.Resize(name, size, force)
	if err != nil {
		return control.VolumeInfo{}, err
	}
	d.log.Info("volume resized", "volume", name, "size", size)
	d.publishVolume(events.Change, m)
	return d.InfoOf(m), nil
}

// UpdateVolume changes a volume's mutable settings (cache mode, rotational
// hint, read-only, description). The open volume is closed and reopened
// with the new settings, which needs it to be idle: with clients connected
// it returns ErrInUse (they would otherwise keep the old flags, negotiated
// at connect time).
func (d *Ops) UpdateVolume(name string, s control.Settings) (control.VolumeInfo, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	old := d.rt.Volume(name)
	if old == nil {
		// Missing, or exists but could not be opened at start (say
		// cache=none where O_DIRECT is refused): new settings may fix it, so
		// try to open and export it now.
		m, err := d.store.Update(name, s.Apply)
		if err != nil {
			return control.VolumeInfo{}, err
		}
		nv, err := d.rt.Open(m)
		if err != nil {
			return control.VolumeInfo{}, fmt.Errorf("settings saved, but the volume still cannot be opened: %w", settingsErr(err))
		}
		d.rt.Publish(func(mm map[string]*volrt.Volume) { mm[name] = nv })
		d.log.Info("volume opened after settings change", "volume", name)
		d.publishVolume(events.Change, m)
		return d.InfoOf(m), nil
	}
	// Same handshake with registry.Open as DeleteVolume: from here no new
	// reference is handed out, so the count below stays true.
	if old.BeginDelete(); d.rt.Clients(name, old) > 0 {
		old.AbortDelete()
		return control.VolumeInfo{}, fmt.Errorf("volume %s: %w (settings apply when no client is connected)", name, volume.ErrInUse)
	}
	// Idle holds (iSCSI logical units between sessions) would keep the
	// instance closed below: let them go; the next command opens the new one.
	d.rt.ReleaseIdle(name)
	prev, err := d.store.Get(name)
	if err != nil {
		old.AbortDelete()
		return control.VolumeInfo{}, err
	}
	m, err := d.store.Update(name, s.Apply)
	if err != nil {
		old.AbortDelete()
		return control.VolumeInfo{}, err
	}
	// Stop the old engine first: the new one must not run beside it on the
	// same file (its writes would not be ordered against the old one's).
	if err := old.Close(); err != nil {
		d.log.Error("closing volume for reopen", "volume", name, "err", err)
	}
	// A device still held on the old instance (a logical unit that a
	// session opened after ReleaseIdle looked) now fails with
	// ErrVolumeGone, which makes its holder open the name again, instead
	// of failing on the closed engine for good.
	old.MarkGone()
	nv, err := d.rt.Open(m)
	if err != nil {
		// Put the old settings back and serve the volume as before.
		d.store.Update(name, func(mm *volume.Meta) error { *mm = prev; return nil })
		nv, err2 := d.rt.Open(prev)
		if err2 != nil {
			d.rt.Publish(func(mm map[string]*volrt.Volume) { delete(mm, name) })
			d.log.Error("volume could not be reopened; not exported", "volume", name, "err", err2)
		} else {
			d.rt.Publish(func(mm map[string]*volrt.Volume) { mm[name] = nv })
		}
		return control.VolumeInfo{}, settingsErr(err)
	}
	d.rt.Publish(func(mm map[string]*volrt.Volume) { mm[name] = nv })
	d.log.Info("volume settings changed", "volume", name, "cache", m.Cache, "rotational", m.Rotational, "read_only", m.ReadOnly)
	d.publishVolume(events.Change, m)
	return d.InfoOf(m), nil
}

// DeleteVolume deletes a volume. Without force it refuses while a client is
// connected. With force, connected clients get EIO on every further request
// and the engine is closed when the last one disconnects.
func (d *Ops) DeleteVolume(name string, force bool) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	v := d.rt.Volume(name)
	if v != nil {
		if err := control.CheckDelete(d.hooks.Delete, d.dataDir, name, force); err != nil {
			return err
		}
		v.BeginDelete() // see volrt.Volume.Acquire's INVARIANT
	}
	if err := d.store.Delete(name, force); err != nil {
		if v != nil {
			v.AbortDelete()
		}
		return err
	}
	if v != nil {
		d.rt.Publish(func(mm map[string]*volrt.Volume) { delete(mm, name) })
		v.MarkGone()
	}
	d.snaps.DropVolume(name) // deleted with it (force; see volume.Store.Delete)
	// Plugins let go of the volume (their references keep it open until
	// then). The store removed the volume's state directory, but a plugin
	// still running (a replica persisting its generations) may have
	// written into it again: once they stopped, that goes too.
	d.rt.Deleted(name)
	if err := d.store.RemoveStateDebris(name); err != nil {
		d.log.Warn("deleted volume: state directory not removed (the volume's next create removes it)", "volume", name, "err", err)
	}
	d.log.Info("volume deleted", "volume", name, "force", force)
	d.events.Publish(events.New(events.Destroy, events.Volume, "name", name))
	return nil
}

// Snapshots, clones, rollback and import through the running daemon
// (volume/snapshot.go has the store side and the on-disk layout).
//
//	GET    /v1/snapshots[?volume=VOL]                 []control.SnapshotInfo
//	POST   /v1/volumes/{name}/snapshots               SnapshotRequest -> control.SnapshotInfo (201)
//	DELETE /v1/volumes/{name}/snapshots/{snap}?force= 204
//	POST   /v1/clone                                  CloneRequest -> control.VolumeInfo (201)
//	POST   /v1/volumes/{name}/rollback                RollbackRequest -> control.VolumeInfo
//	POST   /v1/import                                 ImportRequest -> control.VolumeInfo (201)
//
// Consistency: a snapshot, a clone of a live volume and a rollback run
// with the volume quiesced (volrt.Volume.Quiesce: an engine barrier; new
// writes queued behind it, the writes already accepted completed and
// flushed), so the copy is the
// volume as of one instant with every acknowledged write in it.
//
// Snapshots are served read-only under the export name VOL@SNAP
// (internal/snapexport).

func (d *Ops) snapInfo(sm volume.SnapMeta) control.SnapshotInfo {
	p := d.store.SnapshotPath(sm.Volume, sm.Snapshot)
	return control.SnapshotInfo{SnapMeta: sm, Path: p, Allocated: control.AllocatedBytes(p), Exports: d.snaps.Refs(sm.Name)}
}

// quiesce holds writes to an open volume and flushes it (see the comment
// at the top); the returned resume must be called. A volume that is not
// open has nobody writing to it.
func (d *Ops) quiesce(name string) (func(), error) {
	v := d.rt.Volume(name)
	if v == nil {
		return func() {}, nil
	}
	resume, err := v.Quiesce()
	if err != nil {
		return nil, fmt.Errorf("volume %s: flush before snapshot: %w", name, err)
	}
	return resume, nil
}

// CreateSnapshotOpts takes the snapshot vol@snap of a volume, quiesced; a
// temporary one (o.Temporary: a command's scratch snapshot) is removed at
// the next start if the command does not delete it.
func (d *Ops) CreateSnapshotOpts(vol, snap string, o volume.CloneOptions) (control.SnapshotInfo, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	m, err := d.store.Get(vol)
	if err != nil {
		return control.SnapshotInfo{}, err
	}
	resume, err := d.quiesce(vol)
	if err != nil {
		return control.SnapshotInfo{}, err
	}
	o.Progress = events.CopyProgress(d.events, vol, vol+volume.SnapSep+snap, m.Size)
	sm, err := d.store.CreateSnapshot(vol, snap, o)
	resume()
	if err != nil {
		return control.SnapshotInfo{}, err
	}
	d.log.Info("snapshot created", "volume", vol, "snapshot", snap, "method", sm.Method, "temporary", sm.Temporary)
	return d.snapInfo(sm), nil
}

// DeleteSnapshot deletes vol@snap; refused while its read-only export has
// clients unless force.
func (d *Ops) DeleteSnapshot(vol, snap string, force bool) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	ref := vol + volume.SnapSep + snap
	abort, err := d.snaps.BeginDelete(ref, force)
	if err != nil {
		return err
	}
	if err := d.store.DeleteSnapshot(vol, snap); err != nil {
		abort()
		return err
	}
	d.snaps.Drop(ref)
	d.log.Info("snapshot deleted", "volume", vol, "snapshot", snap)
	return nil
}

// ListSnapshots lists vol's snapshots (every volume's when vol is "").
func (d *Ops) ListSnapshots(vol string) ([]control.SnapshotInfo, error) {
	l, err := d.store.ListSnapshots(vol)
	out := make([]control.SnapshotInfo, 0, len(l))
	for _, sm := range l {
		out = append(out, d.snapInfo(sm))
	}
	return out, err
}

// Clone creates volume name from src ("VOL@SNAP", or "VOL" quiesced) and
// exports it.
func (d *Ops) Clone(src, name string, copyData bool) (control.VolumeInfo, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	vol, _, isSnap, err := volume.SplitRef(src)
	if err != nil {
		return control.VolumeInfo{}, err
	}
	resume := func() {}
	if !isSnap {
		if resume, err = d.quiesce(vol); err != nil {
			return control.VolumeInfo{}, err
		}
	}
	m, err := d.store.Clone(src, name, volume.CloneOptions{Copy: copyData})
	resume()
	if err != nil {
		return control.VolumeInfo{}, err
	}
	if err := d.exportNewLocked(m); err != nil {
		return control.VolumeInfo{}, err
	}
	d.log.Info("volume cloned", "volume", name, "source", src)
	return d.InfoOf(m), nil
}

// exportNewLocked opens a volume just created and publishes it; on failure
// the volume is deleted again (as CreateVolume does). REQUIRES: the daemon's mu held.
func (d *Ops) exportNewLocked(m volume.Meta) error {
	v, err := d.rt.Open(m)
	if err != nil {
		d.store.Delete(m.Name, true)
		return settingsErr(err)
	}
	d.rt.Publish(func(mm map[string]*volrt.Volume) { mm[m.Name] = v })
	return nil
}

// Rollback makes vol's contents those of vol@snap, in place. Refused while
// clients are connected unless force (they then see the contents change
// under them, like a disk swapped), and for a replicated volume.
func (d *Ops) Rollback(vol, snap string, force, copyData bool) (control.VolumeInfo, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, err := d.store.Get(vol); err != nil {
		return control.VolumeInfo{}, err
	}
	if err := control.ReplicatedErr(d.hooks.Resize, d.dataDir, vol); err != nil {
		return control.VolumeInfo{}, err
	}
	if d.rt.VolumeClients(vol) > 0 && !force {
		return control.VolumeInfo{}, fmt.Errorf("volume %s: %w (a rollback changes the data under the clients: disconnect them, or use --force)", vol, volume.ErrInUse)
	}
	resume, err := d.quiesce(vol)
	if err != nil {
		return control.VolumeInfo{}, err
	}
	m, err := d.store.Rollback(vol, snap, volume.CloneOptions{Copy: copyData})
	resume()
	if err != nil {
		return control.VolumeInfo{}, err
	}
	d.log.Warn("volume rolled back to snapshot", "volume", vol, "snapshot", snap, "force", force, "data_id", m.DataID)
	return d.InfoOf(m), nil
}

// ImportVolume creates a volume from a file the client filled (see
// ImportRequest) and exports it.
func (d *Ops) ImportVolume(o volume.CreateOptions, path string) (control.VolumeInfo, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	m, err := d.store.CreateFromFile(o, path)
	if err != nil {
		return control.VolumeInfo{}, err
	}
	if err := d.exportNewLocked(m); err != nil {
		return control.VolumeInfo{}, err
	}
	d.log.Info("volume imported", "volume", m.Name, "size", m.Size)
	return d.InfoOf(m), nil
}
