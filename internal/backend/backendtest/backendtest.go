// Package backendtest provides test doubles for backend.Backend:
//
//   - Counting wraps a backend and records every call and its size, plus
//     the peak number of concurrent calls (merging and worker-bound tests).
//   - Delay wraps a backend and adds latency per call (a slow disk).
//   - Faulty wraps a backend and fails chosen calls.
//   - CrashSim is an in-memory backend that tracks which writes are durable
//     and can produce the image a power failure would leave.
//
// The simplest use:
//
//	c := backendtest.NewCounting(backend.NewMem(1 << 20))
//	... drive c through an engine ...
//	sizes := c.Sizes(backendtest.OpWrite)
//
// All types are safe for concurrent use.
package backendtest

import (
	"sync"
	"time"

	"github.com/vmsan/vmsan/internal/backend"
)

// Op names a backend method.
type Op uint8

const (
	OpRead Op = iota + 1
	OpWrite
	OpSync
	OpTrim
	OpZero
	OpExtents
	OpResize
)

func (o Op) String() string {
	return [...]string{"?", "read", "write", "sync", "trim", "zero", "extents", "resize"}[min(int(o), 7)]
}

// Call is one recorded backend call.
type Call struct {
	Op     Op
	Off    int64
	Len    int64
	NBufs  int // vectored buffers (read/write)
	FUA    bool
	Err    error
	Active int // calls running at the moment this one started (incl. itself)
}

// Counting records every call made through it.
type Counting struct {
	backend.Backend
	mu        sync.Mutex
	calls     []Call
	active    int
	maxActive int
}

// NewCounting wraps b.
func NewCounting(b backend.Backend) *Counting { return &Counting{Backend: b} }

func (c *Counting) begin() int {
	c.mu.Lock()
	c.active++
	if c.active > c.maxActive {
		c.maxActive = c.active
	}
	a := c.active
	c.mu.Unlock()
	return a
}

func (c *Counting) end(call Call) {
	c.mu.Lock()
	c.active--
	c.calls = append(c.calls, call)
	c.mu.Unlock()
}

func bufLen(bufs [][]byte) int64 {
	var n int64
	for _, b := range bufs {
		n += int64(len(b))
	}
	return n
}

func (c *Counting) ReadvAt(bufs [][]byte, off int64) error {
	a := c.begin()
	err := c.Backend.ReadvAt(bufs, off)
	c.end(Call{Op: OpRead, Off: off, Len: bufLen(bufs), NBufs: len(bufs), Err: err, Active: a})
	return err
}

func (c *Counting) WritevAt(bufs [][]byte, off int64, fua bool) error {
	a := c.begin()
	err := c.Backend.WritevAt(bufs, off, fua)
	c.end(Call{Op: OpWrite, Off: off, Len: bufLen(bufs), NBufs: len(bufs), FUA: fua, Err: err, Active: a})
	return err
}

func (c *Counting) Sync() error {
	a := c.begin()
	err := c.Backend.Sync()
	c.end(Call{Op: OpSync, Err: err, Active: a})
	return err
}

func (c *Counting) Trim(off, length int64) error {
	a := c.begin()
	err := c.Backend.Trim(off, length)
	c.end(Call{Op: OpTrim, Off: off, Len: length, Err: err, Active: a})
	return err
}

func (c *Counting) WriteZeroes(off, length int64, mayTrim, fast bool) error {
	a := c.begin()
	err := c.Backend.WriteZeroes(off, length, mayTrim, fast)
	c.end(Call{Op: OpZero, Off: off, Len: length, Err: err, Active: a})
	return err
}

// Calls returns a copy of every call recorded so far, in completion order.
func (c *Counting) Calls() []Call {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]Call(nil), c.calls...)
}

// Sizes returns the length of every recorded call of kind op.
func (c *Counting) Sizes(op Op) []int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []int64
	for _, k := range c.calls {
		if k.Op == op {
			out = append(out, k.Len)
		}
	}
	return out
}

// Count returns the number of recorded calls of kind op.
func (c *Counting) Count(op Op) int { return len(c.Sizes(op)) }

// MaxActive is the highest number of calls that were running at once.
func (c *Counting) MaxActive() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.maxActive
}

// Reset forgets the recorded calls and the peak.
func (c *Counting) Reset() {
	c.mu.Lock()
	c.calls, c.maxActive = nil, c.active
	c.mu.Unlock()
}

