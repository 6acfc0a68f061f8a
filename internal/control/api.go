// Package control is the daemon's control API: its types (the JSON
// bodies), its errors (a stable code per error, mapped back to the volume
// package's sentinel errors), and the HTTP handlers, which call the daemon
// through Ops. The daemon serves them on DATA_DIR/control.sock; the
// daemon's Client speaks to them. Package control imports no daemon, no
// front end and no plugin.
package control

import (
	"errors"
	"net/http"
	"syscall"

	"github.com/vmsan/vmsan/internal/backend"
	"github.com/vmsan/vmsan/internal/volrt"
	"github.com/vmsan/vmsan/internal/volume"
)

// Control API: HTTP/1.1 + JSON over the Unix socket <data_dir>/control.sock.
//
//	GET    /v1/status                     Status
//	GET    /v1/volumes                    []VolumeInfo
//	POST   /v1/volumes                    CreateRequest -> VolumeInfo (201)
//	GET    /v1/volumes/{name}             VolumeInfo
//	POST   /v1/volumes/{name}/resize      ResizeRequest -> VolumeInfo
//	POST   /v1/volumes/{name}/settings    Settings -> VolumeInfo
//	DELETE /v1/volumes/{name}?force=true  204
//	GET    /v1/events?now=&format=json    a stream of event lines (server.go)
//	GET    /v1/iscsi                      `vmsan iscsi show` data
//	(snapshots, clones, rollback, import: see the request types below)
//
// Errors are APIError bodies with a stable Code, which the Client maps back
// to the volume package's sentinel errors so errors.Is works across the
// socket. New subsystems (replication) add endpoints with host.Host.Handle and
// fields to /v1/status with host.Host.AddStatus; clients must ignore unknown
// fields.

// APIVersion is reported in Status; bump it on incompatible changes.
const APIVersion = 1

// SocketName is the control socket's file name inside the data dir.
const SocketName = "control.sock"

// VolumeInfo is a volume as the control API reports it.
type VolumeInfo struct {
	volume.Meta
	Path string `json:"path"`
	// Allocated is the bytes actually allocated on the host filesystem
	// (thin provisioning: usually much less than Size).
	Allocated int64 `json:"allocated"`
	// Open is true when the daemon has the volume open (engine running).
	Open bool `json:"open"`
	// Exports is the number of current references from front ends
	// (connected NBD clients).
	Exports int64 `json:"exports"`
	// Problem says why a volume that is not open cannot be served (e.g. a
	// damaged raw file and the command that repairs it).
	Problem string `json:"problem,omitempty"`
}

// CreateRequest is the body of POST /v1/volumes. Size accepts units
// ("20G"); see volume.ParseSize.
type CreateRequest struct {
	Name        string `json:"name"`
	Size        string `json:"size"`
	Cache       string `json:"cache,omitempty"`
	Rotational  bool   `json:"rotational,omitempty"`
	ReadOnly    bool   `json:"read_only,omitempty"`
	Description string `json:"description,omitempty"`
	BlockSize   uint32 `json:"block_size,omitempty"`
}

// Options converts the request to volume.CreateOptions.
func (c CreateRequest) Options() (volume.CreateOptions, error) {
	size, err := volume.ParseSize(c.Size)
	if err != nil {
		return volume.CreateOptions{}, err
	}
	return volume.CreateOptions{
		Name: c.Name, Size: size, Cache: backend.CacheMode(c.Cache), Rotational: c.Rotational,
		ReadOnly: c.ReadOnly, Description: c.Description, LogicalBlockSize: c.BlockSize,
	}, nil
}

// ResizeRequest is the body of POST /v1/volumes/{name}/resize.
type ResizeRequest struct {
	Size  string `json:"size"`
	Force bool   `json:"force,omitempty"`
}

// Settings is the body of POST /v1/volumes/{name}/settings: the mutable
// metadata fields; nil fields are left unchanged.
type Settings struct {
	Cache       *string `json:"cache,omitempty"`
	Rotational  *bool   `json:"rotational,omitempty"`
	ReadOnly    *bool   `json:"read_only,omitempty"`
	Description *string `json:"description,omitempty"`
}

// Apply sets the non-nil fields on m.
func (s Settings) Apply(m *volume.Meta) error {
	if s.Cache != nil {
		mode, err := backend.ParseCacheMode(*s.Cache)
		if err != nil {
			return &APIError{Code: "bad_request", Message: err.Error()}
		}
		m.Cache = mode
	}
	if s.Rotational != nil {
		m.Rotational = *s.Rotational
	}
	if s.ReadOnly != nil {
		m.ReadOnly = *s.ReadOnly
	}
	if s.Description != nil {
		m.Description = *s.Description
	}
	return nil
}

// Status is the body of GET /v1/status.
type Status struct {
	APIVersion int            `json:"api_version"`
	PID        int            `json:"pid"`
	DataDir    string         `json:"data_dir"`
	Listeners  []string       `json:"listeners"`
	Metrics    string         `json:"metrics,omitempty"`
	Volumes    []VolumeStatus `json:"volumes"`
	// FrontEnds are the front ends' front-end-neutral statistics, with
	// their connected clients.
	FrontEnds []volrt.FrontEndStats `json:"front_ends,omitempty"`
	// InflightBudget is the daemon-wide payload budget all front ends
	// share (inflight_budget): limit, bytes in use, waits, refusals.
	InflightBudget *volrt.BudgetStats `json:"inflight_budget,omitempty"`
	// Server is the NBD server's statistics snapshot (also in FrontEnds'
	// detail; kept so existing readers of this field keep working).
	Server any `json:"server,omitempty"`
	// Extra holds sections added with host.Host.AddStatus (e.g. "replication").
	Extra map[string]any `json:"extra,omitempty"`
}

