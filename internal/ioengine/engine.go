package ioengine

import (
	"bytes"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/vmsan/vmsan/internal/backend"
)

// Defaults for zero Config fields.
const (
	DefaultWorkers       = 4
	DefaultMaxMergeBytes = 1 << 20
	DefaultMaxQueue      = 512
	DefaultGatherDelay   = 300 * time.Microsecond
	// DefaultMaxGatherFactor: MaxGatherDelay defaults to this many
	// GatherDelays (3 ms for the default GatherDelay).
	DefaultMaxGatherFactor = 10
	// DefaultInlineMaxLatency: see Config.InlineMaxLatency.
	DefaultInlineMaxLatency = 30 * time.Microsecond
	// DefaultInlineIdleLatency: see Config.InlineIdleLatency.
	DefaultInlineIdleLatency = 300 * time.Microsecond
)

// maxRunItems bounds the requests in one merged run, so one vectored call
// never needs more iovecs than the kernel's IOV_MAX.
const maxRunItems = 1024

// recentWrites is how many recent write ranges the gathering policy
// remembers to recognise a sequential stream.
const recentWrites = 32

// qdWindow is the period over which the engine measures the submitters'
// queue depth (see the package doc).
const qdWindow = int64(250 * time.Millisecond)

// Config tunes an Engine. Zero fields take the defaults above.
type Config struct {
	// Workers is the number of goroutines calling the backend, i.e. the
	// maximum number of concurrent backend calls. Default 4.
	Workers int
	// MaxMergeBytes caps a merged run (one backend call). A single request
	// larger than this still goes through alone. 1 disables merging.
	// Default 1 MiB.
	MaxMergeBytes int64
	// MaxQueue bounds requests submitted and not yet completed; Submit
	// blocks when it is reached (backpressure), so memory stays bounded.
	// Default 512.
	MaxQueue int
	// GatherDelay is the shortest backstop for a held sequential write:
	// a write held to be merged with the writes following it goes after
	// at most this long, unless the stream's measured inter-arrival gaps
	// (or the submitter's More hint) say more writes are coming later
	// than that (see the package doc). Negative disables gathering.
	// Default 300µs.
	GatherDelay time.Duration
	// MaxGatherDelay bounds every hold, whatever the measurements and
	// hints say: no write is held longer. Default 10 × GatherDelay
	// (3 ms); never below GatherDelay.
	MaxGatherDelay time.Duration
	// Clock is the time source of every scheduling decision. Default
	// RealClock; tests inject ioengine/enginetest.Clock.
	Clock Clock
	// InlineMaxLatency enables the inline fast path for Requests marked
	// Inline: such a request runs on the submitting goroutine when the
	// backend's recent service time for its kind (a moving average of
	// single-request calls) is below this, and nothing else would be
	// reordered, merged, gathered or exceed Workers by it. A slow backend
	// (cold reads from a disk) thus keeps the submitter free to pipeline
	// through the workers. Negative disables. Default 30µs (a page-cache
	// hit is 2-10µs; a device read is 100µs or more).
	InlineMaxLatency time.Duration
	// InlineIdleLatency replaces InlineMaxLatency for requests marked Idle
	// (the submitter has nothing else queued, so blocking it costs no
	// pipelining: queue depth 1). Default 300µs; never below
	// InlineMaxLatency.
	InlineIdleLatency time.Duration
	// OnNoSpace, if set, is called for every request that completes with
	// ENOSPC or EDQUOT from the backend (a thin volume's host filesystem
	// is full), after NoSpaceErrors counts it.
	// REQUIRES: it must not block or call back into the engine: it runs
	// with the engine's lock held (record the fact, wake a goroutine).
	OnNoSpace func()
}

func (c Config) withDefaults() Config {
	if c.Workers <= 0 {
		c.Workers = DefaultWorkers
	}
	if c.MaxMergeBytes <= 0 {
		c.MaxMergeBytes = DefaultMaxMergeBytes
	}
	if c.MaxQueue <= 0 {
		c.MaxQueue = DefaultMaxQueue
	}
	if c.GatherDelay == 0 {
		c.GatherDelay = DefaultGatherDelay
	}
	if c.GatherDelay < 0 {
		c.GatherDelay = 0
	}
	if c.MaxGatherDelay <= 0 {
		c.MaxGatherDelay = DefaultMaxGatherFactor * c.GatherDelay
	}
	c.MaxGatherDelay = max(c.MaxGatherDelay, c.GatherDelay)
	if c.Clock == nil {
		c.Clock = RealClock
	}
	if c.InlineMaxLatency == 0 {
		c.InlineMaxLatency = DefaultInlineMaxLatency
	}
	if c.InlineIdleLatency == 0 {
		c.InlineIdleLatency = DefaultInlineIdleLatency
	}
	c.InlineIdleLatency = max(c.InlineIdleLatency, c.InlineMaxLatency)
	return c
}

// ErrClosed fails requests submitted after Close.
var ErrClosed = fmt.Errorf("ioengine: engine closed: %w", syscall.ESHUTDOWN)

// ErrInvalid fails malformed requests (unknown op, negative range, Data
// length not matching Length).
var ErrInvalid = fmt.Errorf("ioengine: invalid request: %w", syscall.EINVAL)

