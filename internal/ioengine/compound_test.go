package ioengine_test

import (
	"bytes"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vmsan/vmsan/internal/backend"
	"github.com/vmsan/vmsan/internal/ioengine"
)

// blockWrites blocks every write until release is closed and counts
// writes and syncs.
type blockWrites struct {
	backend.Backend
	release chan struct{}
	writes  atomic.Int64
	syncs   atomic.Int64
}

func (b *blockWrites) WritevAt(bufs [][]byte, off int64, fua bool) error {
	<-b.release
	b.writes.Add(1)
	return b.Backend.WritevAt(bufs, off, fua)
}

func (b *blockWrites) Sync() error { b.syncs.Add(1); return b.Backend.Sync() }

func waitErr(t *testing.T, what string, c <-chan error) {
	t.Helper()
	select {
	case err := <-c:
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: no completion in 10 s", what)
	}
}

// TestBarrier: Barrier returns only once the writes submitted before it
// completed and the backend was synced; while it holds, later writes are
// queued (Submit returns at once, also from a Done callback running
// inline on the submitter: the chain that deadlocked a lock-based
// quiesce) but do not reach the backend; reads go on; release lets the
// held writes run.
func TestBarrier(t *testing.T) {
	b := &blockWrites{Backend: backend.NewMem(1 << 20), release: make(chan struct{})}
	e := ioengine.New(b, ioengine.Config{})
	defer e.Close()
	submit := func(r *ioengine.Request) chan error {
		c := make(chan error, 1)
		r.Done = func(r *ioengine.Request) { c <- r.Err }
		e.Submit(r)
		return c
	}
	w1 := submit(&ioengine.Request{Op: ioengine.OpWrite, Offset: 0, Length: 4096, Data: make([]byte, 4096)})
	held := make(chan func(), 1)
	go func() {
		release, err := e.Barrier()
		if err != nil {
			t.Error(err)
		}
		held <- release
	}()
	select {
	case <-held:
		t.Fatal("Barrier returned while a write submitted before it was in flight")
	case <-time.After(50 * time.Millisecond):
	}
	close(b.release)
	waitErr(t, "write before the barrier", w1)
	var release func()
	select {
	case release = <-held:
	case <-time.After(10 * time.Second):
		t.Fatal("Barrier did not return after the earlier write completed")
	}
	if release == nil {
		t.FailNow()
	}
	if b.syncs.Load() == 0 {
		t.Fatal("Barrier did not sync the backend")
	}
	writesAt := b.writes.Load()

	// An inline read whose Done submits a write (what a multi-step
	// command used to do): Submit must return with the write queued.
	var chained chan error
	returned := make(chan struct{})
	go func() {
		r := &ioengine.Request{Op: ioengine.OpRead, Offset: 8192, Length: 4096, Data: make([]byte, 4096), Inline: true, Idle: true}
		r.Done = func(*ioengine.Request) {
			chained = submit(&ioengine.Request{Op: ioengine.OpWrite, Offset: 8192, Length: 4096, Data: make([]byte, 4096)})
		}
		e.Submit(r)
		close(returned)
	}()
	select {
	case <-returned:
	case <-time.After(10 * time.Second):
		t.Fatal("a write submitted from a Done callback blocked on the barrier")
	}
	tr := submit(&ioengine.Request{Op: ioengine.OpTrim, Offset: 16384, Length: 4096})
	ws := submit(&ioengine.Request{Op: ioengine.OpWriteRepeat, Offset: 32768, Length: 8192, Data: []byte{1, 2, 3}})
	rd := submit(&ioengine.Request{Op: ioengine.OpRead, Offset: 0, Length: 4096, Data: make([]byte, 4096)})
	waitErr(t, "read while the barrier holds", rd)
	fl := submit(&ioengine.Request{Op: ioengine.OpFlush})
	time.Sleep(20 * time.Millisecond)
	if n := b.writes.Load() - writesAt; n != 0 {
		t.Fatalf("%d writes reached the backend while the barrier held", n)
	}
	for _, c := range []chan error{chained, tr, ws, fl} {
		select {
		case <-c:
			t.Fatal("a modifying request (or a flush after one) completed while the barrier held")
		default:
		}
	}
	release()
	release() // idempotent
	for _, c := range []chan error{chained, tr, ws, fl} {
		waitErr(t, "request held by the barrier", c)
	}
}

