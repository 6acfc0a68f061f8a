package volrt

import (
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/vmsan/vmsan/internal/backend"
	"github.com/vmsan/vmsan/internal/export"
	"github.com/vmsan/vmsan/internal/ioengine"
	"github.com/vmsan/vmsan/internal/volume"
)

// ErrVolumeGone fails requests on a volume deleted with force while clients
// were still connected. EIO is what a disk that vanished returns.
var ErrVolumeGone = fmt.Errorf("volume deleted: %w", syscall.EIO)

// Wrap is one link of the device wrapping chain: it may return dev itself
// or a device that routes I/O elsewhere first (replication's driver wraps
// a replicated volume's device so client writes are mirrored).
type Wrap func(name string, dev export.Device) export.Device

// Volume is an open volume: backend + engine, shared by every connection
// of every front end (one engine per volume is what makes NBD's
// CAN_MULTI_CONN true: a FLUSH on any connection flushes the one backend
// all of them write to).
//
// Concurrency: all methods are safe for concurrent use. meta is guarded
// by mu; the rest is set at Open and read-only, or atomic.
type Volume struct {
	name       string
	maxPayload uint32

	mu   sync.Mutex
	meta volume.Meta

	be  backend.Backend
	eng *ioengine.Engine

	// refs counts Acquire references not yet released.
	refs atomic.Int64
	// deleting is set while a Delete is deciding (see Acquire); gone is
	// set once the volume's files are removed.
	deleting  atomic.Bool
	gone      atomic.Bool
	closeOnce sync.Once
	closeErr  error

	// noSpace receives the engine's ENOSPC reports (nospace.go).
	noSpace atomic.Pointer[NoSpace]
}

// Open opens a volume's backend and starts its engine. maxPayload is the
// largest request a front end may send (advertised as the maximum block).
func Open(store *volume.Store, m volume.Meta, ecfg ioengine.Config, maxPayload uint32) (*Volume, error) {
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
	return New(m, be, ecfg, maxPayload), nil
}

// New runs an engine over an already open backend (Open does this for a
// store's volume; a front end's tests can pass a backend.Mem). The Volume
// owns be from now on: Close closes it.
func New(m volume.Meta, be backend.Backend, ecfg ioengine.Config, maxPayload uint32) *Volume {
	v := &Volume{name: m.Name, meta: m, be: be, maxPayload: maxPayload}
	if prev := ecfg.OnNoSpace; prev != nil {
		ecfg.OnNoSpace = func() { v.noteNoSpace(); prev() }
	} else {
		ecfg.OnNoSpace = v.noteNoSpace
	}
	v.eng = ioengine.New(be, ecfg)
	return v
}

// Name is the volume's name.
func (v *Volume) Name() string { return v.name }

// Meta is a copy of the volume's metadata as opened (Size follows Resize).
func (v *Volume) Meta() volume.Meta {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.meta
}

// Size is the backend's current size in bytes.
func (v *Volume) Size() int64 { return v.be.Size() }

// Engine is the volume's engine, for statistics and tests: front ends
// submit through the devices Acquire hands out, never to it directly
// (that would bypass the wrapping chain and the gone check).
func (v *Volume) Engine() *ioengine.Engine { return v.eng }

// EngineStats snapshots the volume's engine counters.
func (v *Volume) EngineStats() ioengine.Stats { return v.eng.Stats() }

// Resize changes the open backend's size so the next connection sees it.
func (v *Volume) Resize(size int64) error {
	if err := v.be.Resize(size); err != nil {
		return err
	}
	v.mu.Lock()
	v.meta.Size = size
	v.mu.Unlock()
	return nil
}

// Refs is the number of devices handed out by Acquire and not released.
func (v *Volume) Refs() int64 { return v.refs.Load() }

// Info is what front ends advertise for the volume.
func (v *Volume) Info() export.Info {
	m := v.Meta()
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
		Cache:        m.Cache,
	}
}

// Acquire returns a device for the volume with a reference held (release
// it with Release), passed through the wrapping chain in order. It returns
// export.ErrNotFound while a delete is deciding or after it succeeded.
//
// INVARIANT: a delete that succeeds without force never races with an
// Acquire that succeeds: the deleter sets deleting (BeginDelete) before
// reading refs, Acquire increments refs before reading deleting (both
// sequentially consistent atomics), so at least one of them sees the
// other. The price is that an Acquire overlapping a refused delete may
// fail with ErrNotFound; the client retries.
func (v *Volume) Acquire(chain []Wrap) (export.Device, error) {
	v.refs.Add(1)
	if v.deleting.Load() || v.gone.Load() {
		if v.refs.Add(-1) == 0 && v.gone.Load() {
			v.Close()
		}
		return nil, export.ErrNotFound
	}
	var dev export.Device = &device{v: v}
	for _, w := range chain {
		dev = w(v.name, dev)
	}
	return dev, nil
}

// BeginDelete starts the delete (or close-for-reopen) handshake with
// Acquire and reports whether devices are held. Finish with AbortDelete or
// MarkGone.
func (v *Volume) BeginDelete() (held bool) {
	v.deleting.Store(true)
	return v.refs.Load() > 0
}

// AbortDelete ends a BeginDelete that did not delete: Acquire works again.
func (v *Volume) AbortDelete() { v.deleting.Store(false) }

// MarkGone records that the volume's files are removed: held devices fail
// every further request with ErrVolumeGone, and the volume closes when the
// last one is released (now, if none is held).
func (v *Volume) MarkGone() {
	v.gone.Store(true)
	if v.refs.Load() == 0 {
		v.Close()
	}
}

// Close stops the engine (draining and syncing) and closes the backend.
// Idempotent; the first call's result is returned to every caller.
func (v *Volume) Close() error {
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
	v        *Volume
	released atomic.Bool
}

func (d *device) Info() export.Info { return d.v.Info() }

func (d *device) Submit(r *export.Request) {
	if d.v.gone.Load() {
		export.Finish(r, ErrVolumeGone)
		return
	}
	d.v.eng.Submit(r.Engine())
}

func (d *device) Extents(off, length int64) ([]backend.Extent, error) {
	if d.v.gone.Load() {
		return nil, ErrVolumeGone
	}
	return d.v.be.Extents(off, length)
}

func (d *device) Release() {
	if !d.released.CompareAndSwap(false, true) {
		return
	}
	v := d.v
	if v.refs.Add(-1) == 0 && v.gone.Load() {
		v.Close()
	}
}
