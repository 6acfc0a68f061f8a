package ioengine

import (
	"runtime"
	"testing"
	"time"
)

// Settle waits until e has nothing it would start now: no backend call is
// running and no ready request is due (everything ready is a write held
// for gathering). Tests on a manual clock call it before asserting what
// was, or was not, released: with time standing still, a held write stays
// held until the test advances the clock, so the state Settle returns in
// does not depend on how the goroutines were scheduled. (The wall-clock
// limit only turns an engine that never settles, a bug, into a failure
// instead of a hang.)
func Settle(t testing.TB, e *Engine) {
	t.Helper()
	start := time.Now()
	for {
		e.mu.Lock()
		next, _ := e.findLocked(e.now())
		busy := next != nil || e.st.inflight > 0
		e.mu.Unlock()
		if !busy {
			return
		}
		if time.Since(start) > time.Minute {
			t.Fatal("engine never settled: a due request is not being run")
		}
		runtime.Gosched()
	}
}
