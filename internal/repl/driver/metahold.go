package driver

import (
	"errors"
	"sync"
	"syscall"
	"time"

	"github.com/vmsan/vmsan/internal/netutil"
	"github.com/vmsan/vmsan/internal/repl"
)

// Metadata writes that fail for a reason that passes by itself.
//
// The node's Ready is handled in order: persist, then send, apply and
// release (acknowledge). When the persist step fails, nothing after it
// may happen, or a write could be acknowledged while the out-of-sync
// state that covers it is not durable. A real I/O error (EIO, EROFS, ...)
// stops replication, as always. But running out of file descriptors
// (EMFILE, ENFILE: a flood of connections to some listener), of kernel
// memory (ENOMEM, ENOBUFS) or of space (ENOSPC, EDQUOT: the metadata
// shares the data directory's filesystem, and an operator who frees
// space expects the node to carry on; stopping would not free any, and
// would cost a full resync) is transient: the Ready is held, the loop
// keeps running (events are taken, the node accumulates what follows),
// and the persist step is retried with a backoff doubling from
// metaRetryMin to metaRetryMax, forever, logged at most once per
// metaLogEvery. Once it succeeds the held Ready proceeds (its sends,
// applies and acknowledgements, in order) and so does everything after.
// While held, clients wait for their acknowledgements (I/O hangs, as
// DRBD's suspended I/O), and a peer that stops hearing pings drops the
// link and reconnects later.
//
// EMFILE/ENFILE first release the process's descriptor reserve
// (netutil.FDReserve) and retry at once, so a flood usually costs no
// wait at all; the reserve is refilled afterwards.
const (
	metaRetryMin = 10 * time.Millisecond
	metaRetryMax = time.Second
	metaLogEvery = 5 * time.Second
	// fdReserveSize: an atomic file replace needs two descriptors at
	// once (the temporary file, then the directory for its fsync); a
	// few replicas may be writing metadata at the same moment.
	fdReserveSize = 8
)

// fdReserve is the process's descriptor reserve for metadata writes,
// shared by every replica (opened by the first Start).
var fdReserve = sync.OnceValue(func() *netutil.FDReserve { return netutil.NewFDReserve(fdReserveSize) })

// transientMetaErr reports whether a metadata write error may clear by
// itself (see above): such a write is retried, not fatal.
func transientMetaErr(err error) bool {
	for _, e := range []syscall.Errno{syscall.EMFILE, syscall.ENFILE, syscall.ENOMEM, syscall.ENOBUFS,
		syscall.EAGAIN, syscall.EINTR, syscall.ENOSPC, syscall.EDQUOT} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// heldReady is a Ready whose persist step failed transiently.
type heldReady struct {
	rd    repl.Ready
	err   error
	since time.Time
	next  time.Time // next retry
	delay time.Duration
	tries int
}

// persist writes p, using the descriptor reserve when out of
// descriptors. REQUIRES: loop goroutine.
func (r *Replica) persist(p repl.Persist) error {
	err := r.st.persist(p)
	if err != nil && netutil.OutOfFDs(err) {
		if res := fdReserve(); res.Release() > 0 {
			err = r.st.persist(p)
			r.metaLog.warn(r.log, "reserve", "out of file descriptors: released the descriptor reserve for a replication metadata write",
				"err_after", err)
			res.Refill()
		}
	}
	return err
}

// hold keeps rd (whose persist failed with the transient err) for a
// retry. REQUIRES: loop goroutine.
func (r *Replica) hold(rd repl.Ready, err error) {
	now := time.Now()
	h := r.held
	if h == nil {
		h = &heldReady{rd: rd, since: now}
		r.held = h
		r.obs.metaHeld.Store(true)
	}
	h.err = err
	h.tries++
	h.delay = min(max(2*h.delay, metaRetryMin), metaRetryMax)
	h.next = now.Add(h.delay)
	r.metaLog.warn(r.log, "meta", "replication metadata write failed (transient); acknowledgements held, retrying",
		"err", err, "retry_in", h.delay, "held_for", now.Sub(h.since).Round(time.Millisecond), "attempts", h.tries)
}

// resume notes that the held Ready was persisted. REQUIRES: loop goroutine.
func (r *Replica) resume() {
	h := r.held
	r.held = nil
	r.obs.metaHeld.Store(false)
	r.log.Info("replication metadata write succeeded again; acknowledgements resume",
		"held_for", time.Since(h.since).Round(time.Millisecond), "attempts", h.tries+1)
	fdReserve().Refill()
}

// heldErr is what an admin call reports while a metadata write is held.
func (r *Replica) heldErr() error {
	if r.held == nil {
		return nil
	}
	return errors.Join(errors.New("repl: replication metadata not durable yet (retrying)"), r.held.err)
}
