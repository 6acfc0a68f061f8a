// connect.go: the connection life cycle — Connect (send Hello and bitmap),
// Listen, Disconnect/AdminDisconnect and what a lost connection does to
// in-flight state, the handshake messages (Hello, Bitmap, Role) and the
// connect-time decision (maybeDecide, using Decide in decide.go).
//
// INVARIANT: peerRole/peerDisk are RoleUnknown/DiskUnknown while
// conn < Handshake (NewNode, disconnect) and until the peer's Hello.
// INVARIANT: both sides decide from the same two Hellos (sentHello, not our
// state at decide time); a write that went local-only during the handshake
// (hsWrites) turns NoSync into BitmapSource, so the peer gets it.
// INVARIANT: a primary never becomes sync target: that decision
// disconnects to StandAlone (and onSyncStart refuses it).
// INVARIANT: from the SyncStart it sends until its SyncDone, a sync source
// reports the peer's disk as Inconsistent (the target's state then).
// INVARIANT: discard-my-data is used by at most one decision.
// INVARIANT: the handshake makes progress (Connect, the peer's Hello or a
// bitmap frame, our decision to be sync target) within handshakeTimeout =
// max(PingTimeout, KoTicks) ticks, or Tick abandons it (tick.go).
// INVARIANT: at disconnect every write waiting for the peer's ack has its
// chunks marked out of sync before it is released; protocol A writes sent
// but not reported received (sentA) are marked too; held writes are issued
// local-only; resync, verify and compare state is dropped.

package repl

import "errors"

func (n *Node) hello() Hello {
	return Hello{
		NodeID: n.cfg.NodeID, Gens: n.meta.Gens, Role: n.meta.Role, Disk: n.meta.Disk,
		Protocol: n.cfg.Protocol, CrashedPrimary: n.meta.CrashedPrimary && !n.crashedCleared(),
		PromotedAt: n.meta.PromotedAt, Size: n.cfg.Size, Dirty: n.bm.Count(),
		DiscardMyData: n.discardMyData,
	}
}

// crashedCleared: the flag in meta is about the previous life; while we are
// primary now it is still reported so the peer resyncs our AL extents.
func (n *Node) crashedCleared() bool { return false }

// Connect tells the node both transport channels are up. It sends Hello
// and our bitmap and waits for the peer's.
func (n *Node) Connect() {
	if n.conn != Connecting && n.conn != StandAlone {
		return
	}
	n.conn = Handshake
	n.since, n.heard, n.lastPing, n.hsAt = n.tick, n.tick, n.tick, n.tick
	n.awaitStart = false
	n.peerHello, n.peerBitmap, n.peerBMDone = nil, NewBitmap(n.cfg.Size), false
	n.seq = 0
	n.sentHello, n.hsWrites = n.hello(), false
	n.send(Message{Type: MsgHello, Data: EncodeHello(n.sentHello)})
	runs := n.bm.Runs()
	// Split the run list so no frame exceeds MaxData.
	const perFrame = 1 << 20
	for len(runs) > perFrame {
		n.send(Message{Type: MsgBitmap, Data: EncodeRuns(runs[:perFrame])})
		runs = runs[perFrame:]
	}
	n.send(Message{Type: MsgBitmap, Flags: FlagLast, Data: EncodeRuns(runs)})
}

// Listen puts a StandAlone node in Connecting (the driver starts dialing).
func (n *Node) Listen() {
	if n.conn == StandAlone {
		n.conn = Connecting
	}
}

// ConnectDiscardMyData is Listen for DRBD's one-shot `connect
// --discard-my-data`: if the next handshake finds split brain, this node's
// changes are dropped and it becomes the peer's sync target, whatever the
// split-brain policy. The flag goes to the peer in the Hello (both sides
// decide alike) and is cleared once a handshake reached a decision. A
// primary refuses (its data is what its clients see; demote it first), and
// so does a node already connected or handshaking (its Hello is sent).
func (n *Node) ConnectDiscardMyData() error {
	if n.meta.Role == Primary {
		return ErrDiscardPrimary
	}
	if n.conn >= Handshake {
		return ErrConnected
	}
	n.discardMyData = true
	n.Listen()
	return nil
}

