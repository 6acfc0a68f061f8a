// Package daemon is the composition root: it wires volume store ->
// volume runtime (volrt.Volume: backend + I/O engine) -> export registry
// -> a list of front ends (frontEndFactories: NBD, iSCSI), plus the
// control socket, metrics, plugins and signal-driven shutdown. It knows no
// protocol: each front end is built against frontend.Host (feHost) and
// implements frontend.FrontEnd (package nbd/nbdfront for NBD,
// iscsi/iscsifront for iSCSI); plugins are built against host.Host
// (pluginHost). Adding a front end is a line in frontEndFactories.
//
// Simplest use (what `vmsan serve` does):
//
//	d, err := daemon.New(config.Default(), daemon.Options{Out: os.Stdout})
//	if err != nil { ... }
//	err = d.Run(ctx) // until ctx is cancelled (SIGTERM), then drains and exits
//
// Plugins (replication) and volume hooks are passed in Options; there is
// no global registration, so a daemon built in a test has exactly what the
// test passes. A plugin registers a replicated volume with the role
// controller (host.Host.Roles, internal/role), which owns its role and tells the
// front ends (alua.go; the iSCSI front end maps it to ALUA port group
// states), so front ends and plugins never import each other.
//
// New binds every listener before returning, so tests can pass "127.0.0.1:0"
// and read the real address from NBDAddrs.
//
// Shutdown order (Run, after ctx is done): stop the control socket, each
// front end's Shutdown (stop accepting connections and wait for in-flight
// requests to be replied), stop plugins, close each engine
// (drain + sync) and backend, release the data directory lock. A FLUSH
// acknowledged before shutdown is durable by then; so is every write
// acknowledged before it, because engine Close syncs.
//
// Reload (reload.go; SIGHUP in `vmsan serve` through HandleReloads) applies
// a new configuration without dropping clients: new volumes, TLS files, log
// level; what needs a restart is logged. TLS material lives in tlsreload.Server
// (internal/tlsreload) so new handshakes pick up rotated certificates.
// The volume operations the control API runs are internal/volops.
//
// Concurrency: Daemon methods are safe for concurrent use. Control
// operations that change the set of volumes are serialised by mu; the data
// path reads an immutable snapshot of the volume map and never takes mu.
package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vmsan/vmsan/internal/config"
	"github.com/vmsan/vmsan/internal/control"
	"github.com/vmsan/vmsan/internal/events"
	"github.com/vmsan/vmsan/internal/frontend"
	"github.com/vmsan/vmsan/internal/metrics"
	"github.com/vmsan/vmsan/internal/nbd/nbdfront"
	"github.com/vmsan/vmsan/internal/netutil"
	"github.com/vmsan/vmsan/internal/nospace"
	"github.com/vmsan/vmsan/internal/role"
	"github.com/vmsan/vmsan/internal/snapexport"
	"github.com/vmsan/vmsan/internal/tlsreload"
	"github.com/vmsan/vmsan/internal/volconf"
	"github.com/vmsan/vmsan/internal/volops"
	"github.com/vmsan/vmsan/internal/volrt"
	"github.com/vmsan/vmsan/internal/volume"
)

// ControlSocketName is the control socket's file name inside the data dir.
const ControlSocketName = control.SocketName

// Options are the parts of a daemon that are not configuration.
type Options struct {
	// Out receives the human-readable start-up banner (QEMU command lines);
	// nil discards it.
	Out io.Writer
	// Logger; nil logs to stderr at the configured level.
	Logger *slog.Logger
	// ShutdownTimeout bounds the drain on shutdown (default 30s).
	ShutdownTimeout time.Duration
	// RoleDrainTimeout bounds a promote's or demote's wait for commands
	// admitted under the old role (default role.DefaultDrainTimeout).
	RoleDrainTimeout time.Duration
	// Plugins are built (in order) once the volumes are open; `vmsan
	// serve` passes replication's here (cmd/vmsan/plugins.go). A daemon
	// built without them has none: there is no global registration.
	Plugins []PluginFactory
	// Hooks refuse deletes and resizes plugins cannot follow (pass the
	// same ones to OpenVolumeOps). Plugins' per-volume state lives in the
	// volume's state directory and goes with the volume: no hook removes it.
	Hooks VolumeHooks
}

