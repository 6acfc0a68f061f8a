package ioengine_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/vmsan/vmsan/internal/backend"
	"github.com/vmsan/vmsan/internal/backend/backendtest"
	"github.com/vmsan/vmsan/internal/ioengine"
	"github.com/vmsan/vmsan/internal/ioengine/enginetest"
)

// The tests in this file run the engine on a manual clock
// (enginetest.Clock): time moves only when the test advances it, and
// ioengine.Settle waits until the engine has started everything that is
// due. So every figure they assert (how many backend writes, of what size)
// is exact, whatever the machine's load or the race detector's slowdown.

const bs = 4096

// gatedMem is a Mem whose writes block while the gate is shut: the test
// keeps the first write of a stream inside the backend while the rest of
// the window arrives, so the engine measures the window's full queue depth.
type gatedMem struct {
	*backend.Mem
	mu   sync.Mutex
	gate chan struct{} // nil = open
}

func (g *gatedMem) WritevAt(b [][]byte, off int64, fua bool) error {
	g.mu.Lock()
	ch := g.gate
	g.mu.Unlock()
	if ch != nil {
		<-ch
	}
	return g.Mem.WritevAt(b, off, fua)
}

type fakeEnv struct {
	t   *testing.T
	clk *enginetest.Clock
	g   *gatedMem
	c   *backendtest.Counting
	e   *ioengine.Engine
	wg  sync.WaitGroup
}

func newFakeEnv(t *testing.T, size int64, cfg ioengine.Config) *fakeEnv {
	t.Helper()
	f := &fakeEnv{t: t, clk: enginetest.NewClock(), g: &gatedMem{Mem: backend.NewMem(size)}}
	f.c = backendtest.NewCounting(f.g)
	cfg.Clock = f.clk
	f.e = ioengine.New(f.c, cfg)
	t.Cleanup(func() { f.e.Close() })
	return f
}

// write submits a 4 KiB write of block blk without waiting for it.
func (f *fakeEnv) write(blk int64, more bool) {
	f.wg.Add(1)
	f.e.Submit(&ioengine.Request{Op: ioengine.OpWrite, Offset: blk * bs, Length: bs, Data: make([]byte, bs), More: more,
		Done: func(r *ioengine.Request) {
			if r.Err != nil {
				f.t.Error(r.Err)
			}
			f.wg.Done()
		}})
}

// advance moves the clock and lets the engine act on it.
func (f *fakeEnv) advance(d time.Duration) {
	f.clk.Advance(d)
	ioengine.Settle(f.t, f.e)
}

// wait waits for every write submitted so far, advancing the clock in
// steps of 100 µs while the engine holds some of them (a client waiting for
// its replies lets time pass; the engine's backstops fire at their exact
// times within a step).
func (f *fakeEnv) wait() {
	for {
		ioengine.Settle(f.t, f.e)
		if f.e.Stats().QueueDepth == 0 {
			f.wg.Wait()
			return
		}
		f.advance(100 * time.Microsecond)
	}
}

// writes returns the sizes of the backend writes made since the last call.
func (f *fakeEnv) writes() []int64 {
	ioengine.Settle(f.t, f.e)
	s := f.c.Sizes(backendtest.OpWrite)
	f.c.Reset()
	return s
}

// prime establishes a sequential stream at queue depth qd: the first write
// is kept in the (gated) backend while the other qd-1 arrive, so qd writes
// are outstanding at once; then the clock runs out every hold.
func (f *fakeEnv) prime(qd int) {
	f.g.gate = make(chan struct{})
	for i := 0; i < qd; i++ {
		f.write(int64(i), false)
	}
	f.g.mu.Lock()
	close(f.g.gate)
	f.g.gate = nil
	f.g.mu.Unlock()
	ioengine.Settle(f.t, f.e)
	f.advance(f.e.Config().MaxGatherDelay)
	f.wg.Wait()
	f.writes()
}

