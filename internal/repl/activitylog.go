// activitylog.go: the activity log (AL) — the hot extents whose dirty
// chunks may not yet be in the on-disk bitmap — acquisition by writes
// (acquireAL) and retirement of idle extents behind a local flush
// (maybeRetire from Tick, retireDone from LocalDone).
//
// INVARIANT: no Apply is emitted before the Persist that covers its AL
// extent: acquireAL marks the AL dirty in the same input as the Apply, and
// Ready persists before it applies.
// INVARIANT: an extent leaves the on-disk AL only together with a
// persisted bitmap that covers its dirty chunks (eviction and retirement
// mark both dirty; they go out in the same Persist).
// INVARIANT: an extent is retired only after a flush, issued when all of
// its writes had completed, succeeded.

package repl

import "slices"

// ALExtentSize is the activity log's extent: 4 MiB, as DRBD.
const ALExtentSize = 4 << 20

// activityLog tracks the extents ("hot" regions) that may hold writes not
// yet reflected in the on-disk bitmap. INVARIANT: every local write is
// submitted only after its extents are in the persisted AL, and an extent
// leaves the AL only when no write to it is in flight and its bitmap words
// are persisted. So after a crash, on-disk bitmap ∪ AL ⊇ every block that
// can differ from the peer.
type activityLog struct {
	cap   int
	ext   map[int64]*alEntry
	clock uint64 // deterministic LRU clock
}

type alEntry struct {
	lastTick int64 // node tick of the last write (for retirement)
	lastUse  uint64
	refs     int
}

func newActivityLog(capacity int) *activityLog {
	return &activityLog{cap: capacity, ext: make(map[int64]*alEntry)}
}

// acquire takes references on the extents of [off, off+length). It returns
// whether the AL set changed (needs persisting before the write) and the
// evicted extents (whose bitmap words must be persisted).
func (a *activityLog) acquire(off, length, tick int64) (changed bool, evicted []int64) {
	if length <= 0 {
		length = 1
	}
	for e := off / ALExtentSize; e <= (off+length-1)/ALExtentSize; e++ {
		a.clock++
		if en, ok := a.ext[e]; ok {
			en.refs++
			en.lastUse, en.lastTick = a.clock, tick
			continue
		}
		changed = true
		if len(a.ext) >= a.cap {
			if v, ok := a.victim(); ok {
				delete(a.ext, v)
				evicted = append(evicted, v)
			}
			// No idle extent: the AL grows past its capacity rather than
			// stall the write; it shrinks again on later misses.
		}
		a.ext[e] = &alEntry{lastUse: a.clock, lastTick: tick, refs: 1}
	}
	return changed, evicted
}

func (a *activityLog) release(off, length int64) {
	if length <= 0 {
		length = 1
	}
	for e := off / ALExtentSize; e <= (off+length-1)/ALExtentSize; e++ {
		if en, ok := a.ext[e]; ok && en.refs > 0 {
			en.refs--
		}
	}
}

// idle returns the extents with no write in flight last written at or
// before tick: every write to them has completed.
func (a *activityLog) idle(tick int64) []int64 {
	var out []int64
	for e, en := range a.ext {
		if en.refs == 0 && en.lastTick <= tick {
			out = append(out, e)
		}
	}
	return out
}

// retire drops those of cand that are still idle since tick (not written
// again) and reports whether any was dropped.
func (a *activityLog) retire(cand []int64, tick int64) bool {
	n := 0
	for _, e := range cand {
		if en, ok := a.ext[e]; ok && en.refs == 0 && en.lastTick <= tick {
			delete(a.ext, e)
			n++
		}
	}
	return n > 0
}

func (a *activityLog) victim() (int64, bool) {
	best, found := int64(0), false
	var bestUse uint64
	for e, en := range a.ext {
		if en.refs > 0 {
			continue
		}
		// Deterministic despite map order: lowest lastUse, then lowest extent.
		if !found || en.lastUse < bestUse || (en.lastUse == bestUse && e < best) {
			best, bestUse, found = e, en.lastUse, true
		}
	}
	return best, found
}

// extents returns the AL's extents in ascending order.
func (a *activityLog) extents() []int64 {
	out := make([]int64, 0, len(a.ext))
	for e := range a.ext {
		out = append(out, e)
	}
	slices.Sort(out)
	return out
}

func (n *Node) acquireAL(off, length int64) {
	changed, evicted := n.al.acquire(off, length, n.tick)
	if changed {
		n.alDirty = true
	}
	if len(evicted) > 0 {
		// INVARIANT: an extent leaves the on-disk AL only together with a
		// persisted bitmap that covers its dirty chunks (same Ready,
		// bitmap and AL are persisted before any Apply).
		n.bmDirty = true
	}
}

// maybeRetire issues the flush that retires idle activity-log extents
// (from Tick, every ALRetireTicks, one flush at a time).
func (n *Node) maybeRetire() {
	if n.retireID == 0 && n.tick%int64(n.cfg.ALRetireTicks) == 0 {
		cut := n.tick - int64(n.cfg.ALRetireTicks)
		if set := n.al.idle(cut); len(set) > 0 {
			// Only extents whose writes all completed before this flush is
			// issued; the flush makes them durable.
			n.nextID++
			n.retireID, n.retireTick, n.retireSet = n.nextID, cut, set
			n.rd.Apply = append(n.rd.Apply, Apply{ID: n.retireID, Op: OpFlush})
		}
	}
}

// retireDone: the retirement flush finished (LocalDone of retireID).
func (n *Node) retireDone(err error) {
	n.retireID = 0
	// The flush made every write completed before it durable; extents
	// idle since before it was issued need no replay after a crash.
	// Their dirty bits go to disk in the same Persist as the AL.
	if err == nil && n.al.retire(n.retireSet, n.retireTick) {
		n.alDirty, n.bmDirty = true, true
	}
}