// AdminDisconnect drops the connection and stays StandAlone.
func (n *Node) AdminDisconnect() {
	n.disconnect("administrative disconnect", StandAlone)
}

// Disconnect tells the node the transport is gone (it will be redialed).
func (n *Node) Disconnect(reason string) {
	if n.conn == StandAlone {
		return
	}
	n.disconnect(reason, Connecting)
}

func (n *Node) disconnect(reason string, to ConnState) {
	wasUp := n.conn.up()
	was := n.conn
	n.conn = to
	if was != StandAlone && was != Connecting {
		n.rd.Disconnect = reason
		n.stats.Disconnects++
	}
	if reason != "" && to == StandAlone || was >= Handshake {
		n.lastErr = reason
	}
	// Primary: writes the peer never confirmed may be missing there.
	// Range over a copy: maybeRelease removes released writes from
	// n.order, and ranging over the slice being shifted would skip the
	// write after each one released (left pending forever, never marked).
	for _, p := range append([]*pendingWrite(nil), n.order...) {
		if p.peerWait {
			p.peerWait = false
			if p.w.Op != OpFlush {
				n.bm.SetRange(p.w.Offset, p.w.Length)
			}
			n.bmDirty = true
			n.maybeRelease(p)
		}
	}
	clear(n.bySeq)
	// Protocol A writes already answered but not known to have reached
	// the peer.
	for _, sp := range n.sentA {
		n.bm.SetRange(sp.off, sp.len)
		n.bmDirty = true
	}
	clear(n.sentA)
	if wasUp && n.meta.Role == Primary && n.meta.Gens.Bitmap == 0 {
		n.meta.Gens.newCurrent(n.newGen())
		n.metaDirty = true
	}
	// Secondary: drop stream items not yet submitted (unacked, so the
	// primary has marked them out of sync); submitted ones finish quietly.
	kept := n.rx[:0]
	for _, it := range n.rx {
		if it.submitted && !it.done {
			kept = append(kept, it)
		} else {
			delete(n.rxByID, it.id)
		}
	}
	n.rx = kept
	clear(n.rs)
	clear(n.rsByOff)
	clear(n.cmp)
	// Resync ranges applied but not acknowledged: the source still has
	// their bits and resends them; a flush still in flight (rsFlushID)
	// completes without acknowledging anything on a later connection.
	n.rsPend, n.rsFlushing = nil, nil
	n.peerHello = nil
	n.awaitStart = false
	// What we knew of the peer is stale from now on: report it as unknown
	// (DRBD's DUnknown) rather than as it was at the last contact.
	n.peerRole, n.peerDisk = RoleUnknown, DiskUnknown
	n.bmDirty = true
	n.metaDirty = true
	// Writes held for the handshake or a resync conflict go local-only.
	n.flushHeld()
}

// onHello: the peer's Hello, once per handshake.
func (n *Node) onHello(m Message) error {
	if n.conn != Handshake || n.peerHello != nil {
		return errors.New("unexpected Hello")
	}
	h, err := DecodeHello(m.Data)
	if err != nil {
		return err
	}
	n.peerHello = &h
	n.peerRole, n.peerDisk = h.Role, h.Disk
	n.hsAt = n.tick
	n.maybeDecide()
	return nil
}

// onBitmap: one frame of the peer's dirty bitmap; FlagLast ends it.
func (n *Node) onBitmap(m Message) error {
	if n.conn != Handshake || n.peerBMDone {
		return errors.New("unexpected Bitmap")
	}
	err := ForEachRun(m.Data, n.bm.Chunks(), func(r Run) {
		for i := r.Start; i < r.End; i++ {
			n.peerBitmap.SetChunk(i)
		}
	})
	if err != nil {
		return err
	}
	n.hsAt = n.tick
	if m.Flags&FlagLast != 0 {
		n.peerBMDone = true
		n.maybeDecide()
	}
	return nil
}

