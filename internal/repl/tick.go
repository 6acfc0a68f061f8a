// tick.go: Tick, the node's only clock, and the timeouts it enforces: ping
// interval and ping timeout, the handshake progress deadline
// (handshakeTimeout/handshakeStalled), the ko limit on writes waiting for
// the peer; it also drives AL retirement and the resync budget.
//
// INVARIANT: a peer not heard from for PingTimeout ticks is disconnected.
// INVARIANT: the handshake makes progress within max(PingTimeout, KoTicks)
// ticks or is abandoned, even while the peer answers pings.
// INVARIANT: while connected, a protocol B/C write waits at most KoTicks
// ticks for the peer's ack before the connection is dropped (and the write
// released local-only, marked out of sync).

package repl

import "fmt"

// Tick advances the logical clock.
func (n *Node) Tick() {
	n.tick++
	n.appLast, n.appTick = n.appTick, 0
	if n.conn >= Handshake {
		if n.tick-n.heard > int64(n.cfg.PingTimeout) {
			// Also ends a handshake a frozen peer never answers (its
			// kernel accepted the connection): the primary runs
			// standalone meanwhile and redials.
			reason := "ping timeout"
			if n.conn == Handshake {
				reason = "handshake timeout (peer accepted the connection but did not answer)"
			}
			n.disconnect(reason, Connecting)
			return
		}
		if reason := n.handshakeStalled(); reason != "" {
			n.disconnect(reason, Connecting)
			return
		}
		if n.tick-n.lastPing >= int64(n.cfg.PingInterval) {
			n.lastPing = n.tick
			n.send(Message{Type: MsgPing})
		}
	}
	if n.conn.up() && n.cfg.Protocol != ProtoA {
		for _, p := range n.order {
			if p.peerWait && n.tick-p.since > int64(n.cfg.KoTicks) {
				n.disconnect(fmt.Sprintf("peer alive but did not complete write seq %d in %d ticks (ko)", p.seq, n.tick-p.since), Connecting)
				return
			}
		}
	}
	// Retire idle activity-log extents.
	n.maybeRetire()
	n.persistProgress()
	// Refill the resync budget.
	n.refillBudget()
	n.pump()
}

// given to a peer that is alive but does not complete a replicated write.
func (n *Node) handshakeTimeout() int64 {
	return int64(max(n.cfg.PingTimeout, n.cfg.KoTicks))
}

// handshakeStalled returns a disconnect reason when the handshake has made
// no progress for handshakeTimeout ticks: still in Handshake (the peer's
// Hello or bitmap never came), or sync target still waiting for the
// source's SyncStart. The ping timeout cannot see this: pings flow both
// ways, so the peer is heard from all along. Seen in the fault loop when a
// driver bug left one side's new connection without a Hello (fixed in the
// driver's addHalf); this deadline makes any such stall end in a redial
// rather than a pair stuck for good, whatever its cause.
func (n *Node) handshakeStalled() string {
	if n.tick-n.hsAt <= n.handshakeTimeout() {
		return ""
	}
	switch {
	case n.conn == Handshake:
		return fmt.Sprintf("handshake timeout: the peer answers pings but did not complete the handshake in %d ticks (ko)", n.tick-n.hsAt)
	case n.conn == SyncTarget && n.awaitStart:
		return fmt.Sprintf("handshake timeout: the peer answers pings but did not start the resync in %d ticks (ko)", n.tick-n.hsAt)
	}
	return ""
}
