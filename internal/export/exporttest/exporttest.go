// Package exporttest provides export.Device and export.Registry
// implementations over the production runtime (volrt.Volume: a real I/O
// engine over a backend), for tests of front ends (NBD, iSCSI) that want
// the production data path without the volume store.
//
// Simplest use:
//
//	dev := exporttest.NewFileDevice(t, "disk", 64<<20, backend.CacheWriteback)
//	reg := exporttest.NewRegistry(dev)
//	srv := server.New(server.Config{Registry: reg})
//
// Concurrency: Device and Registry are safe for concurrent use.
package exporttest

import (
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/vmsan/vmsan/internal/backend"
	"github.com/vmsan/vmsan/internal/export"
	"github.com/vmsan/vmsan/internal/ioengine"
	"github.com/vmsan/vmsan/internal/testutil"
	"github.com/vmsan/vmsan/internal/volrt"
	"github.com/vmsan/vmsan/internal/volume"
)

// Device is an export.Device over the production runtime device (a
// volrt.Volume over a backend), with an Info the test may adjust (Meta).
type Device struct {
	// Volume is the runtime volume serving the I/O; Engine and Backend
	// are its engine and backend (for statistics and direct checks).
	Volume  *volrt.Volume
	Engine  *ioengine.Engine
	Backend backend.Backend
	// Meta is returned by Info with Size replaced by the backend's size.
	Meta export.Info
	dev  export.Device // held for the Device's life
	refs atomic.Int64
}

// NewDevice runs a volrt.Volume over b (which it then owns) and returns a
// Device serving it; t.Cleanup closes the volume (engine drain + sync,
// backend close) and reports a failure to close.
func NewDevice(t testing.TB, name string, b backend.Backend) *Device {
	t.Helper()
	v := volrt.New(volume.Meta{Name: name, Size: b.Size()}, b, ioengine.Config{}, 32<<20)
	dev, err := v.Acquire(nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		dev.Release()
		if err := v.Close(); err != nil {
			t.Errorf("volume close: %v", err)
		}
	})
	return &Device{Volume: v, Engine: v.Engine(), Backend: b, dev: dev, Meta: export.Info{
		Name: name, CanMultiConn: true, MinBlock: 1, PrefBlock: 4096, MaxBlock: 32 << 20,
	}}
}

// NewFileDevice creates a sparse file of size bytes in a disk-backed temp
// dir (testutil.DiskTempDir, so cache=none works where /tmp is tmpfs), opens
// it with mode, and serves it (NewDevice); t.Cleanup closes it.
func NewFileDevice(t testing.TB, name string, size int64, mode backend.CacheMode) *Device {
	t.Helper()
	p := filepath.Join(testutil.DiskTempDir(t), name+".raw")
	if err := backend.CreateFile(p, size); err != nil {
		t.Fatal(err)
	}
	f, err := backend.OpenFile(p, mode, false)
	if err != nil {
		t.Fatal(err)
	}
	d := NewDevice(t, name, f)
	if mode == backend.CacheNone {
		d.Meta.MinBlock = uint32(max(f.Alignment(), 1))
	}
	return d
}

// NewMemDevice is NewFileDevice over backend.Mem.
func NewMemDevice(t testing.TB, name string, size int64) *Device {
	t.Helper()
	return NewDevice(t, name, backend.NewMem(size))
}

// Info implements export.Device.
func (d *Device) Info() export.Info {
	in := d.Meta
	in.Size = d.Backend.Size()
	return in
}

// Submit implements export.Device (through the runtime's device).
func (d *Device) Submit(r *export.Request) { d.dev.Submit(r) }

// Extents implements export.Device (through the runtime's device).
func (d *Device) Extents(off, length int64) ([]backend.Extent, error) {
	return d.dev.Extents(off, length)
}

// Release implements export.Device.
func (d *Device) Release() { d.refs.Add(-1) }

// Refs is the number of references held through a Registry (Open minus
// Release); tests use it to check front ends release what they open.
func (d *Device) Refs() int64 { return d.refs.Load() }

// Registry is an export.Registry over a fixed set of devices.
type Registry struct {
	mu   sync.Mutex
	devs map[string]export.Device
}

// NewRegistry returns a Registry serving devs under their Info().Name.
func NewRegistry(devs ...export.Device) *Registry {
	r := &Registry{devs: map[string]export.Device{}}
	for _, d := range devs {
		r.Add(d)
	}
	return r
}

// Add registers (or replaces) a device under its name.
func (r *Registry) Add(d export.Device) {
	r.mu.Lock()
	r.devs[d.Info().Name] = d
	r.mu.Unlock()
}

// Open implements export.Registry.
func (r *Registry) Open(name string) (export.Device, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	d, ok := r.devs[name]
	if !ok {
		return nil, export.ErrNotFound
	}
	if dd, ok := d.(*Device); ok {
		dd.refs.Add(1)
	}
	return d, nil
}

// List implements export.Registry.
func (r *Registry) List() []export.Info {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]export.Info, 0, len(r.devs))
	for _, d := range r.devs {
		out = append(out, d.Info())
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}