func mean(sizes []int64) float64 {
	var sum int64
	for _, n := range sizes {
		sum += n
	}
	return float64(sum) / float64(len(sizes))
}

// TestGatherFullWindow: a closed-loop sequential writer at queue depth qd
// (it sends its next window when the previous one has completed) gets
// exactly one backend write per window, qd × 4 KiB, released because the
// queue is full: no time passes at all.
func TestGatherFullWindow(t *testing.T) {
	for _, qd := range []int{16, 32} {
		t.Run(fmt.Sprintf("qd%d", qd), func(t *testing.T) {
			f := newFakeEnv(t, 8<<20, ioengine.Config{})
			f.prime(qd)
			before := f.e.Stats()
			blk := int64(qd)
			for round := 0; round < 8; round++ {
				for i := 0; i < qd; i++ {
					f.write(blk, false)
					blk++
				}
				f.wg.Wait()
				if got := f.writes(); len(got) != 1 || got[0] != int64(qd*bs) {
					t.Fatalf("round %d: backend writes %v, want one of %d", round, got, qd*bs)
				}
			}
			if s := f.e.Stats(); s.GatherTimeouts != before.GatherTimeouts {
				t.Fatalf("%d runs released by the backstop; want all released by a full queue", s.GatherTimeouts-before.GatherTimeouts)
			}
		})
	}
}

// TestGatherBackstop: writes of a deep stream that stops short of its
// window are held for exactly GatherDelay (nothing measured yet), then go
// as one run.
func TestGatherBackstop(t *testing.T) {
	f := newFakeEnv(t, 8<<20, ioengine.Config{})
	f.prime(32)
	for i := int64(0); i < 10; i++ {
		f.write(32+i, false)
	}
	if got := f.writes(); len(got) != 0 {
		t.Fatalf("backend writes %v before any time passed, want none (held)", got)
	}
	f.advance(ioengine.DefaultGatherDelay - 1)
	if got := f.writes(); len(got) != 0 {
		t.Fatalf("backend writes %v before GatherDelay passed, want none", got)
	}
	before := f.e.Stats()
	f.advance(1)
	f.wg.Wait()
	if got := f.writes(); len(got) != 1 || got[0] != 10*bs {
		t.Fatalf("backend writes %v after GatherDelay, want one of %d", got, 10*bs)
	}
	if n := f.e.Stats().GatherTimeouts - before.GatherTimeouts; n != 1 {
		t.Fatalf("%d runs released by the backstop, want 1", n)
	}
}

// TestGatherSlowSubmitter is the loaded machine, deterministically: a
// queue-depth-32 sequential writer whose process is descheduled twice per
// window, for 1 ms each time (more than GatherDelay), sends its window as
// 8 + 8 + 16 writes. A fixed 300 µs backstop cuts every window into three
// backend writes (mean 42.7 KiB); measuring the gaps, the engine holds
// through them after the first window, and every later window reaches the
// backend as one 128 KiB write.
func TestGatherSlowSubmitter(t *testing.T) {
	const gap = time.Millisecond
	f := newFakeEnv(t, 8<<20, ioengine.Config{})
	f.prime(32)
	var all []int64
	blk := int64(32)
	for window := 0; window < 10; window++ {
		for _, n := range []int{8, 8, 16} {
			if n != 8 || blk%32 != 0 { // the first fragment starts at once
				f.advance(gap)
			}
			for i := 0; i < n; i++ {
				f.write(blk, false)
				blk++
				f.advance(10 * time.Microsecond)
			}
			ioengine.Settle(t, f.e)
		}
		f.wait()
		got := f.writes()
		all = append(all, got...)
		if window >= 1 && (len(got) != 1 || got[0] != 32*bs) {
			t.Fatalf("window %d: backend writes %v, want one of %d (the gaps are measured by now)", window, got, 32*bs)
		}
	}
	s := f.e.Stats()
	t.Logf("backend writes %v; backstop now %v", all, s.GatherHold)
	if m := mean(all); m < 64<<10 {
		t.Fatalf("mean backend write %.0f B, want >= 64 KiB", m)
	}
	if s.GatherHold < 2*gap-gap/2 || s.GatherHold > f.e.Config().MaxGatherDelay {
		t.Fatalf("backstop %v, want about twice the 1 ms gap", s.GatherHold)
	}
}

