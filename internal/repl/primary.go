// primary.go: client writes on the primary — Propose, holding writes that
// overlap a resync range (mustHold, flushHeld), issue (local Apply plus the
// replicated stream, or local-only with the chunks marked), release once
// local completion and the peer's ack are in, the peer's acks (onAck) and
// LocalDone.
//
// INVARIANT: every pending write is released exactly once: maybeRelease
// emits the Release only when localDone && !peerWait and removes the write
// from writes and order; the peer wait ends by the ack (RecvAck for
// protocol B, WriteAck for C) or by the disconnect that gives up on it.
// INVARIANT: a write released without the peer's ack (issued while not
// connected, given up at a disconnect, or failed on either side) has its
// chunks set in the bitmap before its Release is emitted. Protocol A
// releases on local completion; its writes stay in sentA until the peer's
// RecvAck and a disconnect marks whatever is left.
// INVARIANT: writes never wait on a handshake: while not Connected the
// write is applied locally and marked out of sync. A write is held only
// behind an overlapping in-flight resync range (released when the range
// is acked or the connection drops) or an earlier held write it overlaps;
// held writes issue in Propose order, and a flush overtakes no held write.
// INVARIANT: every non-flush Apply acquires its activity-log extent in the
// same input (acquireAL), so no Apply is emitted before the Persist that
// covers its AL extent.
// INVARIANT: stream sequence numbers restart at each Connect; bySeq and
// sentA only hold writes sent on the current connection.

package repl

type pendingWrite struct {
	id        uint64
	w         Write
	seq       uint64
	localDone bool
	localErr  error
	peerWait  bool
	applied   bool // submitted locally
	since     int64
	hasAL     bool
}

// span is a sent protocol A write (id for tests and logs).
type span struct {
	id       uint64
	off, len int64
}

// Propose submits a client operation on the primary. The returned id comes
// back in a Release once the op is acknowledged per the protocol.
func (n *Node) Propose(w Write) (uint64, error) {
	if n.meta.Role != Primary {
		return 0, ErrNotPrimary
	}
	if n.meta.Disk == Diskless {
		return 0, ErrDiskless
	}
	if w.Op != OpFlush && (w.Offset < 0 || w.Length < 0 || w.Offset > n.cfg.Size-w.Length) {
		return 0, ErrOutOfRange
	}
	if w.Op == OpWrite && int64(len(w.Data)) != w.Length {
		return 0, ErrOutOfRange
	}
	n.nextID++
	p := &pendingWrite{id: n.nextID, w: w, since: n.tick}
	n.writes[p.id] = p
	n.order = append(n.order, p)
	if n.mustHold(p) {
		n.held = append(n.held, p)
		return p.id, nil
	}
	n.issue(p)
	return p.id, nil
}

// mustHold: during resync a write overlapping a range being resynced waits
// so stale resync data never lands after it (bounded: the range's ack, or
// the ping timeout that ends the connection); and a write never overtakes
// an earlier held write it overlaps.
//
// A write never waits for a handshake: a peer that accepted the TCP
// connection but is frozen (SIGSTOP, hung host) would hold it until the
// ping timeout, again at every redial. While not Connected the primary runs
// standalone: the write is applied locally and its chunks are marked out of
// sync (issue), and the resync after the handshake sends them (maybeDecide).
func (n *Node) mustHold(p *pendingWrite) bool {
	if p.w.Op == OpFlush {
		return len(n.held) > 0
	}
	for _, h := range n.held {
		if h.w.Op == OpFlush || overlaps(h.w.Offset, h.w.Length, p.w.Offset, p.w.Length) {
			return true
		}
	}
	for _, r := range n.rs {
		if !r.verify && overlaps(r.off, r.len, p.w.Offset, p.w.Length) {
			return true
		}
	}
	return false
}

func overlaps(a, al, b, bl int64) bool { return a < b+bl && b < a+al }

func (n *Node) flushHeld() {
	held := n.held
	n.held = nil
	for i, p := range held {
		if n.mustHold(p) {
			n.held = append(n.held, held[i:]...)
			return
		}
		n.issue(p)
	}
}

