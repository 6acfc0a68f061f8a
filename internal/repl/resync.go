// resync.go: resync and online verify. Source side: StartVerify, pump
// (pumpResync/pumpVerify within the rate budget and in-flight limit),
// ReadDone (send data, zero ranges or hashes), the target's acks and hash
// replies (rsAcked, hashReply), SyncDone. Target side: SyncStart/SyncDone,
// hash requests and compareDone.
//
// INVARIANT: stale resync data never lands after a newer write: a resync
// read never starts over an in-flight application write (appOverlap), and
// an application write overlapping an in-flight resync range is held until
// the range completes (mustHold, primary.go).
// INVARIANT: the source clears a chunk's bit only when the target acked
// its range without error or the hashes matched; verify only sets bits.
// INVARIANT: at most ResyncInflight ranges are in flight; with ResyncRate
// set a read is issued only while the budget is positive, and the debt of
// a larger read carries over to the next ticks.
// INVARIANT: SyncDone is sent only with no range in flight and an empty
// bitmap.
// INVARIANT: a sync target acknowledges resync data (RSAck) only after a
// local flush issued once the data's write had completed succeeded, so a
// bit cleared on either side covers data durable on the target; resync
// writes therefore take no activity-log extent (the bits cover them), and
// a restarted target resyncs what is left, not its recent extents.
// INVARIANT: resync progress (cleared bits) reaches disk at most
// PingInterval ticks late (persistProgress); a later bitmap on disk only
// has more bits set, never fewer.
// INVARIANT: a hash request's length is bounded (MaxData, volume size)
// before the driver reads and allocates it; results arriving after a
// disconnect are dropped (rs and cmp are cleared there).

package repl

import (
	"bytes"
	"errors"
	"fmt"
)

type rsRange struct {
	off, len    int64
	outstanding int         // pieces not yet acked
	pieces      []ReadPiece // kept for checksum mode until the hash reply
	reading     bool
	verify      bool
}

// StartVerify begins online verify (we compare the peer's hashes).
func (n *Node) StartVerify() error {
	if n.conn != Connected {
		if n.conn.up() {
			return ErrBusy
		}
		return ErrNotConnected
	}
	n.conn = VerifySource
	n.verifyCur = 0
	n.stats.VerifyDiff = 0
	n.pump()
	return nil
}

// ReadDone reports a resync/verify Read's result.
func (n *Node) ReadDone(id uint64, pieces []ReadPiece, err error) {
	if m, ok := n.cmp[id]; ok {
		delete(n.cmp, id)
		n.compareDone(m, pieces, err)
		return
	}
	r, ok := n.rs[id]
	if !ok || !n.conn.up() {
		return
	}
	r.reading = false
	if err != nil {
		delete(n.rs, id)
		delete(n.rsByOff, r.off)
		n.lastErr = "resync read: " + err.Error()
		n.flushHeld()
		return
	}
	if r.verify {
		for _, pc := range pieces {
			n.send(Message{Type: MsgVerifyReq, Offset: pc.Offset, Length: pc.Length, Data: append([]byte(nil), pc.Hash[:]...)})
			r.outstanding++
		}
		return
	}
	for _, pc := range pieces {
		switch {
		case pc.Zero:
			n.send(Message{Type: MsgRSZero, Offset: pc.Offset, Length: pc.Length})
			n.stats.ResyncZeroBytes += pc.Length
			if n.cfg.ResyncRate > 0 {
				// A zero range crosses the link as a header: give back the
				// budget it was charged when the read was issued.
				n.budget = min(n.budget+pc.Length, n.cfg.ResyncRate)
			}
		case n.cfg.Checksum:
			n.send(Message{Type: MsgRSHash, Offset: pc.Offset, Length: pc.Length, Data: append([]byte(nil), pc.Hash[:]...)})
			r.pieces = append(r.pieces, pc)
		default:
			n.send(Message{Type: MsgRSData, Offset: pc.Offset, Length: pc.Length, Data: pc.Data})
			n.stats.ResyncBytes += pc.Length
		}
		r.outstanding++
	}
	if r.outstanding == 0 {
		n.rangeDone(id, r)
	}
}

// pump issues resync or verify reads within the rate and in-flight limits.
func (n *Node) pump() {
	switch n.conn {
	case SyncSource:
		n.pumpResync()
	case VerifySource:
		n.pumpVerify()
	}
}

