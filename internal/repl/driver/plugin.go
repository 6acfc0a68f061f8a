package driver

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"

	"github.com/vmsan/vmsan/internal/config"
	"github.com/vmsan/vmsan/internal/daemon"
	"github.com/vmsan/vmsan/internal/events"
	"github.com/vmsan/vmsan/internal/export"
	"github.com/vmsan/vmsan/internal/host"
	"github.com/vmsan/vmsan/internal/httpjson"
	"github.com/vmsan/vmsan/internal/metrics"
	"github.com/vmsan/vmsan/internal/repl"
	"github.com/vmsan/vmsan/internal/role"
	"github.com/vmsan/vmsan/internal/volume"
)

// Plugin runs replication inside a vmsan daemon: one Replica per volume
// that has config.json in its replication directory (Dir: repl/ in the
// volume's state directory). A daemon gets it by
// passing driver.NewPlugin in daemon.Options.Plugins (cmd/vmsan/plugins.go).
//
// Control endpoints (on the daemon's control socket):
//
//	POST /v1/repl/{volume}/{op}   op: promote, promote-force, demote,
//	                              demote-force, verify, connect,
//	                              connect-discard-my-data, disconnect
//
//	GET  /v1/repl                 every replica's Status (JSON list)
//
//	PUT    /v1/repl/{volume}      configure and apply now (lifecycle.go)
//	DELETE /v1/repl/{volume}      remove replication (lifecycle.go)
//
// Replicas are added, reconfigured and removed while the daemon runs
// (lifecycle.go); every volume's clients go through its route (route.go),
// replicated or not.
//
// `vmsan status` gains a "replication" section, and /metrics the
// vmsan_repl_* series (host.Host.SetReplicaMetrics).
type Plugin struct {
	d       host.Host                           // set by Start
	open    func(string) (export.Device, error) // set by Start
	dataDir string
	log     *slog.Logger
	// fileVolumes are the volumes with a replication section in the
	// daemon's configuration file (it wins again at the next start).
	fileVolumes map[string]bool

	// lifeMu serialises replica lifecycle changes (Apply, Remove,
	// VolumeDeleted): one at a time per daemon, each pausing only its
	// own volume's route.
	lifeMu sync.Mutex
	// applied are the settings each running replica runs with (under
	// lifeMu; a replica's own copy is fixed at its start, and timeouts
	// and rates may change in place since).
	applied map[string]Settings
	// listeners are the node's replication listeners, shared by the
	// volumes configured with the same listen address (mux.go).
	listeners *Listeners

	mu        sync.Mutex
	replicas  map[string]*Replica
	devByName map[string]export.Device
	// routes are every served volume's client routes (route.go), by name.
	routes map[string]*route
	// roleOwned: the volumes whose role the role controller owns
	// (registered at the first replica start, kept across restarts).
	roleOwned map[string]bool
}

// NewPlugin is a daemon.PluginFactory. Volumes with a replication section
// in the daemon configuration get their settings written first (the file
// wins over `vmsan repl configure`; the node id is kept). The plugin is
// built even when no volume is replicated yet: replication can be added
// to any volume of the running daemon (Apply), so every volume's clients
// go through its route.
func NewPlugin(cfg config.Config, log *slog.Logger) (daemon.Plugin, error) {
	// State in the old layout moves first, so that nothing below reads or
	// writes the old place.
	if err := Migrate(cfg.DataDir, log); err != nil {
		return nil, err
	}
	fileVolumes := map[string]bool{}
	for _, v := range cfg.Volumes {
		if v.Replication == nil {
			continue
		}
		fileVolumes[v.Name] = true
		if _, err := Configure(cfg.DataDir, v.Name, v.Replication.Settings()); err != nil {
			return nil, fmt.Errorf("replication of %s: %w", v.Name, err)
		}
	}
	return &Plugin{dataDir: cfg.DataDir, log: log, fileVolumes: fileVolumes, applied: map[string]Settings{}, listeners: NewListeners(log),
		replicas: map[string]*Replica{}, devByName: map[string]export.Device{}, routes: map[string]*route{}, roleOwned: map[string]bool{}}, nil
}

