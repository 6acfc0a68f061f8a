package ioengine

import (
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

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

// closer is implemented by timers that hold resources (preciseTimer's
// thread and file descriptor); the engine closes its timer on Close.
type closer interface{ close() }

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

func (realClock) AfterFunc(d time.Duration, f func()) Timer {
	if t := newPreciseTimer(f); t != nil {
		t.Reset(d)
		return t
	}
	return time.AfterFunc(d, f)
}

// RealClock is the wall clock (time.Now, and a timer precise to tens of
// microseconds): the default Config.Clock.
var RealClock Clock = realClock{}

// preciseTimer is a one-shot timer on a Linux timerfd, read by a goroutine
// blocked in read(2).
//
// Why not time.AfterFunc: the gathering backstop is a few hundred
// microseconds, and when a Go process has nothing to run its last thread
// waits for the next timer in epoll_wait, whose timeout is whole
// milliseconds: a 300 µs time.Timer fires after about 1.1 ms. A client
// whose window did not fill the queue (its writes out of order, or fewer
// in flight than it once had) then waits that long for every run
// (measured: QEMU's sequential 4 KiB writes at 7-8k instead of 20-30k
// IOPS). A timerfd wakes the blocked reader at the programmed time, within
// the kernel's timer slack (50 µs).
type preciseTimer struct {
	fd     int
	f      func()
	closed atomic.Bool
	once   sync.Once
}

// newPreciseTimer returns nil where timerfd is unavailable (then the
// caller falls back to time.AfterFunc).
func newPreciseTimer(f func()) *preciseTimer {
	fd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_CLOEXEC)
	if err != nil {
		return nil
	}
	t := &preciseTimer{fd: fd, f: f}
	go t.loop()
	return t
}

func (t *preciseTimer) loop() {
	var buf [8]byte
	for {
		// A blocking read: the goroutine's thread sleeps in the kernel
		// until the timer expires (the fd is not on Go's netpoller).
		_, err := unix.Read(t.fd, buf[:])
		if t.closed.Load() {
			unix.Close(t.fd)
			return
		}
		if err != nil {
			continue // EINTR; EAGAIN cannot happen on a blocking fd
		}
		t.f()
	}
}

// Reset arms the timer to fire once after d (replacing any pending time).
func (t *preciseTimer) Reset(d time.Duration) bool {
	d = max(d, time.Microsecond) // zero would disarm
	spec := unix.ItimerSpec{Value: unix.NsecToTimespec(int64(d))}
	return unix.TimerfdSettime(t.fd, 0, &spec, nil) == nil
}

// Stop disarms the timer.
func (t *preciseTimer) Stop() bool {
	return unix.TimerfdSettime(t.fd, 0, &unix.ItimerSpec{}, nil) == nil
}

// close ends the reading goroutine (by firing the timer once more) and
// closes the file descriptor. The timer must not be used afterwards.
func (t *preciseTimer) close() {
	t.once.Do(func() {
		t.closed.Store(true)
		t.Reset(time.Microsecond)
	})
}
