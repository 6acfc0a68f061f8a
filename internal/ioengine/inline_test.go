package ioengine_test

import (
	"bytes"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vmsan/vmsan/internal/backend"
	"github.com/vmsan/vmsan/internal/backend/backendtest"
	"github.com/vmsan/vmsan/internal/ioengine"
	"github.com/vmsan/vmsan/internal/ioengine/enginetest"
)

// TestInlineRunsOnSubmitter: serial Inline reads on a fast backend run on
// the submitting goroutine (Done before Submit returns); requests not
// marked Inline never do.
func TestInlineRunsOnSubmitter(t *testing.T) {
	for _, inline := range []bool{true, false} {
		e := ioengine.New(backend.NewMem(1<<20), ioengine.Config{})
		const n = 200
		early := 0
		buf := make([]byte, 4096)
		for i := 0; i < n; i++ {
			var done atomic.Bool
			ch := make(chan struct{})
			r := &ioengine.Request{Op: ioengine.OpRead, Offset: int64(i%256) * 4096, Length: 4096, Data: buf, Inline: inline,
				Done: func(r *ioengine.Request) { done.Store(true); close(ch) }}
			e.Submit(r)
			if done.Load() {
				early++
			}
			<-ch
			if r.Err != nil {
				t.Fatal(r.Err)
			}
		}
		e.Close()
		s := e.Stats()
		t.Logf("inline=%v: %d of %d inlined, %d completed before Submit returned", inline, s.Inlined, n, early)
		if uint64(early) < s.Inlined {
			t.Fatalf("%d requests inlined but only %d completed before Submit returned", s.Inlined, early)
		}
		if inline && s.Inlined < n/2 {
			t.Fatalf("only %d of %d serial Inline reads on a memory backend ran inline", s.Inlined, n)
		}
		if !inline && s.Inlined != 0 {
			t.Fatalf("%d requests not marked Inline ran inline", s.Inlined)
		}
	}
}

// slowMem is a Mem whose reads take d on a manual clock: the engine
// measures exactly d per call, however slow the machine running the test.
type slowMem struct {
	*backend.Mem
	clk *enginetest.Clock
	d   time.Duration
}

func (m *slowMem) ReadvAt(b [][]byte, off int64) error {
	m.clk.Advance(m.d)
	return m.Mem.ReadvAt(b, off)
}

// TestInlineSlowBackendUsesWorkers: once the backend is slow (a disk, not
// the page cache), Inline requests go to the workers so the submitter can
// keep pipelining; requests marked Idle (queue depth 1) still run inline
// while the backend is within InlineIdleLatency. On a manual clock the
// engine's service-time average is exact.
func TestInlineSlowBackendUsesWorkers(t *testing.T) {
	const n = 40
	for _, idle := range []bool{false, true} {
		clk := enginetest.NewClock()
		e := ioengine.New(&slowMem{Mem: backend.NewMem(1 << 20), clk: clk, d: 200 * time.Microsecond}, ioengine.Config{Clock: clk})
		buf := make([]byte, 4096)
		for i := 0; i < n; i++ {
			if err := e.Do(&ioengine.Request{Op: ioengine.OpRead, Offset: 0, Length: 4096, Data: buf, Inline: true, Idle: idle}); err != nil {
				t.Fatal(err)
			}
		}
		e.Close()
		s := e.Stats()
		// The moving average starts at 0 and moves 1/8 of the way per
		// call: 25µs after the first 200µs call (still below the 30µs
		// InlineMaxLatency), 46.9µs after the second; it stays below
		// InlineIdleLatency (300µs) for good.
		want := uint64(2)
		if idle {
			want = n
		}
		if s.Inlined != want {
			t.Fatalf("idle=%v: %d of %d reads on a 200µs backend ran inline, want %d", idle, s.Inlined, n, want)
		}
	}
}