// item is the engine's bookkeeping for one request. Items are recycled
// through a free list so the hot path does not allocate.
type item struct {
	r        *Request
	op       Op
	off, end int64
	writes   bool // modifies data (write, trim, write-zeroes)
	fua      bool
	near     bool // close to a recent write: candidate for gathering

	deps       int     // unfinished earlier items this one must wait for
	dependents []*item // items waiting for this one

	oprev, onext *item // outstanding list (submission order)
	rprev, rnext *item // ready list (FIFO)
	ready        bool
	inMaps       bool  // indexed by start/end for merging
	holdUntil    int64 // held for gathering until (engine clock); 0 = not held
	holdCap      int64 // ... and never past this (MaxGatherDelay after held)
	runLen       int64 // bytes of the ready run ending here, when made ready
	mark         uint64
	submitted    int64
	bnext        *item // next in the batch being executed
	err          error
	// A barrier: holding once it has executed (its submitter was told),
	// released when Barrier's release completes it.
	holding, released bool
}

type span struct{ off, end int64 }

// Engine queues, orders, merges and executes Requests against a Backend.
// See the package documentation.
type Engine struct {
	b         backend.Backend
	cfg       Config
	clock     Clock
	gather    int64 // GatherDelay (ns); 0 = gathering disabled
	maxGather int64 // MaxGatherDelay (ns)
	t0        time.Time

	mu        sync.Mutex
	workCond  sync.Cond // workers wait for work
	spaceCond sync.Cond // Submit waits for queue space; Close for drain

	outstanding      int
	outWrites        int // outstanding OpWrite requests
	dispWrites       int // ... of which handed to a worker
	outHead, outTail *item
	readyHead        *item
	readyTail        *item
	nready           int
	rdByStart        map[int64]*item
	rdByEnd          map[int64]*item
	wrByStart        map[int64]*item
	wrByEnd          map[int64]*item
	free             *item
	idle             int
	spaceWaiters     int
	closing, stopped bool
	epoch            uint64

	timer   Timer
	timerAt int64

	// Inter-arrival measurement of sequential writes (see holdLocked):
	// gapMax is a decaying maximum of the gaps between consecutive
	// sequential writes during which the submitters had free slots.
	lastNear  int64
	slotsFree bool // at lastNear, fewer writes were outstanding than qdEstimate
	gapMax    int64
	// more: the latest write was submitted with Request.More (its
	// submitter holds further requests it is about to submit).
	more bool

	winStart          int64
	curPeak, prevPeak int
	recent            [recentWrites]span
	recentPos         int

	// svc is the moving average (ns) of single-request backend call times,
	// for reads [0] and writes [1]: the inline fast path's cost estimate.
	// Updated without the lock; a lost update only delays the average.
	svc [2]atomic.Int64
	// iovs recycles the one-element iovec lists of inline executions.
	iovs sync.Pool

	st        statsState
	wg        sync.WaitGroup
	doChans   sync.Pool
	closeErr  error
	closeDone chan struct{}
}

type statsState struct {
	requests, backendOps       OpCounts
	rejected, errors           uint64
	noSpace                    uint64
	bytesRead, bytesWritten    uint64
	merged, held, inlined      uint64
	gatherTimeouts             uint64
	maxQueue, inflight, maxInF int
	latency, wsizes, rsizes    logHist
	rlat, wlat, flat           logHist
}

// New starts an Engine over b. The Engine does not own b: Close drains and
// syncs but does not close the backend.
func New(b backend.Backend, cfg Config) *Engine {
	cfg = cfg.withDefaults()
	e := &Engine{
		b:         b,
		cfg:       cfg,
		clock:     cfg.Clock,
		gather:    int64(cfg.GatherDelay),
		maxGather: int64(cfg.MaxGatherDelay),
		t0:        cfg.Clock.Now(),
		rdByStart: make(map[int64]*item),
		rdByEnd:   make(map[int64]*item),
		wrByStart: make(map[int64]*item),
		wrByEnd:   make(map[int64]*item),
		closeDone: make(chan struct{}),
	}
	e.workCond.L = &e.mu
	e.spaceCond.L = &e.mu
	e.doChans.New = func() any { return make(chan struct{}, 1) }
	e.iovs.New = func() any { b := make([][]byte, 0, 1); return &b }
	e.st.latency = newLogHist(10, 34) // 1µs .. ~17s
	e.st.rlat, e.st.wlat, e.st.flat = e.st.latency, e.st.latency, e.st.latency
	e.st.wsizes = newLogHist(9, 25) // 512 B .. 32 MiB
	e.st.rsizes = newLogHist(9, 25)
	e.timer = e.clock.AfterFunc(time.Hour, e.onTimer)
	e.timer.Stop()
	e.wg.Add(cfg.Workers)
	for i := 0; i < cfg.Workers; i++ {
		go e.worker()
	}
	return e
}

// now is the engine clock: nanoseconds since New, read from Config.Clock.
func (e *Engine) now() int64 { return int64(e.clock.Now().Sub(e.t0)) }

func validOp(op Op) bool { return op >= OpRead && op <= OpOrWrite }

// modifies reports whether op changes data: what a barrier holds back and
// what conflicts with overlapping requests of any kind.
func modifies(op Op) bool {
	switch op {
	case OpWrite, OpTrim, OpWriteZeroes, OpWriteRepeat, OpCompareWrite, OpOrWrite:
		return true
	}
	return false
}

