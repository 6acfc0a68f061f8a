// Package driver runs a repl.Node for real: TCP connections (one for data,
// one for control, so pings and acks never queue behind bulk data), a
// ticker, the volume's I/O engine (through its export.Device), and the
// persistence of generations, activity log and bitmap.
//
// Simplest use (what the daemon plugin in plugin.go does per volume):
//
//	dir := driver.Dir(dataDir, "vm1")  // repl/ in the volume's state directory
//	s, err := driver.LoadSettings(dir) // replset.Settings with the node id
//	r, err := driver.Start(driver.Options{Name: "vm1", Dir: dir, Device: dev, Settings: s})
//	front := r.Wrap(dev)   // hand this to the front ends instead of dev
//	...
//	r.Close()              // clean stop: bitmap complete on disk
//
// Files: replica.go (Start, the loop, local I/O: the secondary submits
// applies with export.Request.More while more are queued, so its writes
// are gathered by what is queued), link.go (the two TCP connections),
// auth.go (who may connect: the peer's address, the shared-secret
// challenge-response in the channel hello),
// store.go (Settings on disk, meta.json, bitmap.bin, al.bin), migrate.go
// (moving state from the old <data_dir>/repl/<volume>), plugin.go (the
// daemon plugin, Configure, the delete and resize checks), lifecycle.go
// (replicas added, reconfigured and removed on a running daemon), route.go
// (the per-volume switch clients go through), observe.go and
// status.go (logs, metrics, status), device.go (the wrapped device).
// Received payloads come from the shared aligned buffer pool (alignbuf).
//
// Concurrency: one goroutine (the loop) owns the repl.Node; everything else
// (network readers and writers, the apply submitter, the resync reader,
// client Submit calls, admin calls) talks to it through channels and
// queues, and no blocking I/O ever runs on the loop except metadata
// persistence (small atomic files). The loop may hand a write to the
// engine itself (engine Submit only queues it) when the submitter has
// nothing pending and few writes are in flight, so the engine's queue
// limit is never near. All exported methods are safe for concurrent use.
package driver

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"reflect"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/vmsan/vmsan/internal/alignbuf"
	"github.com/vmsan/vmsan/internal/backend"
	"github.com/vmsan/vmsan/internal/events"
	"github.com/vmsan/vmsan/internal/export"
	"github.com/vmsan/vmsan/internal/netutil"
	"github.com/vmsan/vmsan/internal/repl"
	"github.com/vmsan/vmsan/internal/vfs"
)

// Options configure a Replica.
type Options struct {
	Name     string // volume name (also checked in the connection hello)
	Dir      string // where meta.json, al.bin, bitmap.bin live (Dir(dataDir, Name))
	Device   export.Device
	Settings Settings
	Logger   *slog.Logger
	// DataID is the volume's data identity (volume.Meta.DataID); "" when
	// unknown (no check). See checkDataID.
	DataID string
	// Events, if set, gets the replica's state changes and resync progress
	// (`vmsan events`; the daemon's bus).
	Events *events.Bus
	// OnRole, if set, is called (from the replica's loop: it must not
	// call back into the Replica, nor block) whenever this node's role
	// changes; the plugin tells the role controller (role.Controller.
	// Observe), which publishes the role to the front ends.
	OnRole func(repl.Role)
	// FS is the filesystem meta.json, bitmap.bin and al.bin are written through
	// (nil: the real one); tests inject failures with it.
	FS vfs.FS
	// Opens, if set, counts the clients holding the volume open (the
	// plugin's per-volume count, kept across replica restarts); nil: the
	// replica counts its own (Wrap).
	Opens *atomic.Int64
	// Listeners, if set, is the node's set of shared replication
	// listeners (mux.go): the replica registers on the one for its Listen
	// address, shared with the node's other volumes there. nil: a
	// listener of its own.
	Listeners *Listeners
}

