package daemon

import (
	"errors"
	"log/slog"
	"net/http"

	"github.com/vmsan/vmsan/internal/config"
	"github.com/vmsan/vmsan/internal/events"
	"github.com/vmsan/vmsan/internal/export"
	"github.com/vmsan/vmsan/internal/host"
	"github.com/vmsan/vmsan/internal/metrics"
	"github.com/vmsan/vmsan/internal/role"
	"github.com/vmsan/vmsan/internal/volume"
)

// Plugin extends a daemon with per-volume features that live outside this
// package (replication, internal/repl/driver); it is built against
// host.Host, not against *Daemon.
type Plugin = host.Plugin

// PluginFactory builds a plugin for a daemon's configuration; it returns
// nil, nil when the plugin has nothing to do.
type PluginFactory func(cfg config.Config, log *slog.Logger) (Plugin, error)

func (d *Daemon) startPlugins() error {
	for _, f := range d.opts.Plugins {
		p, err := f(d.cfg, d.log)
		if err != nil {
			return err
		}
		if p == nil {
			continue
		}
		d.plugins = append(d.plugins, p)
		d.wraps = append(d.wraps, p.WrapDevice)
		if err := p.Start(pluginHost{d}, func(name string) (export.Device, error) { return registry{d}.open(name, false) }); err != nil {
			return err
		}
	}
	return nil
}

func (d *Daemon) stopPlugins() error {
	var errs []error
	d.pluginsStop.Do(func() {
		for i := len(d.plugins) - 1; i >= 0; i-- {
			if err := d.plugins[i].Stop(); err != nil {
				errs = append(errs, err)
			}
		}
	})
	return errors.Join(errs...)
}

// pluginHost is the daemon as plugins see it (host.Host): the volume
// store, the role controller, the event bus and the registration points,
// nothing of the daemon's lifecycle or control operations.
type pluginHost struct{ d *Daemon }

var _ host.Host = pluginHost{}

func (h pluginHost) Store() *volume.Store    { return h.d.store }
func (h pluginHost) Events() *events.Bus     { return h.d.events }
func (h pluginHost) Roles() *role.Controller { return h.d.roleCtl }

// Handle registers an extra control API endpoint (Go 1.22 ServeMux pattern,
// e.g. "POST /v1/volumes/{name}/promote"). Call before Run.
func (h pluginHost) Handle(pattern string, hd http.Handler) { h.d.ctl.Mux.Handle(pattern, hd) }

// AddStatus adds a section to /v1/status under Extra[key]; fn is called on
// every status request and must be safe for concurrent use.
func (h pluginHost) AddStatus(key string, fn func() any) {
	h.d.statusMu.Lock()
	h.d.statusFn[key] = fn
	h.d.statusMu.Unlock()
}

// AddEventSource adds fn's events to the "exists" snapshot each new
// subscriber gets (the replication plugin: one line per replica). fn must
// be safe for concurrent use. Call before Run.
func (h pluginHost) AddEventSource(fn func() []events.Event) {
	h.d.statusMu.Lock()
	h.d.eventSrc = append(h.d.eventSrc, fn)
	h.d.statusMu.Unlock()
}

// SetReplicaMetrics makes /metrics include replication series: fn is
// called at every scrape and must be safe for concurrent use (the
// replication plugin sets it; the daemon does not know the repl packages).
func (h pluginHost) SetReplicaMetrics(fn func() []metrics.Replica) { h.d.replMetrics.Store(&fn) }