func (e *Engine) validate(r *Request) error {
	if !validOp(r.Op) || r.Offset < 0 || r.Length < 0 {
		return ErrInvalid
	}
	switch r.Op {
	case OpFlush:
		return nil
	case OpRead, OpWrite:
		if int64(len(r.Data)) != r.Length {
			return ErrInvalid
		}
	case OpWriteRepeat:
		if len(r.Data) == 0 {
			return ErrInvalid
		}
	case OpCompareWrite:
		if int64(len(r.Data)) != 2*r.Length || int64(len(r.Aux)) < r.Length {
			return ErrInvalid
		}
	case OpOrWrite:
		if int64(len(r.Data)) != r.Length || int64(len(r.Aux)) < r.Length {
			return ErrInvalid
		}
	case OpTrim, OpWriteZeroes:
		for _, x := range r.Ranges {
			if x.Offset < r.Offset || x.Length < 0 || x.Offset > r.Offset+r.Length-x.Length {
				return ErrInvalid
			}
		}
	}
	if r.Ranges != nil && r.Op != OpTrim && r.Op != OpWriteZeroes {
		return ErrInvalid
	}
	if r.Offset > e.b.Size()-r.Length {
		return backend.ErrOutOfRange
	}
	return nil
}

func finish(r *Request, err error) {
	r.Err = err
	if r.Done != nil {
		r.Done(r)
	}
}

// Submit queues r and returns; r.Done is called exactly once when it
// completes. Submit blocks while MaxQueue requests are outstanding.
//
// Invalid requests, and requests submitted after Close, complete at once
// with an error, with Done called from the submitting goroutine. Done must
// not call Submit on the same Engine when the queue could be full: a
// request made of several steps is one compound request (OpWriteRepeat,
// Ranges, OpCompareWrite, OpOrWrite), not a chain submitted from Done.
func (e *Engine) Submit(r *Request) {
	if err := e.validate(r); err != nil {
		e.mu.Lock()
		e.st.rejected++
		e.mu.Unlock()
		finish(r, err)
		return
	}
	if r.Length == 0 && r.Op != OpFlush {
		// Touches no byte, so it needs no ordering and no backend call.
		e.mu.Lock()
		e.st.requests.add(r.Op, 1)
		e.mu.Unlock()
		finish(r, nil)
		return
	}
	e.queue(r)
}

// queue enqueues a validated request (Submit's, or Barrier's).
func (e *Engine) queue(r *Request) {
	e.mu.Lock()
	for e.outstanding >= e.cfg.MaxQueue && !e.closing {
		e.spaceWaiters++
		e.spaceCond.Wait()
		e.spaceWaiters--
	}
	if e.closing {
		e.st.rejected++
		e.mu.Unlock()
		finish(r, ErrClosed)
		return
	}
	now := e.now()
	it := e.allocLocked()
	it.r, it.op, it.off, it.end = r, r.Op, r.Offset, r.Offset+r.Length
	it.writes = modifies(r.Op)
	it.fua = r.FUA
	it.submitted = now
	e.st.requests.add(r.Op, 1)

	e.outstanding++
	if e.outstanding > e.st.maxQueue {
		e.st.maxQueue = e.outstanding
	}
	if r.Op == OpWrite {
		e.outWrites++
		if el := now - e.winStart; el > qdWindow {
			e.prevPeak, e.curPeak, e.winStart = e.curPeak, 0, now
			if el > 2*qdWindow {
				// The previous window saw no writes at all: a burst from
				// long ago must not make a new writer look deep.
				e.prevPeak = 0
			}
		}
		if e.outWrites > e.curPeak {
			e.curPeak = e.outWrites
		}
	}

	// INVARIANT: a request waits for every earlier-submitted, unfinished
	// request it conflicts with (overlapping ranges where at least one
	// modifies data; for FLUSH and a barrier, every earlier modifying
	// request; for a modifying request, every earlier barrier). So
	// overlapping requests are never reordered, a FLUSH runs Sync only
	// after all writes submitted before it have returned from the backend,
	// and no write submitted after a barrier starts before it is released.
	for o := e.outHead; o != nil; o = o.onext {
		if conflicts(o, it) {
			o.dependents = append(o.dependents, it)
			it.deps++
			if o.ready && o.holdUntil != 0 {
				// Someone is waiting for o: stop gathering it.
				o.holdUntil = 0
			}
		}
	}
	it.oprev = e.outTail
	if e.outTail != nil {
		e.outTail.onext = it
	} else {
		e.outHead = it
	}
	e.outTail = it

	wasMore := e.more
	if it.op == OpWrite {
		it.near = e.nearRecentLocked(it.off, it.end)
		e.recent[e.recentPos] = span{it.off, it.end}
		e.recentPos = (e.recentPos + 1) % recentWrites
		e.noteArrivalLocked(it, now)
		e.more = r.More
	}
	if it.deps == 0 && r.Inline && e.inlineOKLocked(it, now) {
		e.runInline(it) // drops the lock
		return
	}
	if it.deps == 0 {
		e.makeReadyLocked(it, now)
	}
	if e.idle > 0 && e.readyHead != nil {
		if it.ready && it.holdUntil != 0 && e.outWrites-e.dispWrites < e.qdEstimate() &&
			it.runLen < e.cfg.MaxMergeBytes && now < e.releaseAt(it) && (e.more || !wasMore) {
			// A held write that does not fill the submitters' queue: no
			// worker has anything new to do (waking one per held write
			// would cost a context switch per request), but make sure the
			// deadline will wake one. (When More was just withdrawn,
			// earlier holds may be due now: a worker re-evaluates them.)
			e.armTimerLocked(e.releaseAt(it), now)
		} else {
			e.workCond.Signal()
		}
	}
	e.mu.Unlock()
}

