// Package enginetest provides test doubles for the I/O engine: a manual
// Clock, so tests of the engine's time-dependent decisions (write
// gathering, inline execution) advance time explicitly and assert exact
// outcomes instead of sleeping and hoping the machine is idle.
package enginetest

import (
	"sort"
	"sync"
	"time"

	"github.com/vmsan/vmsan/internal/ioengine"
)

// Clock is a manual ioengine.Clock: time stands still until Advance moves
// it, and timers fire only inside Advance, on the advancing goroutine, in
// deadline order. Safe for concurrent use.
//
// Because nothing moves on its own, an engine on a Clock releases held
// writes only for the reasons that do not involve time (queue full, run
// full, a waiter, Close) until the test advances it, so what a test
// observes does not depend on goroutine scheduling or machine load.
type Clock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*timer
}

// NewClock returns a Clock reading an arbitrary fixed start time.
func NewClock() *Clock { return &Clock{now: time.Unix(1_000_000, 0)} }

// Now implements ioengine.Clock.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Since is how far the clock has been advanced past t.
func (c *Clock) Since(t time.Time) time.Duration { return c.Now().Sub(t) }

// AfterFunc implements ioengine.Clock.
func (c *Clock) AfterFunc(d time.Duration, f func()) ioengine.Timer {
	t := &timer{c: c, f: f}
	t.Reset(d)
	return t
}

// Advance moves the clock forward by d at once, then runs (on the calling
// goroutine, without the clock's lock held) every timer that is due, in
// deadline order. Callbacks therefore see the clock at its new reading,
// never at an intermediate one: an engine woken by its timer evaluates
// every deadline against the same instant, whichever goroutine gets there
// first, so the outcome does not depend on scheduling. (A timer that a
// callback arms for a time already due fires in the same Advance.)
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(max(d, 0)) // time never goes backwards
	for {
		var due *timer
		for _, t := range c.timers {
			if t.armed && !t.at.After(c.now) && (due == nil || t.at.Before(due.at)) {
				due = t
			}
		}
		if due == nil {
			break
		}
		due.armed = false
		f := due.f
		c.mu.Unlock()
		f()
		c.mu.Lock()
	}
	c.mu.Unlock()
}

// Pending returns the delays, from now, of the armed timers, shortest
// first (for tests asserting what the engine is waiting for).
func (c *Clock) Pending() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	var ds []time.Duration
	for _, t := range c.timers {
		if t.armed {
			ds = append(ds, t.at.Sub(c.now))
		}
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	return ds
}

type timer struct {
	c     *Clock
	f     func()
	at    time.Time
	armed bool
	added bool
}

// Reset implements ioengine.Timer.
func (t *timer) Reset(d time.Duration) bool {
	c := t.c
	c.mu.Lock()
	defer c.mu.Unlock()
	was := t.armed
	t.at, t.armed = c.now.Add(d), true
	if !t.added {
		t.added = true
		c.timers = append(c.timers, t)
	}
	return was
}

// Stop implements ioengine.Timer.
func (t *timer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	was := t.armed
	t.armed = false
	return was
}