// TestInlineWorkerBound: inline calls count against Workers.
func TestInlineWorkerBound(t *testing.T) {
	c := backendtest.NewCounting(backendtest.NewDelay(backend.NewMem(16<<20), 300*time.Microsecond, 0))
	e := ioengine.New(c, ioengine.Config{Workers: 3, GatherDelay: -1, InlineMaxLatency: time.Hour})
	var wg sync.WaitGroup
	for g := 0; g < 16; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			buf := make([]byte, 4096)
			for i := 0; i < 20; i++ {
				off := int64((g*20+i)*8192) % (16 << 20)
				op := ioengine.OpWrite
				if i%2 == 1 {
					op = ioengine.OpRead
				}
				if err := e.Do(&ioengine.Request{Op: op, Offset: off, Length: 4096, Data: buf, Inline: true}); err != nil {
					t.Error(err)
				}
			}
		}(g)
	}
	wg.Wait()
	e.Close()
	s := e.Stats()
	t.Logf("max concurrent backend calls %d, inlined %d of %d", c.MaxActive(), s.Inlined, s.Requests.Total())
	if c.MaxActive() > 3 || s.MaxInFlight > 3 {
		t.Fatalf("%d concurrent backend calls (engine %d), Workers is 3", c.MaxActive(), s.MaxInFlight)
	}
	if s.Inlined == 0 || s.Inlined == s.Requests.Total() {
		t.Fatalf("inlined %d of %d: want a mix of inline and worker execution", s.Inlined, s.Requests.Total())
	}
}

// gate blocks WritevAt until released, and counts Syncs.
type gate struct {
	backend.Backend
	entered chan struct{}
	release chan struct{}
	syncs   atomic.Int32
}

func (g *gate) WritevAt(b [][]byte, off int64, fua bool) error {
	g.entered <- struct{}{}
	<-g.release
	return g.Backend.WritevAt(b, off, fua)
}

func (g *gate) Sync() error { g.syncs.Add(1); return g.Backend.Sync() }

// TestInlineOrdering: while an inline write is inside the backend, an
// overlapping read and a FLUSH submitted from other goroutines wait for it:
// the read sees the new data and the FLUSH syncs after the write returned.
func TestInlineOrdering(t *testing.T) {
	g := &gate{Backend: backend.NewMem(1 << 20), entered: make(chan struct{}, 1), release: make(chan struct{})}
	e := ioengine.New(g, ioengine.Config{InlineMaxLatency: time.Hour})
	defer e.Close()
	data := bytes.Repeat([]byte{0xab}, 4096)
	wdone := make(chan error, 1)
	go func() {
		wdone <- e.Do(&ioengine.Request{Op: ioengine.OpWrite, Offset: 8192, Length: 4096, Data: data, Inline: true})
	}()
	<-g.entered
	if s := e.Stats(); s.Inlined != 1 {
		t.Fatalf("write not running inline (inlined %d)", s.Inlined)
	}
	rbuf := make([]byte, 4096)
	rdone := make(chan error, 1)
	e.Submit(&ioengine.Request{Op: ioengine.OpRead, Offset: 8192 + 2048, Length: 4096, Data: rbuf, Inline: true,
		Done: func(r *ioengine.Request) { rdone <- r.Err }})
	var syncsAtFlush int32 = -1
	fdone := make(chan error, 1)
	e.Submit(&ioengine.Request{Op: ioengine.OpFlush,
		Done: func(r *ioengine.Request) { syncsAtFlush = g.syncs.Load(); fdone <- r.Err }})
	// Neither may complete while the write is still inside the backend.
	// (A wrong engine would complete them within microseconds; waiting
	// longer only makes the check stricter, never flaky.)
	select {
	case <-rdone:
		t.Fatal("overlapping read completed while an earlier inline write was still in the backend")
	case <-fdone:
		t.Fatal("FLUSH completed while an earlier inline write was still in the backend")
	case <-time.After(20 * time.Millisecond):
	}
	if g.syncs.Load() != 0 {
		t.Fatal("FLUSH called Sync before the earlier inline write returned")
	}
	close(g.release)
	if err := <-wdone; err != nil {
		t.Fatal(err)
	}
	if err := <-rdone; err != nil {
		t.Fatal(err)
	}
	if err := <-fdone; err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(rbuf[:2048], data[:2048]) {
		t.Fatal("read overlapping an earlier inline write returned old data")
	}
	if syncsAtFlush < 1 {
		t.Fatal("FLUSH completed without a Sync")
	}
}