// Replica is one replicated volume on this node.
type Replica struct {
	name string
	set  Settings
	dev  export.Device
	st   *state
	log  *slog.Logger
	bus  *events.Bus // nil: no events
	// onRole is Options.OnRole (nil: none).
	onRole func(repl.Role)
	tick   time.Duration

	node *repl.Node // loop only

	events chan event
	comp   compQueue
	applyQ fifo[repl.Apply]
	readQ  fifo[repl.Read]

	clients map[uint64]*export.Request // loop only
	// rmwLocks and rmwDeferred: read-modify-write range locks and the
	// client writes they hold back (rmw.go). Loop only.
	rmwLocks    []*rmwLock
	rmwDeferred []*export.Request
	link        *link                   // loop only
	epoch       uint64                  // loop only
	pending     map[uint64]*pendingPair // loop only: accepted halves
	inflight    atomic.Int64            // applies submitted and not completed
	opens       *atomic.Int64           // wrapped devices not released: clients holding the volume (Options.Opens)
	queued      atomic.Int64            // applies in applyQ or being submitted by the submitter

	// rxBudget bounds stream data received but not yet applied, so a slow
	// secondary disk pushes back on the TCP data connection (and so on the
	// primary) instead of growing memory; pings are unaffected.
	rxMu    sync.Mutex
	rxCond  *sync.Cond
	rxBytes int64

	// curSender is the current data sender, for client backpressure.
	sendMu    sync.Mutex
	curSender *sender

	ln net.Listener // nil on a shared listener
	// shared is the shared listener the replica is registered on
	// (Options.Listeners), with its set; nil: ln.
	shared    *sharedListener
	listeners *Listeners
	wantDial  atomic.Bool
	// Who may connect (auth.go): the address filter, this side's part of
	// the authenticated channel hello, a bound on handshakes in progress,
	// and rate-limited logs of refused connections.
	filter     *peerFilter
	hsParams   HandshakeParams
	hsSem      chan struct{}
	refusedLog *logLimiter
	remote     string // loop only: the current link's remote address
	// primary/upToDate mirror the node for the client hot path.
	primary  atomic.Bool
	upToDate atomic.Bool
	lastPub  pubKey // loop only
	dialer   bool
	protoA   bool

	statusMu sync.Mutex
	status   Status
	eta      etaEstimator
	obs      observer // logs, disconnect kinds, ack latency (observe.go)

	stop     chan struct{}
	done     chan struct{}
	closed   atomic.Bool
	wg       sync.WaitGroup
	closeErr error
	// deferredErr: a process() failure inside an event handler
	// (processNow); the loop stops on it as on its own. Loop only.
	deferredErr error
	// held: a Ready whose metadata write failed transiently, retried
	// before anything else is processed (metahold.go). Loop only.
	held    *heldReady
	metaLog *logLimiter
}

const (
	resyncReaders   = 4
	directSubmitMax = 64
	rxBudgetBytes   = 64 << 20
	sendBudgetBytes = 64 << 20
)

type evKind uint8

const (
	evMsg evKind = iota + 1
	evLinkErr
	evConn
	evPropose
	evFn
)

type event struct {
	kind  evKind
	epoch uint64
	msg   repl.Message
	err   error
	req   *export.Request
	owner *rmwLock // evPropose: the range lock this write belongs to
	fn    func()
	ch    byte
	conn  net.Conn
}

type pubKey struct {
	conn      repl.ConnState
	role      repl.Role
	disk      repl.DiskState
	peerRole  repl.Role
	peerDisk  repl.DiskState
	outOfSync int64
}

