// Package host is the narrow interface the daemon (the composition root,
// internal/daemon) offers to what it hosts: plugins (replication,
// internal/repl/driver) are built against Host, not against the daemon,
// so a plugin sees the volume store, the role controller, the event bus
// and a few registration points, and nothing of the daemon's lifecycle,
// front ends or control operations. A test can host a plugin with a
// fake Host.
//
// The daemon implements Host with an adapter (internal/daemon, plugin.go);
// package host imports no daemon, no front end and no plugin.
package host

import (
	"net/http"

	"github.com/vmsan/vmsan/internal/events"
	"github.com/vmsan/vmsan/internal/export"
	"github.com/vmsan/vmsan/internal/metrics"
	"github.com/vmsan/vmsan/internal/role"
	"github.com/vmsan/vmsan/internal/volume"
)

// Host is what a plugin gets from the daemon at Start. Safe for concurrent
// use; the registration methods (Handle, AddStatus, AddEventSource,
// SetReplicaMetrics) are meant to be called from Start, before the
// daemon serves.
type Host interface {
	// Store is the volume store (metadata, state directories).
	Store() *volume.Store
	// Events is the daemon's event bus; plugins publish on it.
	Events() *events.Bus
	// Roles is the role controller, the one owner of every replicated
	// volume's role: a plugin registers its volumes' actuators there and
	// changes roles through it (role.Controller.Change).
	Roles() *role.Controller
	// Handle registers a control API endpoint (Go 1.22 ServeMux pattern).
	Handle(pattern string, h http.Handler)
	// AddStatus adds a section to /v1/status under Extra[key]; fn is
	// called on every status request and must be safe for concurrent use.
	AddStatus(key string, fn func() any)
	// AddEventSource adds fn's events to the "exists" snapshot each new
	// event subscriber gets. fn must be safe for concurrent use.
	AddEventSource(fn func() []events.Event)
	// SetReplicaMetrics makes /metrics include replication series: fn is
	// called at every scrape and must be safe for concurrent use.
	SetReplicaMetrics(fn func() []metrics.Replica)
}

// Plugin extends a daemon with per-volume features that live outside the
// daemon (replication, internal/repl/driver). `vmsan serve` passes them
// in daemon.Options.Plugins; a daemon built in a test gets exactly the
// plugins the test passes.
type Plugin interface {
	// Start runs once the volumes are open and the control socket is up,
	// before anything is served. open returns a volume's device without
	// any plugin wrapping (release it with Release when done).
	Start(h Host, open func(name string) (export.Device, error)) error
	// WrapDevice may wrap the device a front end gets from the registry.
	WrapDevice(name string, dev export.Device) export.Device
	// Stop runs at shutdown after front ends drained, before volumes close.
	Stop() error
}
