// node.go: the Node type and its plumbing — Config, the input/output types
// (Write, Apply, Read, Release, Persist, Ready), NewNode, Status, Ready,
// the admin inputs Promote/Demote/Shutdown, and Step, which dispatches
// peer messages to the phase files:
//
//	connect.go     Connect/Listen/Disconnect, handshake, decision
//	primary.go     Propose, holding, issue, release, peer acks, LocalDone
//	secondary.go   the replicated stream: receive, apply in order, ack
//	resync.go      resync and online verify, source and target sides
//	activitylog.go the activity log and its retirement
//	tick.go        Tick: ping, handshake and ko timeouts
//
// INVARIANT: the Node does no I/O and reads no clock: every effect leaves
// through Ready, and time advances only by Tick.
// INVARIANT: a Ready is processed Persist, Send, Apply/Reads, Release, so
// metadata, activity log and bitmap changes made by the same inputs as an
// Apply or a Release are durable before it takes effect.
// INVARIANT: nextID numbers client writes, stream items, resync/verify
// reads, target hash reads and AL retirement flushes alike, so the id in
// LocalDone/ReadDone names exactly one of them.
// INVARIANT: Step drops messages while conn < Handshake (from a torn-down
// connection); any protocol error disconnects.

package repl

import (
	"errors"
	"fmt"

	"github.com/vmsan/vmsan/internal/replset"
)

// Config configures a Node. Durations are in ticks; how long a tick is,
// and every count below, comes from replset.Settings.Ticks (the one place
// the settings' durations become ticks; a tenth of the ping interval, 100
// ms by default). Zero fields take replset's defaults in ticks.
type Config struct {
	NodeID     uint64
	Size       int64
	Protocol   Protocol
	SplitBrain SplitBrainPolicy

	PingInterval int // ticks between pings (default 10: 1 s)
	PingTimeout  int // ticks without hearing from the peer before disconnecting (default 60: 6 s)
	// KoTicks: a peer that answers pings but leaves a replicated write
	// unacknowledged this long is disconnected (DRBD's ko-count). 0: 100
	// (10 s).
	// max(PingTimeout, KoTicks) is also how long a handshake may go
	// without progress while the peer answers pings (handshakeStalled).
	KoTicks int

	// ALExtents is the activity log size in 4 MiB extents (default 1024,
	// i.e. 4 GiB hot; DRBD's default is 1237). A write to an extent not in
	// the AL costs one small synchronous metadata write first.
	ALExtents int
	// ALRetireTicks: extents idle this long are retired (after a local
	// flush makes their writes durable), so after a crash only recently
	// written extents are resynced. Default 50.
	ALRetireTicks int

	ResyncIO int64 // max bytes per resync read (default 1 MiB)
	// ResyncInflight: max resync ranges in flight (default 16). A range
	// stays in flight until the target acknowledges it, which it does
	// only after a flush (resync.go), so the window must cover a flush's
	// latency as well as the link's: 8 ran the resync at about half the
	// speed of 16 on a local disk.
	ResyncInflight int
	// ResyncRate is the resync budget in bytes per tick (0 = unlimited).
	ResyncRate int64
	// ResyncMinRate enables the dynamic controller: each tick resync gets
	// ResyncRate minus the bytes the application replicated in the previous
	// tick, but never less than ResyncMinRate.
	ResyncMinRate int64
	// Checksum enables checksum-based resync: hashes first, data only
	// where they differ.
	Checksum bool

	// Rand returns new generation identifiers (never 0 is used). Injected so
	// that the node stays deterministic in tests.
	Rand func() uint64
}

func (c *Config) setDefaults() {
	// The settings' defaults, in ticks of the default tick (replset owns
	// them; the driver passes replset.Settings.Ticks, so these only apply
	// to a Config built directly, e.g. in tests).
	d := replset.Defaults().Ticks()
	if c.PingInterval <= 0 {
		c.PingInterval = d.PingInterval
	}
	if c.PingTimeout <= 0 {
		c.PingTimeout = d.PingTimeout
	}
	if c.KoTicks <= 0 {
		c.KoTicks = d.KoTicks
	}
	if c.ALExtents <= 0 {
		c.ALExtents = 1024
	}
	if c.ALRetireTicks <= 0 {
		c.ALRetireTicks = d.ALRetireTicks
	}
	if c.ResyncIO <= 0 {
		c.ResyncIO = 1 << 20
	}
	c.ResyncIO = (c.ResyncIO + ChunkSize - 1) / ChunkSize * ChunkSize
	if c.ResyncInflight <= 0 {
		c.ResyncInflight = 16
	}
}