// Start opens (or initialises) the replication state and starts the loop,
// the listener and (if this side dials) the dialer.
func Start(o Options) (*Replica, error) {
	s := o.Settings
	if err := validateStored(s); err != nil {
		return nil, err
	}
	s = s.WithDefaults()
	if err := s.AuthProblem(); err != nil {
		// Settings written before the link was authenticated: say which
		// key to set instead of running an open link.
		return nil, fmt.Errorf("repl %s: %w", o.Name, err)
	}
	secret, err := s.Secret()
	if err != nil {
		return nil, fmt.Errorf("repl %s: %w", o.Name, err)
	}
	filter, err := newPeerFilter(s)
	if err != nil {
		return nil, fmt.Errorf("repl %s: %w", o.Name, err)
	}
	proto, _ := repl.ParseProtocol(s.Protocol)
	sb, _ := repl.ParseSplitBrainPolicy(s.SplitBrain)
	tk := s.Ticks()
	log := o.Logger
	if log == nil {
		log = slog.Default()
	}
	log = log.With("volume", o.Name, "component", "repl")
	if s.Insecure {
		log.Warn("replication link is insecure (no shared secret): any process that reaches the listen port from the peer's address can take the link over",
			"listen", s.Listen, "peer", s.Peer)
	} else if fi, err := os.Stat(s.SharedSecretFile); s.SharedSecretFile != "" && err == nil && fi.Mode().Perm()&0o077 != 0 {
		log.Warn("the shared secret file is readable by other users: chmod 600 it", "file", s.SharedSecretFile, "mode", fi.Mode().Perm().String())
	}
	if err := vfs.MkdirAllSync(vfs.OS, o.Dir, dirMode); err != nil {
		return nil, err
	}
	st := &state{fs: o.FS, dir: o.Dir}
	m, words, al, found, err := st.load()
	if err != nil {
		return nil, err
	}
	if st.al, err = openALFileFS(st.fsys(), o.Dir); err != nil {
		return nil, err
	}
	if len(al) == 1 && al[0] == -1 {
		// The AL overflowed before a crash: every extent may be hot.
		al = nil
		for e := int64(0); e*repl.ALExtentSize < o.Device.Info().Size; e++ {
			al = append(al, e)
		}
	}
	if !found {
		m = repl.Meta{Disk: repl.Inconsistent, Clean: true}
		if s.Role == "primary" {
			// A primary from the start owns the data it has: UpToDate.
			m.Disk = repl.UpToDate
		} else if hasData(o.Device) {
			// Generation 0 means "fresh, all zero" and two such replicas
			// connect without syncing. A secondary that already holds data
			// must not claim that: give it a generation of its own, so the
			// handshake refuses (unrelated data) instead of assuming the
			// replicas are equal. The operator then decides which to keep.
			m.Gens.Current = randGen()
		}
	}
	m, words, al = checkDataID(m, words, al, found, o.DataID, log)
	cfg := repl.Config{
		NodeID: s.NodeID, Size: o.Device.Info().Size, Protocol: proto, SplitBrain: sb,
		PingInterval: tk.PingInterval, PingTimeout: tk.PingTimeout, KoTicks: tk.KoTicks, ALRetireTicks: tk.ALRetireTicks,
		ResyncRate: tk.ResyncRate, ResyncMinRate: tk.ResyncMinRate,
		Checksum: s.Checksum, Rand: randGen,
	}
	r := &Replica{
		name: o.Name, set: s, dev: o.Device, st: st, log: log, bus: o.Events, onRole: o.OnRole,
		tick:    tk.Tick,
		node:    repl.NewNode(cfg, m, words, al),
		events:  make(chan event, 1024),
		clients: make(map[uint64]*export.Request),
		pending: make(map[uint64]*pendingPair),
		stop:    make(chan struct{}),
		done:    make(chan struct{}),
		dialer:  s.Dial == "yes" || (s.Dial != "no" && s.Listen < s.Peer),
		protoA:  proto == repl.ProtoA,

		filter:     filter,
		hsParams:   HandshakeParams{Name: o.Name, NodeID: s.NodeID, Secret: secret},
		hsSem:      make(chan struct{}, maxHandshakes),
		refusedLog: newLogLimiter(10 * time.Second),
		metaLog:    newLogLimiter(metaLogEvery),
		opens:      o.Opens,
	}
	if r.opens == nil {
		r.opens = new(atomic.Int64)
	}
	fdReserve() // opened before any flood can take the descriptors
	r.rxCond = sync.NewCond(&r.rxMu)
	r.comp.init()
	r.applyQ.init()
	r.readQ.init()
	if !found && s.Role == "primary" {
		if err := r.node.Promote(true, time.Now().UnixNano()); err != nil {
			return nil, err
		}
	}
	if err := r.process(); err != nil {
		return nil, err
	}
	if o.Listeners != nil {
		sl, err := o.Listeners.register(s.Listen, o.Name, r)
		if err != nil {
			return nil, fmt.Errorf("repl %s: listen %s: %w", o.Name, s.Listen, err)
		}
		r.shared, r.listeners = sl, o.Listeners
	} else {
		ln, err := net.Listen("tcp", s.Listen)
		if err != nil {
			return nil, fmt.Errorf("repl %s: listen %s: %w", o.Name, s.Listen, err)
		}
		// Accept errors (EMFILE while another listener is flooded, ...)
		// are logged and retried: the accept loop must outlive them, or
		// the peer could never connect again.
		r.ln = netutil.Retry(ln, r.log, "repl "+o.Name)
	}
	r.node.Listen()
	r.process()
	r.publish()
	r.primary.Store(r.node.Status().Role == repl.Primary)
	r.upToDate.Store(r.node.Status().Disk == repl.UpToDate)
	r.wg.Add(2 + resyncReaders)
	go r.loop()
	if r.ln != nil {
		r.wg.Add(1)
		go r.acceptLoop()
	}
	go r.submitter()
	// Several resync readers: the node keeps up to ResyncInflight reads in
	// flight and completions are matched by id, so order does not matter.
	for i := 0; i < resyncReaders; i++ {
		go r.resyncReader()
	}
	if r.dialer {
		r.wg.Add(1)
		go r.dialLoop()
	}
	return r, nil
}