// Delay adds a fixed latency before each call of the wrapped backend.
type Delay struct {
	backend.Backend
	ReadDelay, WriteDelay, SyncDelay, OtherDelay time.Duration
}

// NewDelay wraps b, delaying every data call (read, write, trim, zero) by d
// and Sync by syncD.
func NewDelay(b backend.Backend, d, syncD time.Duration) *Delay {
	return &Delay{Backend: b, ReadDelay: d, WriteDelay: d, SyncDelay: syncD, OtherDelay: d}
}

func sleep(d time.Duration) {
	if d > 0 {
		time.Sleep(d)
	}
}

func (d *Delay) ReadvAt(bufs [][]byte, off int64) error {
	sleep(d.ReadDelay)
	return d.Backend.ReadvAt(bufs, off)
}

func (d *Delay) WritevAt(bufs [][]byte, off int64, fua bool) error {
	sleep(d.WriteDelay)
	return d.Backend.WritevAt(bufs, off, fua)
}

func (d *Delay) Sync() error {
	sleep(d.SyncDelay)
	return d.Backend.Sync()
}

func (d *Delay) Trim(off, length int64) error {
	sleep(d.OtherDelay)
	return d.Backend.Trim(off, length)
}

func (d *Delay) WriteZeroes(off, length int64, mayTrim, fast bool) error {
	sleep(d.OtherDelay)
	return d.Backend.WriteZeroes(off, length, mayTrim, fast)
}

// Rule chooses calls for Faulty to fail: a call of kind Op (0 = any kind)
// whose range overlaps [Off, Off+Len) (Len 0 = any range) fails with Err.
// After skips Skip matching calls first; Times limits how many fail
// (0 = all).
type Rule struct {
	Op       Op
	Off, Len int64
	Err      error
	Skip     int
	Times    int
	hits     int
}

// Faulty fails calls matching its rules; others go to the wrapped backend.
// A failed call does not reach the wrapped backend.
type Faulty struct {
	backend.Backend
	mu     sync.Mutex
	rules  []*Rule
	failed int
}

// NewFaulty wraps b with rules.
func NewFaulty(b backend.Backend, rules ...Rule) *Faulty {
	f := &Faulty{Backend: b}
	for _, r := range rules {
		f.AddRule(r)
	}
	return f
}

// AddRule adds a rule.
func (f *Faulty) AddRule(r Rule) {
	f.mu.Lock()
	f.rules = append(f.rules, &r)
	f.mu.Unlock()
}

// Failed is the number of calls failed so far.
func (f *Faulty) Failed() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.failed
}

func (f *Faulty) match(op Op, off, length int64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, r := range f.rules {
		if r.Op != 0 && r.Op != op {
			continue
		}
		if r.Len != 0 && !(off < r.Off+r.Len && r.Off < off+max(length, 1)) {
			continue
		}
		r.hits++
		if r.hits <= r.Skip {
			continue
		}
		if r.Times != 0 && r.hits > r.Skip+r.Times {
			continue
		}
		f.failed++
		return r.Err
	}
	return nil
}

func (f *Faulty) ReadvAt(bufs [][]byte, off int64) error {
	if err := f.match(OpRead, off, bufLen(bufs)); err != nil {
		return err
	}
	return f.Backend.ReadvAt(bufs, off)
}

func (f *Faulty) WritevAt(bufs [][]byte, off int64, fua bool) error {
	if err := f.match(OpWrite, off, bufLen(bufs)); err != nil {
		return err
	}
	return f.Backend.WritevAt(bufs, off, fua)
}

func (f *Faulty) Sync() error {
	if err := f.match(OpSync, 0, 0); err != nil {
		return err
	}
	return f.Backend.Sync()
}

func (f *Faulty) Trim(off, length int64) error {
	if err := f.match(OpTrim, off, length); err != nil {
		return err
	}
	return f.Backend.Trim(off, length)
}

func (f *Faulty) WriteZeroes(off, length int64, mayTrim, fast bool) error {
	if err := f.match(OpZero, off, length); err != nil {
		return err
	}
	return f.Backend.WriteZeroes(off, length, mayTrim, fast)
}

var (
	_ backend.Backend = (*Counting)(nil)
	_ backend.Backend = (*Delay)(nil)
	_ backend.Backend = (*Faulty)(nil)
	_ backend.Backend = (*CrashSim)(nil)
)
