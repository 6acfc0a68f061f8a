package driver

import (
	"time"

	"github.com/vmsan/vmsan/internal/repl"
)

// Status is what `vmsan status` and `vmsan repl status` show for a
// replicated volume, and the JSON of GET /v1/repl and `vmsan repl status
// --json`. Every field is always present (no omitempty), so scripts see
// one shape; new fields may be added, none removed or renamed. States are
// the names of the repl package's Role, DiskState and ConnState; peer_role
// and peer_disk are "Unknown" while not connected. Resync fields are 0
// unless a resync runs here (as source or target) or a verify runs here as
// source. DiscardMyData is set between `repl connect --discard-my-data`
// and the handshake it applies to.
type Status struct {
	Volume     string  `json:"volume"`
	Role       string  `json:"role"`
	Disk       string  `json:"disk"`
	Conn       string  `json:"connection"`
	PeerRole   string  `json:"peer_role"`
	PeerDisk   string  `json:"peer_disk"`
	Protocol   string  `json:"protocol"`
	Peer       string  `json:"peer"`
	Listen     string  `json:"listen"`
	Gens       string  `json:"generations"`
	OutOfSync  int64   `json:"out_of_sync_bytes"`
	SyncTotal  int64   `json:"resync_total_bytes"`
	SyncLeft   int64   `json:"resync_left_bytes"`
	SyncPct    float64 `json:"resync_percent"`
	SyncRate   float64 `json:"resync_bytes_per_sec"`
	ETASeconds float64 `json:"resync_eta_seconds"`
	Decision   string  `json:"last_decision"`
	LastError  string  `json:"last_error"`
	// DiscardMyData: the next handshake drops this node's data if it
	// finds split brain (one-shot).
	DiscardMyData bool `json:"discard_my_data"`
	// PendingWrites is the client writes accepted and not yet answered.
	PendingWrites int `json:"pending_writes"`
	// MetadataHeld: a metadata write failed for a transient reason (out
	// of file descriptors, memory or space) and is retried; until it
	// succeeds no write is acknowledged.
	MetadataHeld bool `json:"metadata_write_held"`

	ResyncBytes     int64 `json:"resync_sent_bytes"`
	ResyncZeroBytes int64 `json:"resync_zero_bytes"`
	HashMatchBytes  int64 `json:"resync_hash_match_bytes"`
	VerifiedBytes   int64 `json:"verified_bytes"`
	VerifyDiff      int64 `json:"verify_mismatch_bytes"`
	SentBytes       int64 `json:"replicated_bytes"`
	ReceivedOps     int64 `json:"received_ops"`
	Disconnects     int64 `json:"disconnects"`
}

// etaEstimator measures the resync rate since the resync (re)started:
// bytes no longer out of sync divided by elapsed time. Averaging over the
// whole run is steady enough for an ETA and needs no window tuning.
type etaEstimator struct {
	start     time.Time
	startLeft int64
	lastLeft  int64
}

func (e *etaEstimator) update(left int64, now time.Time) float64 {
	if e.start.IsZero() || left > e.lastLeft {
		// New resync, or more became out of sync: restart the average.
		e.start, e.startLeft, e.lastLeft = now, left, left
		return 0
	}
	e.lastLeft = left
	el := now.Sub(e.start).Seconds()
	if el < 0.25 || e.startLeft == left {
		return 0
	}
	return float64(e.startLeft-left) / el
}

// publish snapshots the node's status (loop only).
func (r *Replica) publish() {
	s := r.node.Status()
	st := Status{
		Volume: r.name, Role: s.Role.String(), Disk: s.Disk.String(), Conn: s.Conn.String(),
		PeerRole: s.PeerRole.String(), PeerDisk: s.PeerDisk.String(), Protocol: s.Protocol.String(),
		Peer: r.set.Peer, Listen: r.set.Listen, Gens: s.Gens.String(), OutOfSync: s.OutOfSync,
		SyncTotal: s.ResyncTotal, SyncLeft: s.ResyncLeft, LastError: s.LastError,
		ResyncBytes: s.Stats.ResyncBytes, ResyncZeroBytes: s.Stats.ResyncZeroBytes,
		HashMatchBytes: s.Stats.ResyncHashMatchBytes, VerifiedBytes: s.Stats.VerifiedBytes,
		VerifyDiff: s.Stats.VerifyDiff, SentBytes: s.Stats.SentBytes, ReceivedOps: s.Stats.ReceivedData,
		Disconnects: s.Stats.Disconnects, DiscardMyData: s.DiscardMyData,
	}
	if s.LastDecision.Rule != 0 {
		st.Decision = s.LastDecision.Kind.String()
		if s.LastDecision.Resolved {
			// "split brain resolved by <policy or discard-my-data>"
			st.Decision += " (" + s.LastDecision.Reason + ")"
		}
	}
	if s.Conn == repl.SyncSource || s.Conn == repl.SyncTarget || s.Conn == repl.VerifySource {
		if s.ResyncTotal > 0 {
			st.SyncPct = 100 * float64(s.ResyncTotal-s.ResyncLeft) / float64(s.ResyncTotal)
		}
		st.SyncRate = r.eta.update(s.ResyncLeft, time.Now())
		if st.SyncRate > 0 {
			st.ETASeconds = float64(s.ResyncLeft) / st.SyncRate
		}
	} else {
		r.eta = etaEstimator{}
	}
	st.PendingWrites = len(r.clients)
	r.observe(s, time.Now())
	r.statusMu.Lock()
	r.status = st
	r.statusMu.Unlock()
}

// Status returns the latest snapshot.
func (r *Replica) Status() Status {
	r.statusMu.Lock()
	st := r.status
	r.statusMu.Unlock()
	// Current, not as of the last publish (up to a tick old).
	st.PendingWrites = int(r.obs.pending.Load())
	st.MetadataHeld = r.obs.metaHeld.Load()
	return st
}