// inlineOKLocked decides whether a ready Inline request may run on the
// submitting goroutine: it must be a plain (non-FUA) read or write, the
// ready list must hold nothing but writes held for gathering (so it jumps
// ahead of nothing due to run and misses no merge partner; held writes are
// waiting on purpose and do not overlap it, or it would depend on them), a
// worker slot must be free (the Workers bound counts inline calls too),
// the backend must be fast for its kind lately, and a write must not be
// part of a sequential stream that gathering could merge (inline writes
// would keep the measured queue depth at 1 and so disable gathering).
func (e *Engine) inlineOKLocked(it *item, now int64) bool {
	if e.cfg.InlineMaxLatency < 0 || it.fua || e.st.inflight >= e.cfg.Workers {
		return false
	}
	n := 0
	for x := e.readyHead; x != nil; x = x.rnext {
		if x.holdUntil == 0 || now >= e.releaseAt(x) || n == 64 {
			return false
		}
		n++
	}
	var k int
	switch it.op {
	case OpRead:
		k = 0
	case OpWrite:
		if it.near && e.gather > 0 && it.end-it.off < e.cfg.MaxMergeBytes {
			return false
		}
		k = 1
	default:
		return false
	}
	lim := e.cfg.InlineMaxLatency
	if it.r.Idle {
		lim = e.cfg.InlineIdleLatency
	}
	return e.svc[k].Load() < int64(lim)
}

// runInline executes it on the calling goroutine and completes it.
// REQUIRES: e.mu held, it outstanding with no unfinished dependency and not
// on the ready list. Drops the lock; Done runs without it.
//
// INVARIANT: it stays on the outstanding list while it executes, so a
// later conflicting request still waits for it exactly as for a worker's.
func (e *Engine) runInline(it *item) {
	if it.op == OpWrite {
		e.dispWrites++
	}
	e.st.inlined++
	e.st.inflight++
	if e.st.inflight > e.st.maxInF {
		e.st.maxInF = e.st.inflight
	}
	e.mu.Unlock()

	bp := e.iovs.Get().(*[][]byte)
	*bp = e.exec(it, (*bp)[:0])
	clear(*bp)
	e.iovs.Put(bp)

	var one [1]*Request
	e.mu.Lock()
	e.st.inflight--
	done := e.completeLocked(it, e.now(), one[:0])
	if e.readyHead != nil && e.idle > 0 {
		// A worker may have found every slot taken by inline calls.
		e.workCond.Signal()
	}
	e.mu.Unlock()
	for _, r := range done {
		r.Done(r)
	}
}

// noteSvc folds one single-request backend call time into the moving
// average used by the inline fast path (weight 1/8).
func (e *Engine) noteSvc(op Op, d int64) {
	k := 0
	if op == OpWrite {
		k = 1
	}
	old := e.svc[k].Load()
	e.svc[k].Store(old + (d-old)/8)
}

// conflicts reports whether later request n must wait for earlier request o.
func conflicts(o, n *item) bool {
	if n.op == OpFlush || n.op == OpBarrier {
		return o.writes
	}
	if o.op == OpFlush {
		// Requests after a FLUSH need not wait for it: FLUSH promises
		// nothing about later writes.
		return false
	}
	if o.op == OpBarrier {
		// Writes after a barrier wait for its release; reads, flushes
		// and cache hints do not.
		return n.writes
	}
	if !o.writes && !n.writes {
		return false
	}
	return o.off < n.end && n.off < o.end
}

// nearGap is how far (in bytes) a write may be from a recent write and
// still count as part of a sequential stream: a stream's requests can
// arrive slightly out of order (several submitting goroutines, multi-conn),
// but random writes should rarely qualify.
const nearGap = 64 << 10

func (e *Engine) nearRecentLocked(off, end int64) bool {
	lim := min(e.cfg.MaxMergeBytes, nearGap)
	for _, s := range e.recent {
		if s.end == 0 {
			continue
		}
		gap := max(off-s.end, s.off-end, 0)
		if gap <= lim {
			return true
		}
	}
	return false
}

// noteArrivalLocked measures the inter-arrival gaps of sequential writes
// from submitters with free slots (see holdLocked). REQUIRES: it is an
// OpWrite already counted in outWrites.
//
// A gap counts only when, at the previous sequential write, fewer writes
// were outstanding than the submitters' measured queue depth: the
// submitter could have sent the next write at once and did not (it was
// descheduled, or its client was), which is what a backstop must outlast.
// A gap after a full queue is the engine's own service time plus the
// client's round trip; counting it would make every hold lengthen the
// next one.
func (e *Engine) noteArrivalLocked(it *item, now int64) {
	if !it.near || e.gather == 0 {
		return
	}
	qd := e.qdEstimate()
	if e.slotsFree && qd > 1 {
		if gap := now - e.lastNear; gap <= e.maxGather && gap > e.gapMax {
			e.gapMax = gap
		}
	}
	e.lastNear, e.slotsFree = now, e.outWrites < qd
}

// holdLocked is how long a run of held writes waits for its next write
// before the backstop releases it: twice the recent largest inter-arrival
// gap of the stream, so a submitter that is slow to use its free slots
// (a loaded machine: its gaps are scheduler time slices, not
// microseconds) still gets its writes merged, within
// [GatherDelay, MaxGatherDelay].
func (e *Engine) holdLocked() int64 {
	return min(max(2*e.gapMax, e.gather), e.maxGather)
}

// releaseAt is the earliest time a held write's run can be released by
// the backstop on its account (see runStateLocked for the run's time).
func (e *Engine) releaseAt(it *item) int64 {
	if e.more {
		return it.holdCap
	}
	return min(max(it.holdUntil, e.streamUntilLocked()), it.holdCap)
}

