package daemon

import (
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/vmsan/vmsan/internal/control"
	"github.com/vmsan/vmsan/internal/events"
	"github.com/vmsan/vmsan/internal/frontend"
	"github.com/vmsan/vmsan/internal/metrics"
	"github.com/vmsan/vmsan/internal/netutil"
	"github.com/vmsan/vmsan/internal/volrt"
	"github.com/vmsan/vmsan/internal/volume"
)

func (d *Daemon) startControl() error {
	// Only the owner (root, normally) may create or delete volumes: the
	// socket is ControlSocketMode from the start (see netutil.ListenUnix). Bind
	// under a temporary name, then rename it into place, so a client never
	// finds a socket under the real name that is not yet served.
	// (Holding the data-dir lock means no other daemon uses either name.)
	tmp := filepath.Join(d.cfg.DataDir, ".control.sock.tmp")
	ln, err := netutil.ListenUnix(tmp, ControlSocketMode)
	if err != nil {
		return fmt.Errorf("control socket: %w", err)
	}
	if err := os.Rename(tmp, d.ControlPath()); err != nil {
		ln.Close()
		return fmt.Errorf("control socket: %w", err)
	}
	d.ctlLn = ln
	mux := http.NewServeMux()
	control.Register(mux, controlOps{d}, d.log, d.eventsStop)
	// Metrics are also on the control socket, so they are available without
	// opening a TCP port: curl --unix-socket DATA_DIR/control.sock http://x/metrics
	mux.Handle("GET /metrics", metrics.Handler(metricsSource{d}))
	if d.cfg.Pprof {
		metrics.RegisterPprof(mux)
	}
	d.ctlMux = mux
	d.ctlSrv = &http.Server{Handler: control.WithBodyDeadline(mux), ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout: control.IdleTimeout, MaxHeaderBytes: 64 << 10, ErrorLog: netutil.HTTPErrorLog(d.log)}
	d.ctlSrv.RegisterOnShutdown(func() { close(d.eventsStop) })
	return nil
}

// settingsErr marks a failure to open a volume with the settings a request
// asked for (cache=none where the filesystem refuses O_DIRECT, a damaged
// raw file) as the client's to fix (4xx), keeping the reason.
func settingsErr(err error) error {
	if err == nil || errors.Is(err, volume.ErrDamaged) {
		return err
	}
	return fmt.Errorf("%w: cannot open the volume with these settings: %v", volume.ErrInvalid, err)
}

func (d *Daemon) info(m volume.Meta) VolumeInfo {
	vi := VolumeInfo{Meta: m, Path: d.store.RawPath(m.Name), Allocated: control.AllocatedBytes(d.store.RawPath(m.Name))}
	if v := (*d.vols.Load())[m.Name]; v != nil {
		vi.Open = true
		vi.Exports = d.clientsOf(m.Name, v)
	} else if err := d.store.CheckRaw(m.Name); err != nil {
		vi.Problem = err.Error()
	}
	return vi
}

// createVolume creates a volume and starts exporting it.
func (d *Daemon) createVolume(o volume.CreateOptions) (VolumeInfo, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	m, err := d.store.Create(o)
	if err != nil {
		return VolumeInfo{}, err
	}
	v, err := openVol(d.store, m, d.engineFor(m.Name), uint32(d.cfg.MaxPayload))
	if err != nil {
		// Do not leave a volume the daemon cannot serve (e.g. cache=none on
		// tmpfs): the user gets the reason and can retry with other settings.
		d.store.Delete(m.Name, true)
		return VolumeInfo{}, settingsErr(err)
	}
	d.publish(func(mm map[string]*volrt.Volume) { mm[m.Name] = v })
	d.log.Info("volume created", "volume", m.Name, "size", m.Size)
	d.publishVolume(events.Create, m)
	return d.info(m), nil
}

// resizeVolume resizes a volume online; connected clients see the new size
// when they reconnect.
func (d *Daemon) resizeVolume(name string, size int64, force bool) (VolumeInfo, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := control.CheckResize(d.opts.Hooks.Resize, d.cfg.DataDir, name, size); err != nil {
		return VolumeInfo{}, err
	}
	m, err := d.store.Resize(name, size, force)
	if err != nil {
		return VolumeInfo{}, err
	}
	d.log.Info("volume resized", "volume", name, "size", size)
	d.publishVolume(events.Change, m)
	return d.info(m), nil
}