// TestBarrierAfterClose: a barrier on a closed engine fails.
func TestBarrierAfterClose(t *testing.T) {
	e := ioengine.New(backend.NewMem(1<<20), ioengine.Config{})
	e.Close()
	if _, err := e.Barrier(); !errors.Is(err, ioengine.ErrClosed) {
		t.Fatalf("Barrier after Close: %v, want ErrClosed", err)
	}
}

// TestCompoundOps: the compound requests leave exactly what their
// definitions say, and malformed ones are refused.
func TestCompoundOps(t *testing.T) {
	const size = 4 << 20
	m := backend.NewMem(size)
	e := ioengine.New(m, ioengine.Config{MaxMergeBytes: 64 << 10})
	defer e.Close()
	read := func(off, n int64) []byte {
		b := make([]byte, n)
		if err := e.Do(&ioengine.Request{Op: ioengine.OpRead, Offset: off, Length: n, Data: b}); err != nil {
			t.Fatal(err)
		}
		return b
	}
	do := func(r *ioengine.Request) error { return e.Do(r) }

	// A 3-byte pattern over a range that is no multiple of it, longer
	// than MaxMergeBytes (several backend calls).
	p := []byte{0xA1, 0xB2, 0xC3}
	const wOff, wLen = 1000, 200<<10 + 1
	if err := do(&ioengine.Request{Op: ioengine.OpWriteRepeat, Offset: wOff, Length: wLen, Data: p}); err != nil {
		t.Fatal(err)
	}
	got := read(wOff-1, wLen+2)
	if got[0] != 0 || got[len(got)-1] != 0 {
		t.Fatal("OpWriteRepeat wrote outside its range")
	}
	for i, c := range got[1 : wLen+1] {
		if c != p[i%3] {
			t.Fatalf("OpWriteRepeat: byte %d is %#x, want %#x", i, c, p[i%3])
		}
	}

	// Trims over a list of ranges: only the ranges are zeroed.
	rs := []ioengine.Range{{Offset: 4096, Length: 4096}, {Offset: 65536, Length: 8192}, {Offset: 70000, Length: 0}}
	if err := do(&ioengine.Request{Op: ioengine.OpTrim, Offset: 4096, Length: 65536 + 8192 - 4096, Ranges: rs}); err != nil {
		t.Fatal(err)
	}
	after := read(wOff, wLen)
	for i, c := range after {
		off := int64(wOff + i)
		zero := off >= 4096 && off < 8192 || off >= 65536 && off < 65536+8192
		if zero && c != 0 || !zero && c != p[i%3] {
			t.Fatalf("trim ranges: byte at %d is %#x (zeroed: %v)", off, c, zero)
		}
	}
	if err := do(&ioengine.Request{Op: ioengine.OpTrim, Offset: 4096, Length: 4096, Ranges: []ioengine.Range{{Offset: 0, Length: 4096}}}); !errors.Is(err, ioengine.ErrInvalid) {
		t.Fatalf("a range outside the request: %v, want ErrInvalid", err)
	}

	// COMPARE AND WRITE: a match writes; a mismatch leaves the data and
	// reports what was read.
	const cOff, cLen = 1 << 20, 4096
	cur := read(cOff, cLen)
	next := bytes.Repeat([]byte{7}, cLen)
	aux := make([]byte, cLen)
	if err := do(&ioengine.Request{Op: ioengine.OpCompareWrite, Offset: cOff, Length: cLen, Data: append(append([]byte(nil), cur...), next...), Aux: aux}); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(read(cOff, cLen), next) {
		t.Fatal("OpCompareWrite with matching data did not write")
	}
	err := do(&ioengine.Request{Op: ioengine.OpCompareWrite, Offset: cOff, Length: cLen, Data: append(append([]byte(nil), cur...), cur...), Aux: aux})
	if !errors.Is(err, ioengine.ErrMiscompare) {
		t.Fatalf("OpCompareWrite with other data: %v, want ErrMiscompare", err)
	}
	if !bytes.Equal(aux, next) || !bytes.Equal(read(cOff, cLen), next) {
		t.Fatal("a miscompare changed the data or did not report it in Aux")
	}
	if err := do(&ioengine.Request{Op: ioengine.OpCompareWrite, Offset: cOff, Length: cLen, Data: next, Aux: aux}); !errors.Is(err, ioengine.ErrInvalid) {
		t.Fatalf("OpCompareWrite without a write instance: %v, want ErrInvalid", err)
	}

	// ORWRITE.
	or := bytes.Repeat([]byte{0x30}, cLen)
	if err := do(&ioengine.Request{Op: ioengine.OpOrWrite, Offset: cOff, Length: cLen, Data: or, Aux: aux}); err != nil {
		t.Fatal(err)
	}
	if got := read(cOff, cLen); !bytes.Equal(got, bytes.Repeat([]byte{0x37}, cLen)) {
		t.Fatalf("OpOrWrite: %#x, want 0x37", got[0])
	}
	if err := do(&ioengine.Request{Op: ioengine.OpBarrier}); !errors.Is(err, ioengine.ErrInvalid) {
		t.Fatalf("a submitted OpBarrier: %v, want ErrInvalid", err)
	}
}

