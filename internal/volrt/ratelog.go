package volrt

import (
	"sync"
	"time"
)

// RateLog lets a log line through at most once per interval, so an
// event a client can trigger at will (a connection refused for a limit)
// cannot flood the log; the suppressed count goes with the next line.
//
// Concurrency: safe for concurrent use. The zero value lets one line per
// 10 seconds through.
type RateLog struct {
	mu         sync.Mutex
	Interval   time.Duration // 0: 10s
	last       time.Time
	suppressed uint64
}

// Allow reports whether to log now and, if so, how many events were
// suppressed since the last line.
func (r *RateLog) Allow() (bool, uint64) {
	iv := r.Interval
	if iv <= 0 {
		iv = 10 * time.Second
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	if !r.last.IsZero() && now.Sub(r.last) < iv {
		r.suppressed++
		return false, 0
	}
	r.last = now
	n := r.suppressed
	r.suppressed = 0
	return true, n
}
