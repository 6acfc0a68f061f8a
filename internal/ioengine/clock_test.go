package ioengine

import (
	"sync/atomic"
	"testing"
	"time"
)

// TestPreciseTimer: the real clock's timer fires once per Reset, not after
// Stop, re-arms earlier or later, and close ends its goroutine. (Its
// precision is not asserted: that is wall-clock time on a shared machine.)
func TestPreciseTimer(t *testing.T) {
	fired := make(chan time.Time, 8)
	var n atomic.Int32
	tm := RealClock.AfterFunc(time.Hour, func() { n.Add(1); fired <- time.Now() })
	pt, ok := tm.(*preciseTimer)
	if !ok {
		t.Skipf("timerfd unavailable: %T", tm) // skip: platform
	}
	defer pt.close()
	tm.Reset(200 * time.Microsecond) // earlier than the hour
	select {
	case <-fired:
	case <-time.After(10 * time.Second):
		t.Fatal("timer did not fire")
	}
	// Stopped: nothing fires.
	tm.Reset(time.Millisecond)
	tm.Stop()
	time.Sleep(20 * time.Millisecond)
	if got := n.Load(); got != 1 {
		t.Fatalf("fired %d times, want 1 (stopped before the second)", got)
	}
	// Re-armed later, then earlier: fires once.
	tm.Reset(time.Hour)
	tm.Reset(500 * time.Microsecond)
	select {
	case <-fired:
	case <-time.After(10 * time.Second):
		t.Fatal("re-armed timer did not fire")
	}
	time.Sleep(5 * time.Millisecond)
	if got := n.Load(); got != 2 {
		t.Fatalf("fired %d times, want 2", got)
	}
}