func (n *Node) issue(p *pendingWrite) {
	w := p.w
	p.since = n.tick
	if w.Op != OpFlush {
		n.acquireAL(w.Offset, w.Length)
		p.hasAL = true
	}
	if n.conn.up() {
		n.seq++
		p.seq = n.seq
		var fl uint8
		if w.FUA {
			fl |= FlagFUA
		}
		if w.NoHole {
			fl |= FlagNoHole
		}
		m := Message{Type: MsgData, Op: w.Op, Seq: p.seq, Offset: w.Offset, Length: w.Length, Flags: fl}
		if w.Op == OpWrite {
			m.Data = w.Data
		}
		n.send(m)
		n.stats.SentData++
		n.stats.SentBytes += int64(len(w.Data))
		n.appTick += w.Length
		if n.cfg.Protocol != ProtoA {
			p.peerWait = true
			n.bySeq[p.seq] = p
		} else if w.Op != OpFlush {
			n.sentA[p.seq] = span{p.id, w.Offset, w.Length}
		}
	} else if w.Op != OpFlush {
		if n.conn == Handshake {
			n.hsWrites = true
		}
		if n.meta.Gens.Bitmap == 0 && n.meta.Gens.Current != 0 {
			// First write without the peer in this generation: start a new
			// one (persisted before the write is applied), so the peer can
			// never mistake us for an older copy of its own data. Without
			// this a primary restarted while disconnected would write under
			// the generation the peer also holds.
			n.meta.Gens.newCurrent(n.newGen())
			n.metaDirty = true
		}
		// The bit need not be persisted now: the AL covers this extent
		// until eviction or retirement, which persist the bitmap first.
		n.bm.SetRange(w.Offset, w.Length)
	}
	p.applied = true
	n.rd.Apply = append(n.rd.Apply, Apply{ID: p.id, Op: w.Op, Offset: w.Offset, Length: w.Length, Data: w.Data, FUA: w.FUA, NoHole: w.NoHole})
}

func (n *Node) maybeRelease(p *pendingWrite) {
	if !p.localDone || p.peerWait {
		return
	}
	delete(n.writes, p.id)
	for i, q := range n.order {
		if q == p {
			n.order = append(n.order[:i], n.order[i+1:]...)
			break
		}
	}
	n.rd.Release = append(n.rd.Release, Release{ID: p.id, Err: p.localErr})
}

// LocalDone reports that Apply id finished: an AL retirement flush, a
// sync target's resync flush (resync.go), a client write on the primary,
// or a stream item on the secondary (secondary.go).
func (n *Node) LocalDone(id uint64, err error) {
	if id != 0 && id == n.retireID {
		n.retireDone(err)
		return
	}
	if id != 0 && id == n.rsFlushID {
		n.rsFlushDone(err)
		return
	}
	if p, ok := n.writes[id]; ok {
		p.localDone, p.localErr = true, err
		if p.hasAL {
			n.al.release(p.w.Offset, p.w.Length)
		}
		if err != nil && p.w.Op != OpFlush {
			// The peer may have it, we may not: out of sync either way.
			n.bm.SetRange(p.w.Offset, p.w.Length)
		}
		n.maybeRelease(p)
		n.pump()
		return
	}
	if it, ok := n.rxByID[id]; ok {
		it.done, it.err = true, err
		if it.hasAL {
			n.al.release(it.m.Offset, max(it.m.Length, 1))
		}
		n.drainRx()
	}
}

// onAck: the peer received (RecvAck) or applied (WriteAck) replicated write
// m.Seq. Which of the two releases the write depends on the protocol.
func (n *Node) onAck(m Message) {
	if n.cfg.Protocol == ProtoA {
		// The peer has the write: a disconnect need no longer mark it.
		delete(n.sentA, m.Seq)
		return
	}
	p, ok := n.bySeq[m.Seq]
	if !ok {
		return // ack for a write already given up on
	}
	if m.Type == MsgRecvAck && n.cfg.Protocol != ProtoB {
		return
	}
	delete(n.bySeq, m.Seq)
	p.peerWait = false
	if m.Flags&FlagErr != 0 && p.w.Op != OpFlush {
		n.bm.SetRange(p.w.Offset, p.w.Length)
		n.bmDirty = true
	}
	n.maybeRelease(p)
	n.pump()
}