// TestRunSteps: a compound request run as primitive steps (what a device
// that cannot pass it on does) leaves the same data as the engine's.
func TestRunSteps(t *testing.T) {
	const size = 1 << 20
	direct := ioengine.New(backend.NewMem(size), ioengine.Config{})
	defer direct.Close()
	steps := ioengine.New(backend.NewMem(size), ioengine.Config{})
	defer steps.Close()
	run := func(r ioengine.Request) (error, error) {
		r1, r2 := r, r
		if r.Aux != nil {
			r2.Aux = make([]byte, len(r.Aux))
		}
		err1 := direct.Do(&r1)
		c := make(chan struct{})
		r2.Done = func(*ioengine.Request) { close(c) }
		ioengine.RunSteps(&r2, steps.Submit)
		<-c
		return err1, r2.Err
	}
	zero := make([]byte, 512)
	ones := bytes.Repeat([]byte{1}, 512)
	for _, r := range []ioengine.Request{
		{Op: ioengine.OpWriteRepeat, Offset: 100, Length: 10000, Data: []byte{9, 8, 7, 6, 5}},
		{Op: ioengine.OpTrim, Offset: 0, Length: 8192, Ranges: []ioengine.Range{{Offset: 512, Length: 512}, {Offset: 4096, Length: 1024}}},
		{Op: ioengine.OpWriteZeroes, Offset: 0, Length: 8192, Ranges: []ioengine.Range{{Offset: 2048, Length: 512}}},
		{Op: ioengine.OpCompareWrite, Offset: 20000, Length: 512, Data: append(append([]byte(nil), zero...), ones...), Aux: make([]byte, 512)},
		{Op: ioengine.OpCompareWrite, Offset: 20000, Length: 512, Data: append(append([]byte(nil), zero...), ones...), Aux: make([]byte, 512)},
		{Op: ioengine.OpOrWrite, Offset: 30000, Length: 512, Data: ones, Aux: make([]byte, 512)},
	} {
		e1, e2 := run(r)
		if !errors.Is(e2, e1) && e1 != e2 {
			t.Fatalf("%v: engine %v, steps %v", r.Op, e1, e2)
		}
	}
	a, b := make([]byte, size), make([]byte, size)
	direct.Do(&ioengine.Request{Op: ioengine.OpRead, Length: size, Data: a})
	steps.Do(&ioengine.Request{Op: ioengine.OpRead, Length: size, Data: b})
	if !bytes.Equal(a, b) {
		t.Fatal("RunSteps left other data than the engine's compound requests")
	}
}