// updateVolume changes a volume's mutable settings (cache mode, rotational
// hint, read-only, description). The open volume is closed and reopened
// with the new settings, which needs it to be idle: with clients connected
// it returns ErrInUse (they would otherwise keep the old flags, negotiated
// at connect time).
func (d *Daemon) updateVolume(name string, s Settings) (VolumeInfo, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	old := (*d.vols.Load())[name]
	if old == nil {
		// Missing, or exists but could not be opened at start (say
		// cache=none where O_DIRECT is refused): new settings may fix it, so
		// try to open and export it now.
		m, err := d.store.Update(name, s.Apply)
		if err != nil {
			return VolumeInfo{}, err
		}
		nv, err := openVol(d.store, m, d.engineFor(name), uint32(d.cfg.MaxPayload))
		if err != nil {
			return VolumeInfo{}, fmt.Errorf("settings saved, but the volume still cannot be opened: %w", settingsErr(err))
		}
		d.publish(func(mm map[string]*volrt.Volume) { mm[name] = nv })
		d.log.Info("volume opened after settings change", "volume", name)
		d.publishVolume(events.Change, m)
		return d.info(m), nil
	}
	// Same handshake with registry.Open as DeleteVolume: from here no new
	// reference is handed out, so the count below stays true.
	if old.BeginDelete(); d.clientsOf(name, old) > 0 {
		old.AbortDelete()
		return VolumeInfo{}, fmt.Errorf("volume %s: %w (settings apply when no client is connected)", name, volume.ErrInUse)
	}
	// Idle holds (iSCSI logical units between sessions) would keep the
	// instance closed below: let them go; the next command opens the new one.
	for _, fe := range d.frontEnds {
		if h, ok := fe.(frontend.IdleHolder); ok {
			h.ReleaseIdle(name)
		}
	}
	prev, err := d.store.Get(name)
	if err != nil {
		old.AbortDelete()
		return VolumeInfo{}, err
	}
	m, err := d.store.Update(name, s.Apply)
	if err != nil {
		old.AbortDelete()
		return VolumeInfo{}, err
	}
	// Stop the old engine first: the new one must not run beside it on the
	// same file (its writes would not be ordered against the old one's).
	if err := old.Close(); err != nil {
		d.log.Error("closing volume for reopen", "volume", name, "err", err)
	}
	// A device still held on the old instance (a logical unit that a
	// session opened after ReleaseIdle looked) now fails with
	// ErrVolumeGone, which makes its holder open the name again, instead
	// of failing on the closed engine for good.
	old.MarkGone()
	nv, err := openVol(d.store, m, d.engineFor(name), uint32(d.cfg.MaxPayload))
	if err != nil {
		// Put the old settings back and serve the volume as before.
		d.store.Update(name, func(mm *volume.Meta) error { *mm = prev; return nil })
		nv, err2 := openVol(d.store, prev, d.engineFor(name), uint32(d.cfg.MaxPayload))
		if err2 != nil {
			d.publish(func(mm map[string]*volrt.Volume) { delete(mm, name) })
			d.log.Error("volume could not be reopened; not exported", "volume", name, "err", err2)
		} else {
			d.publish(func(mm map[string]*volrt.Volume) { mm[name] = nv })
		}
		return VolumeInfo{}, settingsErr(err)
	}
	d.publish(func(mm map[string]*volrt.Volume) { mm[name] = nv })
	d.log.Info("volume settings changed", "volume", name, "cache", m.Cache, "rotational", m.Rotational, "read_only", m.ReadOnly)
	d.publishVolume(events.Change, m)
	return d.info(m), nil
}

// deleteVolume deletes a volume. Without force it refuses while a client is
// connected. With force, connected clients get EIO on every further request
// and the engine is closed when the last one disconnects.
func (d *Daemon) deleteVolume(name string, force bool) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	v := (*d.vols.Load())[name]
	if v != nil {
		if err := control.CheckDelete(d.opts.Hooks.Delete, d.cfg.DataDir, name, force); err != nil {
			return err
		}
		v.BeginDelete() // see volrt.Volume.Acquire's INVARIANT
	}
	if err := d.store.Delete(name, force); err != nil {
		if v != nil {
			v.AbortDelete()
		}
		return err
	}
	if v != nil {
		d.publish(func(mm map[string]*volrt.Volume) { delete(mm, name) })
		v.MarkGone()
	}
	d.snaps.DropVolume(name) // deleted with it (force; see volume.Store.Delete)
	// Plugins let go of the volume (their references keep it open until
	// then). The store removed the volume's state directory, but a plugin
	// still running (a replica persisting its generations) may have
	// written into it again: once they stopped, that goes too.
	for _, p := range d.plugins {
		if pd, ok := p.(VolumeDeleter); ok {
			pd.VolumeDeleted(name)
		}
	}
	if err := d.store.RemoveStateDebris(name); err != nil {
		d.log.Warn("deleted volume: state directory not removed (the volume's next create removes it)", "volume", name, "err", err)
	}
	d.log.Info("volume deleted", "volume", name, "force", force)
	d.events.Publish(events.New(events.Destroy, events.Volume, "name", name))
	return nil
}

// status assembles the /v1/status document.
func (d *Daemon) status() Status {
	st := Status{APIVersion: APIVersion, PID: os.Getpid(), DataDir: d.cfg.DataDir}
	st.FrontEnds = d.frontEndStats()
	bs := d.budget.Stats()
	st.InflightBudget = &bs
	clients := map[string][]volrt.Session{}
	for _, fs := range st.FrontEnds {
		st.Listeners = append(st.Listeners, fs.Listeners...)
		for _, c := range fs.Clients {
			clients[c.Volume] = append(clients[c.Volume], c)
		}
		if fs.Name == "nbd" {
			st.Server = fs.Detail // kept for API version 1 readers
		}
	}
	if a := d.MetricsAddr(); a != nil {
		st.Metrics = "http://" + a.String() + "/metrics"
	}
	list, _ := d.store.List()
	vols := *d.vols.Load()
	for _, m := range list {
		cs := clients[m.Name]
		vs := VolumeStatus{VolumeInfo: d.info(m), Connections: len(cs), Clients: cs}
		if v := vols[m.Name]; v != nil {
			es := control.EngineStatsOf(v.EngineStats())
			vs.Engine = &es
		}
		vs.NoSpace = d.noSpace.Status(m.Name)
		st.Volumes = append(st.Volumes, vs)
	}
	d.statusMu.Lock()
	defer d.statusMu.Unlock()
	for k, fn := range d.statusFn {
		// nil: the section has nothing to show now (replication with no
		// replicated volume), so it is left out.
		if v := fn(); v != nil {
			if st.Extra == nil {
				st.Extra = map[string]any{}
			}
			st.Extra[k] = v
		}
	}
	return st
}
