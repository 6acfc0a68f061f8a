package daemon

import (
	"context"
	"errors"
	"fmt"
	"os"
	"reflect"

	"github.com/vmsan/vmsan/internal/config"
	"github.com/vmsan/vmsan/internal/frontend"
	"github.com/vmsan/vmsan/internal/reload"
	"github.com/vmsan/vmsan/internal/volume"
)

// HandleReloads reloads the configuration each time sig delivers (vmsan
// serve passes SIGHUP), until ctx is done (reload.Handle).
func (d *Daemon) HandleReloads(ctx context.Context, sig <-chan os.Signal, load func() (config.Config, error)) {
	reload.Handle(ctx, d.log, sig, load, d.Reload)
}

// Reload applies next to the running daemon without dropping a client:
//
//   - TLS certificate, key and CA files are re-read; handshakes from now on
//     use them, established connections keep theirs (see tlsreload.Server);
//   - the log level changes (when the daemon made its own logger);
//   - iSCSI access settings (CHAP users and secrets, secret files re-read,
//     ACLs, allow_any, drop_revoked_sessions) apply to new logins; open
//     sessions keep going, or with drop_revoked_sessions those whose
//     initiator lost access are closed; each changed key is logged;
//   - configured volumes that do not exist are created and exported;
//     existing ones grow to a larger configured size, and their cache,
//     rotational, read-only and description settings are applied when no
//     client holds them (otherwise at the next restart);
//   - everything else that differs (listeners, data_dir, metrics_listen,
//     pprof, max_payload, inflight_budget, max_connections, max_pending_handshakes,
//     handshake_timeout, TLS mode, engine tuning of open volumes,
//     replication settings, the other iscsi settings) is named in a log line as needing a restart.
//
// Validation and TLS loading happen before anything changes: an error
// there returns it and leaves the daemon exactly as it was. Errors on
// individual volumes after that are logged per volume and returned
// together; the volumes that worked stay applied.
//
// Reloads are serialised with each other; control operations may run
// concurrently (volume changes take d.mu through the same methods the
// control API uses).
func (d *Daemon) Reload(next config.Config) error {
	d.reloadMu.Lock()
	defer d.reloadMu.Unlock()
	if d.closed.Load() {
		return errors.New("daemon is shutting down")
	}
	if err := next.Validate(); err != nil {
		return err
	}
	d.mu.Lock()
	cur := d.cfg
	d.mu.Unlock()

	// Read the iSCSI access settings (CHAP secret files) before anything
	// changes: an unreadable or short secret rejects the whole reload.
	isf := d.iscsiFrontEnd()
	var applies []func()
	for _, fe := range d.frontEnds {
		if r, ok := fe.(frontend.Reloader); ok {
			apply, err := r.PrepareReload(next)
			if err != nil {
				return err
			}
			applies = append(applies, apply)
		}
	}

	// Load TLS first: bad certificate files reject the whole reload.
	reloadTLS := d.tls != nil && next.TLS.Mode == cur.TLS.Mode
	if reloadTLS {
		if err := d.tls.Reload(next.TLS); err != nil {
			return err
		}
		d.log.Info("TLS certificates reloaded; new connections use them", "cert", next.TLS.Cert, "ca", next.TLS.CA)
		reload.WarnCAChange(d.log, cur.TLS, next.TLS)
	}

	reload.LogRestarts(d.log, cur, next, isf != nil)
	for _, apply := range applies {
		apply()
	}
	if next.LogLevel != cur.LogLevel {
		if d.level != nil {
			d.level.Set(config.SlogLevel(next.LogLevel))
			d.log.Info("log level changed", "level", next.LogLevel)
		} else {
			d.log.Warn("log_level changed but this daemon's logger was supplied by its embedder; not applied")
		}
	}

	// What the daemon now runs with. Restart-only fields keep their running
	// values, so the next reload compares against what is really in force.
	// Volumes go first: volumes opened below take their engine settings
	// from it (engineFor).
	d.mu.Lock()
	d.cfg.LogLevel = next.LogLevel
	d.cfg.Volumes = next.Volumes
	if isf != nil {
		d.cfg.ISCSI = d.cfg.ISCSI.WithAccessOf(next.ISCSI)
	}
	if reloadTLS {
		d.cfg.TLS.Cert, d.cfg.TLS.Key, d.cfg.TLS.CA = next.TLS.Cert, next.TLS.Key, next.TLS.CA
	}
	d.mu.Unlock()

	var errs []error
	for _, cv := range next.Volumes {
		old, had := reload.FindVolume(cur.Volumes, cv.Name)
		if err := d.reloadVolume(cv, old, had); err != nil {
			d.log.Error("reload: volume not applied", "volume", cv.Name, "err", err)
			errs = append(errs, fmt.Errorf("volume %s: %w", cv.Name, err))
		}
	}
	for _, ov := range cur.Volumes {
		if _, ok := reload.FindVolume(next.Volumes, ov.Name); !ok {
			d.log.Info("volume is no longer in the configuration; it stays (vmsan volume delete removes it)", "volume", ov.Name)
		}
	}

	d.log.Info("configuration reloaded", "volumes", len(next.Volumes))
	return errors.Join(errs...)
}

