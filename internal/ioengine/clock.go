package ioengine

import (
	"errors"
	"os"
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
// file descriptor); the engine closes its timer on Close.
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

// preciseTimer is a one-shot timer on a Linux timerfd, read through Go's
// network poller.
//
// Why not time.AfterFunc: the gathering backstop is a few hundred
// microseconds, and when a Go process has nothing to run its last thread
// waits for the next timer in epoll_wait, whose timeout is whole
// milliseconds: a 300 µs time.Timer fires after about 1.1 ms. A client
// whose window did not fill the queue (its writes out of order, or fewer
// in flight than it once had) then waits that long for every run
// (measured: QEMU's sequential 4 KiB writes at 7-8k instead of 20-30k
// IOPS). An expiring timerfd is an fd event, which ends that same
// epoll_wait at once, within the kernel's timer slack (50 µs). The fd is
// non-blocking and registered with the poller, so a waiting timer holds
// no OS thread (one engine per volume, many volumes per daemon).
type preciseTimer struct {
	fd   int      // for timerfd_settime
	file *os.File // the same fd, read through the poller
	f    func()
}

// newPreciseTimer returns nil where timerfd is unavailable (then the
// caller falls back to time.AfterFunc).
func newPreciseTimer(f func()) *preciseTimer {
	fd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_CLOEXEC|unix.TFD_NONBLOCK)
	if err != nil {
		return nil
	}
	// INVARIANT: file.Fd() is never called: it would put the fd back in
	// blocking mode and take it off the poller.
	t := &preciseTimer{fd: fd, file: os.NewFile(uintptr(fd), "timerfd"), f: f}
	go t.loop()
	return t
}

func (t *preciseTimer) loop() {
	var buf [8]byte
	for {
		// Parks the goroutine (not its thread) until the timer expires;
		// returns an error once close closed the file.
		if _, err := t.file.Read(buf[:]); err != nil {
			if errors.Is(err, os.ErrClosed) {
				return
			}
			continue
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

// close ends the reading goroutine and closes the file descriptor. The
// timer must not be used afterwards.
func (t *preciseTimer) close() { t.file.Close() }