// TestGatherHoldIgnoresRoundTrip: the time a writer with a full queue
// waits for its replies (here 2 ms per window, a slow network) is not a
// gap to outlast: the backstop stays GatherDelay, so a writer whose queue
// depth drops is not held for the round trip.
func TestGatherHoldIgnoresRoundTrip(t *testing.T) {
	f := newFakeEnv(t, 8<<20, ioengine.Config{})
	f.prime(32)
	blk := int64(32)
	for window := 0; window < 4; window++ {
		f.advance(2 * time.Millisecond)
		for i := 0; i < 32; i++ {
			f.write(blk, false)
			blk++
		}
		f.wait()
		if got := f.writes(); len(got) != 1 || got[0] != 32*bs {
			t.Fatalf("window %d: backend writes %v, want one of %d", window, got, 32*bs)
		}
	}
	if h := f.e.Stats().GatherHold; h != ioengine.DefaultGatherDelay {
		t.Fatalf("backstop %v after windows 2 ms apart, want GatherDelay (%v)", h, ioengine.DefaultGatherDelay)
	}
}

// TestGatherBackstopBounded: no hold outlasts MaxGatherDelay. Gaps longer
// than that are not counted (a writer that pauses is not a slow one), and
// the More hint stretches a hold only up to it.
func TestGatherBackstopBounded(t *testing.T) {
	f := newFakeEnv(t, 8<<20, ioengine.Config{})
	f.prime(32)
	maxHold := f.e.Config().MaxGatherDelay
	if maxHold != 10*ioengine.DefaultGatherDelay {
		t.Fatalf("default MaxGatherDelay %v", maxHold)
	}
	// A pause of 10 × MaxGatherDelay between writes: not a gap to outlast.
	f.write(32, false)
	f.advance(10 * maxHold)
	f.write(33, false)
	f.advance(ioengine.DefaultGatherDelay)
	f.wg.Wait()
	if got := f.writes(); len(got) != 2 {
		t.Fatalf("backend writes %v, want the two writes released by the GatherDelay backstop", got)
	}
	if h := f.e.Stats().GatherHold; h != ioengine.DefaultGatherDelay {
		t.Fatalf("backstop %v after a long pause, want GatherDelay", h)
	}

	// More on every write: held up to exactly MaxGatherDelay, no longer.
	for i := int64(0); i < 10; i++ {
		f.write(40+i, true)
	}
	f.advance(maxHold - 1)
	if got := f.writes(); len(got) != 0 {
		t.Fatalf("backend writes %v before MaxGatherDelay with More set, want none", got)
	}
	f.advance(1)
	f.wg.Wait()
	if got := f.writes(); len(got) != 1 || got[0] != 10*bs {
		t.Fatalf("backend writes %v at MaxGatherDelay, want one of %d", got, 10*bs)
	}
}

// TestGatherMoreHint: while the submitter says more requests are in its
// hands (an NBD connection with more requests buffered), a run is held
// past its backstop: here the submitter is descheduled for 4 × GatherDelay
// after its tenth write. Its next write withdraws the hint; the gap it
// left is measured (the backstop becomes twice it), so the run is held on
// until the cap, MaxGatherDelay after its first write, and goes whole.
func TestGatherMoreHint(t *testing.T) {
	f := newFakeEnv(t, 8<<20, ioengine.Config{})
	f.prime(32)
	maxHold := f.e.Config().MaxGatherDelay
	const pause = 4 * ioengine.DefaultGatherDelay
	for i := int64(0); i < 10; i++ {
		f.write(32+i, true)
	}
	f.advance(pause)
	if got := f.writes(); len(got) != 0 {
		t.Fatalf("backend writes %v while More was set, want none", got)
	}
	f.write(42, false) // the last buffered request: the stream pauses here
	if h := f.e.Stats().GatherHold; h != 2*pause {
		t.Fatalf("backstop %v, want %v (twice the measured gap)", h, 2*pause)
	}
	f.advance(maxHold - pause - 1)
	if got := f.writes(); len(got) != 0 {
		t.Fatalf("backend writes %v before the cap, want none", got)
	}
	f.advance(1)
	f.wg.Wait()
	if got := f.writes(); len(got) != 1 || got[0] != 11*bs {
		t.Fatalf("backend writes %v, want one of %d", got, 11*bs)
	}
}

