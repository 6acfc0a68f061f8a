package driver

import (
	"errors"
	"io"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/vmsan/vmsan/internal/events"
	"github.com/vmsan/vmsan/internal/ioengine"
	"github.com/vmsan/vmsan/internal/metrics"
	"github.com/vmsan/vmsan/internal/repl"
)

// This file is the operator's view of a replica: log lines for state
// transitions (connect, disconnect with reason, resync start/finish, role
// and disk changes, split brain), disconnect counts by kind and the
// peer-ack latency histogram, all read by the metrics collector at scrape
// time. The state machine stays free of clocks and logging: everything
// here is derived in the driver from node statuses and the messages it
// sends and receives.

// Disconnect reason kinds, the bounded label set of
// vmsan_repl_disconnects_total{reason}. The node reports free-text reasons
// (they go to the log and to last_error); classifyDisconnect maps each to
// one of these.
const (
	ReasonAdmin            = "admin"             // vmsan repl disconnect
	ReasonPingTimeout      = "ping_timeout"      // peer silent for the ping timeout
	ReasonKoTimeout        = "ko_timeout"        // peer alive (answers pings) but a write stayed unacknowledged, or the handshake made no progress, for ko ticks
	ReasonPeerClosed       = "peer_closed"       // EOF/reset from the peer, or the peer dialed anew
	ReasonIOError          = "io_error"          // any other socket error
	ReasonProtocolError    = "protocol_error"    // malformed or unexpected message
	ReasonSplitBrain       = "split_brain"       // handshake found split brain (not resolved by policy)
	ReasonHandshakeRefused = "handshake_refused" // unrelated data, sizes or protocols differ, both primary
	ReasonOther            = "other"
)

// DisconnectReasons lists every kind, in a fixed order.
var DisconnectReasons = [...]string{ReasonAdmin, ReasonPingTimeout, ReasonKoTimeout, ReasonPeerClosed,
	ReasonIOError, ReasonProtocolError, ReasonSplitBrain, ReasonHandshakeRefused, ReasonOther}

func reasonIndex(kind string) int {
	for i, k := range DisconnectReasons {
		if k == kind {
			return i
		}
	}
	return len(DisconnectReasons) - 1
}

// classifyDisconnect maps a node's disconnect reason to a kind. linkErr is
// the transport error the reason came from, when it came from one (the
// node only sees its text).
func classifyDisconnect(reason string, linkErr error) string {
	if linkErr != nil {
		return classifyLinkErr(linkErr)
	}
	switch {
	case reason == "administrative disconnect":
		return ReasonAdmin
	case reason == "ping timeout":
		return ReasonPingTimeout
	case strings.HasSuffix(reason, "(ko)"):
		return ReasonKoTimeout
	case strings.HasPrefix(reason, "protocol error"):
		return ReasonProtocolError
	case strings.HasPrefix(reason, repl.SplitBrain.String()+":"):
		return ReasonSplitBrain
	case strings.HasPrefix(reason, repl.Unrelated.String()+":"), strings.HasPrefix(reason, repl.Refused.String()):
		return ReasonHandshakeRefused
	case reason == "replaced by a new connection":
		// The peer dialed again: it gave up on the old connection.
		return ReasonPeerClosed
	}
	return ReasonOther
}

// linkErrReason is the disconnect reason (status last_error) for a
// transport error: the peer closing the connection is said in words
// ("read: EOF" reads like a bug to an operator).
func linkErrReason(err error) string {
	switch {
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "peer stopped (connection closed)"
	case classifyLinkErr(err) == ReasonPeerClosed:
		return "peer stopped (connection reset)"
	}
	return err.Error()
}

func classifyLinkErr(err error) string {
	switch {
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE), errors.Is(err, syscall.ECONNABORTED):
		return ReasonPeerClosed
	case errors.Is(err, repl.ErrBadFrame), errors.Is(err, repl.ErrShort):
		return ReasonProtocolError
	}
	var ne net.Error
	if errors.As(err, &ne) || errors.Is(err, net.ErrClosed) {
		return ReasonIOError
	}
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return ReasonIOError
	}
	// The readers' own checks (a message on the wrong connection, a bad
	// channel hello) are protocol violations.
	return ReasonProtocolError
}

