package daemon

import (
	"net/http"

	"github.com/vmsan/vmsan/internal/control"
	"github.com/vmsan/vmsan/internal/events"
	"github.com/vmsan/vmsan/internal/volume"
)

// The control API (types, errors, HTTP handlers) is package control; the
// daemon serves it over controlOps. The names below keep the API's types
// where the CLI and tests have always found them.
type (
	VolumeInfo      = control.VolumeInfo
	CreateRequest   = control.CreateRequest
	ResizeRequest   = control.ResizeRequest
	Settings        = control.Settings
	Status          = control.Status
	VolumeStatus    = control.VolumeStatus
	EngineStats     = control.EngineStats
	NoSpaceStatus   = control.NoSpaceStatus
	APIError        = control.APIError
	SnapshotInfo    = control.SnapshotInfo
	SnapshotRequest = control.SnapshotRequest
	CloneRequest    = control.CloneRequest
	RollbackRequest = control.RollbackRequest
	ImportRequest   = control.ImportRequest
	// The client side: the control socket's client, and the volume
	// operations the CLI runs through it or, without a daemon, on the
	// store.
	Client      = control.Client
	VolumeOps   = control.VolumeOps
	SnapshotOps = control.SnapshotOps
	VolumeHooks = control.VolumeHooks
	DeleteCheck = control.DeleteCheck
	ResizeCheck = control.ResizeCheck
)

// Dial connects to the daemon serving dataDir (control.Dial).
func Dial(dataDir string) (*Client, error) { return control.Dial(dataDir) }

// NewClient is a client for the control socket at path (control.NewClient).
func NewClient(path string) *Client { return control.NewClient(path) }

// OpenVolumeOps is control.OpenVolumeOps.
func OpenVolumeOps(dataDir string, hooks ...VolumeHooks) (VolumeOps, bool, error) {
	return control.OpenVolumeOps(dataDir, hooks...)
}

// OpenExistingVolumeOps is control.OpenExistingVolumeOps.
func OpenExistingVolumeOps(dataDir string, hooks ...VolumeHooks) (VolumeOps, bool, error) {
	return control.OpenExistingVolumeOps(dataDir, hooks...)
}

// FollowCopy is control.FollowCopy.
func FollowCopy(ops any, target string, set func(done, total int64)) (stop func()) {
	return control.FollowCopy(ops, target, set)
}

// APIVersion is the control API's version (Status.APIVersion).
const APIVersion = control.APIVersion

var (
	// ErrReplicated: the operation would break a replicated pair
	// (resizing one copy); a ResizeCheck wraps it.
	ErrReplicated = control.ErrReplicated
	// ErrDaemonStopped: the daemon went away during a call.
	ErrDaemonStopped = control.ErrDaemonStopped
	// ErrNoDaemon: no daemon is listening on the control socket.
	ErrNoDaemon = control.ErrNoDaemon
)

// ErrorCode is control.ErrorCode: the API's code for err, or "".
func ErrorCode(err error) string { return control.ErrorCode(err) }

func writeJSON(w http.ResponseWriter, status int, v any) { control.WriteJSON(w, status, v) }

// controlOps is the daemon as the control API calls it (control.Ops).
type controlOps struct{ d *Daemon }

var _ control.Ops = controlOps{}

func (o controlOps) Status() Status { return o.d.status() }

func (o controlOps) List() ([]VolumeInfo, error) {
	list, err := o.d.store.List()
	if list == nil {
		return nil, err
	}
	out := make([]VolumeInfo, 0, len(list))
	for _, m := range list {
		out = append(out, o.d.info(m))
	}
	return out, err
}

func (o controlOps) Info(name string) (VolumeInfo, error) {
	m, err := o.d.store.Get(name)
	if err != nil {
		return VolumeInfo{}, err
	}
	return o.d.info(m), nil
}

func (o controlOps) CreateVolume(c volume.CreateOptions) (VolumeInfo, error) {
	return o.d.createVolume(c)
}

func (o controlOps) ResizeVolume(name string, size int64, force bool) (VolumeInfo, error) {
	return o.d.resizeVolume(name, size, force)
}

func (o controlOps) UpdateVolume(name string, s Settings) (VolumeInfo, error) {
	return o.d.updateVolume(name, s)
}

func (o controlOps) DeleteVolume(name string, force bool) error { return o.d.deleteVolume(name, force) }

func (o controlOps) CreateSnapshot(vol, snap string, copyData, temporary bool) (SnapshotInfo, error) {
	return o.d.createSnapshot(vol, snap, volume.CloneOptions{Copy: copyData, Temporary: temporary})
}

func (o controlOps) DeleteSnapshot(vol, snap string, force bool) error {
	return o.d.deleteSnapshot(vol, snap, force)
}

func (o controlOps) ListSnapshots(vol string) ([]SnapshotInfo, error) { return o.d.listSnapshots(vol) }

func (o controlOps) Clone(src, name string, copyData bool) (VolumeInfo, error) {
	return o.d.clone(src, name, copyData)
}

func (o controlOps) Rollback(vol, snap string, force, copyData bool) (VolumeInfo, error) {
	return o.d.rollback(vol, snap, force, copyData)
}

func (o controlOps) ImportVolume(c volume.CreateOptions, path string) (VolumeInfo, error) {
	return o.d.importVolume(c, path)
}

func (o controlOps) ISCSIShow() any                { return o.d.iscsiShow() }
func (o controlOps) Events() *events.Bus           { return o.d.events }
func (o controlOps) EventSnapshot() []events.Event { return o.d.eventSnapshot() }