func (n *Node) spend(l int64) bool {
	if n.cfg.ResyncRate <= 0 {
		return true
	}
	if n.budget <= 0 {
		return false
	}
	n.budget -= l
	return true
}

func (n *Node) pumpResync() {
	for len(n.rs) < n.cfg.ResyncInflight {
		start := n.bm.NextSet(n.cursor)
		if start < 0 && n.cursor > 0 {
			n.cursor = 0
			start = n.bm.NextSet(0)
		}
		if start < 0 {
			break
		}
		end := start + 1
		for end < n.bm.Chunks() && n.bm.Test(end) && (end-start)*ChunkSize < n.cfg.ResyncIO {
			end++
		}
		off, l := start*ChunkSize, min(end*ChunkSize, n.cfg.Size)-start*ChunkSize
		if _, busy := n.rsByOff[off]; busy || n.appOverlap(off, l) {
			// In flight already (wrapped around) or an application write
			// to it is in flight locally: reading now could send stale
			// data after it. Try again when something completes.
			if n.cursor == 0 {
				break
			}
			n.cursor = 0
			continue
		}
		if !n.spend(l) {
			break
		}
		n.cursor = end
		n.nextID++
		r := &rsRange{off: off, len: l, reading: true}
		n.rs[n.nextID], n.rsByOff[off] = r, r
		n.rd.Reads = append(n.rd.Reads, Read{ID: n.nextID, Offset: off, Length: l, WantHash: n.cfg.Checksum, NeedData: true})
		if n.cursor >= n.bm.Chunks() {
			n.cursor = 0
		}
	}
	n.maybeSyncDone()
}

func (n *Node) appOverlap(off, l int64) bool {
	for _, p := range n.order {
		if p.applied && !p.localDone && p.w.Op != OpFlush && overlaps(off, l, p.w.Offset, p.w.Length) {
			return true
		}
	}
	return false
}

func (n *Node) maybeSyncDone() {
	if n.conn != SyncSource || len(n.rs) > 0 || n.bm.Count() > 0 {
		return
	}
	n.meta.Gens.pushHistory(n.meta.Gens.Bitmap)
	n.meta.Gens.Bitmap = 0
	n.metaDirty, n.bmDirty = true, true
	n.send(Message{Type: MsgSyncDone, Seq: n.meta.Gens.Current})
	n.conn = Connected
	n.peerDisk = UpToDate
}

func (n *Node) pumpVerify() {
	for len(n.rs) < n.cfg.ResyncInflight && n.verifyCur < n.cfg.Size {
		// 256 KiB per hash: finer than ResyncIO so one bad byte does not
		// mark a whole megabyte, coarse enough to keep messages few.
		l := min(4*ChunkSize, n.cfg.Size-n.verifyCur)
		if !n.spend(l) {
			return
		}
		n.nextID++
		r := &rsRange{off: n.verifyCur, len: l, reading: true, verify: true}
		n.rs[n.nextID], n.rsByOff[r.off] = r, r
		n.rd.Reads = append(n.rd.Reads, Read{ID: n.nextID, Offset: r.off, Length: l, WantHash: true})
		n.verifyCur += l
	}
	if len(n.rs) == 0 && n.verifyCur >= n.cfg.Size {
		n.send(Message{Type: MsgVerifyDone})
		n.conn = Connected
		if n.bm.Count() > 0 && n.meta.Role == Primary {
			// Resync what verify found, from the primary. The peer does
			// not know which chunks: Length tells it how much, for its
			// progress.
			n.cursor, n.rsTotal = 0, n.outOfSync()
			n.send(Message{Type: MsgSyncStart, Seq: 0, Length: n.rsTotal})
			n.conn = SyncSource
			n.peerDisk = Inconsistent
			n.pump()
		}
	}
}

// findRange locates the in-flight range containing [off, off+l).
func (n *Node) findRange(off, l int64) (uint64, *rsRange) {
	for id, r := range n.rs {
		if off >= r.off && off+l <= r.off+r.len {
			return id, r
		}
	}
	return 0, nil
}