// Daemon is a running vmsan node.
type Daemon struct {
	cfg   config.Config
	opts  Options
	log   *slog.Logger
	store *volume.Store
	nbd   *nbdfront.FrontEnd // the NBD entry of frontEnds (NBDAddrs)
	// budget is the daemon-wide in-flight payload budget every front
	// end's per-connection budget reserves from (inflight_budget).
	budget volrt.Budget
	tls    *tlsreload.Server // nil when TLS is off

	// mu serialises changes to vols, and guards the fields of cfg that
	// Reload changes (LogLevel, Volumes, TLS file names); the others are
	// fixed after New.
	mu   sync.Mutex
	vols atomic.Pointer[map[string]*volrt.Volume] // copy-on-write snapshot

	ctl     *control.Server   // the control socket
	metrics *metrics.Listener // nil without metrics_listen

	statusMu sync.Mutex
	statusFn map[string]func() any
	eventSrc []func() []events.Event // under statusMu

	// events carries volume, client and replication events to `vmsan
	// events` subscribers (events.go); eventsStop ends their streams at
	// shutdown (an HTTP server's Shutdown waits for handlers).
	events     *events.Bus
	eventsStop chan struct{}

	serveErr chan error
	closed   atomic.Bool

	reloadMu sync.Mutex     // serialises Reload
	level    *slog.LevelVar // the log level, when New made the logger

	// plugins (and their WrapDevice links, wraps) are set in New before
	// anything is served, then read-only.
	plugins     []Plugin
	wraps       []volrt.Wrap
	pluginsStop sync.Once

	// frontEnds serve the volumes (NBD, iSCSI when configured): set in New, then
	// read-only.
	frontEnds []FrontEnd

	// snaps are the read-only exports of snapshots (internal/snapexport):
	// set in New once the store is open.
	snaps *snapexport.Exports
	// vo are the volume operations (internal/volops): set with snaps.
	vo *volops.Ops

	// replMetrics is set by the replication plugin (SetReplicaMetrics).
	replMetrics atomic.Pointer[replMetricsFn]

	// roles are replicated volumes' roles as the front ends were told
	// them (role.Mirror; setVolumeRole, alua.go); roleCtl owns them
	// (pluginHost.Roles).
	roles   *role.Mirror
	roleCtl *role.Controller

	// noSpace holds the volumes' ENOSPC records (internal/nospace): set
	// in New once the store is open.
	noSpace *nospace.Watch
}

// VolumeDeleter is implemented by plugins that hold a volume open or keep
// live per-volume state: VolumeDeleted runs after a (forced) delete
// removed the volume (and its state directory), to stop using it; the
// daemon then removes whatever the plugin wrote into the state directory
// before it stopped (volume.Store.RemoveStateDebris).
type VolumeDeleter interface {
	VolumeDeleted(name string)
}

// New opens the data directory, binds all listeners, then ensures the
// configured (or default) volumes exist and opens them: a listener that
// cannot be bound fails New with no volume created. Nothing is served
// until Run.
func New(cfg config.Config, opts Options) (_ *Daemon, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if opts.Out == nil {
		opts.Out = io.Discard
	}
	if opts.ShutdownTimeout == 0 {
		opts.ShutdownTimeout = 30 * time.Second
	}
	log := opts.Logger
	var level *slog.LevelVar
	if log == nil {
		level = new(slog.LevelVar)
		level.Set(config.SlogLevel(cfg.LogLevel))
		log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	}
	for _, n := range cfg.DeprecationNotes() {
		log.Warn(n)
	}
	d := &Daemon{cfg: cfg, opts: opts, log: log, level: level, statusFn: map[string]func() any{}, serveErr: make(chan error, 8),
		events: events.NewBus(), eventsStop: make(chan struct{})}
	empty := map[string]*volrt.Volume{}
	d.vols.Store(&empty)
	d.roles = role.NewMirror(log, d.tellFrontEnds)
	d.budget.Init(int64(d.inflightBudget()))
	defer func() {
		if err != nil {
			d.closeAll()
		}
	}()

	if d.store, err = volume.Open(cfg.DataDir); err != nil {
		return nil, err
	}
	for _, n := range d.store.Notices() {
		lvl := slog.LevelInfo
		if n.Warn {
			lvl = slog.LevelWarn
		}
		if n.Volume != "" {
			log.Log(context.Background(), lvl, n.Msg, "volume", n.Volume)
		} else {
			log.Log(context.Background(), lvl, n.Msg)
		}
	}
	d.store.SetHooks(volume.Hooks{InUse: d.inUse, Resize: d.resizeHook})
	d.noSpace = nospace.New(d.store, log, d.events)
	d.snaps = snapexport.New(d.store, log, engineConfig(cfg.Engine), uint32(cfg.MaxPayload))
	d.vo = volops.New(&d.mu, d.store, log, d.events, opts.Hooks, cfg.DataDir, d.snaps, volRuntime{d})

	if d.tls, err = tlsreload.New(cfg.TLS); err != nil {
		return nil, err
	}
	// Every listener is bound before any volume is created (configured
	// ones, or "default"): a start that fails (a port in use) changes
	// nothing in the data directory. Front ends bind first, before the
	// control socket and plugins, so a listener that cannot be bound
	// fails New before replication starts talking to its peer. Front ends
	// look volumes up when clients come (nothing is served before Run).
	for _, newFE := range frontEndFactories {
		fe, err := newFE(d)
		if err != nil {
			return nil, err
		}
		if fe == nil {
			continue // not configured (iSCSI without a listener)
		}
		d.frontEnds = append(d.frontEnds, fe)
	}
	if err = d.startControl(); err != nil {
		return nil, err
	}
	if cfg.MetricsListen != "" {
		if err = d.startMetrics(); err != nil {
			return nil, err
		}
	}
	if err = volconf.Ensure(d.store, cfg, opts.Hooks.Resize, log); err != nil {
		return nil, err
	}
	if err = d.openAll(); err != nil {
		return nil, err
	}
	// The role controller exists before any plugin registers a volume
	// with it, and its one subscriber (the front ends) before any role.
	d.roleCtl = role.New(role.Options{Drain: d.drainVolume, DrainTimeout: opts.RoleDrainTimeout, Log: log, Events: d.events})
	d.roleCtl.Subscribe(func(e role.Event) { d.setVolumeRole(e.Volume, e.Role) })
	pluginHost{d}.AddEventSource(d.roleCtl.ExistsEvents)
	if err = d.startPlugins(); err != nil {
		return nil, err
	}
	return d, nil
}