// streamUntilLocked is when the stream as a whole has gone quiet for a
// hold: no write near the recent ones has arrived since. A client may send
// a window's writes out of offset order (QEMU's NBD client does: requests
// waiting for one of its 16 slots are woken in no particular order), so
// the window is several runs until its gaps fill; each run's own last
// arrival would release it while the writes that join it are still
// coming.
func (e *Engine) streamUntilLocked() int64 {
	return e.lastNear + e.holdLocked()
}

// qdEstimate is the writers' recent queue depth: the most OpWrite requests
// outstanding at once over the last one or two qdWindows. Only writes
// count, so a busy reader does not make a queue-depth-1 writer look deep.
func (e *Engine) qdEstimate() int { return max(e.curPeak, e.prevPeak) }

func (e *Engine) allocLocked() *item {
	it := e.free
	if it == nil {
		return &item{}
	}
	e.free = it.onext
	it.onext = nil
	return it
}

func (e *Engine) freeLocked(it *item) {
	deps := it.dependents
	clear(deps)
	*it = item{dependents: deps[:0], onext: e.free}
	e.free = it
}

// makeReadyLocked puts an item whose dependencies are all finished on the
// ready list, indexes reads and writes for merging, and decides whether a
// write is held back for gathering.
func (e *Engine) makeReadyLocked(it *item, now int64) {
	it.ready = true
	it.rprev = e.readyTail
	if e.readyTail != nil {
		e.readyTail.rnext = it
	} else {
		e.readyHead = it
	}
	e.readyTail = it
	e.nready++
	byStart, byEnd := e.maps(it.op)
	if byStart != nil && byStart[it.off] == nil && byEnd[it.end] == nil {
		// INVARIANT: for an indexed item x, byStart[x.off] == x and
		// byEnd[x.end] == x. Two ready writes never overlap (the later one
		// depends on the earlier), so only reads can collide; a colliding
		// read is simply not indexed and runs alone.
		byStart[it.off] = it
		byEnd[it.end] = it
		it.inMaps = true
		it.runLen = it.end - it.off
		if p := byEnd[it.off]; p != nil {
			it.runLen += p.runLen
		}
	}
	// A write that others already wait for (e.g. rewrites of one block,
	// serialised by their overlap) is never held: holding it would delay
	// the whole chain by GatherDelay per link.
	if it.op == OpWrite && it.inMaps && e.gather > 0 && it.near && !e.closing && len(it.dependents) == 0 &&
		e.qdEstimate() > 1 && it.end-it.off < e.cfg.MaxMergeBytes {
		// A run waits while its writes keep coming (each new member
		// pushes its backstop to now + hold) but never past the cap of
		// its oldest member (see runStateLocked).
		// INVARIANT: 0 < holdUntil <= holdCap = (time held) + MaxGatherDelay
		// for every held write: the cap bounds every hold.
		it.holdUntil, it.holdCap = now+e.holdLocked(), now+e.maxGather
		e.st.held++
	}
}

func (e *Engine) maps(op Op) (byStart, byEnd map[int64]*item) {
	switch op {
	case OpRead:
		return e.rdByStart, e.rdByEnd
	case OpWrite:
		return e.wrByStart, e.wrByEnd
	}
	return nil, nil
}

func (e *Engine) unreadyLocked(it *item) {
	if it.rprev != nil {
		it.rprev.rnext = it.rnext
	} else {
		e.readyHead = it.rnext
	}
	if it.rnext != nil {
		it.rnext.rprev = it.rprev
	} else {
		e.readyTail = it.rprev
	}
	it.rprev, it.rnext = nil, nil
	it.ready = false
	e.nready--
	if it.inMaps {
		byStart, byEnd := e.maps(it.op)
		delete(byStart, it.off)
		delete(byEnd, it.end)
		it.inMaps = false
	}
}

// pickLocked chooses the next batch: the oldest ready item that is not held
// back, together with every ready item of the same kind contiguous with it
// (up to MaxMergeBytes). Returns the batch head (linked by bnext) or nil.
//
// Gathering policy (see package doc): a held write is released when its
// run reaches MaxMergeBytes, when something waits for it, when the engine
// closes, when the submitters' queue is as deep as it recently got (no
// more requests will arrive until some complete), or, as a backstop, when
// its run's time is up (runStateLocked).
func (e *Engine) pickLocked(now int64) *item {
	it, expired := e.findLocked(now)
	if it == nil {
		return nil
	}
	if expired {
		e.st.gatherTimeouts++
	}
	return e.takeRunLocked(it)
}

// findLocked is pickLocked's decision without taking anything: the ready
// item whose run goes next (nil if none is due; the timer is then armed
// for the earliest backstop), and whether it goes because a backstop
// expired.
func (e *Engine) findLocked(now int64) (next *item, expired bool) {
	if e.readyHead == nil {
		return nil, false
	}
	release := e.closing || e.outWrites-e.dispWrites >= e.qdEstimate()
	e.epoch++
	var earliest int64
	for it := e.readyHead; it != nil; it = it.rnext {
		if it.mark == e.epoch {
			continue
		}
		if it.holdUntil != 0 && !release {
			free, at := e.runStateLocked(it)
			if free {
				return it, false
			}
			if now >= at {
				return it, true
			}
			if earliest == 0 || at < earliest {
				earliest = at
			}
			continue
		}
		return it, false
	}
	if earliest != 0 {
		e.armTimerLocked(earliest, now)
	}
	return nil, false
}