// Start opens every configured replica.
func (p *Plugin) Start(d host.Host, open func(string) (export.Device, error)) error {
	p.d = d
	p.open = open
	for _, name := range volume.StateVolumes(p.dataDir, settingsRel) {
		dir := Dir(p.dataDir, name)
		set, err := LoadSettings(dir)
		if err != nil {
			return fmt.Errorf("replication of %s: %w", name, err)
		}
		_, verr := d.Store().Get(name)
		if err := p.startReplica(name, set); errors.Is(err, export.ErrNotFound) {
			if verr == nil {
				// The volume exists but is not served (a damaged raw file,
				// reported with its repair command when the daemon opened
				// its volumes): its replication state must stay as it is.
				p.log.Error("replicated volume is not served; replication not started until it is repaired (see the volume's error above)", "volume", name)
				continue
			}
			// A state directory left by a crash during a delete (the
			// volume's next Create removes it): not a reason to refuse to
			// serve the other volumes.
			p.log.Warn("replication state for a volume that does not exist; ignored (remove the directory)", "volume", name, "dir", dir)
			continue
		} else if err != nil {
			return err
		}
	}
	d.AddStatus("replication", func() any {
		if st := p.Statuses(); len(st) > 0 {
			return st
		}
		return nil // no replicated volume: no section
	})
	d.SetReplicaMetrics(p.Metrics)
	d.AddEventSource(func() []events.Event {
		var out []events.Event
		for _, st := range p.Statuses() {
			out = append(out, eventsFromStatus(st)...)
		}
		return out
	})
	d.Handle("POST /v1/repl/{volume}/{op}", http.HandlerFunc(p.handle))
	d.Handle("GET /v1/repl", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		httpjson.Write(w, http.StatusOK, p.Statuses())
	}))
	d.Handle("PUT /v1/repl/{volume}", http.HandlerFunc(p.handleConfigure))
	d.Handle("DELETE /v1/repl/{volume}", http.HandlerFunc(p.handleRemove))
	return nil
}

// startReplica opens the volume's device and starts its replica with set,
// routing the volume's clients through it. It returns an error wrapping
// export.ErrNotFound when the volume is not served.
// REQUIRES: lifeMu held or the daemon not yet serving (Start); the route
// paused or not yet used by clients.
func (p *Plugin) startReplica(name string, set Settings) error {
	vm, err := p.d.Store().Get(name)
	if err != nil {
		return fmt.Errorf("replication of %s: volume: %w", name, err)
	}
	p.mu.Lock()
	dev := p.devByName[name]
	p.mu.Unlock()
	if dev == nil {
		if dev, err = p.open(name); err != nil {
			return fmt.Errorf("replication of %s: volume: %w", name, err)
		}
	}
	rt := p.route(name)
	r, err := Start(Options{Name: name, Dir: Dir(p.dataDir, name), Device: dev, Settings: set, Logger: p.log, DataID: vm.DataID, Events: p.d.Events(),
		Opens: &rt.opens, Listeners: p.listeners, OnRole: p.onRole(name)})
	if err != nil {
		p.mu.Lock()
		if p.devByName[name] == nil {
			dev.Release()
		}
		p.mu.Unlock()
		return err
	}
	p.mu.Lock()
	p.replicas[name] = r
	p.devByName[name] = dev
	p.mu.Unlock()
	rt.cur.Store(r)
	p.applied[name] = set
	p.log.Info("replication started", "volume", name, "listen", set.Listen, "peer", set.Peer, "protocol", set.Protocol)
	// The role controller owns the volume's role from the first start
	// on: it publishes the role the replica starts in, runs promote and
	// demote, and re-reads the role when the replica reports a change
	// (onRole). Its actuator finds the replica by name, so a replica
	// restarted by a reconfigure is the one it acts on.
	p.mu.Lock()
	owned := p.roleOwned[name]
	p.roleOwned[name] = true
	p.mu.Unlock()
	if owned {
		p.d.Roles().Observe(name) // the new replica's role
		return nil
	}
	if err := p.d.Roles().Register(name, replicaRole{p, name}); err != nil {
		return fmt.Errorf("replication of %s: %w", name, err)
	}
	return nil
}

