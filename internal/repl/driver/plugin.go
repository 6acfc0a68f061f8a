package driver

import (
	"encoding/json"
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
// `vmsan status` gains a "replication" section, and /metrics the
// vmsan_repl_* series (host.Host.SetReplicaMetrics).
type Plugin struct {
	d       host.Host // set by Start
	dataDir string
	log     *slog.Logger

	mu        sync.Mutex
	replicas  map[string]*Replica
	devByName map[string]export.Device
}

// NewPlugin is a daemon.PluginFactory. Volumes with a replication section
// in the daemon configuration get their settings written first (the file
// wins over `vmsan repl configure`; the node id is kept). It returns nil
// when no volume is configured for replication.
func NewPlugin(cfg config.Config, log *slog.Logger) (daemon.Plugin, error) {
	// State in the old layout moves first, so that nothing below reads or
	// writes the old place.
	if err := Migrate(cfg.DataDir, log); err != nil {
		return nil, err
	}
	for _, v := range cfg.Volumes {
		if v.Replication == nil {
			continue
		}
		if _, err := Configure(cfg.DataDir, v.Name, v.Replication.Settings()); err != nil {
			return nil, fmt.Errorf("replication of %s: %w", v.Name, err)
		}
	}
	if len(volume.StateVolumes(cfg.DataDir, settingsRel)) == 0 {
		return nil, nil
	}
	return &Plugin{dataDir: cfg.DataDir, log: log, replicas: map[string]*Replica{}, devByName: map[string]export.Device{}}, nil
}

// Start opens every configured replica.
func (p *Plugin) Start(d host.Host, open func(string) (export.Device, error)) error {
	p.d = d
	for _, name := range volume.StateVolumes(p.dataDir, settingsRel) {
		dir := Dir(p.dataDir, name)
		set, err := LoadSettings(dir)
		if err != nil {
			return fmt.Errorf("replication of %s: %w", name, err)
		}
		vm, verr := d.Store().Get(name)
		dev, err := open(name)
		if errors.Is(err, export.ErrNotFound) {
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
		}
		if err != nil {
			return fmt.Errorf("replication of %s: volume: %w", name, err)
		}
		r, err := Start(Options{Name: name, Dir: dir, Device: dev, Settings: set, Logger: p.log, DataID: vm.DataID, Events: d.Events(),
			OnRole: p.onRole(name)})
		if err != nil {
			dev.Release()
			return err
		}
		p.mu.Lock()
		p.replicas[name] = r
		p.devByName[name] = dev
		p.mu.Unlock()
		p.log.Info("replication started", "volume", name, "listen", set.Listen, "peer", set.Peer, "protocol", set.Protocol)
		// The role controller owns the volume's role from now on: it
		// publishes the role the replica starts in, runs promote and
		// demote, and re-reads the role when the replica reports a change
		// (onRole).
		if err := d.Roles().Register(name, replicaRole{r}); err != nil {
			return fmt.Errorf("replication of %s: %w", name, err)
		}
	}
	d.AddStatus("replication", func() any { return p.Statuses() })
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
		writeJSON(w, http.StatusOK, p.Statuses())
	}))
	return nil
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

// replicaRole is a replica as the role controller's actuator.
type replicaRole struct{ r *Replica }

func (a replicaRole) Role() role.Role          { return frontRole(a.r.role()) }
func (a replicaRole) Promote(force bool) error { return a.r.Promote(force) }
func (a replicaRole) Demote(force bool) error  { return a.r.Demote(force) }

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
		writeJSON(w, http.StatusNotFound, daemon.APIError{Code: "not_found", Message: fmt.Sprintf("volume %q is not replicated on this node", req.PathValue("volume"))})
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
			writeJSON(w, http.StatusConflict, daemon.APIError{Code: code, Message: err.Error()})
			return
		}
		writeJSON(w, http.StatusOK, r.Status())
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
		writeJSON(w, http.StatusNotFound, daemon.APIError{Code: "not_found",
			Message: fmt.Sprintf("unknown replication operation %q (want promote, promote-force, demote, demote-force, verify, connect, connect-discard-my-data or disconnect)", op)})
		return
	}
	if err != nil {
		writeJSON(w, http.StatusConflict, daemon.APIError{Code: "conflict", Message: err.Error()})
		return
	}
	writeJSON(w, http.StatusOK, r.Status())
}

// WrapDevice routes a replicated volume's client I/O through replication.
func (p *Plugin) WrapDevice(name string, dev export.Device) export.Device {
	if r := p.replica(name); r != nil {
		return r.Wrap(dev)
	}
	return dev
}

// Stop closes every replica cleanly and releases the devices.
func (p *Plugin) Stop() error {
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

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(v)
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
	p.mu.Lock()
	r := p.replicas[name]
	delete(p.replicas, name)
	dev := p.devByName[name]
	delete(p.devByName, name)
	p.mu.Unlock()
	if r == nil {
		return
	}
	// Not replicated any more: the front ends go back to standalone (a
	// volume created again under the name must not inherit the role).
	p.d.Roles().Unregister(name)
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
