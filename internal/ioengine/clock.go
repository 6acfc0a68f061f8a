package ioengine

import "time"

// Clock is the engine's time source. Every scheduling decision reads it:
// gathering deadlines, the queue-depth and inter-arrival measurements that
// set them, and the backend service times that gate inline execution.
// Tests inject a fake (ioengine/enginetest.Clock) so those decisions are
// reproducible and independent of machine load; production uses the real
// clock (the default).
type Clock interface {
	// Now returns the current time; only differences between two values
	// are used, so it may start anywhere but must never go backwards.
	Now() time.Time
	// AfterFunc calls f in its own goroutine (or, for a fake clock, from
	// whoever advances it) once d has passed, like time.AfterFunc.
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is a Clock's pending call, with time.Timer's Reset and Stop.
type Timer interface {
	Reset(d time.Duration) bool
	Stop() bool
}

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

func (realClock) AfterFunc(d time.Duration, f func()) Timer { return time.AfterFunc(d, f) }

// RealClock is the wall clock (time.Now and time.AfterFunc): the default
// Config.Clock.
var RealClock Clock = realClock{}
