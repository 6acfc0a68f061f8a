package driver

import (
	"bytes"
	"sync"
	"testing"
	"time"

	"github.com/vmsan/vmsan/internal/export"
	"github.com/vmsan/vmsan/internal/export/exporttest"
)

// A paused route holds client requests without blocking their submitters
// (a Done callback that submits again, as chunked SCSI commands do, runs
// while the route is paused and does not deadlock it); resume hands every
// held request to the target, none fails, and the data is what was
// written.
func TestRoutePauseHoldsAndResumes(t *testing.T) {
	dev := exporttest.NewMemDevice(t, "v", 1<<20)
	rt := &route{}
	d := newRoutedDevice(rt, dev)
	defer d.Release()

	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []error
	done := func(q *export.Request) {
		mu.Lock()
		if q.Err != nil {
			errs = append(errs, q.Err)
		}
		mu.Unlock()
		wg.Done()
	}
	write := func(i int, fn func(*export.Request)) *export.Request {
		return &export.Request{Op: export.OpWrite, Offset: int64(i) * 4096, Length: 4096, Data: bytes.Repeat([]byte{byte(i + 1)}, 4096), Done: fn}
	}
	if err := rt.pause(time.Second); err != nil {
		t.Fatal(err)
	}
	const n = 32
	wg.Add(n + 1)
	for i := 0; i < n-1; i++ {
		d.Submit(write(i, done)) // returns at once: held
	}
	// The last one's Done submits another write (inline, while the
	// route may still be resuming).
	d.Submit(write(n-1, func(q *export.Request) {
		d.Submit(write(n, done))
		done(q)
	}))
	rt.mu.Lock()
	held := len(rt.held)
	rt.mu.Unlock()
	if held != n {
		t.Fatalf("%d requests held while paused, want %d", held, n)
	}
	rt.resume()
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("held requests failed: %v", errs)
	}
	for i := 0; i <= n; i++ {
		buf := make([]byte, 4096)
		if err := dev.Backend.ReadvAt([][]byte{buf}, int64(i)*4096); err != nil {
			t.Fatal(err)
		}
		if buf[0] != byte(i+1) || buf[4095] != byte(i+1) {
			t.Fatalf("block %d holds %#x, want %#x", i, buf[0], i+1)
		}
	}
	if rt.paused.Load() {
		t.Fatal("still paused after resume")
	}
}

// While a change is in progress, concurrent submitters never reach the old
// target after pause returned (route's INVARIANT), and every request is
// answered once resumed.
func TestRoutePauseRacingSubmitters(t *testing.T) {
	dev := exporttest.NewMemDevice(t, "v", 1<<20)
	var violations, answered int64
	var cmu sync.Mutex
	// check counts requests that reach the target while marked paused.
	check := &checkDev{Device: dev, bad: &violations, mu: &cmu}
	rt := &route{}
	d := newRoutedDevice(rt, check)
	defer d.Release()
	stop := make(chan struct{})
	var subs sync.WaitGroup
	var reqs sync.WaitGroup
	for g := 0; g < 4; g++ {
		subs.Add(1)
		go func() {
			defer subs.Done()
			// A client with a bounded window (as every front end has):
			// at most 4 requests outstanding.
			window := make(chan struct{}, 4)
			for {
				select {
				case <-stop:
					return
				case window <- struct{}{}:
				}
				reqs.Add(1)
				d.Submit(&export.Request{Op: export.OpFlush, Done: func(*export.Request) {
					cmu.Lock()
					answered++
					cmu.Unlock()
					<-window
					reqs.Done()
				}})
			}
		}()
	}
	for k := 0; k < 20; k++ {
		if err := rt.pause(time.Second); err != nil {
			t.Fatal(err)
		}
		check.setPaused(true)
		time.Sleep(time.Millisecond)
		check.setPaused(false)
		rt.resume()
		time.Sleep(time.Millisecond)
	}
	close(stop)
	subs.Wait()
	reqs.Wait()
	cmu.Lock()
	defer cmu.Unlock()
	if violations > 0 {
		t.Fatalf("%d requests reached the target while the route was paused", violations)
	}
	if answered == 0 {
		t.Fatal("no request answered")
	}
}

// checkDev counts requests that reach it while marked paused.
type checkDev struct {
	*exporttest.Device
	bad    *int64
	mu     *sync.Mutex
	paused bool
}

func (c *checkDev) setPaused(p bool) { c.mu.Lock(); c.paused = p; c.mu.Unlock() }

func (c *checkDev) Submit(r *export.Request) {
	c.mu.Lock()
	if c.paused {
		*c.bad++
	}
	c.mu.Unlock()
	c.Device.Submit(r)
}

// Timeouts and rates are applied in place; anything the handshake or the
// link depends on (protocol, peer, the tick) restarts the replica.
func TestRetunable(t *testing.T) {
	base := Settings{Listen: "127.0.0.1:1", Peer: "127.0.0.1:2", Insecure: true, NodeID: 1}
	with := func(f func(*Settings)) Settings { s := base; f(&s); return s }
	for _, c := range []struct {
		name string
		s    Settings
		want bool
	}{
		{"same", base, true},
		{"resync rate", with(func(s *Settings) { s.ResyncRate = 1 << 20; s.ResyncMinRate = 1 << 10 }), true},
		{"ko timeout", with(func(s *Settings) { s.KoTimeout = msD(20000) }), true},
		{"ping timeout", with(func(s *Settings) { s.PingTimeout = msD(30000) }), true},
		{"role (first start only)", with(func(s *Settings) { s.Role = "primary" }), true},
		{"protocol", with(func(s *Settings) { s.Protocol = "A" }), false},
		{"peer", with(func(s *Settings) { s.Peer = "127.0.0.1:3" }), false},
		{"tick", with(func(s *Settings) { s.Tick = msD(20) }), false},
		{"ping interval (derived tick)", with(func(s *Settings) { s.PingInterval = msD(200) }), false},
		{"split brain", with(func(s *Settings) { s.SplitBrain = "discard-zero-changes" }), false},
	} {
		if got := retunable(base, c.s); got != c.want {
			t.Errorf("%s: retunable %v, want %v", c.name, got, c.want)
		}
	}
}
