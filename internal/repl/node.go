package repl

import (
	"bytes"
	"errors"
	"fmt"
)

// Config configures a Node. Durations are in ticks; the driver decides how
// long a tick is (Config.TickInterval in the driver, 100 ms by default).
type Config struct {
	NodeID     uint64
	Size       int64
	Protocol   Protocol
	SplitBrain SplitBrainPolicy

	PingInterval int // ticks between pings (default 10)
	PingTimeout  int // ticks without hearing from the peer before disconnecting (default 60)
	// KoTicks: a peer that answers pings but leaves a replicated write
	// unacknowledged this long is disconnected (DRBD's ko-count). 0: 100.
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

	ResyncIO       int64 // max bytes per resync read (default 1 MiB)
	ResyncInflight int   // max resync reads in flight (default 8)
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
	if c.PingInterval <= 0 {
		c.PingInterval = 10
	}
	if c.PingTimeout <= 0 {
		c.PingTimeout = 60
	}
	if c.KoTicks <= 0 {
		c.KoTicks = 100
	}
	if c.ALExtents <= 0 {
		c.ALExtents = 1024
	}
	if c.ALRetireTicks <= 0 {
		c.ALRetireTicks = 50
	}
	if c.ResyncIO <= 0 {
		c.ResyncIO = 1 << 20
	}
	c.ResyncIO = (c.ResyncIO + ChunkSize - 1) / ChunkSize * ChunkSize
	if c.ResyncInflight <= 0 {
		c.ResyncInflight = 8
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
)

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

type rxItem struct {
	id        uint64
	m         Message
	resync    bool
	submitted bool
	done      bool
	err       error
	hasAL     bool
}

type rsRange struct {
	off, len    int64
	outstanding int         // pieces not yet acked
	pieces      []ReadPiece // kept for checksum mode until the hash reply
	reading     bool
	verify      bool
}

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
	// ResyncTotal/ResyncLeft in bytes for the current resync or verify.
	ResyncTotal, ResyncLeft int64
	LastDecision            Decision
	LastError               string
	Stats                   Stats
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
	verifyEnd bool
	verifyCur int64
	// target-side reads for checksum/verify compare: read id -> message
	cmp map[uint64]Message

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

func (n *Node) hello() Hello {
	return Hello{
		NodeID: n.cfg.NodeID, Gens: n.meta.Gens, Role: n.meta.Role, Disk: n.meta.Disk,
		Protocol: n.cfg.Protocol, CrashedPrimary: n.meta.CrashedPrimary && !n.crashedCleared(),
		PromotedAt: n.meta.PromotedAt, Size: n.cfg.Size, Dirty: n.bm.Count(),
	}
}

// crashedCleared: the flag in meta is about the previous life; while we are
// primary now it is still reported so the peer resyncs our AL extents.
func (n *Node) crashedCleared() bool { return false }

// ---- admin inputs ----

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

// Promote makes this node primary. now is the wall time (unix ns).
func (n *Node) Promote(force bool, now int64) error {
	if n.meta.Role == Primary {
		return nil
	}
	if n.conn.up() && n.peerRole == Primary {
		return ErrPeerPrimary
	}
	if n.conn == Handshake || n.conn == SyncTarget {
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

// ---- I/O inputs ----

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

// LocalDone reports that Apply id finished.
func (n *Node) LocalDone(id uint64, err error) {
	if id != 0 && id == n.retireID {
		n.retireID = 0
		// The flush made every write completed before it durable; extents
		// idle since before it was issued need no replay after a crash.
		// Their dirty bits go to disk in the same Persist as the AL.
		if err == nil && n.al.retire(n.retireSet, n.retireTick) {
			n.alDirty, n.bmDirty = true, true
		}
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
	// Refill the resync budget.
	if n.cfg.ResyncRate > 0 {
		rate := n.cfg.ResyncRate
		if n.cfg.ResyncMinRate > 0 {
			rate = max(n.cfg.ResyncRate-n.appLast, n.cfg.ResyncMinRate)
		}
		// Debt from a read larger than one tick's budget carries over, so
		// the long-run rate is right; unused budget does not accumulate.
		n.budget = min(n.budget+rate, rate)
	}
	n.pump()
}

// handshakeTimeout is how long a handshake may go without progress while
// the peer answers pings: max(PingTimeout, KoTicks) ticks, the patience
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

func (n *Node) step(m Message) error {
	switch m.Type {
	case MsgPing:
		n.send(Message{Type: MsgPingAck})
	case MsgPingAck:
	case MsgHello:
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
	case MsgBitmap:
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
	case MsgRole:
		if Role(m.Op) > Primary {
			return errors.New("bad role")
		}
		n.peerRole = Role(m.Op)
	case MsgData:
		return n.rxData(m, false)
	case MsgRSData, MsgRSZero:
		if n.conn != SyncTarget {
			return fmt.Errorf("%v while %v", m.Type, n.conn)
		}
		return n.rxData(m, true)
	case MsgRecvAck, MsgWriteAck:
		if n.cfg.Protocol == ProtoA {
			// The peer has the write: a disconnect need no longer mark it.
			delete(n.sentA, m.Seq)
			return nil
		}
		p, ok := n.bySeq[m.Seq]
		if !ok {
			return nil // ack for a write already given up on
		}
		if m.Type == MsgRecvAck && n.cfg.Protocol != ProtoB {
			return nil
		}
		delete(n.bySeq, m.Seq)
		p.peerWait = false
		if m.Flags&FlagErr != 0 && p.w.Op != OpFlush {
			n.bm.SetRange(p.w.Offset, p.w.Length)
			n.bmDirty = true
		}
		n.maybeRelease(p)
		n.pump()
	case MsgSyncStart:
		if n.conn != SyncTarget && n.conn != Connected {
			return fmt.Errorf("SyncStart while %v", n.conn)
		}
		if n.meta.Role == Primary {
			return errors.New("primary cannot be sync target")
		}
		n.conn = SyncTarget
		n.awaitStart = false
		if m.Seq != 0 && m.Seq != n.meta.Gens.Current {
			n.meta.Gens.pushHistory(n.meta.Gens.Current)
			n.meta.Gens.Current = m.Seq
		}
		n.meta.Disk = Inconsistent
		n.metaDirty = true
	case MsgSyncDone:
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
	case MsgRSAck:
		return n.rsAcked(m.Offset, m.Length, m.Flags&FlagErr != 0)
	case MsgRSHash, MsgVerifyReq:
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
	case MsgRSHashReply:
		return n.hashReply(m.Offset, m.Length, m.Flags&FlagMatch != 0)
	case MsgVerifyReply:
		n.stats.VerifiedBytes += m.Length
		if m.Flags&FlagMatch == 0 {
			n.bm.SetRange(m.Offset, m.Length)
			n.stats.VerifyDiff += m.Length
			n.bmDirty = true
		}
		return n.rsAcked(m.Offset, m.Length, false)
	case MsgVerifyDone:
		if n.conn == VerifyTarget {
			n.conn = Connected
		}
	default:
		return fmt.Errorf("unexpected %v", m.Type)
	}
	return nil
}

func (n *Node) maybeDecide() {
	if n.peerHello == nil || !n.peerBMDone {
		return
	}
	d := Decide(n.sentHello, *n.peerHello, n.cfg.SplitBrain)
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
		n.peerBitmap = nil
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
		n.send(Message{Type: MsgSyncStart, Seq: n.meta.Gens.Bitmap})
		n.conn = SyncSource
		n.cursor, n.rsTotal = 0, n.outOfSync()
		n.metaDirty, n.bmDirty = true, true
	}
	n.peerRole, n.peerDisk = n.peerHello.Role, n.peerHello.Disk
	n.flushHeld()
	n.pump()
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
		if a.Op != OpFlush {
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
			n.bm.ClearRange(it.m.Offset, it.m.Length, n.cfg.Size)
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

// ---- resync / verify source ----

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
			// Resync what verify found, from the primary.
			n.send(Message{Type: MsgSyncStart, Seq: 0})
			n.conn = SyncSource
			n.cursor, n.rsTotal = 0, n.outOfSync()
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
			n.bm.ClearRange(r.off, r.len, n.cfg.Size)
			n.bmDirty = n.bmDirty || n.bm.Count() == 0
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
		}
	}
	n.send(Message{Type: t, Offset: m.Offset, Length: m.Length, Flags: fl})
}
