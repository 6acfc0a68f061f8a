package daemon

import (
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/vmsan/vmsan/internal/backend"
	"github.com/vmsan/vmsan/internal/config"
	"github.com/vmsan/vmsan/internal/export"
	"github.com/vmsan/vmsan/internal/ioengine"
	"github.com/vmsan/vmsan/internal/volume"
)

func backendMode(s string) backend.CacheMode { return backend.CacheMode(s) }

// errVolumeGone fails requests on a volume deleted with force while clients
// were still connected. EIO is what a disk that vanished returns.
var errVolumeGone = fmt.Errorf("volume deleted: %w", syscall.EIO)

// vol is an open volume: backend + engine, shared by every connection to it
// (one engine per volume is what makes CAN_MULTI_CONN true: a FLUSH on any
// connection flushes the one backend all of them write to).
//
// Concurrency: meta is guarded by mu; everything else is set at open and
// read-only, or atomic.
type vol struct {
	name       string
	maxPayload uint32

	mu   sync.Mutex
	meta volume.Meta

	be  *backend.File
	eng *ioengine.Engine

	// refs counts Registry.Open references not yet released.
	refs atomic.Int64
	// deleting is set while a Delete is deciding (see Registry.Open);
	// gone is set once the volume's files are removed.
	deleting  atomic.Bool
	gone      atomic.Bool
	closeOnce sync.Once
	closeErr  error
}

func engineConfig(e config.Engine) ioengine.Config {
	return ioengine.Config{
		Workers:       e.Workers,
		MaxMergeBytes: int64(e.MaxMerge),
		MaxQueue:      e.MaxQueue,
		GatherDelay:   time.Duration(e.GatherDelay),
	}
}

// openVol opens a volume's backend and starts its engine.
func openVol(store *volume.Store, m volume.Meta, ecfg config.Engine, maxPayload uint32) (*vol, error) {
	// Never serve a raw file that is not the volume's (missing, or of a
	// size no vmsan operation leaves): the error names the repair.
	if err := store.CheckRaw(m.Name); err != nil {
		return nil, err
	}
	be, err := backend.OpenFile(store.RawPath(m.Name), m.Cache, m.ReadOnly)
	if err != nil {
		return nil, fmt.Errorf("volume %s: %w", m.Name, err)
	}
	if be.Size() != m.Size {
		be.Close()
		return nil, fmt.Errorf("volume %s: raw file is %d bytes but metadata says %d", m.Name, be.Size(), m.Size)
	}
	v := &vol{name: m.Name, meta: m, be: be, maxPayload: maxPayload}
	v.eng = ioengine.New(be, engineConfig(ecfg))
	return v, nil
}

// close stops the engine (draining and syncing) and closes the backend.
// Idempotent.
func (v *vol) close() error {
	v.closeOnce.Do(func() {
		err := v.eng.Close()
		if berr := v.be.Close(); err == nil {
			err = berr
		}
		v.closeErr = err
	})
	return v.closeErr
}

// device is the export.Device handed to a front end; Release is guarded so
// a double release by a buggy front end cannot drive refs negative.
type device struct {
	v        *vol
	released atomic.Bool
}

func (d *device) Info() export.Info {
	v := d.v
	v.mu.Lock()
	m := v.meta
	v.mu.Unlock()
	min := uint32(1)
	if m.LogicalBlockSize > 512 {
		// A 4Kn volume: clients must not do sub-block I/O.
		min = m.LogicalBlockSize
	}
	return export.Info{
		Name:         m.Name,
		Description:  m.Description,
		UUID:         m.UUID,
		Size:         v.be.Size(),
		ReadOnly:     m.ReadOnly,
		Rotational:   m.Rotational,
		CanMultiConn: true,
		MinBlock:     min,
		PrefBlock:    max(m.PhysicalBlockSize, min),
		MaxBlock:     v.maxPayload,
	}
}

func (d *device) Submit(r *ioengine.Request) {
	if d.v.gone.Load() {
		r.Err = errVolumeGone
		r.Done(r)
		return
	}
	d.v.eng.Submit(r)
}

func (d *device) Extents(off, length int64) ([]backend.Extent, error) {
	if d.v.gone.Load() {
		return nil, errVolumeGone
	}
	return d.v.be.Extents(off, length)
}

func (d *device) Release() {
	if !d.released.CompareAndSwap(false, true) {
		return
	}
	v := d.v
	if v.refs.Add(-1) == 0 && v.gone.Load() {
		v.close()
	}
}

// registry implements export.Registry over the daemon's open volumes.
type registry struct{ d *Daemon }

// Open looks the name up in a lock-free snapshot of the volume map so that
// a connection never waits behind a control operation.
//
// INVARIANT: a Delete that succeeds without force never races with an Open
// that succeeds: Delete sets deleting before reading refs, Open increments
// refs before reading deleting (both sequentially consistent atomics), so
// at least one of them sees the other. The price is that an Open that
// overlaps a refused Delete may fail with ErrNotFound; the client retries.
func (r registry) Open(name string) (export.Device, error) { return r.open(name, true) }

// open is Open; wrap=false skips plugin wrapping (plugins' own access).
func (r registry) open(name string, wrap bool) (export.Device, error) {
	vols := *r.d.vols.Load()
	if name == "" {
		name = r.d.defaultExport(vols)
	}
	v := vols[name]
	if v == nil {
		return nil, export.ErrNotFound
	}
	v.refs.Add(1)
	if v.deleting.Load() || v.gone.Load() {
		if v.refs.Add(-1) == 0 && v.gone.Load() {
			v.close()
		}
		return nil, export.ErrNotFound
	}
	var dev export.Device = &device{v: v}
	if wrap {
		for _, p := range r.d.plugins {
			dev = p.WrapDevice(name, dev)
		}
	}
	return dev, nil
}

func (r registry) List() []export.Info {
	vols := *r.d.vols.Load()
	out := make([]export.Info, 0, len(vols))
	for _, v := range vols {
		out = append(out, (&device{v: v}).Info())
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// defaultExport resolves the empty export name: "default" if it exists,
// else the only volume if there is exactly one.
func (d *Daemon) defaultExport(vols map[string]*vol) string {
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
