// Package frontend is the seam between the daemon (the composition root)
// and its protocol front ends (NBD, iSCSI; next NFS): a front end is a
// package built against Host (volumes, roles, sessions, the in-flight
// budget, state directories, the logger) that returns a FrontEnd. The
// daemon builds each front end in its list, starts it, stops it, reads
// its Stats, and tells it about roles and reloads through the optional
// interfaces below; it knows nothing else about any protocol.
//
// Package frontend imports no daemon, no front end and no plugin.
package frontend

import (
	"context"
	"log/slog"
	"time"

	"github.com/vmsan/vmsan/internal/config"
	"github.com/vmsan/vmsan/internal/export"
	"github.com/vmsan/vmsan/internal/role"
	"github.com/vmsan/vmsan/internal/volrt"
)

// Volumes is the daemon's map of open volumes by name.
// INVARIANT: a map Host.Volumes returns is never modified: a change of
// the set publishes a new map, so a front end may cache what it derives
// from one and compare pointers to see a change.
type Volumes = map[string]*volrt.Volume

// Host is what a front end gets from the daemon. Safe for concurrent use.
type Host interface {
	// Logger is the daemon's logger.
	Logger() *slog.Logger
	// Registry opens volumes' devices (with the plugins' wrapping).
	Registry() export.Registry
	// Volumes is the current snapshot of open volumes (see Volumes).
	Volumes() *Volumes
	// StateDir is a volume's state directory (per-volume front-end
	// state: persisted LUN numbers, reservations).
	StateDir(vol string) (string, error)
	// Budget is the daemon-wide in-flight payload budget (inflight_budget)
	// every connection's budget reserves from.
	Budget() *volrt.Budget
	// VolumeRole is a volume's role as the role controller last
	// published it (role.Standalone unless replicated).
	VolumeRole(vol string) role.Role
	// BannerExport is the volume the start-up banner shows ("" when
	// there is none).
	BannerExport() string
	// NewSessions is a client tracker whose connects and disconnects the
	// daemon logs and publishes as client events.
	NewSessions(frontEnd string) *volrt.Sessions
}

// FrontEnd is a protocol server over the daemon's volumes.
//
// Concurrency: Stats and BannerLines may be called concurrently with
// Serve; Shutdown is called once, after or concurrently with Serve.
type FrontEnd interface {
	// Name is the front end's short name ("nbd"): the status section and
	// the metrics label.
	Name() string
	// Serve serves until Shutdown (then returns nil) or until a listener
	// fails (returns the error; the daemon then shuts down).
	Serve(ctx context.Context) error
	// Shutdown stops accepting, lets in-flight requests complete and be
	// answered, and releases the listeners. Bounded by ctx.
	Shutdown(ctx context.Context) error
	// Stats is the front-end-neutral snapshot (clients included).
	Stats() volrt.FrontEndStats
	// BannerLines are printed at start-up after the volume summary: how a
	// user connects (QEMU options, URLs).
	BannerLines() []string
	// Close releases listeners without draining (unwinding a failed New
	// or after Shutdown). Idempotent.
	Close()
}

// RoleObserver is implemented by front ends that present roles (iSCSI:
// ALUA states). VolumeRoleChanged is called on the role controller's
// owner goroutine and must not change roles (role.Subscriber).
type RoleObserver interface {
	VolumeRoleChanged(name string, r role.Role)
}

// RoleDrainer is implemented by front ends that can wait until the
// commands they admitted under the previous role have completed (iSCSI:
// the per-volume logical unit's ALUA-checked commands). The role
// controller calls it between publishing role.Transitioning and the change.
type RoleDrainer interface {
	DrainVolume(name string, timeout time.Duration) error
}

// IdleHolder is a front end that holds volumes open without a client (the
// iSCSI front end's logical units keep their volume between sessions).
// IdleHolds returns how many of vol's references are such holds, so they
// do not count as clients (delete needs no --force for them); ReleaseIdle
// drops them.
type IdleHolder interface {
	IdleHolds(vol string) int64
	ReleaseIdle(vol string)
}

// Reloader is implemented by front ends that apply some settings of a
// reloaded configuration without a restart. PrepareReload reads and
// checks next (secret files included) before the reload changes anything
// and returns what applies it; an error rejects the whole reload.
type Reloader interface {
	PrepareReload(next config.Config) (apply func(), err error)
}
