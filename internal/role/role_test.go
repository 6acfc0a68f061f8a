package role

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vmsan/vmsan/internal/events"
)

// fakeReplica is an Actuator that checks it is never driven by two
// goroutines at once. gate, when set, holds Promote/Demote until closed.
type fakeReplica struct {
	mu   sync.Mutex
	role Role
	// busy counts Promote/Demote calls running; max is the most seen.
	busy, max atomic.Int32
	calls     atomic.Int32
	gate      chan struct{}
	entered   chan struct{} // receives once per call when set
	fail      error         // returned by Promote/Demote (role unchanged)
	slow      bool          // each call takes up to 200 µs (overlapping callers)
	onChange  func()        // called inside Promote/Demote after the role changed
}

func (f *fakeReplica) Role() Role {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.role
}

func (f *fakeReplica) set(r Role) {
	f.mu.Lock()
	f.role = r
	f.mu.Unlock()
}

func (f *fakeReplica) change(to Role) error {
	f.calls.Add(1)
	n := f.busy.Add(1)
	defer f.busy.Add(-1)
	for {
		m := f.max.Load()
		if n <= m || f.max.CompareAndSwap(m, n) {
			break
		}
	}
	if f.entered != nil {
		f.entered <- struct{}{}
	}
	if f.gate != nil {
		<-f.gate
	}
	if f.slow {
		time.Sleep(time.Duration(rand.IntN(200)) * time.Microsecond)
	}
	if f.fail != nil {
		return f.fail
	}
	f.set(to)
	if f.onChange != nil {
		f.onChange()
	}
	return nil
}

func (f *fakeReplica) Promote(bool) error { return f.change(Primary) }
func (f *fakeReplica) Demote(bool) error  { return f.change(Secondary) }

// recorder is a subscriber keeping every event per volume.
type recorder struct {
	mu  sync.Mutex
	evs map[string][]Event
}

func (r *recorder) sub(e Event) {
	r.mu.Lock()
	if r.evs == nil {
		r.evs = map[string][]Event{}
	}
	r.evs[e.Volume] = append(r.evs[e.Volume], e)
	r.mu.Unlock()
}

func (r *recorder) roles(vol string) []Role {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []Role
	for _, e := range r.evs[vol] {
		out = append(out, e.Role)
	}
	return out
}

func (r *recorder) last(vol string) Role {
	rs := r.roles(vol)
	if len(rs) == 0 {
		return Standalone
	}
	return rs[len(rs)-1]
}

// checkSequence: every event's Was is the previous event's Role (nothing
// skipped or reordered), and Transitioning is always left for a settled
// role before the next Transitioning.
func (r *recorder) checkSequence(t *testing.T, vol string) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	prev := Standalone
	for i, e := range r.evs[vol] {
		if e.Was != prev {
			t.Fatalf("%s event %d: was %v, but the previous event said %v (%v)", vol, i, e.Was, prev, r.evs[vol])
		}
		if e.Role == prev && e.Cause != CauseCurrent {
			t.Fatalf("%s event %d: %v published twice in a row", vol, i, e.Role)
		}
		prev = e.Role
	}
}

func logBuf() (*slog.Logger, *syncBuf) {
	b := &syncBuf{}
	return slog.New(slog.NewTextHandler(b, nil)), b
}

type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// settle waits until the owner of vol has done everything queued before
// (a hello with no subscriber is queued behind it).
func settle(c *Controller, vol string) {
	if o := c.owner(vol); o != nil {
		<-o.hello(nil)
	}
}

