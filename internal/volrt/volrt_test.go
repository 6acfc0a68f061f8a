package volrt

import (
	"errors"
	"fmt"
	"io"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vmsan/vmsan/internal/backend"
	"github.com/vmsan/vmsan/internal/export"
	"github.com/vmsan/vmsan/internal/ioengine"
	"github.com/vmsan/vmsan/internal/volume"
)

func TestErrno(t *testing.T) {
	for _, c := range []struct {
		err  error
		want syscall.Errno
	}{
		{fmt.Errorf("wrapped: %w", backend.ErrNotFast), syscall.EOPNOTSUPP},
		{backend.ErrOutOfRange, syscall.EINVAL},
		{ioengine.ErrInvalid, syscall.EINVAL},
		{ioengine.ErrClosed, syscall.ESHUTDOWN},
		{fmt.Errorf("pwrite: %w", syscall.ENOSPC), syscall.ENOSPC},
		{syscall.EDQUOT, syscall.ENOSPC},
		{syscall.EACCES, syscall.EPERM},
		{syscall.ENOMEM, syscall.ENOMEM},
		{io.ErrUnexpectedEOF, syscall.EIO},
		{ErrVolumeGone, syscall.EIO},
	} {
		if got := Errno(c.err); got != c.want {
			t.Errorf("Errno(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}

// extDev is an export.Device whose Extents answer is fixed.
type extDev struct {
	exts []backend.Extent
	err  error
}

func (d extDev) Info() export.Info                              { return export.Info{} }
func (d extDev) Submit(r *export.Request)                       { r.Done(r) }
func (d extDev) Extents(int64, int64) ([]backend.Extent, error) { return d.exts, d.err }
func (d extDev) Release()                                       {}

func TestSplitHoles(t *testing.T) {
	data := make([]byte, 16384)
	data[0] = 1 // first page is data
	zeroExt := []backend.Extent{{Offset: 0, Length: 16384, Zero: true, Hole: true}}
	// The extent claims zero but the first page is not: only the zero
	// bytes may become a hole (a stale extent must never hide data).
	ps := SplitHoles(nil, extDev{exts: zeroExt}, 0, data)
	want := []Piece{{Off: 0, N: 16384, Hole: false}}
	// The first page is not all zeroes, so the whole extent is data (holes are
	// decided per extent, not per page).
	if fmt.Sprint(ps) != fmt.Sprint(want) {
		t.Fatalf("got %v want %v", ps, want)
	}
	two := []backend.Extent{{Offset: 0, Length: 4096}, {Offset: 4096, Length: 12288, Zero: true}}
	ps = SplitHoles(ps, extDev{exts: two}, 0, data)
	want = []Piece{{0, 4096, false}, {4096, 12288, true}}
	if fmt.Sprint(ps) != fmt.Sprint(want) {
		t.Fatalf("got %v want %v", ps, want)
	}
	gap := []backend.Extent{{Offset: 0, Length: 4096}, {Offset: 8192, Length: 8192, Zero: true}}
	if ps = SplitHoles(ps, extDev{exts: gap}, 0, data); len(ps) != 0 {
		t.Fatalf("gap: got %v, want none", ps)
	}
	if ps = SplitHoles(ps, extDev{err: syscall.EIO}, 0, data); len(ps) != 0 {
		t.Fatalf("error: got %v, want none", ps)
	}
}

func TestBudgetBlocksAndAdmitsOversize(t *testing.T) {
	var b Budget
	b.Init(100)
	b.Reserve(500) // larger than the budget, nothing held: admitted
	got := make(chan struct{})
	go func() { b.Reserve(10); close(got) }()
	select {
	case <-got:
		t.Fatal("Reserve did not wait while the budget was exceeded")
	case <-time.After(50 * time.Millisecond):
	}
	b.Release(500)
	<-got
	if b.Used() != 10 {
		t.Fatalf("used %d", b.Used())
	}
}

// asyncDev completes requests on another goroutine after Submit returned
// (when hold is closed), or inline.
type asyncDev struct {
	extDev
	inline bool
	hold   chan struct{}
}

func (d *asyncDev) Submit(r *export.Request) {
	if d.inline {
		r.Done(r)
		return
	}
	go func() { <-d.hold; r.Done(r) }()
}

func TestLifecycleExactlyOneReplier(t *testing.T) {
	for _, inline := range []bool{true, false} {
		dev := &asyncDev{inline: inline, hold: make(chan struct{})}
		var lc Lifecycle
		var mu sync.Mutex
		byCompletion := 0
		done := make(chan struct{})
		r := &export.Request{Op: export.OpRead, Inline: true, Done: func(*export.Request) {
			if !lc.Complete() {
				mu.Lock()
				byCompletion++
				mu.Unlock()
			}
			close(done)
		}}
		bySubmitter := lc.Submit(dev, r, false)
		close(dev.hold)
		<-done
		mu.Lock()
		if bySubmitter == (byCompletion == 1) || bySubmitter != inline {
			t.Fatalf("inline=%v: submitter=%v completion=%d", inline, bySubmitter, byCompletion)
		}
		mu.Unlock()
		if !r.Idle || r.More {
			t.Fatalf("hints: Idle=%v More=%v, want Idle for an inline request with nothing buffered", r.Idle, r.More)
		}
	}
}

func newVolume(t *testing.T) (*Volume, *volume.Store) {
	t.Helper()
	st, err := volume.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	m, err := st.Create(volume.CreateOptions{Name: "v", Size: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	v, err := Open(st, m, ioengine.Config{}, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { v.Close() })
	return v, st
}

func TestVolumeAcquireDeleteHandshake(t *testing.T) {
	v, _ := newVolume(t)
	wrapped := 0
	dev, err := v.Acquire([]Wrap{func(name string, d export.Device) export.Device { wrapped++; return d }})
	if err != nil || wrapped != 1 || v.Refs() != 1 {
		t.Fatalf("Acquire: %v wrapped=%d refs=%d", err, wrapped, v.Refs())
	}
	if info := dev.Info(); info.Name != "v" || info.Size != 1<<20 || info.MaxBlock != 1<<20 || !info.CanMultiConn {
		t.Fatalf("Info %+v", info)
	}
	if !v.BeginDelete() {
		t.Fatal("BeginDelete: held device not seen")
	}
	if _, err := v.Acquire(nil); !errors.Is(err, export.ErrNotFound) {
		t.Fatalf("Acquire while deleting: %v", err)
	}
	v.MarkGone()
	done := make(chan error, 1)
	dev.Submit(&export.Request{Op: export.OpFlush, Done: func(r *export.Request) { done <- r.Err }})
	if err := <-done; !errors.Is(err, ErrVolumeGone) {
		t.Fatalf("request on a gone volume: %v", err)
	}
	dev.Release()
	dev.Release() // double release must not go negative
	if v.Refs() != 0 {
		t.Fatalf("refs %d", v.Refs())
	}
}

func TestSessions(t *testing.T) {
	var nilS *Sessions
	nilS.Remove(nilS.Add("v", "a")) // nil-safe
	s := NewSessions("nbd")
	a := s.Add("vb", "10.0.0.2:1")
	s.Add("va", "10.0.0.1:1")
	s.Add("vb", "10.0.0.3:1")
	l := s.List()
	if len(l) != 3 || l[0].Volume != "va" || l[1].Remote != "10.0.0.2:1" || l[0].FrontEnd != "nbd" || l[0].Since.IsZero() {
		t.Fatalf("List %+v", l)
	}
	s.Remove(a)
	if pv := s.PerVolume(); pv["vb"] != 1 || pv["va"] != 1 {
		t.Fatalf("PerVolume %v", pv)
	}
}

// TestNewOverMem: a Volume over any backend (what a front end's tests use)
// serves I/O through its device and closes the backend with the engine.
func TestNewOverMem(t *testing.T) {
	v := New(volume.Meta{Name: "m", Size: 1 << 20, LogicalBlockSize: 4096}, backend.NewMem(1<<20), ioengine.Config{}, 1<<20)
	dev, err := v.Acquire(nil)
	if err != nil {
		t.Fatal(err)
	}
	if in := dev.Info(); in.MinBlock != 4096 || in.Size != 1<<20 {
		t.Fatalf("Info %+v: a 4Kn volume advertises 4096-byte minimum blocks", in)
	}
	buf := *GetBuf(4096)
	buf[0] = 7
	done := make(chan error, 1)
	dev.Submit(&export.Request{Op: export.OpWrite, Offset: 8192, Length: 4096, Data: buf, Done: func(r *export.Request) { done <- r.Err }})
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	exts, err := dev.Extents(0, 1<<20)
	if err != nil || len(exts) == 0 {
		t.Fatalf("Extents: %v %v", exts, err)
	}
	dev.Release()
	if err := v.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestSessionsWatch: the watcher sees each Add and Remove once, with the
// session's id, and the duration on removal; unknown ids are not reported.
func TestSessionsWatch(t *testing.T) {
	s := NewSessions("nbd")
	var got []SessionChange
	s.Watch(func(c SessionChange) { got = append(got, c) })
	id := s.Add("vm1", "127.0.0.1:5000")
	time.Sleep(2 * time.Millisecond)
	s.Remove(id)
	s.Remove(id)
	s.Remove(12345)
	if len(got) != 2 || !got[0].Connected || got[0].ID != id || got[0].Remote != "127.0.0.1:5000" ||
		got[1].Connected || got[1].ID != id || got[1].Volume != "vm1" || got[1].Duration < 2*time.Millisecond {
		t.Fatalf("watcher saw %+v", got)
	}
}