// hasData reports whether any block of the device is allocated.
func hasData(d export.Device) bool {
	exts, err := d.Extents(0, d.Info().Size)
	if err != nil {
		return true // unknown: do not claim "fresh"
	}
	for _, e := range exts {
		if !e.Hole && !e.Zero {
			return true
		}
	}
	return false
}

func randGen() uint64 {
	var b [8]byte
	rand.Read(b[:])
	return binary.LittleEndian.Uint64(b[:])
}

// Addr is the replication listener's address.
func (r *Replica) Addr() net.Addr {
	if r.shared != nil {
		return r.shared.ln.Addr()
	}
	return r.ln.Addr()
}

// ---- the loop ----

func (r *Replica) loop() {
	defer r.wg.Done()
	defer close(r.done)
	// Deferred writes belong to clients waiting for them: never dropped.
	defer r.rmwFail(errStopped)
	t := time.NewTicker(r.tick)
	defer t.Stop()
	for {
		tick := false
		select {
		case <-r.stop:
			if r.held != nil {
				// Their acknowledgements wait for a metadata write that
				// will not happen now.
				r.failAll(errStopped)
			}
			return
		case ev := <-r.events:
			r.handle(ev)
			// Batch: take what else is already queued before producing
			// output, so a burst of client writes costs one pass.
			for i := 0; i < 256; i++ {
				select {
				case ev := <-r.events:
					r.handle(ev)
					continue
				default:
				}
				break
			}
		case <-r.comp.notify:
			r.drainCompletions()
		case <-t.C:
			// Handle what arrived while we were busy first, so a slow
			// metadata write never looks like a silent peer.
			for i := 0; i < 1024; i++ {
				select {
				case ev := <-r.events:
					r.handle(ev)
					continue
				default:
				}
				break
			}
			r.node.Tick()
			tick = true
			// Top the descriptor reserve up again after a flood took what
			// it released (a no-op while full; one failing open while the
			// process is still out of descriptors).
			if res := fdReserve(); res.Held() < fdReserveSize {
				res.Refill()
			}
		}
		err := r.deferredErr
		if err == nil {
			err = r.process()
		}
		if err != nil {
			// Metadata could not be persisted: continuing could acknowledge
			// writes whose out-of-sync state is not durable. Stop.
			r.log.Error("replication metadata write failed; stopping replication", "err", err)
			r.failAll(err)
			return
		}
		st := r.node.Status()
		r.wantDial.Store(r.link == nil && st.Conn == repl.Connecting)
		r.primary.Store(st.Role == repl.Primary)
		r.upToDate.Store(st.Disk == repl.UpToDate)
		key := pubKey{st.Conn, st.Role, st.Disk, st.PeerRole, st.PeerDisk, st.OutOfSync}
		if tick || key != r.lastPub {
			// The full snapshot (strings, rates) is for status readers:
			// once per tick and whenever a state or the out-of-sync
			// amount changes.
			r.lastPub = key
			r.publish()
		}
	}
}

// handle applies one event to the node. REQUIRES: loop goroutine.
func (r *Replica) handle(ev event) {
	switch ev.kind {
	case evMsg:
		if r.link != nil && ev.epoch == r.link.epoch {
			r.onRecv(ev.epoch, ev.msg)
			r.node.Step(ev.msg)
		}
		if t := ev.msg.Type; t != repl.MsgData && t != repl.MsgRSData && len(ev.msg.Data) > 0 {
			// Not applied through the engine: done with its payload now.
			r.rxRelease(int64(len(ev.msg.Data)))
		}
	case evLinkErr:
		if r.link != nil && ev.epoch == r.link.epoch {
			r.log.Warn("replication link lost", "err", ev.err)
			r.dropLink()
			r.obs.linkErr = ev.err
			r.node.Disconnect(linkErrReason(ev.err))
		}
	case evConn:
		r.addHalf(ev)
	case evPropose:
		r.propose(ev.req, ev.owner)
	case evFn:
		ev.fn()
	}
}