// TestQD1NeverHeld: a lone synchronous writer is never held, not even
// with the More hint, and not because of a deep burst long ago (the queue
// depth estimate forgets after two 250 ms windows without writes).
func TestQD1NeverHeld(t *testing.T) {
	f := newFakeEnv(t, 8<<20, ioengine.Config{})
	f.prime(32)
	f.advance(600 * time.Millisecond)
	before := f.e.Stats()
	for blk := int64(64); blk < 64+256; blk++ {
		f.write(blk, blk%2 == 0)
		f.wg.Wait()
	}
	s := f.e.Stats()
	if held, ops := s.Held-before.Held, s.BackendOps.Write-before.BackendOps.Write; held != 0 || ops != 256 {
		t.Fatalf("QD1 stream: held %d, backend writes %d (want 0, 256)", held, ops)
	}
}

// TestGatherOverlapNeverReorders: a read overlapping a held write waits
// for it and releases it at once (no time passes), and sees its data.
func TestGatherOverlapNeverReorders(t *testing.T) {
	f := newFakeEnv(t, 8<<20, ioengine.Config{})
	f.prime(32)
	data := make([]byte, bs)
	for i := range data {
		data[i] = 0x5a
	}
	f.wg.Add(1)
	f.e.Submit(&ioengine.Request{Op: ioengine.OpWrite, Offset: 32 * bs, Length: bs, Data: data, More: true,
		Done: func(*ioengine.Request) { f.wg.Done() }})
	if got := f.writes(); len(got) != 0 {
		t.Fatalf("backend writes %v, want the write held", got)
	}
	rbuf := make([]byte, bs)
	if err := f.e.Do(&ioengine.Request{Op: ioengine.OpRead, Offset: 32 * bs, Length: bs, Data: rbuf}); err != nil {
		t.Fatal(err)
	}
	f.wg.Wait()
	if rbuf[0] != 0x5a || rbuf[bs-1] != 0x5a {
		t.Fatal("read overtook the held write it overlaps")
	}
}

// TestGatherOutOfOrderWindow: a window sent out of offset order (QEMU's NBD
// client wakes the requests waiting for one of its 16 slots in no
// particular order) is several runs until its gaps fill. While the
// stream's writes keep coming, no run is released by its own backstop:
// here the window's first 8 blocks come first, then its last 16, then the
// middle 8, one write every 50 µs, so the first run's newest write is
// 1.2 ms old when the window is complete. Each window still reaches the
// backend as one 128 KiB write.
func TestGatherOutOfOrderWindow(t *testing.T) {
	f := newFakeEnv(t, 8<<20, ioengine.Config{})
	f.prime(32)
	var order []int64
	for _, r := range [][2]int64{{0, 8}, {16, 32}, {8, 16}} {
		for i := r[0]; i < r[1]; i++ {
			order = append(order, i)
		}
	}
	blk := int64(32)
	for window := 0; window < 4; window++ {
		for _, i := range order {
			f.write(blk+i, false)
			f.advance(50 * time.Microsecond)
		}
		f.wait()
		if got := f.writes(); len(got) != 1 || got[0] != 32*bs {
			t.Fatalf("window %d: backend writes %v, want one of %d", window, got, 32*bs)
		}
		blk += 32
	}
}