func TestChangeSequence(t *testing.T) {
	log, lb := logBuf()
	bus := events.NewBus()
	sub := bus.Subscribe(64)
	defer sub.Close()
	var drains atomic.Int32
	c := New(Options{Log: log, Events: bus, Drain: func(string, time.Duration) error { drains.Add(1); return nil }})
	defer c.Close()
	var rec recorder
	c.Subscribe(rec.sub)
	f := &fakeReplica{role: Secondary}
	if err := c.Register("v", f); err != nil {
		t.Fatal(err)
	}
	// Register returns once the start role is published.
	if got := rec.roles("v"); len(got) != 1 || got[0] != Secondary {
		t.Fatalf("after Register: %v", got)
	}
	r, err := c.Change(context.Background(), Request{Volume: "v", Op: Promote, By: "test"})
	if err != nil || r != Primary {
		t.Fatalf("promote: %v %v", r, err)
	}
	want := []Role{Secondary, Transitioning, Primary}
	if got := rec.roles("v"); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("roles %v, want %v", got, want)
	}
	if drains.Load() != 1 {
		t.Fatalf("%d drains, want 1", drains.Load())
	}
	rec.checkSequence(t, "v")
	if r, ok := c.Role("v"); !ok || r != Primary {
		t.Fatalf("Role: %v %v", r, ok)
	}
	// Each published role is an event naming who asked.
	var seen []string
	for len(seen) < 3 {
		select {
		case e := <-sub.C():
			if e.Object == events.Role {
				seen = append(seen, e.Get("role")+"/"+e.Get("by"))
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("role events: %v", seen)
		}
	}
	if fmt.Sprint(seen) != "[secondary/ changing/test primary/test]" {
		t.Fatalf("role events %v", seen)
	}
	if l := lb.String(); !strings.Contains(l, "role change started") || !strings.Contains(l, "role change done") || !strings.Contains(l, "by=test") {
		t.Fatalf("log:\n%s", l)
	}
	// A failed change publishes the role the actuator is in.
	f.fail = errors.New("refused by the replica")
	if r, err := c.Change(context.Background(), Request{Volume: "v", Op: Demote}); err == nil || r != Primary {
		t.Fatalf("failed demote: %v %v", r, err)
	}
	want = append(want, Transitioning, Primary)
	if got := rec.roles("v"); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("roles %v, want %v", got, want)
	}
	if _, err := c.Change(context.Background(), Request{Volume: "nope", Op: Demote}); !errors.Is(err, ErrNotManaged) {
		t.Fatalf("unregistered volume: %v", err)
	}
	// Unregister publishes Standalone and refuses later changes.
	c.Unregister("v")
	if rec.last("v") != Standalone {
		t.Fatalf("after Unregister: %v", rec.roles("v"))
	}
	if _, err := c.Change(context.Background(), Request{Volume: "v", Op: Promote}); !errors.Is(err, ErrNotManaged) {
		t.Fatalf("after Unregister: %v", err)
	}
}

// A second change while one runs is refused at once, naming the running
// one and who asked; the actuator is never driven twice at once.
func TestChangeInProgressRefused(t *testing.T) {
	c := New(Options{Log: slog.New(slog.DiscardHandler)})
	defer c.Close()
	f := &fakeReplica{role: Primary, gate: make(chan struct{}), entered: make(chan struct{}, 1)}
	if err := c.Register("v", f); err != nil {
		t.Fatal(err)
	}
	first := make(chan error, 1)
	go func() {
		_, err := c.Change(context.Background(), Request{Volume: "v", Op: Demote, By: "alice"})
		first <- err
	}()
	<-f.entered
	_, err := c.Change(context.Background(), Request{Volume: "v", Op: Promote, By: "bob"})
	var ip *InProgressError
	if !errors.Is(err, ErrInProgress) || !errors.As(err, &ip) || ip.Running.By != "alice" || !strings.Contains(err.Error(), "demote asked by alice") {
		t.Fatalf("concurrent promote: %v", err)
	}
	// A caller that gives up waiting gets its context's error; the change
	// still completes.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	close(f.gate)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	f.gate = make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		if _, err := c.Change(ctx, Request{Volume: "v", Op: Promote}); !errors.Is(err, context.Canceled) {
			t.Errorf("cancelled caller: %v", err)
		}
	}()
	<-f.entered
	<-done
	close(f.gate)
	settle(c, "v")
	if r, _ := c.Role("v"); r != Primary || f.Role() != Primary {
		t.Fatalf("abandoned promote did not complete: published %v, actuator %v", r, f.Role())
	}
	if f.max.Load() != 1 {
		t.Fatalf("actuator driven by %d goroutines at once", f.max.Load())
	}
}