// propose hands a client request to the node, unless a read-modify-write
// range lock other than owner holds it back (rmw.go).
func (r *Replica) propose(req *export.Request, owner *rmwLock) {
	if r.rmwDefer(req, owner) {
		return
	}
	w := repl.Write{Offset: req.Offset, Length: req.Length, FUA: req.FUA, NoHole: req.NoHole}
	switch req.Op {
	case export.OpWrite:
		w.Op, w.Data = repl.OpWrite, req.Data
		if r.protoA {
			// Under protocol A the client is answered once the write is
			// locally durable, possibly before the sender has written the
			// payload to the socket; front ends recycle their buffers
			// after the reply, so the stream needs its own copy. (B and
			// C answer only after the peer has received the data.)
			w.Data = append([]byte(nil), req.Data...)
		}
	case export.OpTrim:
		w.Op = repl.OpTrim
	case export.OpWriteZeroes:
		w.Op = repl.OpZero
	case export.OpFlush:
		w.Op = repl.OpFlush
	}
	id, err := r.node.Propose(w)
	if err != nil {
		finish(req, mapErr(err))
		return
	}
	r.clients[id] = req
}

func mapErr(err error) error {
	switch {
	case errors.Is(err, repl.ErrNotPrimary):
		return fmt.Errorf("%w: %w", err, syscall.EROFS)
	case errors.Is(err, repl.ErrOutOfRange):
		return fmt.Errorf("%w: %w", err, syscall.EINVAL)
	}
	return fmt.Errorf("%w: %w", err, syscall.EIO)
}

func finish(req *export.Request, err error) {
	req.Err = err
	if req.Done != nil {
		req.Done(req)
	}
}

// process drains the node's Ready in the documented order.
//
// REQUIRES: running on the loop goroutine (it owns r.node, r.clients,
// r.link).
//
// A persist failure that is transient (transientMetaErr: out of
// descriptors, memory or space) does not stop replication: the Ready is
// held and retried first on a later pass, once its backoff has passed
// (metahold.go); until then nothing after it is done, so no write is
// acknowledged before its out-of-sync state is durable.
func (r *Replica) process() error {
	for {
		var rd repl.Ready
		if h := r.held; h != nil {
			if time.Now().Before(h.next) {
				break
			}
			rd = h.rd
		} else {
			if !r.node.HasReady() {
				break
			}
			rd = r.node.Ready()
		}
		if err := r.persist(rd.Persist); err != nil {
			if !transientMetaErr(err) {
				return err
			}
			r.hold(rd, err)
			break
		}
		if r.held != nil {
			r.resume()
		}
		for _, m := range rd.Send {
			if r.link != nil {
				r.ackSent(m)
				r.link.send(m)
			}
		}
		for i, a := range rd.Apply {
			// Submit on the loop when nothing is queued for the submitter
			// (so order is kept) and few applies are in flight (so the
			// engine, whose Submit blocks only when MaxQueue requests are
			// outstanding, has room): one goroutine hand-off less per
			// write on both nodes. Under deep queues the submitter takes
			// over and the loop never waits for the engine.
			if r.queued.Load() == 0 && r.inflight.Load() < directSubmitMax {
				r.inflight.Add(1)
				// More: the rest of this batch follows right after.
				r.submit(a, i < len(rd.Apply)-1)
				continue
			}
			r.inflight.Add(1)
			r.queued.Add(1)
			r.applyQ.push(a)
		}
		for _, rd := range rd.Reads {
			r.readQ.push(rd)
		}
		for _, rel := range rd.Release {
			if req, ok := r.clients[rel.ID]; ok {
				delete(r.clients, rel.ID)
				var err error
				if rel.Err != nil {
					err = rel.Err
				}
				finish(req, err)
			}
		}
		if len(r.rmwLocks) > 0 && len(rd.Release) > 0 {
			r.rmwGrant()
		}
		if rd.Disconnect != "" {
			r.noteDisconnect(rd.Disconnect)
			r.dropLink()
		}
	}
	r.obs.pending.Store(int64(len(r.clients)))
	return nil
}