// disownRole hands the volume's role back (replication removed or the
// volume deleted): the front ends are told Standalone.
func (p *Plugin) disownRole(name string) {
	p.mu.Lock()
	owned := p.roleOwned[name]
	delete(p.roleOwned, name)
	p.mu.Unlock()
	if owned {
		p.d.Roles().Unregister(name)
	}
}

// route returns the volume's route, created on first use.
func (p *Plugin) route(name string) *route {
	p.mu.Lock()
	defer p.mu.Unlock()
	rt := p.routes[name]
	if rt == nil {
		rt = &route{}
		p.routes[name] = rt
	}
	return rt
}

// Statuses returns every replica's status, by volume name.
func (p *Plugin) Statuses() []Status {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]Status, 0, len(p.replicas))
	for _, r := range p.replicas {
		out = append(out, r.Status())
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Volume < out[j].Volume })
	return out
}

// Metrics returns every replica's metrics snapshot (for /metrics).
func (p *Plugin) Metrics() []metrics.Replica {
	p.mu.Lock()
	rs := make([]*Replica, 0, len(p.replicas))
	for _, r := range p.replicas {
		rs = append(rs, r)
	}
	p.mu.Unlock()
	out := make([]metrics.Replica, 0, len(rs))
	for _, r := range rs {
		out = append(out, r.Metrics())
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Volume < out[j].Volume })
	return out
}

func (p *Plugin) replica(name string) *Replica {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.replicas[name]
}

// onRole is a replica's OnRole: it runs on the replica's loop, which a
// running role change may be waiting for, so it only tells the role
// controller to re-read the role (role.Controller.Observe never blocks).
func (p *Plugin) onRole(name string) func(repl.Role) {
	return func(repl.Role) { p.d.Roles().Observe(name) }
}

// replicaRole is a volume's replica as the role controller's actuator,
// looked up by name at each call: a reconfigure replaces the *Replica.
type replicaRole struct {
	p    *Plugin
	name string
}

func (a replicaRole) Role() role.Role {
	if r := a.p.replica(a.name); r != nil {
		return frontRole(r.role())
	}
	return role.Standalone
}

func (a replicaRole) Promote(force bool) error {
	if r := a.p.replica(a.name); r != nil {
		return r.Promote(force)
	}
	return fmt.Errorf("replication of %s: %w", a.name, ErrNotReplicated)
}

func (a replicaRole) Demote(force bool) error {
	if r := a.p.replica(a.name); r != nil {
		return r.Demote(force)
	}
	return fmt.Errorf("replication of %s: %w", a.name, ErrNotReplicated)
}

// requestedBy names the caller of a role change for the controller's log
// lines and events: the CLI passes "cli pid N" in ?by=.
func requestedBy(req *http.Request) string {
	by := req.URL.Query().Get("by")
	if by == "" {
		return "control API"
	}
	if len(by) > 64 {
		by = by[:64]
	}
	return strings.Map(func(c rune) rune {
		if c < ' ' || c == 0x7f {
			return '?'
		}
		return c
	}, by)
}

