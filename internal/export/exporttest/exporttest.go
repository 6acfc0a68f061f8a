// Package exporttest provides export.Device and export.Registry
// implementations over a real I/O engine, for tests of front ends (NBD,
// iSCSI) that want the production data path without the volume store.
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
)

// Device is an export.Device over an Engine and its Backend.
type Device struct {
	Engine  *ioengine.Engine
	Backend backend.Backend
	// Meta is returned by Info with Size replaced by the backend's size.
	Meta export.Info
	refs atomic.Int64
}

// NewDevice wraps an engine already driving b.
func NewDevice(name string, e *ioengine.Engine, b backend.Backend) *Device {
	return &Device{Engine: e, Backend: b, Meta: export.Info{
		Name: name, CanMultiConn: true, MinBlock: 1, PrefBlock: 4096, MaxBlock: 32 << 20,
	}}
}

// NewFileDevice creates a sparse file of size bytes in a disk-backed temp
// dir (testutil.DiskTempDir, so cache=none works where /tmp is tmpfs), opens
// it with mode, and starts an engine on it; t.Cleanup closes both.
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
	e := ioengine.New(f, ioengine.Config{})
	t.Cleanup(func() {
		if err := e.Close(); err != nil {
			t.Errorf("engine close: %v", err)
		}
		if err := f.Close(); err != nil {
			t.Errorf("backend close: %v", err)
		}
	})
	d := NewDevice(name, e, f)
	if mode == backend.CacheNone {
		d.Meta.MinBlock = uint32(max(f.Alignment(), 1))
	}
	return d
}

// NewMemDevice is NewFileDevice over backend.Mem.
func NewMemDevice(t testing.TB, name string, size int64) *Device {
	t.Helper()
	m := backend.NewMem(size)
	e := ioengine.New(m, ioengine.Config{})
	t.Cleanup(func() { e.Close() })
	return NewDevice(name, e, m)
}

// Info implements export.Device.
func (d *Device) Info() export.Info {
	in := d.Meta
	in.Size = d.Backend.Size()
	return in
}

// Submit implements export.Device.
func (d *Device) Submit(r *ioengine.Request) { d.Engine.Submit(r) }

// Extents implements export.Device.
func (d *Device) Extents(off, length int64) ([]backend.Extent, error) {
	return d.Backend.Extents(off, length)
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
