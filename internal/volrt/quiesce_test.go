package volrt

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vmsan/vmsan/internal/backend"
	"github.com/vmsan/vmsan/internal/export"
	"github.com/vmsan/vmsan/internal/ioengine"
	"github.com/vmsan/vmsan/internal/volume"
)

// gatedBackend blocks writes until release is closed and counts them;
// entered (when set) receives one value per write as it blocks, so a test
// knows a write reached the backend rather than guessing with a sleep.
type gatedBackend struct {
	backend.Backend
	release chan struct{}
	entered chan struct{}
	writes  atomic.Int64
	syncs   atomic.Int64
}

func (g *gatedBackend) WritevAt(bufs [][]byte, off int64, fua bool) error {
	if g.entered != nil {
		select {
		case g.entered <- struct{}{}:
		default: // nobody waits for this one
		}
	}
	<-g.release
	g.writes.Add(1)
	return g.Backend.WritevAt(bufs, off, fua)
}

func (g *gatedBackend) Sync() error { g.syncs.Add(1); return g.Backend.Sync() }

// TestQuiesce: Quiesce returns only after the writes already submitted
// completed and the backend was synced; writes submitted while quiesced
// reach the backend only after resume; reads keep flowing.
func TestQuiesce(t *testing.T) {
	g := &gatedBackend{Backend: backend.NewMem(1 << 20), release: make(chan struct{}), entered: make(chan struct{}, 1)}
	v := New(volume.Meta{Name: "q", Size: 1 << 20, LogicalBlockSize: 512}, g, ioengine.Config{}, 1<<20)
	defer v.Close()
	var once sync.Once
	release := func() { once.Do(func() { close(g.release) }) }
	defer release() // a failing test must not leave Close draining a blocked write
	dev, err := v.Acquire(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Release()
	submit := func(op ioengine.Op, off int64) chan error {
		done := make(chan error, 1)
		go dev.Submit(&export.Request{Op: op, Offset: off, Length: 4096, Data: make([]byte, 4096), Done: func(r *export.Request) { done <- r.Err }})
		return done
	}
	w1 := submit(export.OpWrite, 0)
	// w1 must be in flight (blocked in the backend) before Quiesce, or the
	// barrier would be queued ahead of it.
	select {
	case <-g.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the first write did not reach the backend")
	}
	quiesced := make(chan func(), 1)
	go func() {
		resume, err := v.Quiesce()
		if err != nil {
			t.Error(err)
		}
		quiesced <- resume
	}()
	select {
	case <-quiesced:
		t.Fatal("Quiesce returned while a write submitted before it was still in flight")
	case <-time.After(100 * time.Millisecond):
	}
	syncsBefore := g.syncs.Load()
	release()
	if err := <-w1; err != nil {
		t.Fatal(err)
	}
	var resume func()
	select {
	case resume = <-quiesced:
	case <-time.After(10 * time.Second):
		t.Fatal("Quiesce did not return after the in-flight write completed")
	}
	if g.syncs.Load() == syncsBefore {
		t.Fatal("Quiesce did not sync the backend")
	}
	w2 := submit(export.OpWrite, 8192)
	tr := submit(export.OpTrim, 16384)
	rd := submit(export.OpRead, 0)
	select {
	case err := <-rd:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a read was held while quiesced")
	}
	time.Sleep(50 * time.Millisecond)
	if n := g.writes.Load(); n != 1 {
		t.Fatalf("%d writes reached the backend while quiesced, want only the one from before", n)
	}
	select {
	case <-w2:
		t.Fatal("a write completed while quiesced")
	case <-tr:
		t.Fatal("a trim completed while quiesced")
	default:
	}
	resume()
	resume() // idempotent
	for _, c := range []chan error{w2, tr} {
		select {
		case err := <-c:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("a held request did not complete after resume")
		}
	}
}