func (n *Node) rsAcked(off, l int64, failed bool) error {
	id, r := n.findRange(off, l)
	if r == nil {
		return nil // from before a reconnect
	}
	r.outstanding--
	if failed {
		// Bits stay set: the range is resent on a later pass.
		n.lastErr = "peer failed to apply resync data"
	}
	if r.outstanding <= 0 && !r.reading {
		if !r.verify && !failed {
			// The target acknowledges resync data only once it is durable
			// there (rsFlushDone), so the bit may go, and may be persisted.
			n.bm.ClearRange(r.off, r.len, n.cfg.Size)
			n.bmDirty = n.bmDirty || n.bm.Count() == 0
			n.progressDirty = true
		}
		n.rangeDone(id, r)
	}
	return nil
}

func (n *Node) rangeDone(id uint64, r *rsRange) {
	delete(n.rs, id)
	delete(n.rsByOff, r.off)
	n.flushHeld()
	n.pump()
}

func (n *Node) hashReply(off, l int64, match bool) error {
	_, r := n.findRange(off, l)
	if r == nil {
		return nil
	}
	for i, pc := range r.pieces {
		if pc.Offset != off || pc.Length != l {
			continue
		}
		r.pieces = append(r.pieces[:i], r.pieces[i+1:]...)
		if match {
			n.stats.ResyncHashMatchBytes += l
			return n.rsAcked(off, l, false)
		}
		n.send(Message{Type: MsgRSData, Offset: off, Length: l, Data: pc.Data})
		n.stats.ResyncBytes += l
		return nil
	}
	return nil
}

// compareDone: a target-side hash read for MsgRSHash/MsgVerifyReq finished.
func (n *Node) compareDone(m Message, pieces []ReadPiece, err error) {
	if !n.conn.up() {
		return
	}
	match := err == nil && len(pieces) > 0
	if match {
		if len(pieces) == 1 {
			match = bytes.Equal(pieces[0].Hash[:], m.Data)
		} else {
			// The driver returns one piece per hash request (WantHash
			// without NeedData); anything else is treated as different.
			match = false
		}
	}
	var fl uint8
	if match {
		fl = FlagMatch
	}
	t := MsgVerifyReply
	if m.Type == MsgRSHash {
		t = MsgRSHashReply
		if match {
			n.bm.ClearRange(m.Offset, m.Length, n.cfg.Size)
			n.rsDone += m.Length
			n.progressDirty = true
		}
	}
	n.send(Message{Type: t, Offset: m.Offset, Length: m.Length, Flags: fl})
}

// refillBudget refills the resync budget once per tick.
func (n *Node) refillBudget() {
	if n.cfg.ResyncRate > 0 {
		rate := n.cfg.ResyncRate
		if n.cfg.ResyncMinRate > 0 {
			rate = max(n.cfg.ResyncRate-n.appLast, n.cfg.ResyncMinRate)
		}
		// Debt from a read larger than one tick's budget carries over, so
		// the long-run rate is right; unused budget does not accumulate.
		n.budget = min(n.budget+rate, rate)
	}
}

// ---- resync / verify target ----

// onSyncStart: the source starts a resync to us (the last step of its
// handshake, or after an online verify found differences).
func (n *Node) onSyncStart(m Message) error {
	if n.conn != SyncTarget && n.conn != Connected {
		return fmt.Errorf("SyncStart while %v", n.conn)
	}
	if n.meta.Role == Primary {
		return errors.New("primary cannot be sync target")
	}
	if n.conn == Connected {
		// After an online verify, or writes the source made during the
		// handshake: only the source knows which chunks come; it says
		// how many bytes (Length, 0 from an older source).
		n.rsKnown, n.rsDone, n.rsTotal = false, 0, m.Length
	}
	n.conn = SyncTarget
	n.awaitStart = false
	if m.Seq != 0 && m.Seq != n.meta.Gens.Current {
		n.meta.Gens.pushHistory(n.meta.Gens.Current)
		n.meta.Gens.Current = m.Seq
	}
	n.meta.Disk = Inconsistent
	n.metaDirty = true
	return nil
}

// onSyncDone: the source finished the resync (or, for a fresh volume, a
// newly promoted peer names the first generation): we are UpToDate.
func (n *Node) onSyncDone(m Message) error {
	if n.meta.Role == Primary {
		return errors.New("SyncDone on a primary")
	}
	if n.meta.Gens.Current != m.Seq {
		n.meta.Gens.pushHistory(n.meta.Gens.Current)
	}
	n.meta.Gens.Current, n.meta.Gens.Bitmap = m.Seq, 0
	n.awaitStart = false
	n.meta.Disk = UpToDate
	n.bm.LoadWords(nil)
	n.metaDirty, n.bmDirty = true, true
	n.conn = Connected
	n.peerDisk = UpToDate
	return nil
}