// runStateLocked measures the contiguous run of ready writes around a
// held item, marking its members as seen for this pick. The run goes now
// (free) if it has reached MaxMergeBytes or a member is no longer held;
// otherwise the backstop releases it at `at`: when its newest member's
// hold has passed with no further write joining, or when its oldest
// member has been held MaxGatherDelay, whichever comes first; while the
// latest write came with Request.More, only at the latter.
func (e *Engine) runStateLocked(it *item) (free bool, at int64) {
	byStart, byEnd := e.maps(it.op)
	total := it.end - it.off
	it.mark = e.epoch
	until, capAt := it.holdUntil, it.holdCap
	note := func(x *item) {
		x.mark = e.epoch
		total += x.end - x.off
		if x.holdUntil == 0 {
			free = true
			return
		}
		until, capAt = max(until, x.holdUntil), min(capAt, x.holdCap)
	}
	for p := byEnd[it.off]; p != nil && total < e.cfg.MaxMergeBytes; p = byEnd[p.off] {
		note(p)
	}
	for q := byStart[it.end]; q != nil && total < e.cfg.MaxMergeBytes; q = byStart[q.end] {
		note(q)
	}
	if free || total >= e.cfg.MaxMergeBytes {
		return true, 0
	}
	if e.more {
		return false, capAt
	}
	return false, min(max(until, e.streamUntilLocked()), capAt)
}

// takeRunLocked removes it and its mergeable neighbours from the ready list
// and returns the leftmost, with the batch linked in offset order.
//
// INVARIANT: every member of a run is ready (all its dependencies are
// finished) and members never overlap, so issuing them as one vectored call
// cannot reorder conflicting requests.
func (e *Engine) takeRunLocked(it *item) *item {
	if !it.inMaps {
		e.unreadyLocked(it)
		it.bnext = nil
		if it.op == OpWrite {
			e.dispWrites++
		}
		return it
	}
	byStart, byEnd := e.maps(it.op)
	limit := e.cfg.MaxMergeBytes
	total, n := it.end-it.off, 1
	left := it
	for n < maxRunItems {
		p := byEnd[left.off]
		if p == nil || total+(p.end-p.off) > limit {
			break
		}
		left, total, n = p, total+(p.end-p.off), n+1
	}
	right := it
	for n < maxRunItems {
		q := byStart[right.end]
		if q == nil || total+(q.end-q.off) > limit {
			break
		}
		right, total, n = q, total+(q.end-q.off), n+1
	}
	for cur := left; ; {
		var next *item
		if cur != right {
			next = byStart[cur.end]
		}
		e.unreadyLocked(cur)
		cur.bnext = next
		if next == nil {
			break
		}
		cur = next
	}
	if n > 1 {
		e.st.merged += uint64(n - 1)
	}
	if it.op == OpWrite {
		e.dispWrites += n
		// One run per write cycle of the stream: the gap measurement
		// decays by 1/8 per run, so one long descheduling lengthens the
		// holds of the next few cycles, not for ever.
		e.gapMax -= e.gapMax >> 3
	}
	return left
}

func (e *Engine) armTimerLocked(at, now int64) {
	if e.timerAt != 0 && e.timerAt <= at {
		return
	}
	e.timerAt = at
	e.timer.Reset(time.Duration(at - now))
}

func (e *Engine) onTimer() {
	e.mu.Lock()
	e.timerAt = 0
	e.workCond.Broadcast()
	e.mu.Unlock()
}

// worker is one of Config.Workers goroutines; each runs one backend call
// at a time, which bounds backend concurrency.
func (e *Engine) worker() {
	defer e.wg.Done()
	var (
		bufs [][]byte   // reused iovec list
		done []*Request // reused completion list
	)
	e.mu.Lock()
	for {
		var b *item
		// INVARIANT: st.inflight counts worker and inline backend calls
		// and never exceeds Workers: a worker finding the slots taken by
		// inline calls waits (runInline wakes it when it is done).
		if e.st.inflight < e.cfg.Workers {
			b = e.pickLocked(e.now())
		}
		if b == nil {
			if e.stopped {
				e.mu.Unlock()
				return
			}
			e.idle++
			e.workCond.Wait()
			e.idle--
			continue
		}
		e.st.inflight++
		if e.st.inflight > e.st.maxInF {
			e.st.maxInF = e.st.inflight
		}
		e.mu.Unlock()

		bufs = e.exec(b, bufs[:0])
		clear(bufs)

		e.mu.Lock()
		e.st.inflight--
		done = e.completeLocked(b, e.now(), done[:0])
		e.mu.Unlock()
		// Done callbacks run without the lock: they may take their own
		// locks or submit (within the queue bound).
		for i, r := range done {
			r.Done(r)
			done[i] = nil
		}
		e.mu.Lock()
	}
}