// ackBounds are the peer-ack latency buckets (ns): from a LAN round trip
// to the ko timeout's order of magnitude.
var ackBounds = [...]int64{
	50e3, 100e3, 250e3, 500e3, 1e6, 2.5e6, 5e6, 10e6, 25e6, 50e6, 100e6, 250e6, 500e6, 1e9, 2.5e9, 5e9, 10e9,
}

// ackRing remembers when each replicated write was sent, by sequence
// number, so the first ack for it gives the latency. Fixed size: with more
// writes outstanding than slots the oldest are overwritten and simply not
// measured, so memory is bounded and nothing is allocated per write.
const ackRingSize = 4096

type ackSlot struct {
	epoch, seq uint64
	at         int64 // unix ns; 0: free
}

// observer is the Replica's operator-facing state. Fields without atomics
// are loop only; the atomics are read by scrapes.
type observer struct {
	prev    repl.Status
	started bool
	linkErr error // transport error behind the next disconnect reason

	rsStart time.Time // current resync
	rsBytes int64     // as source: bytes to sync when it started
	rsRecv  int64     // resync bytes received as target, since start
	rsRecv0 int64     // rsRecv when the current resync started
	rsEvent time.Time // last resync progress event (at most one a second)

	disc    [len(DisconnectReasons)]atomic.Uint64 // by DisconnectReasons index
	ring    [ackRingSize]ackSlot
	buckets [len(ackBounds) + 1]atomic.Uint64 // ackBounds, then +Inf
	sumNs   atomic.Int64
	pending atomic.Int64 // client writes waiting for the node's release
	// metaHeld: a metadata write failed transiently and is being retried
	// (acknowledgements wait for it).
	metaHeld atomic.Bool
}

// ackSent records the send time of a replicated write. REQUIRES: loop.
func (r *Replica) ackSent(m repl.Message) {
	if m.Type != repl.MsgData || r.link == nil {
		return
	}
	r.obs.ring[m.Seq%ackRingSize] = ackSlot{epoch: r.link.epoch, seq: m.Seq, at: time.Now().UnixNano()}
}

// onRecv sees every message of the current link before the node: it
// observes the latency of the first ack of a write and counts resync data
// received. REQUIRES: loop.
func (r *Replica) onRecv(epoch uint64, m repl.Message) {
	switch m.Type {
	case repl.MsgRSData:
		r.obs.rsRecv += int64(len(m.Data))
		return
	case repl.MsgRSZero:
		r.obs.rsRecv += m.Length
		return
	case repl.MsgRecvAck, repl.MsgWriteAck:
	default:
		return
	}
	s := &r.obs.ring[m.Seq%ackRingSize]
	if s.at == 0 || s.seq != m.Seq || s.epoch != epoch {
		return
	}
	d := time.Now().UnixNano() - s.at
	s.at = 0
	i := 0
	for i < len(ackBounds) && d > ackBounds[i] {
		i++
	}
	r.obs.buckets[i].Add(1)
	r.obs.sumNs.Add(max(d, 0))
}

func (o *observer) ackHistogram() ioengine.Histogram {
	h := ioengine.Histogram{UpperBounds: ackBounds[:], Counts: make([]uint64, len(o.buckets))}
	for i := range o.buckets {
		h.Counts[i] = o.buckets[i].Load()
		h.Count += h.Counts[i]
	}
	h.Sum = o.sumNs.Load()
	return h
}

// noteDisconnect counts and logs a disconnect the node decided or was told
// about. REQUIRES: loop.
func (r *Replica) noteDisconnect(reason string) {
	var le error
	if r.obs.linkErr != nil && linkErrReason(r.obs.linkErr) == reason {
		le = r.obs.linkErr
	}
	r.obs.linkErr = nil
	kind := classifyDisconnect(reason, le)
	r.obs.disc[reasonIndex(kind)].Add(1)
	r.log.Warn("replication disconnected", "peer", r.set.Peer, "reason", reason, "kind", kind, "remote", r.remote)
}

func syncing(c repl.ConnState) bool { return c == repl.SyncSource || c == repl.SyncTarget }