// targetProgress is a sync target's resync total and what is left, in
// bytes: the bitmap holds what is left when the handshake decided the set
// (rsKnown), else only the source knows and we count what was done.
func (n *Node) targetProgress() (total, left int64) {
	if n.rsKnown {
		left = n.outOfSync()
		return max(n.rsTotal, left), left
	}
	return n.rsTotal, max(n.rsTotal-n.rsDone, 0)
}

// rsApplied (target): resync range it was applied without error. It is
// acknowledged once a flush made it durable, never before: the source
// then clears (and may persist) its bit, and a crash here must not lose
// data the source no longer marks. Flushes are group commits: one in
// flight, covering every range applied before it was issued.
func (n *Node) rsApplied(off, l int64) {
	n.rsPend = append(n.rsPend, span{off: off, len: l})
	n.maybeFlushResync()
}

func (n *Node) maybeFlushResync() {
	if n.rsFlushID != 0 || len(n.rsPend) == 0 {
		return
	}
	n.nextID++
	n.rsFlushID = n.nextID
	n.rsFlushing, n.rsPend = n.rsPend, nil
	n.rd.Apply = append(n.rd.Apply, Apply{ID: n.rsFlushID, Op: OpFlush})
}

// rsFlushDone (target): the flush covering rsFlushing finished. Its
// ranges are durable: clear their bits and acknowledge them. A failed
// flush acknowledges them with the error, so the source keeps their bits
// and resends them on a later pass.
func (n *Node) rsFlushDone(err error) {
	n.rsFlushID = 0
	done := n.rsFlushing
	n.rsFlushing = nil
	if !n.conn.up() {
		return // dropped at the disconnect; the source resends them
	}
	var fl uint8
	if err != nil {
		fl = FlagErr
		n.lastErr = "resync flush: " + err.Error()
	}
	for _, sp := range done {
		if err == nil {
			n.bm.ClearRange(sp.off, sp.len, n.cfg.Size)
			n.rsDone += sp.len
			n.progressDirty = true
		}
		n.send(Message{Type: MsgRSAck, Offset: sp.off, Length: sp.len, Flags: fl})
	}
	n.maybeFlushResync()
}

// persistProgress (from Tick) persists the bitmap when resync cleared
// bits, at most every PingInterval ticks: a bitmap write per acknowledged
// range would cost more than the resync, and a bitmap older by a second
// only means that second is resynced again after a restart.
func (n *Node) persistProgress() {
	if n.progressDirty && n.tick-n.progressAt >= int64(n.cfg.PingInterval) {
		n.progressDirty, n.progressAt = false, n.tick
		n.bmDirty = true
	}
}

// onHashReq: the source sent a checksum (RSHash, checksum resync) or a
// verify hash (VerifyReq): read and hash our copy; compareDone answers.
func (n *Node) onHashReq(m Message) error {
	if m.Type == MsgVerifyReq && n.conn == Connected {
		n.conn = VerifyTarget
	}
	if m.Type == MsgRSHash && n.conn != SyncTarget || m.Type == MsgVerifyReq && n.conn != VerifyTarget {
		return fmt.Errorf("%v while %v", m.Type, n.conn)
	}
	// We will read (and the driver allocate) Length bytes: bound it.
	if m.Length <= 0 || m.Length > MaxData || m.Offset > n.cfg.Size-m.Length {
		return ErrOutOfRange
	}
	n.nextID++
	m.Data = append([]byte(nil), m.Data...)
	n.cmp[n.nextID] = m
	n.rd.Reads = append(n.rd.Reads, Read{ID: n.nextID, Offset: m.Offset, Length: m.Length, WantHash: true})
	return nil
}

// onVerifyReply (verify source): the target's verdict on one hash; a
// mismatch marks the range for the resync that follows the verify.
func (n *Node) onVerifyReply(m Message) error {
	n.stats.VerifiedBytes += m.Length
	if m.Flags&FlagMatch == 0 {
		n.bm.SetRange(m.Offset, m.Length)
		n.stats.VerifyDiff += m.Length
		n.bmDirty = true
	}
	return n.rsAcked(m.Offset, m.Length, false)
}