// exec runs one batch against the backend, setting each item's err.
func (e *Engine) exec(head *item, bufs [][]byte) [][]byte {
	var err error
	switch head.op {
	case OpRead, OpWrite:
		fua := false
		for it := head; it != nil; it = it.bnext {
			bufs = append(bufs, it.r.Data[:it.end-it.off])
			fua = fua || it.fua
		}
		start := e.now()
		if head.op == OpRead {
			err = e.b.ReadvAt(bufs, head.off)
		} else {
			// INVARIANT: a run containing a FUA write is written with fua
			// for the whole run, so the FUA member is durable on return.
			err = e.b.WritevAt(bufs, head.off, fua)
		}
		if head.bnext == nil && !fua {
			// Only single plain requests: a merged run or a FUA sync says
			// nothing about what one inline request would cost.
			e.noteSvc(head.op, e.now()-start)
		}
		if err != nil && head.bnext != nil {
			// Retry members one by one so one failing range does not fail
			// its neighbours.
			for it := head; it != nil; it = it.bnext {
				b := [][]byte{it.r.Data[:it.end-it.off]}
				if head.op == OpRead {
					it.err = e.b.ReadvAt(b, it.off)
				} else {
					it.err = e.b.WritevAt(b, it.off, it.fua)
				}
			}
			return bufs
		}
	case OpFlush:
		// INVARIANT: every write completed before this FLUSH was submitted
		// has returned from the backend (it was finished, or this FLUSH
		// depends on it), so Sync makes it durable.
		err = e.b.Sync()
	case OpBarrier:
		// INVARIANT: every modifying request submitted before the barrier
		// has returned from the backend (the barrier depends on it), so
		// Sync makes all of them durable: the image is a consistent point
		// in time while the barrier holds.
		err = e.b.Sync()
	case OpTrim, OpWriteZeroes:
		r := head.r
		if r.Ranges == nil {
			err = e.zero(head.op, r, head.off, head.end-head.off)
		}
		for _, x := range r.Ranges {
			if x.Length == 0 {
				continue
			}
			if err = e.zero(head.op, r, x.Offset, x.Length); err != nil {
				break
			}
		}
		if err == nil && head.fua {
			// INVARIANT: FUA trim/write-zeroes is durable before completion.
			err = e.b.Sync()
		}
	case OpWriteRepeat:
		bufs, err = e.writeRepeat(head, bufs)
	case OpCompareWrite, OpOrWrite:
		bufs, err = e.readModifyWrite(head, bufs)
	case OpCache:
		if p, ok := e.b.(interface{ Prefetch(off, length int64) error }); ok {
			err = p.Prefetch(head.off, head.end-head.off)
		}
	}
	for it := head; it != nil; it = it.bnext {
		it.err = err
	}
	return bufs
}

func (e *Engine) zero(op Op, r *Request, off, n int64) error {
	if op == OpTrim {
		return e.b.Trim(off, n)
	}
	return e.b.WriteZeroes(off, n, !r.NoHole, r.FastZero)
}

// writeRepeat writes an OpWriteRepeat's pattern over its range, up to
// MaxMergeBytes (and maxRunItems copies of Data) per backend call.
func (e *Engine) writeRepeat(it *item, bufs [][]byte) ([][]byte, error) {
	p := it.r.Data
	for off := it.off; off < it.end; {
		bufs = bufs[:0]
		n := int64(0)
		for off+n < it.end && len(bufs) < maxRunItems && (n == 0 || n+int64(len(p)) <= e.cfg.MaxMergeBytes) {
			k := min(int64(len(p)), it.end-off-n)
			bufs = append(bufs, p[:k])
			n += k
		}
		if err := e.b.WritevAt(bufs, off, it.fua); err != nil {
			return bufs, err
		}
		off += n
	}
	return bufs, nil
}

// ErrMiscompare fails an OpCompareWrite whose compare instance differs
// from the data read (left in Request.Aux).
var ErrMiscompare = errors.New("ioengine: compare and write: data differs")

// readModifyWrite executes OpCompareWrite and OpOrWrite. No other
// request overlapping the range runs meanwhile (it conflicts with this
// one), whatever front end submitted it: the read and the write are one
// atomic step for every other user of the engine.
// bufs is the worker's reused iovec list (no allocation per request).
func (e *Engine) readModifyWrite(it *item, bufs [][]byte) ([][]byte, error) {
	n := it.end - it.off
	r := it.r
	cur := r.Aux[:n]
	bufs = append(bufs[:0], cur)
	if err := e.b.ReadvAt(bufs, it.off); err != nil {
		return bufs, err
	}
	if it.op == OpCompareWrite {
		if !bytes.Equal(cur, r.Data[:n]) {
			return bufs, ErrMiscompare
		}
		bufs[0] = r.Data[n : 2*n]
	} else {
		for i, b := range r.Data[:n] {
			cur[i] |= b
		}
	}
	return bufs, e.b.WritevAt(bufs, it.off, it.fua)
}

// completeLocked finishes a batch: records stats, releases dependents,
// unlinks and recycles the items, and returns the requests whose Done is
// to be called (after the lock is dropped).
func (e *Engine) completeLocked(head *item, now int64, done []*Request) []*Request {
	var bytes int64
	for it := head; it != nil; it = it.bnext {
		bytes += it.end - it.off
	}
	if !head.released {
		e.st.backendOps.add(head.op, 1)
	}
	switch head.op {
	case OpRead:
		e.st.bytesRead += uint64(bytes)
		e.st.rsizes.record(bytes)
	case OpWrite:
		e.st.bytesWritten += uint64(bytes)
		e.st.wsizes.record(bytes)
	case OpWriteRepeat, OpCompareWrite, OpOrWrite:
		if head.err == nil {
			e.st.bytesWritten += uint64(bytes)
		}
	}
	woke := 0
	for it := head; it != nil; {
		next := it.bnext
		if it.op == OpBarrier && !it.released && it.err == nil {
			// The barrier holds: its submitter hears so, and it stays
			// outstanding (later writes keep depending on it) until
			// releaseBarrier completes it.
			it.holding = true
			if it.r.Done != nil {
				done = append(done, it.r)
			}
			it = next
			continue
		}
		lat := now - it.submitted
		e.st.latency.record(lat)
		switch it.op {
		case OpRead:
			e.st.rlat.record(lat)
		case OpWrite:
			e.st.wlat.record(lat)
		case OpFlush:
			e.st.flat.record(lat)
		}
		if it.err != nil {
			e.st.errors++
			if isNoSpace(it.err) {
				e.st.noSpace++
				if e.cfg.OnNoSpace != nil {
					e.cfg.OnNoSpace()
				}
			}
		}
		for _, d := range it.dependents {
			d.deps--
			if d.deps == 0 {
				e.makeReadyLocked(d, now)
				woke++
			}
		}
		if it.oprev != nil {
			it.oprev.onext = it.onext
		} else {
			e.outHead = it.onext
		}
		if it.onext != nil {
			it.onext.oprev = it.oprev
		} else {
			e.outTail = it.oprev
		}
		r := it.r
		// INVARIANT: Err is set, and the item is off every list, before
		// Done is called, so a request submitted from Done (or after it)
		// sees this one as finished.
		r.Err = it.err
		if r.Done != nil {
			done = append(done, r)
		}
		e.outstanding--
		if it.op == OpWrite {
			e.outWrites--
			e.dispWrites--
		}
		e.freeLocked(it)
		it = next
	}
	for ; woke > 0 && e.idle > 0; woke-- {
		e.workCond.Signal()
	}
	if e.spaceWaiters > 0 || e.closing {
		e.spaceCond.Broadcast()
	}
	return done
}