// ReplicationReloader is implemented by plugins that apply a volume's
// replication section at runtime: ReloadReplication runs on reload when
// the section was added or changed, for a volume that exists.
type ReplicationReloader interface {
	ReloadReplication(name string, r *config.Replication) error
}

// reloadReplication hands cv's replication section to the plugins that
// apply it at runtime; false: none does.
func (d *Daemon) reloadReplication(cv config.Volume) bool {
	handled := false
	for _, p := range d.plugins {
		rr, ok := p.(ReplicationReloader)
		if !ok {
			continue
		}
		handled = true
		if err := rr.ReloadReplication(cv.Name, cv.Replication); err != nil {
			d.log.Error("reload: replication settings not applied", "volume", cv.Name, "err", err)
		} else {
			d.log.Info("reload: replication settings applied", "volume", cv.Name)
		}
	}
	return handled
}

// reloadVolume brings one configured volume in line with its entry cv;
// old is its previous entry (had: there was one).
func (d *Daemon) reloadVolume(cv config.Volume, old config.Volume, had bool) error {
	replChanged := had && !reflect.DeepEqual(cv.Replication, old.Replication)
	m, err := d.store.Get(cv.Name)
	switch {
	case errors.Is(err, volume.ErrNotFound):
		if cv.Replication != nil {
			// Created and exported without its replication plugin, a
			// would-be secondary would take writes of its own.
			d.log.Warn("new volume has replication settings; restart to create and replicate it", "volume", cv.Name)
			return nil
		}
		_, err := d.vo.CreateVolume(volume.CreateOptions{
			Name: cv.Name, Size: int64(cv.Size), Cache: backendMode(cv.Cache), Rotational: cv.Rotational,
			ReadOnly: cv.ReadOnly, Description: cv.Description, LogicalBlockSize: cv.BlockSize,
		})
		if err != nil {
			return err
		}
		d.log.Info("created volume from config", "volume", cv.Name, "size", int64(cv.Size))
		return nil
	case err != nil:
		return err
	}
	if (replChanged || !had) && cv.Replication != nil {
		// A plugin that applies replication at runtime does it now (the
		// replica restarts with the new settings, its clients held);
		// without one the settings wait for a restart.
		if !d.reloadReplication(cv) {
			d.log.Warn("replication settings changed; restart to apply", "volume", cv.Name)
		}
	} else if replChanged {
		// The section was removed: the volume keeps the replication it
		// runs with (as at a start; `vmsan repl remove` removes it).
		d.log.Warn("replication section removed from the configuration; replication keeps running (vmsan repl remove VOLUME removes it)", "volume", cv.Name)
	}
	if had && cv.Engine != old.Engine {
		d.log.Warn("engine settings changed; restart to apply", "volume", cv.Name)
	}
	switch {
	case int64(cv.Size) > m.Size:
		if _, err := d.vo.ResizeVolume(cv.Name, int64(cv.Size), false); err != nil {
			return err
		}
	case int64(cv.Size) < m.Size:
		d.log.Warn("volume is larger than configured; not shrinking (use vmsan volume resize --force)", "volume", cv.Name, "size", m.Size, "configured", int64(cv.Size))
	}

	// The settings the config file declares (see volconf.Ensure).
	s := reload.VolumeSettings(cv, m)
	open := (*d.vols.Load())[cv.Name] != nil
	if s == (Settings{}) && open {
		return nil
	}
	// UpdateVolume reopens the volume with the new settings when it is
	// idle, and opens and exports one that is not open.
	if _, err := d.vo.UpdateVolume(cv.Name, s); err != nil {
		if errors.Is(err, volume.ErrInUse) {
			d.log.Warn("volume settings changed but clients hold the volume; they apply once it is idle and the daemon is reloaded, or at restart", "volume", cv.Name)
			return nil
		}
		return err
	}
	return nil
}
