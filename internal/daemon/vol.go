package daemon

import (
	"sort"
	"strings"
	"time"

	"github.com/vmsan/vmsan/internal/backend"
	"github.com/vmsan/vmsan/internal/config"
	"github.com/vmsan/vmsan/internal/export"
	"github.com/vmsan/vmsan/internal/ioengine"
	"github.com/vmsan/vmsan/internal/volrt"
	"github.com/vmsan/vmsan/internal/volume"
)

func backendMode(s string) backend.CacheMode { return backend.CacheMode(s) }

// errVolumeGone is volrt.ErrVolumeGone (requests on a force-deleted volume).
var errVolumeGone = volrt.ErrVolumeGone

func engineConfig(e config.Engine) ioengine.Config {
	return ioengine.Config{
		Workers:       e.Workers,
		MaxMergeBytes: int64(e.MaxMerge),
		MaxQueue:      e.MaxQueue,
		GatherDelay:   time.Duration(e.GatherDelay),
	}
}

// openVol opens a volume (volrt.Open) with the daemon's engine settings.
func openVol(store *volume.Store, m volume.Meta, ecfg config.Engine, maxPayload uint32) (*volrt.Volume, error) {
	return volrt.Open(store, m, engineConfig(ecfg), maxPayload)
}

// registry implements export.Registry over the daemon's open volumes.
type registry struct{ d *Daemon }

// Open looks the name up in a lock-free snapshot of the volume map so that
// a connection never waits behind a control operation.
//
// Delete and Open keep volrt.Volume.Acquire's INVARIANT: a delete that
// succeeds without force never races with an Open that succeeds.
func (r registry) Open(name string) (export.Device, error) { return r.open(name, true) }

// open is Open; wrap=false skips plugin wrapping (plugins' own access).
func (r registry) open(name string, wrap bool) (export.Device, error) {
	vols := *r.d.vols.Load()
	if name == "" {
		name = r.d.defaultExport(vols)
	}
	if strings.Contains(name, volume.SnapSep) {
		return r.d.snaps.Open(name) // VOL@SNAP: read-only, never wrapped
	}
	v := vols[name]
	if v == nil {
		return nil, export.ErrNotFound
	}
	if !wrap {
		return v.Acquire(nil)
	}
	return v.Acquire(r.d.wraps)
}

func (r registry) List() []export.Info {
	vols := *r.d.vols.Load()
	out := make([]export.Info, 0, len(vols))
	for _, v := range vols {
		out = append(out, v.Info())
	}
	out = append(out, r.d.snaps.List()...) // VOL@SNAP, read-only
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// defaultExport resolves the empty export name: "default" if it exists,
// else the only volume if there is exactly one.
func (d *Daemon) defaultExport(vols map[string]*volrt.Volume) string {
	if _, ok := vols[config.DefaultVolumeName]; ok {
		return config.DefaultVolumeName
	}
	if len(vols) == 1 {
		for n := range vols {
			return n
		}
	}
	return ""
}