func (p *Plugin) handle(w http.ResponseWriter, req *http.Request) {
	r := p.replica(req.PathValue("volume"))
	if r == nil {
		httpjson.Write(w, http.StatusNotFound, daemon.APIError{Code: "not_found", Message: fmt.Sprintf("volume %q is not replicated on this node", req.PathValue("volume"))})
		return
	}
	var err error
	op := req.PathValue("op")
	if base, force := strings.CutSuffix(op, "-force"); base == "promote" || base == "demote" {
		// The role controller runs the change on the volume's one owner
		// goroutine: front ends shown transitioning, the drain, the
		// replica's promote or demote, the role it ended in.
		rq := role.Request{Volume: r.name, Op: role.Promote, Force: force, By: requestedBy(req)}
		if base == "demote" {
			rq.Op = role.Demote
		}
		if _, err := p.d.Roles().Change(req.Context(), rq); err != nil {
			code := "conflict"
			if errors.Is(err, role.ErrInProgress) {
				code = "busy"
			}
			httpjson.Write(w, http.StatusConflict, daemon.APIError{Code: code, Message: err.Error()})
			return
		}
		httpjson.Write(w, http.StatusOK, r.Status())
		return
	}
	switch op {
	case "verify":
		err = r.Verify()
	case "connect":
		err = r.Connect()
	case "connect-discard-my-data":
		err = r.ConnectDiscardMyData()
	case "disconnect":
		err = r.Disconnect()
	default:
		httpjson.Write(w, http.StatusNotFound, daemon.APIError{Code: "not_found",
			Message: fmt.Sprintf("unknown replication operation %q (want promote, promote-force, demote, demote-force, verify, connect, connect-discard-my-data or disconnect)", op)})
		return
	}
	if err != nil {
		httpjson.Write(w, http.StatusConflict, daemon.APIError{Code: "conflict", Message: err.Error()})
		return
	}
	httpjson.Write(w, http.StatusOK, r.Status())
}

// WrapDevice routes a volume's client I/O through its route: through
// replication while the volume is replicated, straight to the engine
// otherwise.
func (p *Plugin) WrapDevice(name string, dev export.Device) export.Device {
	return newRoutedDevice(p.route(name), dev)
}

// Stop closes every replica cleanly and releases the devices.
func (p *Plugin) Stop() error {
	p.lifeMu.Lock() // a change in progress finishes first
	defer p.lifeMu.Unlock()
	p.mu.Lock()
	defer p.mu.Unlock()
	var errs []error
	for name, r := range p.replicas {
		if err := r.Close(); err != nil {
			errs = append(errs, fmt.Errorf("replication of %s: %w", name, err))
		}
	}
	for _, d := range p.devByName {
		d.Release()
	}
	clear(p.devByName)
	return errors.Join(errs...)
}

// Configure writes a volume's replication settings (a new NodeID when the
// volume had none). It works without a running daemon; the daemon reads
// the settings at start. The volume must exist (its name is validated like
// every volume name, so the settings can never land outside the data
// directory).
func Configure(dataDir, name string, s Settings) (Settings, error) {
	if _, err := volume.ReadMeta(dataDir, name); err != nil {
		if errors.Is(err, volume.ErrNotFound) {
			return s, fmt.Errorf("replication of %s: %w in %s (create it first: vmsan volume create %s --size SIZE)", name, err, dataDir, name)
		}
		return s, fmt.Errorf("replication of %s: %w", name, err)
	}
	// The link must be able to authenticate its peer (or be explicitly
	// insecure), and a secret file must be usable now, not at the next
	// start.
	if err := s.AuthProblem(); err != nil {
		return s, fmt.Errorf("replication of %s: %w", name, err)
	}
	if _, err := s.Secret(); err != nil {
		return s, fmt.Errorf("replication of %s: %w", name, err)
	}
	// State still in the old layout moves first (or the refusal names both
	// places), so that the settings land beside it.
	if err := migrateVolume(dataDir, name, nil); err != nil {
		return s, err
	}
	dir := Dir(dataDir, name)
	if old, err := LoadSettings(dir); err == nil && s.NodeID == 0 {
		s.NodeID = old.NodeID
	} else if err != nil && !errors.Is(err, os.ErrNotExist) && s.NodeID == 0 {
		return s, err
	}
	for s.NodeID == 0 {
		s.NodeID = randGen()
	}
	return s, SaveSettings(dir, s)
}