func (d *Daemon) engineFor(name string) config.Engine {
	for _, cv := range d.cfg.Volumes {
		if cv.Name == name {
			return cv.Engine.Merge(d.cfg.Engine)
		}
	}
	return d.cfg.Engine
}

// openAll opens every volume in the store (volconf.OpenAll).
func (d *Daemon) openAll() error {
	m, err := volconf.OpenAll(d.store, d.log, func(meta volume.Meta) (*volrt.Volume, error) {
		return openVol(d.store, meta, d.engineFor(meta.Name), uint32(d.cfg.MaxPayload))
	})
	if m == nil {
		return err
	}
	d.noSpace.Attach(m)
	d.vols.Store(&m)
	return nil
}

// publish replaces the volume map snapshot. REQUIRES: d.mu held.
func (d *Daemon) publish(fn func(m map[string]*volrt.Volume)) {
	old := *d.vols.Load()
	n := make(map[string]*volrt.Volume, len(old)+1)
	for k, v := range old {
		n[k] = v
	}
	fn(n)
	d.noSpace.Attach(n)
	d.vols.Store(&n)
}

// inUse is the store's InUse hook. It runs under the store mutex, so it only
// reads atomics.
func (d *Daemon) inUse(name string) bool { return d.volumeClients(name) > 0 }

// volumeClients is the one definition of "in use" every command applies
// (volume list's EXPORTS, delete, set, rollback): the references front
// ends hold on the volume for connected clients, that is, all of them but
// the idle holds (frontend.IdleHolder) of front ends with no client on it.
func (d *Daemon) volumeClients(name string) int64 {
	v := (*d.vols.Load())[name]
	if v == nil {
		return 0
	}
	return d.clientsOf(name, v)
}

func (d *Daemon) clientsOf(name string, v *volrt.Volume) int64 {
	refs := v.Refs()
	for _, fe := range d.frontEnds {
		if h, ok := fe.(frontend.IdleHolder); ok {
			refs -= h.IdleHolds(name)
		}
	}
	return max(refs, 0)
}

// resizeHook is the store's Resize hook: an open volume is resized through
// its backend so the size the next connection sees is the new one.
func (d *Daemon) resizeHook(name string, size int64) (bool, error) {
	v := (*d.vols.Load())[name]
	if v == nil {
		return false, nil
	}
	return true, v.Resize(size)
}

// NBDSocketMode is the mode of NBD Unix sockets: owner and group may
// connect (read-write access to the volumes), others may not, whatever the
// umask. Give a client access by group (chgrp the socket's directory and
// socket), not by widening the mode.
const NBDSocketMode = 0o660

// ControlSocketMode is the control socket's mode: only the owner may
// create, resize or delete volumes.
const ControlSocketMode = 0o600