// observe logs the transitions between the previous published status and
// s. It runs whenever a state or the out-of-sync amount changed (publish),
// so no state change is missed, though a state entered and left within one
// batch of events is never seen (e.g. a resync of nothing). REQUIRES: loop.
func (r *Replica) observe(s repl.Status, now time.Time) {
	o := &r.obs
	p := o.prev
	o.prev = s
	if !o.started {
		o.started = true
		return
	}
	r.publishChanges(p, s, now)
	log := r.log
	if s.Role != p.Role {
		log.Info("replication role changed", "from", p.Role.String(), "to", s.Role.String())
		if r.onRole != nil {
			r.onRole(s.Role)
		}
	}
	if s.Disk != p.Disk {
		log.Info("replication disk state changed", "from", p.Disk.String(), "to", s.Disk.String())
	}
	if s.PeerRole != p.PeerRole && s.PeerRole != repl.RoleUnknown && p.PeerRole != repl.RoleUnknown {
		log.Info("replication peer role changed", "from", p.PeerRole.String(), "to", s.PeerRole.String())
	}
	wasUp, isUp := p.Conn >= repl.Connected, s.Conn >= repl.Connected
	if isUp && !wasUp {
		log.Info("replication established", "peer", r.set.Peer, "peer_role", s.PeerRole.String(),
			"peer_disk", s.PeerDisk.String(), "decision", s.LastDecision.Kind.String(), "out_of_sync_bytes", s.OutOfSync, "remote", r.remote)
		if s.LastDecision.Resolved {
			by := r.set.SplitBrain
			if strings.HasSuffix(s.LastDecision.Reason, "discard-my-data") {
				by = "discard-my-data"
			}
			log.Warn("split brain detected and resolved by policy", "policy", by,
				"outcome", s.LastDecision.Kind.String(), "reason", s.LastDecision.Reason)
		}
	}
	if s.Conn == repl.StandAlone && p.Conn != repl.StandAlone {
		if strings.HasPrefix(s.LastError, repl.SplitBrain.String()+":") {
			log.Error("split brain detected: replication stopped (StandAlone) until resolved by hand; see docs/replication.md",
				"reason", s.LastError)
		} else {
			log.Warn("replication stand-alone (not reconnecting)", "reason", s.LastError)
		}
	}
	if syncing(p.Conn) && s.Conn != p.Conn {
		secs := now.Sub(o.rsStart).Seconds()
		if s.Conn == repl.Connected {
			if p.Conn == repl.SyncTarget {
				// The target knows what it received, not what was due.
				o.rsBytes = o.rsRecv - o.rsRecv0
			}
			rate := 0.0
			if secs > 0 {
				rate = float64(o.rsBytes) / secs
			}
			log.Info("resync finished", "direction", direction(p.Conn), "bytes", o.rsBytes,
				"seconds", round3(secs), "bytes_per_sec", int64(rate))
		} else {
			log.Warn("resync interrupted", "direction", direction(p.Conn), "bytes_left", s.OutOfSync,
				"seconds", round3(secs), "now", s.Conn.String())
		}
	}
	if syncing(s.Conn) && s.Conn != p.Conn {
		o.rsStart, o.rsBytes, o.rsRecv0 = now, s.OutOfSync, o.rsRecv
		if s.Conn == repl.SyncSource && s.ResyncTotal > 0 {
			o.rsBytes = s.ResyncTotal
		}
		if s.Conn == repl.SyncSource {
			log.Info("resync started", "direction", direction(s.Conn), "bytes", o.rsBytes, "peer", r.set.Peer)
		} else {
			// bytes: what the source resyncs (known here from the
			// handshake's bitmaps, or announced by its SyncStart; 0 while
			// the SyncStart of a resync after verify has not come).
			log.Info("resync started", "direction", direction(s.Conn), "bytes", s.ResyncTotal, "local_out_of_sync_bytes", s.OutOfSync, "peer", r.set.Peer)
		}
	}
	if p.Conn == repl.VerifySource && s.Conn == repl.Connected {
		log.Info("online verify finished", "verified_bytes", s.Stats.VerifiedBytes, "mismatch_bytes", s.Stats.VerifyDiff)
	}
}

// resyncEventEvery spaces resync progress events: a resync changes its
// out-of-sync count on every batch, and a subscriber wants progress, not
// a line per batch.
const resyncEventEvery = time.Second

