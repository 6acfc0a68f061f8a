// secondary.go: the receiving side of the replicated stream (and of resync
// data on a sync target) — rxData queues, drainRx submits in order and
// acknowledges completed items, ackRx sends the per-protocol ack.
//
// INVARIANT: a primary refuses replicated writes (protocol error).
// INVARIANT: a stream flush is submitted only after every earlier item
// completed, and no later item is submitted before it completes.
// INVARIANT: every non-flush stream item acquires its activity-log extent
// when it is submitted, so no Apply is emitted before the Persist that
// covers it; resync data takes none (its bits cover it until durable).
// INVARIANT: acks go out only while connected, and only after the item
// completed locally (protocol C WriteAck, RSAck); protocols A and B send
// RecvAck on receipt. Items not yet submitted when the connection drops
// are dropped unacknowledged: the primary has marked them out of sync.
// INVARIANT: resync data clears the target's bits and is acknowledged
// only once applied without error and flushed (resync.go); a stream write that fails here while connected marks its
// chunks and makes the local disk Inconsistent.

package repl

import (
	"errors"
	"fmt"
)

type rxItem struct {
	id        uint64
	m         Message
	resync    bool
	submitted bool
	done      bool
	err       error
	hasAL     bool
}

// rxData queues a stream op on the secondary (or resync data on a target).
func (n *Node) rxData(m Message, resync bool) error {
	if !n.conn.up() {
		return fmt.Errorf("%v while %v", m.Type, n.conn)
	}
	if !resync && n.meta.Role == Primary {
		return errors.New("replicated write received by a primary")
	}
	if m.Op != OpFlush && (m.Offset > n.cfg.Size-m.Length) {
		return ErrOutOfRange
	}
	if m.Type == MsgData && n.cfg.Protocol != ProtoC {
		// B: the client's ack. A: lets the primary forget the write (it
		// marks writes not yet received out of sync at a disconnect).
		n.send(Message{Type: MsgRecvAck, Seq: m.Seq})
	}
	n.nextID++
	// m.Data aliases the driver's receive buffer; the driver hands over
	// ownership with Step and may recycle it once LocalDone reports the
	// apply (Apply.Received).
	it := &rxItem{id: n.nextID, m: m, resync: resync}
	n.rx = append(n.rx, it)
	n.rxByID[it.id] = it
	n.stats.ReceivedData++
	n.drainRx()
	return nil
}

// drainRx submits stream items in arrival order. A flush is submitted only
// after every earlier item completed (so it covers them), and nothing after
// it is submitted before it. Completed items at the head are acknowledged.
//
// INVARIANT: the secondary submits writes to its engine in stream order,
// which is the primary's submission order; the engine never reorders
// overlapping requests, so both replicas apply overlapping writes in the
// same order.
func (n *Node) drainRx() {
	// Acknowledge completed items in order of completion is fine for
	// protocol C (acks are per seq); remove them from the queue.
	kept := n.rx[:0]
	for _, it := range n.rx {
		if it.done {
			n.ackRx(it)
			delete(n.rxByID, it.id)
			continue
		}
		kept = append(kept, it)
	}
	for i := len(kept); i < len(n.rx); i++ {
		n.rx[i] = nil
	}
	n.rx = kept
	for i, it := range n.rx {
		if it.submitted {
			if it.m.Op == OpFlush {
				return // barrier still running
			}
			continue
		}
		if it.m.Op == OpFlush && it.m.Type == MsgData {
			if i > 0 {
				return // wait for everything before it
			}
		}
		it.submitted = true
		a := Apply{ID: it.id, Offset: it.m.Offset, Length: it.m.Length, FUA: it.m.Flags&FlagFUA != 0, NoHole: it.m.Flags&FlagNoHole != 0, Received: true}
		switch it.m.Type {
		case MsgRSData:
			a.Op, a.Data = OpWrite, it.m.Data
		case MsgRSZero:
			a.Op = OpZero
		default:
			a.Op, a.Data = it.m.Op, it.m.Data
		}
		if a.Op != OpFlush && !it.resync {
			// Resync data needs no AL extent: the source keeps its bits
			// until we acknowledge, and we acknowledge only once it is
			// durable (rsApplied), so a crash here loses nothing the
			// bitmaps do not cover. With extents, a crashed target would
			// resync everything it had received in the last retire
			// period again.
			n.acquireAL(a.Offset, a.Length)
			it.hasAL = true
		}
		n.rd.Apply = append(n.rd.Apply, a)
		if it.m.Op == OpFlush && it.m.Type == MsgData {
			return
		}
	}
}

func (n *Node) ackRx(it *rxItem) {
	if !n.conn.up() {
		return
	}
	var fl uint8
	if it.err != nil {
		fl = FlagErr
	}
	if it.resync {
		if it.err == nil {
			n.rsApplied(it.m.Offset, it.m.Length)
			return
		}
		n.send(Message{Type: MsgRSAck, Offset: it.m.Offset, Length: it.m.Length, Flags: fl})
		return
	}
	if it.err != nil {
		// We could not apply the peer's write: our copy is now wrong here.
		n.bm.SetRange(it.m.Offset, it.m.Length)
		n.meta.Disk = Inconsistent
		n.metaDirty, n.bmDirty = true, true
	}
	if n.cfg.Protocol == ProtoC {
		n.send(Message{Type: MsgWriteAck, Seq: it.m.Seq, Flags: fl})
	}
}