// Write is a client operation proposed on the primary.
type Write struct {
	Op     Op
	Offset int64
	Length int64
	Data   []byte
	FUA    bool
	NoHole bool
}

// Apply is local I/O the driver must submit; it reports completion with
// LocalDone(ID, err).
type Apply struct {
	ID     uint64
	Op     Op
	Offset int64
	Length int64
	Data   []byte
	FUA    bool
	NoHole bool // OpZero: keep allocated (else the range may be trimmed)
	// Received: Data is a payload the driver handed over with Step (a
	// peer's stream or resync data), not a client's buffer. The node does
	// not read it again once LocalDone reports this apply, so the driver
	// may recycle the buffer then.
	Received bool
}

// Read is a local read for resync/verify; report with ReadDone.
// With NeedData the driver splits the range into pieces: runs that read as
// zero (holes or zero data; no Data) and data runs. Without NeedData it
// returns exactly one piece covering the range. With WantHash every piece
// carries the SHA-256 of its bytes (zero pieces too, so a hole on one side
// matches written zeroes on the other), and data pieces are then at most
// ChunkSize long so checksum resync compares chunk by chunk.
type Read struct {
	ID       uint64
	Offset   int64
	Length   int64
	WantHash bool
	// NeedData: the data must be returned (a resync source). A verify or
	// checksum target only needs hashes.
	NeedData bool
}

// ReadPiece is one run of a Read's result, in order, covering the range.
type ReadPiece struct {
	Offset int64
	Length int64
	Zero   bool
	Data   []byte
	Hash   [HashSize]byte
}

// Release completes a client operation returned by Propose.
type Release struct {
	ID  uint64
	Err error
}

// Persist is what must be durable before anything else in Ready happens.
type Persist struct {
	Meta   *Meta   // write metadata atomically
	AL     []int64 // when ALChanged: the activity log's extents
	Bitmap []uint64
	// ALChanged/BitmapChanged say which of the fields above are set.
	ALChanged, BitmapChanged bool
}

// Ready is a batch of outputs. Process in this order: Persist, Send,
// Apply and Reads, Release; Disconnect when set (close both channels).
type Ready struct {
	Persist    Persist
	Send       []Message
	Apply      []Apply
	Reads      []Read
	Release    []Release
	Disconnect string // non-empty: tear the connection down (reason)
}

// Errors returned to clients.
var (
	ErrNotPrimary   = errors.New("repl: volume is secondary here (read-only)")
	ErrDiskless     = errors.New("repl: no usable local disk")
	ErrOutOfRange   = errors.New("repl: request outside the volume")
	ErrPeerPrimary  = errors.New("repl: peer is primary and connected; demote it first")
	ErrNotUpToDate  = errors.New("repl: local disk is not UpToDate (use --force)")
	ErrNotConnected = errors.New("repl: not connected")
	ErrBusy         = errors.New("repl: resync or verify in progress")
	// ErrDiscardPrimary: discard-my-data asked on a primary, whose data is
	// what its clients see.
	ErrDiscardPrimary = errors.New("repl: this node is primary: demote it before discarding its data")
	ErrConnected      = errors.New("repl: already connected to the peer or handshaking (vmsan repl disconnect first)")
)

// SyncTargetError refuses a promote while this node receives a resync:
// its disk is Inconsistent until the resync is done. errors.Is(err,
// ErrBusy) holds.
type SyncTargetError struct {
	Percent int // resync progress, rounded down
}

func (e *SyncTargetError) Error() string {
	return fmt.Sprintf("repl: local disk Inconsistent (%d %% synced): wait for the resync from the peer to finish", e.Percent)
}

// Is makes errors.Is(err, ErrBusy) true.
func (e *SyncTargetError) Is(target error) bool { return target == ErrBusy }

// Stats are counters since start.
type Stats struct {
	SentData, SentBytes       int64 // replicated client ops and payload bytes
	ResyncBytes               int64 // resync payload bytes sent (RSData)
	ResyncZeroBytes           int64 // bytes resynced as zero ranges (no payload)
	ResyncHashMatchBytes      int64 // bytes skipped because checksums matched
	VerifiedBytes, VerifyDiff int64
	Disconnects               int64
	ReceivedData              int64 // stream ops applied here (secondary)
}