// VolumeStatus is one volume in Status.
type VolumeStatus struct {
	VolumeInfo
	// Connections counts clients over all front ends; Clients lists them
	// (front end, address, since when).
	Connections int             `json:"connections"`
	Clients     []volrt.Session `json:"clients,omitempty"`
	Engine      *EngineStats    `json:"engine,omitempty"`
	// NoSpace is present once writes to the volume failed with ENOSPC
	// (its filesystem full): count, last time, free space now.
	NoSpace *NoSpaceStatus `json:"no_space,omitempty"`
}

// APIError is the JSON body of every non-2xx reply.
type APIError struct {
	Code    string `json:"code"`
	Message string `json:"error"`
}

func (e *APIError) Error() string { return e.Message }

// Is maps codes back to sentinel errors.
func (e *APIError) Is(target error) bool {
	for code, err := range codeErrs {
		if e.Code == code && target == err {
			return true
		}
	}
	return false
}

var codeErrs = map[string]error{
	"not_found":     volume.ErrNotFound,
	"exists":        volume.ErrExists,
	"in_use":        volume.ErrInUse,
	"shrink":        volume.ErrShrink,
	"bad_size":      volume.ErrBadSize,
	"invalid_name":  volume.ErrInvalidName,
	"read_only":     volume.ErrReadOnly,
	"invalid":       volume.ErrInvalid,
	"damaged":       volume.ErrDamaged,
	"no_reflink":    volume.ErrNoReflink,
	"has_snapshots": volume.ErrHasSnapshots,
	"replicated":    ErrReplicated,
}

// ErrReplicated: the operation would break a replicated pair (resizing one
// copy); a ResizeCheck wraps it.
var ErrReplicated = errors.New("refused for a replicated volume")

// StatusOf turns an internal error into a status code and APIError. Bad
// input always maps to 4xx (TestControlBadInput); 500 is left for real
// server failures (I/O errors writing metadata, and the like).
func StatusOf(err error) (int, *APIError) {
	if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
		return http.StatusInsufficientStorage, &APIError{Code: "no_space", Message: err.Error()}
	}
	for code, target := range codeErrs {
		if errors.Is(err, target) {
			st := http.StatusConflict
			switch code {
			case "not_found":
				st = http.StatusNotFound
			case "bad_size", "invalid_name", "invalid":
				st = http.StatusBadRequest
			}
			return st, &APIError{Code: code, Message: err.Error()}
		}
	}
	var ae *APIError
	if errors.As(err, &ae) {
		return http.StatusBadRequest, ae
	}
	return http.StatusInternalServerError, &APIError{Code: "internal", Message: err.Error()}
}

// ErrorCode is the control API's code for err ("not_found", "exists", ...,
// as in APIError), or "" when it has none: what `--json` error output
// reports beside the message, the same whether the error came over the
// control socket or from the store directly.
func ErrorCode(err error) string {
	if err == nil {
		return ""
	}
	var ae *APIError
	if errors.As(err, &ae) && ae.Code != "" && ae.Code != "http" {
		return ae.Code
	}
	if errors.Is(err, ErrDaemonStopped) {
		return "daemon_stopped"
	}
	if errors.Is(err, ErrNoDaemon) {
		return "no_daemon"
	}
	if errors.Is(err, volume.ErrNoDataDir) {
		return "no_data_dir"
	}
	if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
		return "no_space"
	}
	for code, target := range codeErrs {
		if errors.Is(err, target) {
			return code
		}
	}
	return ""
}

// SnapshotInfo is a snapshot as the control API reports it.
type SnapshotInfo struct {
	volume.SnapMeta
	Path      string `json:"path"`
	Allocated int64  `json:"allocated"`
	// Exports counts connected clients of the read-only export VOL@SNAP.
	Exports int64 `json:"exports"`
}

// SnapshotRequest is the body of POST /v1/volumes/{name}/snapshots.
type SnapshotRequest struct {
	Name string `json:"name"`
	Copy bool   `json:"copy,omitempty"`
	// Temporary: the caller deletes it when done (a live export); one
	// left behind is removed when the daemon next starts.
	Temporary bool `json:"temporary,omitempty"`
}

// CloneRequest is the body of POST /v1/clone: Source is "VOL@SNAP" or
// "VOL", Name the new volume.
type CloneRequest struct {
	Source string `json:"source"`
	Name   string `json:"name"`
	Copy   bool   `json:"copy,omitempty"`
}

// RollbackRequest is the body of POST /v1/volumes/{name}/rollback.
type RollbackRequest struct {
	Snapshot string `json:"snapshot"`
	Force    bool   `json:"force,omitempty"`
	Copy     bool   `json:"copy,omitempty"`
}

// ImportRequest is the body of POST /v1/import: a new volume whose raw
// file is Path, a temporary file in the data directory's volumes/ that the
// client filled (volume.TempImportPath).
type ImportRequest struct {
	CreateRequest
	Path string `json:"path"`
}

// NoSpaceStatus is a volume's ENOSPC record in Status (present once the
// volume had such an error), with the free space of its filesystem now.
type NoSpaceStatus struct {
	volrt.NoSpaceStats
	FSFreeBytes int64 `json:"fs_free_bytes"`
	FSSizeBytes int64 `json:"fs_size_bytes"`
}

// ErrDaemonStopped means the daemon went away during a call: its control
// socket refused the connection, or closed it before the reply. The
// request may or may not have been carried out (a caller that must know
// looks, as volume import does).
var ErrDaemonStopped = errors.New("the daemon stopped")

// ErrNoDaemon means no daemon is listening on the control socket.
var ErrNoDaemon = errors.New("no vmsan daemon is running on this data directory")