// A drain that times out: a plain demote is refused and the old role
// published again (the actuator not called); a forced one warns and goes
// ahead.
func TestDrainTimeout(t *testing.T) {
	log, lb := logBuf()
	var timeout time.Duration
	c := New(Options{Log: log, DrainTimeout: 123 * time.Millisecond, Drain: func(vol string, d time.Duration) error {
		timeout = d
		return fmt.Errorf("volume %s: 1 command still running after %v", vol, d)
	}})
	defer c.Close()
	var rec recorder
	c.Subscribe(rec.sub)
	f := &fakeReplica{role: Primary}
	if err := c.Register("v", f); err != nil {
		t.Fatal(err)
	}
	r, err := c.Change(context.Background(), Request{Volume: "v", Op: Demote, By: "ops"})
	if err == nil || !strings.Contains(err.Error(), "demote refused, role unchanged") || r != Primary {
		t.Fatalf("plain demote with a drain timeout: %v %v", r, err)
	}
	if timeout != 123*time.Millisecond {
		t.Fatalf("drain timeout %v", timeout)
	}
	if f.calls.Load() != 0 || f.Role() != Primary {
		t.Fatalf("actuator called %d times, role %v", f.calls.Load(), f.Role())
	}
	if got := fmt.Sprint(rec.roles("v")); got != "[primary changing primary]" {
		t.Fatalf("roles %v", got)
	}
	r, err = c.Change(context.Background(), Request{Volume: "v", Op: Demote, Force: true, By: "ops"})
	if err != nil || r != Secondary || f.Role() != Secondary {
		t.Fatalf("forced demote: %v %v", r, err)
	}
	if got := fmt.Sprint(rec.roles("v")); got != "[primary changing primary changing secondary]" {
		t.Fatalf("roles %v", got)
	}
	if l := lb.String(); !strings.Contains(l, "forced role change with commands still running") || !strings.Contains(l, "level=WARN") {
		t.Fatalf("no warning for the forced change:\n%s", l)
	}
	rec.checkSequence(t, "v")
}

// Admit (the fencing plug-in point) refuses before anything is published.
func TestAdmitRefuses(t *testing.T) {
	errStale := errors.New("stale epoch")
	c := New(Options{Log: slog.New(slog.DiscardHandler), Admit: func(q Request) error {
		if q.By == "old-lease" {
			return errStale
		}
		return nil
	}})
	defer c.Close()
	var rec recorder
	c.Subscribe(rec.sub)
	f := &fakeReplica{role: Secondary}
	c.Register("v", f)
	if _, err := c.Change(context.Background(), Request{Volume: "v", Op: Promote, By: "old-lease"}); !errors.Is(err, errStale) {
		t.Fatalf("stale: %v", err)
	}
	if got := fmt.Sprint(rec.roles("v")); got != "[secondary]" || f.calls.Load() != 0 {
		t.Fatalf("refused change published %v, called %d", got, f.calls.Load())
	}
	if _, err := c.Change(context.Background(), Request{Volume: "v", Op: Promote, By: "lease"}); err != nil {
		t.Fatal(err)
	}
}