// Status is a snapshot for `vmsan status`.
type Status struct {
	Role      Role
	Disk      DiskState
	Conn      ConnState
	PeerRole  Role
	PeerDisk  DiskState
	Protocol  Protocol
	Gens      Generations
	OutOfSync int64 // bytes marked out of sync
	// ResyncTotal/ResyncLeft in bytes for the current resync (source or
	// target) or verify (source).
	ResyncTotal, ResyncLeft int64
	// DiscardMyData: the next handshake discards this node's data if it
	// finds split brain (ConnectDiscardMyData; one-shot).
	DiscardMyData bool
	LastDecision  Decision
	LastError     string
	Stats         Stats
}

// Node is the replication state machine for one volume on one node.
type Node struct {
	cfg  Config
	meta Meta
	conn ConnState
	bm   *Bitmap
	al   *activityLog

	tick     int64
	lastPing int64
	heard    int64
	since    int64 // tick the current connection came up
	// hsAt: tick of the last handshake progress (Connect, the peer's
	// Hello or a bitmap frame, our decision). Pings do not count: a peer
	// that answers pings but never completes the handshake must not hold
	// the connection forever (see handshakeStalled).
	hsAt int64
	// awaitStart: we decided to be sync target and wait for the source's
	// SyncStart, the last step of its handshake.
	awaitStart bool

	nextID uint64
	seq    uint64
	writes map[uint64]*pendingWrite // by id (primary)
	bySeq  map[uint64]*pendingWrite
	order  []*pendingWrite // submission order (for deferral)
	held   []*pendingWrite // deferred until a resync conflict clears
	// sentA: protocol A writes sent on the current connection (by seq)
	// that the peer has not yet reported received. Their clients may
	// already be answered; a disconnect marks them out of sync, since the
	// peer may never have got them.
	sentA   map[uint64]span
	rx      []*rxItem // secondary stream in arrival order
	rxByID  map[uint64]*rxItem
	appTick int64 // application bytes replicated this tick (dynamic rate)
	appLast int64

	peerHello  *Hello
	peerBitmap *Bitmap
	peerBMDone bool
	peerRole   Role
	peerDisk   DiskState
	// sentHello is the Hello we sent at Connect. The decision uses it, not
	// our state at decide time: the peer decides from the same two Hellos,
	// and writes during the handshake may have changed our generations.
	sentHello Hello
	// hsWrites: a write went local-only (bitmap marked) during this
	// handshake; the peer has not seen it, whatever the decision says.
	hsWrites bool

	// resync/verify source
	rs        map[uint64]*rsRange // by read id
	rsByOff   map[int64]*rsRange
	cursor    int64
	budget    int64
	rsTotal   int64
	verifyCur int64
	// target-side reads for checksum/verify compare: read id -> message
	cmp map[uint64]Message

	// resync target (resync.go): rsKnown says the bitmap holds exactly
	// what the source resyncs (decided in the handshake; false for a
	// resync started after a verify or handshake writes, whose set only
	// the source knows: progress is then rsDone of rsTotal). rsPend are
	// applied resync ranges waiting for the flush that makes them durable
	// before they are acknowledged; rsFlushing those covered by the flush
	// rsFlushID in flight.
	rsKnown    bool
	rsDone     int64
	rsPend     []span
	rsFlushing []span
	rsFlushID  uint64
	// progressDirty: resync cleared bits not yet persisted; they are
	// written at most every PingInterval ticks (progressAt), so a restart
	// resumes near where the resync stopped.
	progressDirty bool
	progressAt    int64

	// discardMyData: one-shot, for the next handshake's decision
	// (ConnectDiscardMyData).
	discardMyData bool

	// AL retirement: a local flush in flight, and the tick it covers.
	retireID   uint64
	retireTick int64
	retireSet  []int64

	lastDecision Decision
	lastErr      string
	stats        Stats

	rd        Ready
	metaDirty bool
	alDirty   bool
	bmDirty   bool
}

// NewNode restores a node from its persisted state. bitmapWords and
// alExtents are what the driver loaded (nil for a new volume). If m.Clean is
// false (crash), the activity log's extents are marked out of sync.
// Tunables are the Config fields a running node may change (Retune):
// none of them is part of the handshake, so the peer need not agree.
type Tunables struct {
	PingInterval, PingTimeout, KoTicks, ALRetireTicks int
	ResyncRate, ResyncMinRate                         int64
}