// processNow drains the node's Ready in the middle of a batch of events
// (the loop processes once per batch). A failure is kept for the loop,
// which stops replication on it. REQUIRES: loop goroutine.
func (r *Replica) processNow() {
	if err := r.process(); err != nil && r.deferredErr == nil {
		r.deferredErr = err
	}
}

func (r *Replica) drainCompletions() {
	for _, c := range r.comp.take() {
		if c.read {
			r.node.ReadDone(c.id, c.pieces, c.err)
			continue
		}
		r.inflight.Add(-1)
		if _, client := r.clients[c.id]; !client {
			r.rxRelease(c.bytes)
		}
		r.node.LocalDone(c.id, c.err)
		if c.rxBuf != nil {
			putRxBuf(c.rxBuf)
		}
	}
}

func (r *Replica) failAll(err error) {
	for id, req := range r.clients {
		delete(r.clients, id)
		finish(req, fmt.Errorf("replication stopped: %w: %w", err, syscall.EIO))
	}
	r.rmwFail(fmt.Errorf("replication stopped: %w: %w", err, syscall.EIO))
	r.dropLink()
}

// ---- local I/O ----

// submitter applies in the node's order: one goroutine, so the engine sees
// writes in exactly the order the state machine emitted them.
func (r *Replica) submitter() {
	defer r.wg.Done()
	for {
		a, ok := r.applyQ.pop(r.stop)
		if !ok {
			return
		}
		// queued still counts a: more than 1 means the next apply is
		// already in applyQ, submitted right after this one (the engine's
		// More hint, so a sequential stream keeps being gathered).
		r.submit(a, r.queued.Load() > 1)
		// INVARIANT: queued counts applies pushed and not yet handed to
		// the engine; the loop submits directly only when it is 0, so the
		// engine sees applies in the node's order.
		r.queued.Add(-1)
	}
}

// submit hands one apply to the engine; more says the caller holds the
// next apply already (export.Request.More: the secondary has the
// replication stream's window in hand, so its writes are gathered by what
// is queued rather than by the engine's timed backstop alone).
// REQUIRES: called by the loop (when queued == 0) or by the submitter,
// never both at once for consecutive applies (see queued).
func (r *Replica) submit(a repl.Apply, more bool) {
	req := &export.Request{Offset: a.Offset, Length: a.Length, Data: a.Data, FUA: a.FUA, Cookie: a.ID, More: more}
	switch a.Op {
	case repl.OpWrite:
		req.Op = export.OpWrite
	case repl.OpTrim:
		req.Op = export.OpTrim
	case repl.OpZero:
		req.Op, req.NoHole = export.OpWriteZeroes, a.NoHole
	case repl.OpFlush:
		req.Op = export.OpFlush
	}
	bytes := int64(len(a.Data))
	var rxBuf []byte
	if a.Received {
		rxBuf = a.Data
	}
	req.Done = func(q *export.Request) {
		r.comp.push(completion{id: q.Cookie, err: q.Err, bytes: bytes, rxBuf: rxBuf})
	}
	r.dev.Submit(req)
}

// resyncReader serves the node's resync/verify reads: block status first
// (holes cost nothing), then the data through the engine (ordered with
// writes), split into zero and data pieces.
func (r *Replica) resyncReader() {
	defer r.wg.Done()
	for {
		rd, ok := r.readQ.pop(r.stop)
		if !ok {
			return
		}
		pieces, err := r.readPieces(rd)
		r.comp.push(completion{read: true, id: rd.ID, pieces: pieces, err: err})
	}
}

func (r *Replica) readRange(off, length int64) ([]byte, error) {
	buf := make([]byte, length)
	done := make(chan error, 1)
	r.dev.Submit(&export.Request{Op: export.OpRead, Offset: off, Length: length, Data: buf,
		Done: func(q *export.Request) { done <- q.Err }})
	return buf, <-done
}

