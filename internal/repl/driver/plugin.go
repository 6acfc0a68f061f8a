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
	"sync"

	"github.com/vmsan/vmsan/internal/config"
	"github.com/vmsan/vmsan/internal/daemon"
	"github.com/vmsan/vmsan/internal/export"
)

// Plugin runs replication inside a vmsan daemon: one Replica per volume
// that has <data_dir>/repl/<volume>/config.json. Register it with
// daemon.RegisterPlugin(driver.NewPlugin) (cmd/vmsan/repl.go does).
//
// Control endpoints (on the daemon's control socket):
//
//	POST /v1/repl/{volume}/{op}   op: promote, promote-force, demote,
//	                              verify, connect, disconnect
//
// and `vmsan status` gains a "replication" section.
type Plugin struct {
	dataDir string
	log     *slog.Logger

	mu       sync.Mutex
	replicas map[string]*Replica
	devs     []export.Device
}

// NewPlugin is a daemon.PluginFactory. It returns nil when no volume is
// configured for replication.
func NewPlugin(cfg config.Config, log *slog.Logger) (daemon.Plugin, error) {
	dirs, _ := filepath.Glob(filepath.Join(cfg.DataDir, "repl", "*", "config.json"))
	if len(dirs) == 0 {
		return nil, nil
	}
	return &Plugin{dataDir: cfg.DataDir, log: log, replicas: map[string]*Replica{}}, nil
}

// Start opens every configured replica.
func (p *Plugin) Start(d *daemon.Daemon, open func(string) (export.Device, error)) error {
	dirs, _ := filepath.Glob(filepath.Join(p.dataDir, "repl", "*", "config.json"))
	for _, f := range dirs {
		dir := filepath.Dir(f)
		name := filepath.Base(dir)
		set, err := LoadSettings(dir)
		if err != nil {
			return fmt.Errorf("replication of %s: %w", name, err)
		}
		dev, err := open(name)
		if err != nil {
			return fmt.Errorf("replication of %s: volume: %w", name, err)
		}
		r, err := Start(Options{Name: name, Dir: dir, Device: dev, Settings: set, Logger: p.log})
		if err != nil {
			dev.Release()
			return err
		}
		p.mu.Lock()
		p.replicas[name] = r
		p.devs = append(p.devs, dev)
		p.mu.Unlock()
		p.log.Info("replication started", "volume", name, "listen", set.Listen, "peer", set.Peer, "protocol", set.Protocol)
	}
	d.AddStatus("replication", func() any { return p.Statuses() })
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

func (p *Plugin) replica(name string) *Replica {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.replicas[name]
}

func (p *Plugin) handle(w http.ResponseWriter, req *http.Request) {
	r := p.replica(req.PathValue("volume"))
	if r == nil {
		writeJSON(w, http.StatusNotFound, daemon.APIError{Code: "not_found", Message: "volume is not replicated here"})
		return
	}
	var err error
	switch req.PathValue("op") {
	case "promote":
		err = r.Promote(false)
	case "promote-force":
		err = r.Promote(true)
	case "demote":
		err = r.Demote()
	case "verify":
		err = r.Verify()
	case "connect":
		err = r.Connect()
	case "disconnect":
		err = r.Disconnect()
	default:
		err = errors.New("unknown operation")
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
	for _, d := range p.devs {
		d.Release()
	}
	p.devs = nil
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
// the settings at start.
func Configure(dataDir, volume string, s Settings) (Settings, error) {
	dir := Dir(dataDir, volume)
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
