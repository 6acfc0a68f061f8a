package volrt

import (
	"sync"
	"sync/atomic"
)

// Budget bounds payload bytes held in flight (read buffers waiting to be
// sent, write payloads waiting to be applied), so clients cannot make the
// server hold unbounded memory.
//
// Budgets nest: a per-connection budget made with InitChild also reserves
// every byte from its parent, the daemon-wide budget shared by all front
// ends. The per-connection limit keeps one client from taking the whole
// daemon budget; the parent bounds the sum over all clients, which the
// per-connection limits alone do not (N connections hold N times their
// limit).
//
// Waiters are served first come, first served: a large reservation that
// does not fit yet is not overtaken forever by a stream of small ones
// (it waits until it fits, never longer than it takes the holders ahead of
// it to release). A single reservation larger than the whole limit is
// admitted when nothing else is held, so progress is always possible; the
// front ends refuse requests larger than their maximum request size before
// reserving, and the daemon keeps the limit at least that large, so this
// exemption never lets the total exceed the limit there.
//
// INVARIANT: used <= limit, or used is one reservation larger than limit
// taken while nothing else was held.
//
// Concurrency: safe for concurrent use. The zero value is not usable; call
// Init or InitChild.
type Budget struct {
	mu     sync.Mutex
	cond   sync.Cond
	used   int64
	limit  int64
	parent *Budget
	// FIFO tickets: a Reserve takes ticket next and proceeds when serving
	// reaches it and its bytes fit. next == serving means nobody waits.
	next, serving uint64
	waiters       int // goroutines in cond.Wait: no Broadcast (syscall-free but not free) when 0

	waits   atomic.Uint64 // Reserve calls that had to wait
	refused atomic.Uint64 // TryReserve calls that failed
}

// Init sets the limit (bytes). Call before any Reserve.
func (b *Budget) Init(limit int64) {
	b.limit = limit
	b.cond.L = &b.mu
}

// InitChild sets the limit and a parent every reservation is also taken
// from (nil: none). Call before any Reserve.
func (b *Budget) InitChild(limit int64, parent *Budget) {
	b.Init(limit)
	b.parent = parent
}

// fits reports whether n more bytes fit now. REQUIRES: mu.
func (b *Budget) fits(n int64) bool { return b.used == 0 || b.used+n <= b.limit }

// Reserve blocks until n bytes fit in the budget (and in the parent's).
//
// It must not be called by a goroutine whose own progress is needed to
// release what the budget waits for (a connection's only reader waiting for
// bytes that only that reader's next request would free); the NBD reader
// satisfies this because its reservations are released by completions and
// the writer, not by reading.
func (b *Budget) Reserve(n int64) { b.ReserveWaiting(n, nil) }

// ReserveWaiting is Reserve that calls beforeWait (if not nil) once
// before it starts waiting, without holding any lock (e.g. to flush
// buffered replies the client may be waiting for); it is not called when
// the bytes fit at once.
func (b *Budget) ReserveWaiting(n int64, beforeWait func()) {
	b.mu.Lock()
	ticket := b.next
	b.next++
	if ticket != b.serving || !b.fits(n) {
		b.waits.Add(1)
		if beforeWait != nil {
			// The ticket keeps this reservation's place meanwhile; the
			// loop below rechecks, so a release now is not missed.
			b.mu.Unlock()
			beforeWait()
			b.mu.Lock()
		}
		b.waiters++
		for ticket != b.serving || !b.fits(n) {
			b.cond.Wait()
		}
		b.waiters--
	}
	b.serving++
	b.used += n
	wake := b.waiters > 0 // the next ticket may fit too
	b.mu.Unlock()
	if wake {
		b.cond.Broadcast()
	}
	if b.parent != nil {
		b.parent.ReserveWaiting(n, beforeWait)
	}
}

// Fits reports whether n bytes would be taken now without waiting (in
// this budget and the parent's). The answer may be stale at once; it is a
// hint, e.g. to flush buffered output before a Reserve that will wait.
func (b *Budget) Fits(n int64) bool {
	b.mu.Lock()
	ok := b.next == b.serving && b.fits(n)
	b.mu.Unlock()
	return ok && (b.parent == nil || b.parent.Fits(n))
}

// TryReserve takes n bytes if they fit now (in this budget and the
// parent's) and nobody is waiting ahead; otherwise it takes nothing and
// returns false.
func (b *Budget) TryReserve(n int64) bool {
	b.mu.Lock()
	if b.next != b.serving || !b.fits(n) {
		b.mu.Unlock()
		b.refused.Add(1)
		return false
	}
	b.used += n
	b.mu.Unlock()
	if b.parent != nil && !b.parent.TryReserve(n) {
		b.release(n)
		b.refused.Add(1)
		return false
	}
	return true
}

// NoteRefused counts a reservation the caller refused on a policy of its
// own over this budget (the iSCSI target's share for commands waiting for
// their data), so Stats' Refused counts every refusal.
func (b *Budget) NoteRefused() { b.refused.Add(1) }

// Release gives back n bytes taken by Reserve or TryReserve.
func (b *Budget) Release(n int64) {
	if n == 0 {
		return
	}
	if b.parent != nil {
		b.parent.Release(n)
	}
	b.release(n)
}

func (b *Budget) release(n int64) {
	b.mu.Lock()
	b.used -= n
	wake := b.waiters > 0
	b.mu.Unlock()
	if wake {
		b.cond.Broadcast()
	}
}

// Used is the number of bytes currently reserved.
func (b *Budget) Used() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used
}

// BudgetStats is a snapshot of a Budget for metrics and status.
type BudgetStats struct {
	Limit int64 `json:"limit_bytes"`
	Used  int64 `json:"used_bytes"`
	// Waits counts reservations that waited for memory (NBD: a
	// connection's reader paused); Refused counts reservations refused
	// outright (iSCSI: a command answered BUSY or TASK SET FULL).
	Waits   uint64 `json:"waits"`
	Refused uint64 `json:"refused"`
}

// Stats returns the budget's snapshot.
func (b *Budget) Stats() BudgetStats {
	b.mu.Lock()
	st := BudgetStats{Limit: b.limit, Used: b.used}
	b.mu.Unlock()
	st.Waits, st.Refused = b.waits.Load(), b.refused.Load()
	return st
}