func (r *Replica) readPieces(rd repl.Read) ([]repl.ReadPiece, error) {
	if !rd.NeedData {
		b, err := r.readRange(rd.Offset, rd.Length)
		if err != nil {
			return nil, err
		}
		return []repl.ReadPiece{{Offset: rd.Offset, Length: rd.Length, Zero: alignbuf.IsZero(b), Hash: hashOf(b)}}, nil
	}
	exts, err := r.dev.Extents(rd.Offset, rd.Length)
	if err != nil || len(exts) == 0 {
		exts = []backend.Extent{{Offset: rd.Offset, Length: rd.Length}}
	}
	var out []repl.ReadPiece
	add := func(p repl.ReadPiece) {
		if n := len(out); n > 0 && p.Zero && out[n-1].Zero && out[n-1].Offset+out[n-1].Length == p.Offset {
			out[n-1].Length += p.Length
			return
		}
		out = append(out, p)
	}
	for _, e := range exts {
		s, end := max(e.Offset, rd.Offset), min(e.Offset+e.Length, rd.Offset+rd.Length)
		if s >= end {
			continue
		}
		if e.Zero || e.Hole {
			add(repl.ReadPiece{Offset: s, Length: end - s, Zero: true})
			continue
		}
		b, err := r.readRange(s, end-s)
		if err != nil {
			return nil, err
		}
		// Split at 64 KiB: all-zero chunks travel as zero ranges, and
		// checksum resync compares chunk by chunk.
		for off := int64(0); off < int64(len(b)); {
			l := min(int64(repl.ChunkSize)-(s+off)%repl.ChunkSize, int64(len(b))-off)
			c := b[off : off+l]
			if alignbuf.IsZero(c) {
				add(repl.ReadPiece{Offset: s + off, Length: l, Zero: true})
			} else if n := len(out); !rd.WantHash && n > 0 && !out[n-1].Zero && out[n-1].Offset+out[n-1].Length == s+off {
				out[n-1].Length += l
				out[n-1].Data = b[out[n-1].Offset-s : off+l]
			} else {
				out = append(out, repl.ReadPiece{Offset: s + off, Length: l, Data: c})
			}
			off += l
		}
	}
	if rd.WantHash {
		for i := range out {
			if out[i].Zero {
				out[i].Hash = zeroHash(out[i].Length)
			} else {
				out[i].Hash = hashOf(out[i].Data)
			}
		}
	}
	return out, nil
}

// ---- rx budget ----

func (r *Replica) rxAcquire(n int64) bool {
	r.rxMu.Lock()
	defer r.rxMu.Unlock()
	for r.rxBytes > 0 && r.rxBytes+n > rxBudgetBytes {
		if r.closed.Load() {
			return false
		}
		r.rxCond.Wait()
	}
	r.rxBytes += n
	return true
}

func (r *Replica) rxRelease(n int64) {
	r.rxMu.Lock()
	r.rxBytes = max(0, r.rxBytes-n)
	r.rxMu.Unlock()
	r.rxCond.Broadcast()
}

func (r *Replica) rxReset() {
	r.rxMu.Lock()
	r.rxBytes = 0
	r.rxMu.Unlock()
	r.rxCond.Broadcast()
}

// ---- admin ----

// call runs fn on the loop and waits.
func (r *Replica) call(fn func() error) error {
	errc := make(chan error, 1)
	select {
	case r.events <- event{kind: evFn, fn: func() {
		err := fn()
		// Publish before answering, so a caller reading Status right
		// after sees the effect.
		if perr := r.process(); err == nil {
			err = perr
		}
		if err == nil {
			err = r.heldErr()
		}
		st := r.node.Status()
		r.primary.Store(st.Role == repl.Primary)
		r.upToDate.Store(st.Disk == repl.UpToDate)
		r.publish()
		errc <- err
	}}:
	case <-r.done:
		return errors.New("repl: replica stopped")
	}
	select {
	case err := <-errc:
		return err
	case <-r.done:
		return errors.New("repl: replica stopped")
	}
}

// Promote makes this node primary (force: even if the disk is not UpToDate).
func (r *Replica) Promote(force bool) error {
	return r.call(func() error { return r.node.Promote(force, time.Now().UnixNano()) })
}

// ErrHeldOpen: demote refused because clients hold the volume open.
var ErrHeldOpen = errors.New("repl: volume is held open")

// Demote makes this node secondary. Like DRBD ("Device is held open") it
// refuses while a client holds the volume open, unless force: the client
// would keep a read-write device whose next write fails with EROFS.
func (r *Replica) Demote(force bool) error {
	if n := r.opens.Load(); n > 0 && !force {
		if r.primary.Load() {
			return fmt.Errorf("%w by %d client(s) (e.g. NBD connections): disconnect them first, or demote with --force (their writes then fail with EROFS)", ErrHeldOpen, n)
		}
	}
	return r.call(r.node.Demote)
}