// Retune changes the node's timeouts and resync rates in place (zero
// fields: the defaults, as in Config); they apply from the next tick,
// with no disconnect. A resync in progress continues at the new rate.
func (n *Node) Retune(t Tunables) {
	c := n.cfg
	c.PingInterval, c.PingTimeout, c.KoTicks, c.ALRetireTicks = t.PingInterval, t.PingTimeout, t.KoTicks, t.ALRetireTicks
	c.ResyncRate, c.ResyncMinRate = t.ResyncRate, t.ResyncMinRate
	c.setDefaults()
	n.cfg = c
	if c.ResyncRate > 0 {
		n.budget = min(n.budget, c.ResyncRate)
	}
}

func NewNode(cfg Config, m Meta, bitmapWords []uint64, alExtents []int64) *Node {
	cfg.setDefaults()
	n := &Node{
		cfg:     cfg,
		meta:    m,
		conn:    StandAlone,
		bm:      NewBitmap(cfg.Size),
		al:      newActivityLog(cfg.ALExtents),
		writes:  make(map[uint64]*pendingWrite),
		bySeq:   make(map[uint64]*pendingWrite),
		sentA:   make(map[uint64]span),
		rxByID:  make(map[uint64]*rxItem),
		rs:      make(map[uint64]*rsRange),
		rsByOff: make(map[int64]*rsRange),
		cmp:     make(map[uint64]Message),
		// Nothing is known of the peer until its Hello.
		peerRole: RoleUnknown,
		peerDisk: DiskUnknown,
	}
	n.meta.NodeID = cfg.NodeID
	if bitmapWords != nil {
		n.bm.LoadWords(bitmapWords)
	}
	if !m.Clean {
		for _, e := range alExtents {
			n.bm.SetRange(e*ALExtentSize, ALExtentSize)
		}
		n.bmDirty = true
	}
	if !m.Clean && m.Role == Primary {
		// Like DRBD, a node that crashed comes back secondary: its peer
		// may have been promoted meanwhile, and two primaries writing
		// apart is the split brain we must not create. CrashedPrimary
		// stays set so the handshake resyncs our activity log.
		n.meta.Role = Secondary
	}
	// From now on the bitmap on disk is incomplete until a clean Shutdown.
	n.meta.Clean = false
	n.metaDirty = true
	n.alDirty = true // AL starts empty; record that
	return n
}

// Status returns a snapshot.
func (n *Node) Status() Status {
	s := Status{
		Role: n.meta.Role, Disk: n.meta.Disk, Conn: n.conn,
		PeerRole: n.peerRole, PeerDisk: n.peerDisk, Protocol: n.cfg.Protocol,
		Gens: n.meta.Gens, OutOfSync: n.outOfSync(),
		LastDecision: n.lastDecision, LastError: n.lastErr, Stats: n.stats,
	}
	if n.conn == SyncSource {
		s.ResyncTotal, s.ResyncLeft = n.rsTotal, s.OutOfSync
	}
	if n.conn == SyncTarget {
		s.ResyncTotal, s.ResyncLeft = n.targetProgress()
	}
	s.DiscardMyData = n.discardMyData
	if n.conn == VerifySource {
		s.ResyncTotal, s.ResyncLeft = n.cfg.Size, n.cfg.Size-n.verifyCur
	}
	return s
}

func (n *Node) outOfSync() int64 {
	b := n.bm.Count() * ChunkSize
	if b > n.cfg.Size {
		b = n.cfg.Size
	}
	return b
}

// Meta returns the current persistent state.
func (n *Node) Meta() Meta { return n.meta }

// Bitmap gives read access to the dirty bitmap (tests, status).
func (n *Node) Bitmap() *Bitmap { return n.bm }

// HasReady reports whether Ready has anything.
func (n *Node) HasReady() bool {
	r := &n.rd
	return n.metaDirty || n.alDirty || n.bmDirty || len(r.Send) > 0 || len(r.Apply) > 0 ||
		len(r.Reads) > 0 || len(r.Release) > 0 || r.Disconnect != ""
}

// Ready returns and clears the pending outputs.
func (n *Node) Ready() Ready {
	rd := n.rd
	n.rd = Ready{}
	if n.metaDirty {
		m := n.meta
		rd.Persist.Meta = &m
		n.metaDirty = false
	}
	if n.alDirty {
		rd.Persist.ALChanged, rd.Persist.AL = true, n.al.extents()
		n.alDirty = false
	}
	if n.bmDirty {
		rd.Persist.BitmapChanged = true
		rd.Persist.Bitmap = append([]uint64(nil), n.bm.Words()...)
		n.bmDirty = false
	}
	return rd
}