// VolumeDeleted stops a deleted volume's replica and lets go of its
// device (daemon.VolumeDeleter). Its state went with the volume's state
// directory (volume.Store.Delete; the daemon removes anything the replica
// wrote there before it stopped).
func (p *Plugin) VolumeDeleted(name string) {
	p.lifeMu.Lock()
	defer p.lifeMu.Unlock()
	delete(p.applied, name)
	p.mu.Lock()
	r := p.replicas[name]
	delete(p.replicas, name)
	dev := p.devByName[name]
	delete(p.devByName, name)
	rt := p.routes[name]
	delete(p.routes, name)
	p.mu.Unlock()
	if rt != nil {
		rt.failHeld(errVolumeDeleted)
	}
	if r == nil {
		return
	}
	// Not replicated any more: the front ends go back to standalone (a
	// volume created again under the name must not inherit the role).
	p.disownRole(name)
	if err := r.Close(); err != nil {
		p.log.Warn("replication of a deleted volume stopped with an error", "volume", name, "err", err)
	}
	if dev != nil {
		dev.Release()
	}
	p.log.Info("replication stopped: volume deleted", "volume", name)
}

// ResizeCheck refuses to resize a replicated volume (pass in
// daemon.Options.Hooks). Both copies must have the same size: the
// handshake refuses to connect a pair whose sizes differ, and a primary
// grown alone would send writes past the secondary's end. Resizing both
// sides in step is not implemented; docs/replication.md ("Resizing a
// replicated volume") gives the procedure.
func ResizeCheck(dataDir, name string, size int64) error {
	s, err := LoadSettings(Dir(dataDir, name))
	if err != nil {
		// Not yet moved from the old layout (no start since the upgrade)?
		s, err = LoadSettings(legacyDir(dataDir, name))
	}
	if err != nil {
		return nil // not replicated (or no readable settings: nothing to keep in step)
	}
	return fmt.Errorf("volume %s is replicated (peer %s): resizing one copy would leave the pair unable to reconnect (sizes must match). "+
		"To resize, take replication down on both nodes, resize, and resync the secondary in full: see \"Resizing a replicated volume\" in docs/replication.md (%w)",
		name, s.Peer, daemon.ErrReplicated)
}

// DeleteCheck refuses to delete a replicated volume without force (pass
// in daemon.Options.Hooks): its replication state (generations, bitmap) is
// in the volume's state directory and goes with it; the peer keeps its copy
// and its own configuration. State still in the old layout (no daemon
// started since the upgrade) is not deleted with the volume, so the delete
// is refused until a start moves it.
func DeleteCheck(dataDir, name string, force bool) error {
	if _, err := os.Lstat(legacyDir(dataDir, name)); err == nil {
		return fmt.Errorf("volume %s has replication state in the old location %s: start vmsan serve once to move it into the volume's state directory "+
			"(or remove it), then delete the volume: %w", name, legacyDir(dataDir, name), volume.ErrInUse)
	}
	s, err := LoadSettings(Dir(dataDir, name))
	if err != nil || force {
		return nil
	}
	return fmt.Errorf("volume %s is replicated (peer %s): deleting it also deletes its replication state; "+
		"use --force to delete both (the peer keeps its copy; remove the volume's replication section from the config file too, or it is set up again at the next start): %w",
		name, s.Peer, volume.ErrInUse)
}

// settingsRel is config.json relative to a volume's state directory.
var settingsRel = filepath.Join("repl", "config.json")

// role is the replica's current role (RoleUnknown before the first
// status).
func (r *Replica) role() repl.Role {
	switch r.Status().Role {
	case repl.Primary.String():
		return repl.Primary
	case repl.Secondary.String():
		return repl.Secondary
	}
	return repl.RoleUnknown
}

// frontRole maps a replication role to the role front ends present.
func frontRole(r repl.Role) daemon.VolumeRole {
	switch r {
	case repl.Primary:
		return daemon.RolePrimary
	case repl.Secondary:
		return daemon.RoleSecondary
	}
	return daemon.RoleStandalone
}
