package daemon

import (
	"net/http"

	"github.com/vmsan/vmsan/internal/control"
	"github.com/vmsan/vmsan/internal/events"
	"github.com/vmsan/vmsan/internal/frontend"
	"github.com/vmsan/vmsan/internal/volops"
	"github.com/vmsan/vmsan/internal/volrt"
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

// controlOps is the daemon as the control API calls it (control.Ops):
// the volume operations are volops.Ops.
type controlOps struct {
	*volops.Ops
	d *Daemon
}

var _ control.Ops = controlOps{}

func (o controlOps) Status() Status                { return o.d.status() }
func (o controlOps) ISCSIShow() any                { return o.d.iscsiShow() }
func (o controlOps) Events() *events.Bus           { return o.d.events }
func (o controlOps) EventSnapshot() []events.Event { return o.d.eventSnapshot() }

// volRuntime is the daemon's open volumes as volops.Ops uses them.
type volRuntime struct{ d *Daemon }

func (r volRuntime) Volume(name string) *volrt.Volume            { return (*r.d.vols.Load())[name] }
func (r volRuntime) Publish(fn func(m map[string]*volrt.Volume)) { r.d.publish(fn) }
func (r volRuntime) Open(m volume.Meta) (*volrt.Volume, error) {
	return openVol(r.d.store, m, r.d.engineFor(m.Name), uint32(r.d.cfg.MaxPayload))
}
func (r volRuntime) Clients(name string, v *volrt.Volume) int64 { return r.d.clientsOf(name, v) }
func (r volRuntime) VolumeClients(name string) int64            { return r.d.volumeClients(name) }

func (r volRuntime) ReleaseIdle(name string) {
	for _, fe := range r.d.frontEnds {
		if h, ok := fe.(frontend.IdleHolder); ok {
			h.ReleaseIdle(name)
		}
	}
}

func (r volRuntime) Deleted(name string) {
	for _, p := range r.d.plugins {
		if pd, ok := p.(VolumeDeleter); ok {
			pd.VolumeDeleted(name)
		}
	}
}
