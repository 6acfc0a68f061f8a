package daemon

import (
	"fmt"

	"github.com/vmsan/vmsan/internal/control"
	"github.com/vmsan/vmsan/internal/events"
	"github.com/vmsan/vmsan/internal/volrt"
	"github.com/vmsan/vmsan/internal/volume"
)

// Snapshots, clones, rollback and import through the running daemon
// (volume/snapshot.go has the store side and the on-disk layout).
//
//	GET    /v1/snapshots[?volume=VOL]                 []SnapshotInfo
//	POST   /v1/volumes/{name}/snapshots               SnapshotRequest -> SnapshotInfo (201)
//	DELETE /v1/volumes/{name}/snapshots/{snap}?force= 204
//	POST   /v1/clone                                  CloneRequest -> VolumeInfo (201)
//	POST   /v1/volumes/{name}/rollback                RollbackRequest -> VolumeInfo
//	POST   /v1/import                                 ImportRequest -> VolumeInfo (201)
//
// Consistency: a snapshot, a clone of a live volume and a rollback run
// with the volume quiesced (volrt.Volume.Quiesce: an engine barrier; new
// writes queued behind it, the writes already accepted completed and
// flushed), so the copy is the
// volume as of one instant with every acknowledged write in it.
//
// Snapshots are served read-only under the export name VOL@SNAP
// (internal/snapexport).

func (d *Daemon) snapInfo(sm volume.SnapMeta) SnapshotInfo {
	p := d.store.SnapshotPath(sm.Volume, sm.Snapshot)
	return SnapshotInfo{SnapMeta: sm, Path: p, Allocated: control.AllocatedBytes(p), Exports: d.snaps.Refs(sm.Name)}
}

// quiesce holds writes to an open volume and flushes it (see the comment
// at the top); the returned resume must be called. A volume that is not
// open has nobody writing to it.
func (d *Daemon) quiesce(name string) (func(), error) {
	v := (*d.vols.Load())[name]
	if v == nil {
		return func() {}, nil
	}
	resume, err := v.Quiesce()
	if err != nil {
		return nil, fmt.Errorf("volume %s: flush before snapshot: %w", name, err)
	}
	return resume, nil
}

// createSnapshot takes the snapshot vol@snap of a volume, quiesced; a
// temporary one (o.Temporary: a command's scratch snapshot) is removed at
// the next start if the command does not delete it.
func (d *Daemon) createSnapshot(vol, snap string, o volume.CloneOptions) (SnapshotInfo, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	m, err := d.store.Get(vol)
	if err != nil {
		return SnapshotInfo{}, err
	}
	resume, err := d.quiesce(vol)
	if err != nil {
		return SnapshotInfo{}, err
	}
	o.Progress = events.CopyProgress(d.events, vol, vol+volume.SnapSep+snap, m.Size)
	sm, err := d.store.CreateSnapshot(vol, snap, o)
	resume()
	if err != nil {
		return SnapshotInfo{}, err
	}
	d.log.Info("snapshot created", "volume", vol, "snapshot", snap, "method", sm.Method, "temporary", sm.Temporary)
	return d.snapInfo(sm), nil
}

// deleteSnapshot deletes vol@snap; refused while its read-only export has
// clients unless force.
func (d *Daemon) deleteSnapshot(vol, snap string, force bool) error {
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

// listSnapshots lists vol's snapshots (every volume's when vol is "").
func (d *Daemon) listSnapshots(vol string) ([]SnapshotInfo, error) {
	l, err := d.store.ListSnapshots(vol)
	out := make([]SnapshotInfo, 0, len(l))
	for _, sm := range l {
		out = append(out, d.snapInfo(sm))
	}
	return out, err
}

// clone creates volume name from src ("VOL@SNAP", or "VOL" quiesced) and
// exports it.
func (d *Daemon) clone(src, name string, copyData bool) (VolumeInfo, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	vol, _, isSnap, err := volume.SplitRef(src)
	if err != nil {
		return VolumeInfo{}, err
	}
	resume := func() {}
	if !isSnap {
		if resume, err = d.quiesce(vol); err != nil {
			return VolumeInfo{}, err
		}
	}
	m, err := d.store.Clone(src, name, volume.CloneOptions{Copy: copyData})
	resume()
	if err != nil {
		return VolumeInfo{}, err
	}
	if err := d.exportNewLocked(m); err != nil {
		return VolumeInfo{}, err
	}
	d.log.Info("volume cloned", "volume", name, "source", src)
	return d.info(m), nil
}

// exportNewLocked opens a volume just created and publishes it; on failure
// the volume is deleted again (as CreateVolume does). REQUIRES: d.mu held.
func (d *Daemon) exportNewLocked(m volume.Meta) error {
	v, err := openVol(d.store, m, d.engineFor(m.Name), uint32(d.cfg.MaxPayload))
	if err != nil {
		d.store.Delete(m.Name, true)
		return settingsErr(err)
	}
	d.publish(func(mm map[string]*volrt.Volume) { mm[m.Name] = v })
	return nil
}

// rollback makes vol's contents those of vol@snap, in place. Refused while
// clients are connected unless force (they then see the contents change
// under them, like a disk swapped), and for a replicated volume.
func (d *Daemon) rollback(vol, snap string, force, copyData bool) (VolumeInfo, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, err := d.store.Get(vol); err != nil {
		return VolumeInfo{}, err
	}
	if err := control.ReplicatedErr(d.opts.Hooks.Resize, d.cfg.DataDir, vol); err != nil {
		return VolumeInfo{}, err
	}
	if d.volumeClients(vol) > 0 && !force {
		return VolumeInfo{}, fmt.Errorf("volume %s: %w (a rollback changes the data under the clients: disconnect them, or use --force)", vol, volume.ErrInUse)
	}
	resume, err := d.quiesce(vol)
	if err != nil {
		return VolumeInfo{}, err
	}
	m, err := d.store.Rollback(vol, snap, volume.CloneOptions{Copy: copyData})
	resume()
	if err != nil {
		return VolumeInfo{}, err
	}
	d.log.Warn("volume rolled back to snapshot", "volume", vol, "snapshot", snap, "force", force, "data_id", m.DataID)
	return d.info(m), nil
}

// importVolume creates a volume from a file the client filled (see
// ImportRequest) and exports it.
func (d *Daemon) importVolume(o volume.CreateOptions, path string) (VolumeInfo, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	m, err := d.store.CreateFromFile(o, path)
	if err != nil {
		return VolumeInfo{}, err
	}
	if err := d.exportNewLocked(m); err != nil {
		return VolumeInfo{}, err
	}
	d.log.Info("volume imported", "volume", m.Name, "size", m.Size)
	return d.info(m), nil
}