// Barrier queues a barrier and waits until it holds: every write, trim,
// write-zeroes and compound write submitted before it has completed and
// the backend was synced (a consistent point-in-time image, what a
// snapshot needs). Until release is called, modifying requests submitted
// later wait in the queue behind it; their submitters are not blocked
// (Submit returns; only the MaxQueue bound applies), so a Done callback
// that submits, or an inline request's submitter, can never wait on the
// barrier. Reads, flushes and cache hints keep flowing. release is
// idempotent; it must be called (Close waits for it).
//
// A barrier is one queued request, not a lock held by submitters: the
// ordering is the engine's, like every other.
func (e *Engine) Barrier() (release func(), err error) {
	ch := make(chan struct{}, 1)
	r := &Request{Op: OpBarrier, Done: func(*Request) { ch <- struct{}{} }}
	e.queue(r)
	<-ch
	if r.Err != nil {
		return nil, r.Err
	}
	var once sync.Once
	return func() { once.Do(func() { e.releaseBarrier(r) }) }, nil
}

// releaseBarrier completes a holding barrier: the writes behind it become
// ready.
func (e *Engine) releaseBarrier(r *Request) {
	e.mu.Lock()
	var it *item
	for o := e.outHead; o != nil; o = o.onext {
		if o.r == r && o.holding {
			it = o
			break
		}
	}
	if it == nil {
		e.mu.Unlock()
		return
	}
	it.released, it.bnext = true, nil
	r.Done = nil
	done := e.completeLocked(it, e.now(), nil)
	e.mu.Unlock()
	for _, d := range done {
		d.Done(d)
	}
}

// Do submits r and waits for it, returning r.Err. It uses r.Done and r.Ctx
// internally and restores them before returning.
func (e *Engine) Do(r *Request) error {
	ch := e.doChans.Get().(chan struct{})
	saveDone, saveCtx := r.Done, r.Ctx
	r.Done, r.Ctx = doDone, ch
	e.Submit(r)
	<-ch
	r.Done, r.Ctx = saveDone, saveCtx
	e.doChans.Put(ch)
	return r.Err
}

func doDone(r *Request) { r.Ctx.(chan struct{}) <- struct{}{} }

// Stats returns a snapshot of the counters.
// isNoSpace: the host filesystem is full (or the quota spent), the error
// thin provisioning turns into and an operator must hear about at once.
func isNoSpace(err error) bool {
	return errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT)
}

func (e *Engine) Stats() Stats {
	e.mu.Lock()
	defer e.mu.Unlock()
	s := &e.st
	return Stats{
		Requests:       s.requests,
		Rejected:       s.rejected,
		BackendOps:     s.backendOps,
		Errors:         s.errors,
		NoSpaceErrors:  s.noSpace,
		BytesRead:      s.bytesRead,
		BytesWritten:   s.bytesWritten,
		Merged:         s.merged,
		Held:           s.held,
		Inlined:        s.inlined,
		GatherTimeouts: s.gatherTimeouts,
		GatherHold:     time.Duration(e.holdLocked()),
		QueueDepth:     e.outstanding,
		MaxQueueDepth:  s.maxQueue,
		InFlight:       s.inflight,
		MaxInFlight:    s.maxInF,
		Latency:        s.latency.snapshot(),
		ReadLatency:    s.rlat.snapshot(),
		WriteLatency:   s.wlat.snapshot(),
		FlushLatency:   s.flat.snapshot(),
		WriteSizes:     s.wsizes.snapshot(),
		ReadSizes:      s.rsizes.snapshot(),
	}
}

// Config returns the effective configuration (defaults filled in).
func (e *Engine) Config() Config { return e.cfg }

// Close stops accepting requests (later Submits fail with ErrClosed), waits
// for every outstanding request to complete, syncs the backend and stops
// the workers. It does not close the backend. Safe to call more than once.
func (e *Engine) Close() error {
	e.mu.Lock()
	if e.closing {
		e.mu.Unlock()
		<-e.closeDone
		return e.closeErr
	}
	e.closing = true
	e.workCond.Broadcast() // held writes go now
	e.spaceCond.Broadcast()
	for e.outstanding > 0 {
		e.spaceCond.Wait()
	}
	e.stopped = true
	e.workCond.Broadcast()
	e.mu.Unlock()
	e.wg.Wait()
	e.timer.Stop()
	if c, ok := e.timer.(closer); ok {
		c.close()
	}
	e.closeErr = e.b.Sync()
	close(e.closeDone)
	return e.closeErr
}
