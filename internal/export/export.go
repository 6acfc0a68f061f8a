// Package export is the seam between protocol front ends (NBD, iSCSI) and
// the volumes they serve. A front end looks a Device up by name in a
// Registry, reads its Info once per connection, and submits requests.
//
// Simplest use (a front end):
//
//	dev, err := reg.Open(name) // a reference is held
//	defer dev.Release()
//	info := dev.Info()
//	dev.Submit(req)            // *export.Request; req.Done is called exactly once
//
// Front ends submit Requests (request.go), the runtime's request type,
// not the engine's: what executes them is the runtime's business.
//
// The production Device is volrt.Volume's (daemon's registry hands it
// out); replication's driver wraps it, which is why the interfaces live
// here, below both. Tests use export/exporttest.
//
// Concurrency: implementations are safe for concurrent use.
package export

import (
	"github.com/vmsan/vmsan/internal/backend"
)

// Info is what a front end advertises for a device.
type Info struct {
	Name        string
	Description string
	UUID        string
	Size        int64
	ReadOnly    bool
	Rotational  bool
	// CanMultiConn is true when a FLUSH on one connection makes writes
	// completed on every connection durable (true for one shared engine).
	CanMultiConn bool
	// Block sizes (NBD_INFO_BLOCK_SIZE): minimum, preferred, maximum payload.
	MinBlock, PrefBlock, MaxBlock uint32
	// Cache is the volume's cache mode: SCSI advertises a volatile write
	// cache (WCE) for every mode but writethrough. Empty means writeback.
	Cache backend.CacheMode
}

// Device is an exported volume.
//
// Concurrency: all methods are safe for concurrent use.
type Device interface {
	Info() Info
	// Submit queues r; r.Done is called exactly once.
	Submit(r *Request)
	// Extents answers block status for [off, off+length).
	Extents(off, length int64) ([]backend.Extent, error)
	// Release drops the reference taken by Registry.Open.
	Release()
}

// Registry resolves export names to devices.
type Registry interface {
	// Open returns the named device with a reference held (release with
	// Device.Release). The empty name means the default export.
	// It returns ErrNotFound when there is no such export.
	Open(name string) (Device, error)
	// List returns the exports in name order.
	List() []Info
}

// ErrNotFound is returned by Registry.Open for an unknown export name.
var ErrNotFound = errNotFound{}

type errNotFound struct{}

func (errNotFound) Error() string { return "export: no such export" }

// RoleFollower is implemented by a wrapped device whose holder may declare
// that it follows the volume's replication role (it refuses I/O itself
// while the role changes and waits for what it admitted before, e.g. an
// ALUA-aware iSCSI logical unit). Such a holder is then not a client that
// keeps the volume "held open" against a demote.
type RoleFollower interface {
	// FollowRoles marks this reference as role-following; idempotent.
	FollowRoles()
}