// Opens reports how many clients hold the volume open (wrapped devices not
// released).
func (r *Replica) Opens() int64 { return r.opens.Load() }

// Verify starts online verify.
func (r *Replica) Verify() error { return r.call(r.node.StartVerify) }

// Disconnect drops the link and stays StandAlone until Connect.
func (r *Replica) Disconnect() error {
	return r.call(func() error { r.dropLink(); r.node.AdminDisconnect(); return nil })
}

// Connect leaves StandAlone (e.g. after split brain was resolved by hand).
func (r *Replica) Connect() error {
	return r.call(func() error { r.node.Listen(); return nil })
}

// ConnectDiscardMyData is Connect with DRBD's one-shot --discard-my-data:
// should the next handshake find split brain, this node's changes since
// the split are dropped and it resyncs from the peer (repl.Node.
// ConnectDiscardMyData: refused on a primary, or while connected).
func (r *Replica) ConnectDiscardMyData() error {
	return r.call(func() error {
		if err := r.node.ConnectDiscardMyData(); err != nil {
			return err
		}
		r.log.Warn("discard-my-data: if the next handshake finds split brain, this node's changes are dropped and it resyncs from the peer", "peer", r.set.Peer)
		return nil
	})
}

// retunable reports whether the replica running with old can take new in
// place (Retune): they differ only in timeouts and resync rates, with the
// same tick.
func retunable(old, new Settings) bool {
	a, b := old.WithDefaults(), new.WithDefaults()
	if a.Ticks().Tick != b.Ticks().Tick {
		return false
	}
	for _, s := range []*Settings{&a, &b} {
		s.PingInterval, s.PingTimeout, s.KoTimeout, s.ALRetire, s.ResyncRate, s.ResyncMinRate = 0, 0, 0, 0, 0, 0
		s.Tick = 0
		// The role counts at the very first start only (afterwards the
		// persisted role wins): nothing to restart for.
		s.Role = ""
	}
	return reflect.DeepEqual(a, b)
}

// Retune applies new timeouts and resync rates in place (see retunable):
// the link stays up. REQUIRES: retunable(running settings, s).
func (r *Replica) Retune(s Settings) error {
	tk := s.WithDefaults().Ticks()
	return r.call(func() error {
		r.node.Retune(repl.Tunables{PingInterval: tk.PingInterval, PingTimeout: tk.PingTimeout, KoTicks: tk.KoTicks,
			ALRetireTicks: tk.ALRetireTicks, ResyncRate: tk.ResyncRate, ResyncMinRate: tk.ResyncMinRate})
		return nil
	})
}

// errClientsPending: drainClients is still waiting for client requests.
var errClientsPending = errors.New("repl: client requests still pending")

// drainClients waits until no client request is held by the replica
// (proposed and not yet answered), or until timeout. The caller has
// stopped new client requests from reaching it (the plugin's pause):
// events are handled in order, so a check run on the loop sees every
// request submitted before it.
func (r *Replica) drainClients(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		err := r.call(func() error {
			if n := len(r.clients); n > 0 {
				return fmt.Errorf("%w (%d)", errClientsPending, n)
			}
			return nil
		})
		if err == nil || !errors.Is(err, errClientsPending) || time.Now().After(deadline) {
			return err
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Close stops replication cleanly: waits (bounded) for local writes in
// flight, records a clean shutdown (bitmap complete, activity log need not
// be replayed) and stops every goroutine. It does not close the device.
func (r *Replica) Close() error {
	if r.closed.Swap(true) {
		return r.closeErr
	}
	deadline := time.Now().Add(10 * time.Second)
	for r.inflight.Load() > 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	clean := r.inflight.Load() == 0
	r.closeErr = r.call(func() error {
		r.dropLink()
		if clean {
			r.node.Shutdown()
		}
		return r.process()
	})
	close(r.stop)
	if r.shared != nil {
		r.listeners.unregister(r.shared, r.name, r)
	} else {
		r.ln.Close()
	}
	r.rxCond.Broadcast()
	r.wg.Wait()
	r.st.al.close()
	return r.closeErr
}