// onRole: the peer was promoted or demoted.
func (n *Node) onRole(m Message) error {
	if Role(m.Op) > Primary {
		return errors.New("bad role")
	}
	n.peerRole = Role(m.Op)
	return nil
}

func (n *Node) maybeDecide() {
	if n.peerHello == nil || !n.peerBMDone {
		return
	}
	d := Decide(n.sentHello, *n.peerHello, n.cfg.SplitBrain)
	// discard-my-data is one-shot: it applied to this decision (sent in
	// our Hello) and not to later handshakes.
	n.discardMyData = false
	if d.Kind == NoSync && n.hsWrites {
		// Identical when the Hellos were sent, but we wrote since (the
		// writes went local-only and are in our bitmap): resync them. The
		// peer decided NoSync and is Connected; a SyncStart moves it to
		// SyncTarget, as after an online verify.
		d = Decision{Kind: BitmapSource, Rule: d.Rule, Reason: "writes during the handshake"}
	}
	n.lastDecision = d
	if d.Kind != SplitBrain && d.Kind != Unrelated && d.Kind != Refused {
		n.lastErr = ""
	}
	switch d.Kind {
	case SplitBrain, Unrelated, Refused:
		n.disconnect(d.Kind.String()+": "+d.Reason, StandAlone)
		return
	case BitmapTarget, FullTarget:
		if n.meta.Role == Primary {
			n.disconnect("refused: this primary would become sync target (demote it first)", StandAlone)
			return
		}
		n.conn = SyncTarget // the source's SyncStart sets generation and disk
		n.awaitStart, n.hsAt = true, n.tick
		// The source resyncs exactly this set (it computes the same
		// union): keep it in our bitmap, persisted before any resync data
		// lands, and clear bits as the data becomes durable here
		// (rsFlushDone). That gives the target its progress, and a
		// restarted target sends what is left instead of everything.
		if d.Kind == FullTarget {
			n.bm.SetAll()
		}
		n.bm.Or(n.peerBitmap)
		n.peerBitmap = nil
		n.rsKnown, n.rsDone, n.rsTotal = true, 0, n.outOfSync()
		n.bmDirty = true
	case NoSync:
		n.conn = Connected
		if n.meta.Gens.Bitmap != 0 {
			n.meta.Gens.pushHistory(n.meta.Gens.Bitmap)
			n.meta.Gens.Bitmap = 0
		}
		if n.meta.Gens.Current == 0 && n.peerHello.Gens.Current == 0 {
			// Two fresh all-zero replicas are identical.
			n.meta.Disk, n.peerHello.Disk = UpToDate, UpToDate
		}
		n.bm.LoadWords(nil)
		n.metaDirty, n.bmDirty = true, true
	case BitmapSource, FullSource:
		if d.Kind == FullSource {
			n.bm.SetAll()
		}
		n.bm.Or(n.peerBitmap)
		n.peerBitmap = nil
		if n.meta.Gens.Bitmap == 0 {
			n.meta.Gens.newCurrent(n.newGen())
		}
		n.cursor, n.rsTotal = 0, n.outOfSync()
		n.send(Message{Type: MsgSyncStart, Seq: n.meta.Gens.Bitmap, Length: n.rsTotal})
		n.conn = SyncSource
		n.metaDirty, n.bmDirty = true, true
	}
	n.peerRole, n.peerDisk = n.peerHello.Role, n.peerHello.Disk
	if n.conn == SyncSource {
		// The SyncStart makes the peer Inconsistent until our SyncDone,
		// whatever its Hello said (a cleanly restarted secondary says
		// UpToDate): never report the peer UpToDate mid-resync.
		n.peerDisk = Inconsistent
	}
	n.flushHeld()
	n.pump()
}