// Promote/demote storms on several volumes, with the actuator also
// changing roles on its own (Observe, as a replica reports a change the
// peer caused) from other goroutines: per volume the actuator is never
// driven twice at once, subscribers see a gapless sequence (each event's
// Was the previous Role) with Transitioning always followed by a settled
// role, and once quiet the role last published equals the actuator's.
func TestStorm(t *testing.T) {
	c := New(Options{Log: slog.New(slog.DiscardHandler), Drain: func(string, time.Duration) error {
		if rand.IntN(8) == 0 {
			return errors.New("drain timed out")
		}
		return nil
	}})
	defer c.Close()
	var rec recorder
	c.Subscribe(rec.sub)
	vols := []string{"a", "b", "c"}
	reps := map[string]*fakeReplica{}
	for _, v := range vols {
		f := &fakeReplica{role: Secondary, slow: true}
		reps[v] = f
		f.onChange = func() { c.Observe(v) } // as the replica's loop does
		if err := c.Register(v, f); err != nil {
			t.Fatal(err)
		}
	}
	var ok, busy, refused atomic.Int32
	var wg sync.WaitGroup
	for g := range 12 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 60 {
				v := vols[(g+i)%len(vols)]
				q := Request{Volume: v, Op: Promote, Force: i%5 == 0, By: fmt.Sprintf("g%d", g)}
				if (g+i)%2 == 0 {
					q.Op = Demote
				}
				r, err := c.Change(context.Background(), q)
				switch {
				case err == nil:
					ok.Add(1)
					if r == Transitioning {
						t.Errorf("change returned %v", r)
					}
				case errors.Is(err, ErrInProgress):
					busy.Add(1)
				case strings.Contains(err.Error(), "role unchanged"):
					refused.Add(1)
				default:
					t.Errorf("change: %v", err)
				}
			}
		}()
	}
	// The peer side: roles flip under the controller, reported by Observe.
	stop := make(chan struct{})
	var obs sync.WaitGroup
	obs.Add(1)
	go func() {
		defer obs.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			v := vols[i%len(vols)]
			f := reps[v]
			if f.busy.Load() == 0 {
				f.set([]Role{Primary, Secondary}[i%2])
				c.Observe(v)
			}
			time.Sleep(50 * time.Microsecond)
		}
	}()
	wg.Wait()
	close(stop)
	obs.Wait()
	for _, v := range vols {
		settle(c, v)
		c.Observe(v)
		settle(c, v)
		f := reps[v]
		if f.max.Load() != 1 {
			t.Errorf("%s: actuator driven by %d goroutines at once", v, f.max.Load())
		}
		rec.checkSequence(t, v)
		pub, _ := c.Role(v)
		if last := rec.last(v); last != f.Role() || pub != f.Role() {
			t.Errorf("%s: subscriber last saw %v, controller says %v, actuator is %v", v, last, pub, f.Role())
		}
		rs := rec.roles(v)
		for i, r := range rs {
			if r == Transitioning && (i+1 >= len(rs) || rs[i+1] == Transitioning) {
				t.Errorf("%s: transitioning at %d not followed by a settled role: %v", v, i, rs[max(0, i-3):min(len(rs), i+3)])
			}
		}
	}
	t.Logf("changes: %d done, %d refused in progress, %d refused by the drain", ok.Load(), busy.Load(), refused.Load())
	if ok.Load() == 0 || busy.Load() == 0 {
		t.Fatalf("the storm did not both change roles and collide (%d done, %d in progress)", ok.Load(), busy.Load())
	}
}

// A subscriber added after volumes registered is told their current
// roles, on their owner goroutines, before any later change.
func TestLateSubscriber(t *testing.T) {
	c := New(Options{Log: slog.New(slog.DiscardHandler)})
	defer c.Close()
	f := &fakeReplica{role: Primary}
	c.Register("v", f)
	var rec recorder
	c.Subscribe(rec.sub)
	if _, err := c.Change(context.Background(), Request{Volume: "v", Op: Demote}); err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(rec.roles("v")); got != "[primary changing secondary]" {
		t.Fatalf("late subscriber saw %v", got)
	}
	if e := rec.evs["v"][0]; e.Cause != CauseCurrent {
		t.Fatalf("first event %+v", e)
	}
	if err := c.Register("v", f); err == nil {
		t.Fatal("second Register of one volume accepted")
	}
	c.Close()
	if err := c.Register("w", f); err == nil {
		t.Fatal("Register after Close accepted")
	}
}
