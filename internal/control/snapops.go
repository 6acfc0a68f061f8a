package control

import (
	"net/url"
	"strconv"

	"github.com/vmsan/vmsan/internal/volume"
)

// SnapshotOps is what `vmsan volume snapshot|clone|rollback|import|export`
// need, implemented (like VolumeOps) by the control client and directly on
// the store. Every VolumeOps that OpenVolumeOps returns implements it.
type SnapshotOps interface {
	CreateSnapshot(vol, snap string, copyData bool) (SnapshotInfo, error)
	// CreateTemporarySnapshot takes a snapshot the caller deletes when
	// done; one left behind is removed when the data directory is next
	// opened (the daemon's start).
	CreateTemporarySnapshot(vol, snap string, copyData bool) (SnapshotInfo, error)
	ListSnapshots(vol string) ([]SnapshotInfo, error)
	DeleteSnapshot(vol, snap string, force bool) error
	Clone(src, name string, copyData bool) (VolumeInfo, error)
	Rollback(vol, snap string, force, copyData bool) (VolumeInfo, error)
	// ImportVolume creates a volume from path, a temporary file in the
	// data directory (volume.TempImportPath) filled by the caller.
	ImportVolume(o volume.CreateOptions, path string) (VolumeInfo, error)
}

var (
	_ SnapshotOps = (*Client)(nil)
	_ SnapshotOps = directOps{}
)

// CreateSnapshot takes a snapshot.
func (c *Client) CreateSnapshot(vol, snap string, copyData bool) (SnapshotInfo, error) {
	var si SnapshotInfo
	err := c.Do("POST", "/v1/volumes/"+url.PathEscape(vol)+"/snapshots", SnapshotRequest{Name: snap, Copy: copyData}, &si)
	return si, err
}

// CreateTemporarySnapshot takes a temporary snapshot.
func (c *Client) CreateTemporarySnapshot(vol, snap string, copyData bool) (SnapshotInfo, error) {
	var si SnapshotInfo
	err := c.Do("POST", "/v1/volumes/"+url.PathEscape(vol)+"/snapshots", SnapshotRequest{Name: snap, Copy: copyData, Temporary: true}, &si)
	return si, err
}

// ListSnapshots lists snapshots (of every volume when vol is "").
func (c *Client) ListSnapshots(vol string) ([]SnapshotInfo, error) {
	var l []SnapshotInfo
	p := "/v1/snapshots"
	if vol != "" {
		p += "?volume=" + url.QueryEscape(vol)
	}
	err := c.Do("GET", p, nil, &l)
	return l, err
}

// DeleteSnapshot deletes a snapshot.
func (c *Client) DeleteSnapshot(vol, snap string, force bool) error {
	return c.Do("DELETE", "/v1/volumes/"+url.PathEscape(vol)+"/snapshots/"+url.PathEscape(snap)+"?force="+strconv.FormatBool(force), nil, nil)
}

// Clone creates a volume from a snapshot or volume.
func (c *Client) Clone(src, name string, copyData bool) (VolumeInfo, error) {
	var vi VolumeInfo
	err := c.Do("POST", "/v1/clone", CloneRequest{Source: src, Name: name, Copy: copyData}, &vi)
	return vi, err
}

// Rollback rolls a volume back to a snapshot.
func (c *Client) Rollback(vol, snap string, force, copyData bool) (VolumeInfo, error) {
	var vi VolumeInfo
	err := c.Do("POST", "/v1/volumes/"+url.PathEscape(vol)+"/rollback", RollbackRequest{Snapshot: snap, Force: force, Copy: copyData}, &vi)
	return vi, err
}

// ImportVolume creates a volume from a filled temporary file.
func (c *Client) ImportVolume(o volume.CreateOptions, path string) (VolumeInfo, error) {
	var vi VolumeInfo
	req := ImportRequest{Path: path, CreateRequest: CreateRequest{Name: o.Name, Size: strconv.FormatInt(o.Size, 10), Cache: string(o.Cache),
		Rotational: o.Rotational, ReadOnly: o.ReadOnly, Description: o.Description, BlockSize: o.LogicalBlockSize}}
	err := c.Do("POST", "/v1/import", req, &vi)
	return vi, err
}

// Without a daemon nothing is exported or written: no quiescing, and no
// snapshot export has clients.

func (o directOps) snapInfo(sm volume.SnapMeta) SnapshotInfo {
	p := o.s.SnapshotPath(sm.Volume, sm.Snapshot)
	return SnapshotInfo{SnapMeta: sm, Path: p, Allocated: AllocatedBytes(p)}
}

func (o directOps) CreateSnapshot(vol, snap string, copyData bool) (SnapshotInfo, error) {
	sm, err := o.s.CreateSnapshot(vol, snap, volume.CloneOptions{Copy: copyData})
	if err != nil {
		return SnapshotInfo{}, err
	}
	return o.snapInfo(sm), nil
}

func (o directOps) CreateTemporarySnapshot(vol, snap string, copyData bool) (SnapshotInfo, error) {
	sm, err := o.s.CreateSnapshot(vol, snap, volume.CloneOptions{Copy: copyData, Temporary: true})
	if err != nil {
		return SnapshotInfo{}, err
	}
	return o.snapInfo(sm), nil
}

func (o directOps) ListSnapshots(vol string) ([]SnapshotInfo, error) {
	l, err := o.s.ListSnapshots(vol)
	out := make([]SnapshotInfo, 0, len(l))
	for _, sm := range l {
		out = append(out, o.snapInfo(sm))
	}
	return out, err
}

func (o directOps) DeleteSnapshot(vol, snap string, force bool) error {
	return o.s.DeleteSnapshot(vol, snap)
}

func (o directOps) Clone(src, name string, copyData bool) (VolumeInfo, error) {
	m, err := o.s.Clone(src, name, volume.CloneOptions{Copy: copyData})
	if err != nil {
		return VolumeInfo{}, err
	}
	return o.vi(m), nil
}

func (o directOps) Rollback(vol, snap string, force, copyData bool) (VolumeInfo, error) {
	if _, err := o.s.Get(vol); err != nil {
		return VolumeInfo{}, err
	}
	if err := ReplicatedErr(o.hooks.Resize, o.s.Dir(), vol); err != nil {
		return VolumeInfo{}, err
	}
	m, err := o.s.Rollback(vol, snap, volume.CloneOptions{Copy: copyData})
	if err != nil {
		return VolumeInfo{}, err
	}
	return o.vi(m), nil
}

func (o directOps) ImportVolume(c volume.CreateOptions, path string) (VolumeInfo, error) {
	m, err := o.s.CreateFromFile(c, path)
	if err != nil {
		return VolumeInfo{}, err
	}
	return o.vi(m), nil
}
