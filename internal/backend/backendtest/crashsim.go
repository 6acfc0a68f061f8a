package backendtest

import (
	"math/rand/v2"
	"sync"

	"github.com/vmsan/vmsan/internal/backend"
)

// CrashSim is an in-memory Backend that models a volatile write cache, in
// the spirit of pebble's crash-simulating vfs: every modification (write,
// trim, write-zeroes) is logged as not yet durable; Sync makes all logged
// modifications durable; a FUA write is durable at once. Crash returns the
// image a power failure would leave: the durable state with each
// non-durable modification independently kept or lost (seeded RNG), applied
// in the original order.
//
// Modifications are atomic units (no torn writes within one call).
// Concurrency: safe for concurrent use; each call is atomic.
type CrashSim struct {
	mu   sync.Mutex
	rng  *rand.Rand
	base []byte // image at the last Sync
	cur  []byte // what reads see now
	log  []mod  // modifications since the last Sync, in order
}

type mod struct {
	off     int64
	data    []byte // nil: zeroes of length n
	n       int64
	durable bool
}

// NewCrashSim returns a zero-filled CrashSim of size bytes whose crash
// outcomes are determined by seed.
func NewCrashSim(size int64, seed uint64) *CrashSim {
	return &CrashSim{
		rng:  rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		base: make([]byte, size),
		cur:  make([]byte, size),
	}
}

func (c *CrashSim) check(off, n int64) error {
	if off < 0 || n < 0 || off > int64(len(c.cur))-n {
		return backend.ErrOutOfRange
	}
	return nil
}

// Size implements backend.Backend.
func (c *CrashSim) Size() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return int64(len(c.cur))
}

// ReadvAt implements backend.Backend.
func (c *CrashSim) ReadvAt(bufs [][]byte, off int64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.check(off, bufLen(bufs)); err != nil {
		return err
	}
	for _, b := range bufs {
		off += int64(copy(b, c.cur[off:]))
	}
	return nil
}

// WritevAt implements backend.Backend.
func (c *CrashSim) WritevAt(bufs [][]byte, off int64, fua bool) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := bufLen(bufs)
	if err := c.check(off, n); err != nil {
		return err
	}
	data := make([]byte, 0, n)
	for _, b := range bufs {
		data = append(data, b...)
	}
	copy(c.cur[off:], data)
	c.log = append(c.log, mod{off: off, data: data, n: n, durable: fua})
	return nil
}

// Sync implements backend.Backend: everything logged becomes durable.
func (c *CrashSim) Sync() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, m := range c.log {
		apply(c.base, m)
	}
	c.log = c.log[:0]
	return nil
}

func apply(img []byte, m mod) {
	if m.data != nil {
		copy(img[m.off:], m.data)
	} else {
		clear(img[m.off : m.off+m.n])
	}
}

func (c *CrashSim) zero(off, n int64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.check(off, n); err != nil {
		return err
	}
	clear(c.cur[off : off+n])
	c.log = append(c.log, mod{off: off, n: n})
	return nil
}

// Trim implements backend.Backend.
func (c *CrashSim) Trim(off, n int64) error { return c.zero(off, n) }

// WriteZeroes implements backend.Backend (always fast).
func (c *CrashSim) WriteZeroes(off, n int64, mayTrim, fast bool) error { return c.zero(off, n) }

// Extents implements backend.Backend: one data extent (CrashSim does not
// track allocation).
func (c *CrashSim) Extents(off, n int64) ([]backend.Extent, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.check(off, n); err != nil {
		return nil, err
	}
	if n == 0 {
		return nil, nil
	}
	return []backend.Extent{{Offset: off, Length: n}}, nil
}

// Resize implements backend.Backend. For simplicity the new size is
// durable at once.
func (c *CrashSim) Resize(size int64) error {
	if size < 0 {
		return backend.ErrOutOfRange
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	grow := func(b []byte) []byte {
		if int64(len(b)) >= size {
			return b[:size]
		}
		return append(b, make([]byte, size-int64(len(b)))...)
	}
	c.base, c.cur = grow(c.base), grow(c.cur)
	kept := c.log[:0]
	for _, m := range c.log {
		if m.off+m.n <= size {
			kept = append(kept, m)
		}
	}
	c.log = kept
	return nil
}

// Close implements backend.Backend (nothing to release; Close does not sync,
// so a test can Close and then Crash).
func (c *CrashSim) Close() error { return nil }

// Image returns a copy of what reads currently see.
func (c *CrashSim) Image() []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]byte(nil), c.cur...)
}

// Unsynced returns the number of logged modifications that are not durable.
func (c *CrashSim) Unsynced() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, m := range c.log {
		if !m.durable {
			n++
		}
	}
	return n
}

// Crash simulates a power failure and returns a copy of the resulting
// image. The simulator then continues from that image (as after a reboot).
func (c *CrashSim) Crash() []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	img := append([]byte(nil), c.base...)
	for _, m := range c.log {
		if m.durable || c.rng.IntN(2) == 0 {
			apply(img, m)
		}
	}
	c.log = c.log[:0]
	c.base = img
	c.cur = append([]byte(nil), img...)
	return append([]byte(nil), img...)
}