// publishChanges sends the replica's events (`vmsan events`): a change
// line when a role, disk or connection state changed, and resync lines
// (create when it starts, change at most every resyncEventEvery, destroy
// when it ends). REQUIRES: loop.
func (r *Replica) publishChanges(p, s repl.Status, now time.Time) {
	if r.bus == nil {
		return
	}
	if s.Role != p.Role || s.Disk != p.Disk || s.Conn != p.Conn || s.PeerRole != p.PeerRole || s.PeerDisk != p.PeerDisk {
		r.bus.Publish(events.New(events.Change, events.Replication, replAttrs(r.name, s)...))
	}
	switch {
	case syncing(s.Conn) && s.Conn != p.Conn:
		r.obs.rsEvent = now
		r.bus.Publish(events.New(events.Create, events.Resync, resyncAttrs(r.name, s)...))
	case syncing(s.Conn) && (s.ResyncLeft != p.ResyncLeft || s.OutOfSync != p.OutOfSync) && now.Sub(r.obs.rsEvent) >= resyncEventEvery:
		r.obs.rsEvent = now
		r.bus.Publish(events.New(events.Change, events.Resync, resyncAttrs(r.name, s)...))
	case syncing(p.Conn) && s.Conn != p.Conn:
		r.bus.Publish(events.New(events.Destroy, events.Resync, "volume", r.name, "connection", s.Conn.String(),
			"left_bytes", strconv.FormatInt(s.OutOfSync, 10)))
	}
}

func replAttrs(volume string, s repl.Status) []string {
	return []string{"volume", volume, "role", s.Role.String(), "disk", s.Disk.String(), "connection", s.Conn.String(),
		"peer_role", s.PeerRole.String(), "peer_disk", s.PeerDisk.String(), "out_of_sync_bytes", strconv.FormatInt(s.OutOfSync, 10)}
}

// resyncAttrs: left_bytes and the percentage, on either side (the target
// knows the total from the handshake or the source's SyncStart).
func resyncAttrs(volume string, s repl.Status) []string {
	kv := []string{"volume", volume, "direction", s.Conn.String(), "left_bytes", strconv.FormatInt(s.ResyncLeft, 10)}
	if s.ResyncTotal > 0 {
		kv = append(kv, "percent", strconv.FormatFloat(100*float64(s.ResyncTotal-s.ResyncLeft)/float64(s.ResyncTotal), 'f', 1, 64))
	}
	return kv
}

// eventsFromStatus is the replica's "exists" lines for a new subscriber.
func eventsFromStatus(st Status) []events.Event {
	out := []events.Event{events.New(events.Exists, events.Replication, "volume", st.Volume, "role", st.Role, "disk", st.Disk,
		"connection", st.Conn, "peer_role", st.PeerRole, "peer_disk", st.PeerDisk,
		"out_of_sync_bytes", strconv.FormatInt(st.OutOfSync, 10))}
	if st.Conn == repl.SyncSource.String() || st.Conn == repl.SyncTarget.String() {
		kv := []string{"volume", st.Volume, "direction", st.Conn, "left_bytes", strconv.FormatInt(st.SyncLeft, 10)}
		if st.SyncTotal > 0 {
			kv = append(kv, "percent", strconv.FormatFloat(st.SyncPct, 'f', 1, 64))
		}
		out = append(out, events.New(events.Exists, events.Resync, kv...))
	}
	return out
}

func direction(c repl.ConnState) string {
	if c == repl.SyncSource {
		return "to peer (SyncSource)"
	}
	return "from peer (SyncTarget)"
}

func round3(f float64) float64 { return float64(int64(f*1000+0.5)) / 1000 }

// Metrics is the replica's snapshot for the metrics collector.
func (r *Replica) Metrics() metrics.Replica {
	st := r.Status()
	m := metrics.Replica{
		Volume: st.Volume, Role: st.Role, Disk: st.Disk, Conn: st.Conn, PeerRole: st.PeerRole, PeerDisk: st.PeerDisk,
		OutOfSync: st.OutOfSync, ResyncRate: st.SyncRate,
		ResyncBytes: st.ResyncBytes, ResyncZeroBytes: st.ResyncZeroBytes, ResyncHashMatchBytes: st.HashMatchBytes,
		ReplicatedBytes: st.SentBytes, PendingWrites: r.obs.pending.Load(), MetadataHeld: st.MetadataHeld,
		Disconnects: make(map[string]uint64, len(DisconnectReasons)),
		AckLatency:  r.obs.ackHistogram(),
	}
	for i, k := range DisconnectReasons {
		m.Disconnects[k] = r.obs.disc[i].Load()
	}
	return m
}