func listen(l string) (net.Listener, error) {
	if p, ok := strings.CutPrefix(l, "unix:"); ok {
		return netutil.ListenUnix(p, NBDSocketMode)
	}
	ln, err := net.Listen("tcp", l)
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", l, err)
	}
	return ln, nil
}

// NBDAddrs returns the bound NBD listener addresses in configuration order.
func (d *Daemon) NBDAddrs() []net.Addr { return d.nbd.Addrs() }

// MetricsAddr is the bound metrics address, or nil.
func (d *Daemon) MetricsAddr() net.Addr {
	if d.metrics == nil {
		return nil
	}
	return d.metrics.Addr()
}

// ControlPath is the control socket path.
func (d *Daemon) ControlPath() string { return filepath.Join(d.cfg.DataDir, ControlSocketName) }

// bannerExport is the volume the banner shows (frontend.BannerExport).
func (d *Daemon) bannerExport() string {
	vols := *d.vols.Load()
	return frontend.BannerExport(vols, d.defaultExport(vols))
}

// Banner writes how to use the daemon (frontend.WriteBanner).
func (d *Daemon) Banner(w io.Writer) {
	frontend.WriteBanner(w, d.cfg.DataDir, *d.vols.Load(), d.bannerExport(), d.frontEnds)
}

// Run serves until ctx is done, then shuts down gracefully (see package
// doc). It returns nil after a clean shutdown.
func (d *Daemon) Run(ctx context.Context) error {
	d.Banner(d.opts.Out)
	for _, fe := range d.frontEnds {
		go func(fe FrontEnd) {
			if err := fe.Serve(ctx); err != nil && !d.closed.Load() {
				d.serveErr <- err
			}
		}(fe)
	}
	go d.ctl.Serve(d.log)
	go d.noSpace.Run(ctx)
	if d.metrics != nil {
		go d.metrics.Serve()
	}
	d.log.Info("vmsan serving", "data_dir", d.cfg.DataDir, "listen", d.cfg.Listeners(),
		"inflight_budget", volume.HumanSize(d.budget.Stats().Limit),
		// The Go runtime raised the soft limit to the hard one; the caps
		// of non-data listeners derive from it (limits.go, fdShare).
		"max_open_files", netutil.NofileLimit())
	var runErr error
	select {
	case <-ctx.Done():
		d.log.Info("shutting down: draining in-flight requests")
	case runErr = <-d.serveErr:
		d.log.Error("listener failed; shutting down", "err", runErr)
	}
	if err := d.Shutdown(); err != nil && runErr == nil {
		runErr = err
	}
	return runErr
}

// Shutdown stops serving, drains, flushes and releases everything.
// Idempotent; Run calls it.
func (d *Daemon) Shutdown() error {
	if d.closed.Swap(true) {
		return nil
	}
	// Wait for a reload in progress (it may be opening a volume that
	// closeAll must see); later ones see closed and do nothing.
	d.reloadMu.Lock()
	d.reloadMu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), d.opts.ShutdownTimeout)
	defer cancel()
	var errs []error
	if d.ctl != nil {
		d.ctl.Shutdown(ctx)
	}
	for _, fe := range d.frontEnds {
		if err := fe.Shutdown(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	if d.metrics != nil {
		d.metrics.Shutdown(ctx)
	}
	if err := d.stopPlugins(); err != nil {
		errs = append(errs, fmt.Errorf("plugins: %w", err))
	}
	if err := d.closeAll(); err != nil {
		errs = append(errs, err)
	}
	if len(errs) == 0 {
		d.log.Info("shutdown complete: all volumes flushed")
	}
	return errors.Join(errs...)
}

// closeAll closes volumes, listeners and the store (also used to unwind a
// failed New).
func (d *Daemon) closeAll() error {
	var errs []error
	if err := d.stopPlugins(); err != nil {
		errs = append(errs, err)
	}
	if d.roleCtl != nil {
		// After the plugins: a change still running finishes first.
		d.roleCtl.Close()
	}
	for _, fe := range d.frontEnds {
		fe.Close()
	}
	if d.ctl != nil {
		d.ctl.Close()
	}
	if d.metrics != nil {
		d.metrics.Close()
	}
	if d.snaps != nil {
		if err := d.snaps.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	if p := d.vols.Load(); p != nil {
		for name, v := range *p {
			if err := v.Close(); err != nil {
				errs = append(errs, fmt.Errorf("volume %s: close: %w", name, err))
			}
		}
	}
	if d.store != nil {
		d.store.Close()
	}
	return errors.Join(errs...)
}