func (n *Node) send(m Message) { n.rd.Send = append(n.rd.Send, m) }

func (n *Node) newGen() uint64 {
	for {
		if u := n.cfg.Rand(); u != 0 {
			return u
		}
	}
}

// ---- admin inputs ----

// Promote makes this node primary. now is the wall time (unix ns).
func (n *Node) Promote(force bool, now int64) error {
	if n.meta.Role == Primary {
		return nil
	}
	if n.conn == SyncTarget {
		// First, even if the peer is primary: this is what stays in the
		// way once the peer is demoted.
		total, left := n.targetProgress()
		pct := 0
		if total > 0 {
			pct = int(100 * float64(total-left) / float64(total))
		}
		return &SyncTargetError{Percent: pct}
	}
	if n.conn.up() && n.peerRole == Primary {
		return ErrPeerPrimary
	}
	if n.conn == Handshake {
		return ErrBusy
	}
	if n.meta.Disk != UpToDate {
		if !force || n.meta.Disk == Diskless {
			return ErrNotUpToDate
		}
		n.meta.Disk = UpToDate
	}
	n.meta.Role, n.meta.CrashedPrimary, n.meta.PromotedAt = Primary, true, now
	if n.meta.Gens.Current == 0 {
		// First writer of a fresh volume names the first generation; a
		// connected fresh peer (identical: all zero) adopts it.
		n.meta.Gens.Current = n.newGen()
		if n.conn.up() {
			n.send(Message{Type: MsgSyncDone, Seq: n.meta.Gens.Current})
		}
	} else if !n.conn.up() && n.meta.Gens.Bitmap == 0 {
		n.meta.Gens.newCurrent(n.newGen())
	}
	n.metaDirty = true
	if n.conn.up() {
		n.send(Message{Type: MsgRole, Op: Op(Primary)})
	}
	return nil
}

// Demote makes this node secondary. Writes still in flight keep going.
func (n *Node) Demote() error {
	if n.meta.Role == Secondary {
		return nil
	}
	n.meta.Role, n.meta.CrashedPrimary = Secondary, false
	n.metaDirty = true
	if n.conn.up() {
		n.send(Message{Type: MsgRole, Op: Op(Secondary)})
	}
	return nil
}

// Shutdown records a clean stop: the bitmap is complete on disk, so the
// activity log need not be replayed at the next start.
func (n *Node) Shutdown() {
	n.meta.Clean = true
	if n.meta.Role == Primary {
		// A clean stop of a primary is not a crash.
		n.meta.CrashedPrimary = false
	}
	n.metaDirty, n.bmDirty = true, true
}

// ---- peer messages ----

// Step feeds one message from the peer. A protocol violation disconnects.
func (n *Node) Step(m Message) {
	if n.conn < Handshake {
		return // stale message from a connection already torn down
	}
	n.heard = n.tick
	if err := n.step(m); err != nil {
		n.disconnect("protocol error: "+err.Error(), Connecting)
	}
}

// step dispatches a peer message to the phase that handles it: handshake
// (connect.go), primary acks (primary.go), the replicated stream
// (secondary.go), resync and verify (resync.go). An error is a protocol
// violation.
func (n *Node) step(m Message) error {
	switch m.Type {
	case MsgPing:
		n.send(Message{Type: MsgPingAck})
	case MsgPingAck:
	case MsgHello:
		return n.onHello(m)
	case MsgBitmap:
		return n.onBitmap(m)
	case MsgRole:
		return n.onRole(m)
	case MsgData:
		return n.rxData(m, false)
	case MsgRSData, MsgRSZero:
		if n.conn != SyncTarget {
			return fmt.Errorf("%v while %v", m.Type, n.conn)
		}
		return n.rxData(m, true)
	case MsgRecvAck, MsgWriteAck:
		n.onAck(m)
	case MsgSyncStart:
		return n.onSyncStart(m)
	case MsgSyncDone:
		return n.onSyncDone(m)
	case MsgRSAck:
		return n.rsAcked(m.Offset, m.Length, m.Flags&FlagErr != 0)
	case MsgRSHash, MsgVerifyReq:
		return n.onHashReq(m)
	case MsgRSHashReply:
		return n.hashReply(m.Offset, m.Length, m.Flags&FlagMatch != 0)
	case MsgVerifyReply:
		return n.onVerifyReply(m)
	case MsgVerifyDone:
		if n.conn == VerifyTarget {
			n.conn = Connected
		}
	default:
		return fmt.Errorf("unexpected %v", m.Type)
	}
	return nil
}
