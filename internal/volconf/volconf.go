// Package volconf makes the volume store match the configuration's
// volumes at start: the config file is declarative, so a configured
// volume that is missing is created, one declared larger grows, and its
// flags follow the file. The daemon runs Ensure before opening any
// volume, then OpenAll.
package volconf

import (
	"errors"
	"log/slog"

	"github.com/vmsan/vmsan/internal/backend"
	"github.com/vmsan/vmsan/internal/config"
	"github.com/vmsan/vmsan/internal/control"
	"github.com/vmsan/vmsan/internal/volrt"
	"github.com/vmsan/vmsan/internal/volume"
)

// Ensure creates configured volumes that do not exist (and grows
// ones the config declares larger, unless resize refuses), or the 10 GiB
// "default" volume when the data directory is empty and the config
// declares none. It runs at start, before any volume is opened.
func Ensure(store *volume.Store, cfg config.Config, resize []control.ResizeCheck, log *slog.Logger) error {
	e := ensurer{store: store, cfg: cfg, resize: resize, log: log}
	return e.ensure()
}

type ensurer struct {
	store  *volume.Store
	cfg    config.Config
	resize []control.ResizeCheck
	log    *slog.Logger
}

func (d ensurer) ensure() error {
	for _, cv := range d.cfg.Volumes {
		m, err := d.store.Get(cv.Name)
		switch {
		case errors.Is(err, volume.ErrNotFound):
			_, err = d.store.Create(volume.CreateOptions{
				Name: cv.Name, Size: int64(cv.Size), Cache: backend.CacheMode(cv.Cache), Rotational: cv.Rotational,
				ReadOnly: cv.ReadOnly, Description: cv.Description, LogicalBlockSize: cv.BlockSize,
			})
			if err != nil {
				return err
			}
			d.log.Info("created volume from config", "volume", cv.Name, "size", int64(cv.Size))
		case err != nil:
			return err
		case d.store.CheckRaw(cv.Name) != nil:
			// Damaged: the daemon's openAll reports it with the repair command; one
			// damaged volume must not keep the others from being served,
			// and its size or settings are not touched until repaired.
			continue
		case int64(cv.Size) > m.Size:
			if cerr := control.CheckResize(d.resize, d.cfg.DataDir, cv.Name, int64(cv.Size)); cerr != nil {
				// Serve at the old size rather than refuse to start.
				d.log.Error("not growing volume to its configured size", "volume", cv.Name, "size", m.Size, "configured", int64(cv.Size), "err", cerr)
				break
			}
			if _, err := d.store.Resize(cv.Name, int64(cv.Size), false); err != nil {
				return err
			}
			d.log.Info("grew volume to configured size", "volume", cv.Name, "size", int64(cv.Size))
		case int64(cv.Size) < m.Size:
			d.log.Warn("volume is larger than configured; not shrinking (use vmsan volume resize --force)", "volume", cv.Name, "size", m.Size, "configured", int64(cv.Size))
		}
		if err == nil {
			if err := d.applyConfigSettings(cv); err != nil {
				return err
			}
		}
	}
	if len(d.cfg.Volumes) > 0 || d.cfg.NoDefaultVolume {
		return nil
	}
	list, err := d.store.List()
	if list == nil {
		return err
	}
	if err != nil || len(list) > 0 {
		// Volumes exist (even if some are unreadable): not an empty directory.
		return nil
	}
	_, err = d.store.Create(volume.CreateOptions{Name: config.DefaultVolumeName, Size: config.DefaultVolumeSize, Description: "vmsan default volume"})
	if err == nil {
		d.log.Info("created default volume", "volume", config.DefaultVolumeName, "size", volume.HumanSize(config.DefaultVolumeSize))
	}
	return err
}

// applyConfigSettings makes an existing volume's flags match its config
// entry: the config file is declarative, so editing "rotational: true" and
// restarting must take effect. Cache and description apply only when set.
func (d ensurer) applyConfigSettings(cv config.Volume) error {
	m, err := d.store.Get(cv.Name)
	if err != nil {
		return err
	}
	want := m
	if cv.Cache != "" {
		want.Cache = backend.CacheMode(cv.Cache)
	}
	if cv.Description != "" {
		want.Description = cv.Description
	}
	want.Rotational, want.ReadOnly = cv.Rotational, cv.ReadOnly
	if want == m {
		return nil
	}
	if _, err := d.store.Update(cv.Name, func(mm *volume.Meta) error { *mm = want; return nil }); err != nil {
		return err
	}
	d.log.Info("applied config settings to volume", "volume", cv.Name, "cache", want.Cache, "rotational", want.Rotational, "read_only", want.ReadOnly)
	return nil
}

// OpenAll opens every volume in the store with open. A volume that fails
// to open (for example cache=none on a filesystem without O_DIRECT) is
// logged and left unexported rather than taking the whole node down.
func OpenAll(store *volume.Store, log *slog.Logger, open func(volume.Meta) (*volrt.Volume, error)) (map[string]*volrt.Volume, error) {
	list, err := store.List()
	if list == nil {
		return nil, err
	}
	if err != nil {
		log.Error("some volumes have unreadable metadata; not exporting them", "err", err)
	}
	m := map[string]*volrt.Volume{}
	for _, meta := range list {
		if err := store.CheckRaw(meta.Name); err != nil {
			// Never serve (or let replication "resync") a file that is not
			// the volume's: the operator repairs it (the error says how).
			log.Error("volume damaged; not exporting it", "volume", meta.Name, "err", err)
			continue
		}
		v, err := open(meta)
		if err != nil {
			log.Error("cannot open volume; not exporting it", "volume", meta.Name, "err", err)
			continue
		}
		m[meta.Name] = v
	}
	return m, nil
}
