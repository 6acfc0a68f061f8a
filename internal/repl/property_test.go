package repl

import (
	"bytes"
	"fmt"
	"math/rand"
	"os"
	"strconv"
	"testing"
)

// The property test drives a primary and a secondary Node through random
// workloads with disconnects and reconnects at random points, local I/O
// completing in random order and messages delivered in random interleavings
// of the two channels. It checks, on the primary:
//
//   - every proposed operation is released exactly once;
//   - a write released without the peer's acknowledgement is marked out of
//     sync, in memory and durably (persisted bitmap or activity log), before
//     the client hears about it;
//   - once the peer is gone and every local I/O completed, nothing is left
//     pending (no client waits forever);
//   - after a final reconnect and resync, both disks are byte-equal.
//
// Deterministic: everything comes from the seed. VMSAN_SOAK=1 runs many
// more seeds and steps.

type propNode struct {
	n       *Node
	disk    []byte
	applies []Apply // submitted, not completed (any order)
	reads   []Read
	pBM     []uint64 // persisted bitmap
	pAL     []int64  // persisted activity log
}

type propSim struct {
	t      *testing.T
	rng    *rand.Rand
	size   int64
	proto  Protocol
	p, s   *propNode
	linkUp bool
	// queues: 0 p>s data, 1 p>s control, 2 s>p data, 3 s>p control.
	q [4][]Message

	proposed map[uint64]bool // id -> is a data op (not flush)
	writes   map[uint64]Write
	released map[uint64]int
	acked    map[uint64]bool // the peer acknowledged (without error)
	// earlyA: protocol A writes answered before the peer reported them
	// received; the next disconnect must mark them.
	earlyA   map[uint64]bool
	sentA    map[uint64]bool // protocol A writes sent to the peer
	checkCut bool
	step     int
	// cutPerMille: chance of a link cut among the link-event steps.
	cutPerMille int
	discs       int
}

func (ps *propSim) fatalf(format string, a ...any) {
	ps.t.Helper()
	ps.t.Fatalf("step %d: "+format, append([]any{ps.step}, a...)...)
}

func newPropSim(t *testing.T, seed int64) *propSim {
	rng := rand.New(rand.NewSource(seed))
	size := int64(64 * ChunkSize)
	protos := []Protocol{ProtoB, ProtoC, ProtoA}
	ps := &propSim{t: t, rng: rng, size: size, proto: protos[rng.Intn(len(protos))],
		proposed: map[uint64]bool{}, writes: map[uint64]Write{}, released: map[uint64]int{}, acked: map[uint64]bool{}, earlyA: map[uint64]bool{}, sentA: map[uint64]bool{}}
	// Both replicas start identical (same generation, all zero), so the
	// first handshake needs no sync and the bitmap starts empty: a write
	// left unmarked shows.
	mk := func(id uint64) *propNode {
		var gen uint64 = id << 32
		cfg := Config{NodeID: id, Size: size, Protocol: ps.proto, PingInterval: 3, PingTimeout: 10, KoTicks: 15,
			ALExtents: 2, ALRetireTicks: 7, ResyncIO: 2 * ChunkSize, ResyncInflight: 2, Checksum: rng.Intn(2) == 0,
			Rand: func() uint64 { gen++; return gen }}
		m := Meta{Disk: UpToDate, Gens: Generations{Current: 7}, Clean: true}
		return &propNode{n: NewNode(cfg, m, nil, nil), disk: make([]byte, size)}
	}
	ps.p, ps.s = mk(1), mk(2)
	if err := ps.p.n.Promote(false, 1); err != nil {
		t.Fatal(err)
	}
	ps.cutPerMille = []int{10, 50, 200, 600}[rng.Intn(4)]
	ps.p.n.Listen()
	ps.s.n.Listen()
	ps.processAll()
	return ps
}

// durable reports whether chunk c is covered by what a crash would leave:
// the persisted bitmap or a persisted activity-log extent.
func (pn *propNode) durable(c int64) bool {
	if w := c / 64; w < int64(len(pn.pBM)) && pn.pBM[w]&(1<<(c%64)) != 0 {
		return true
	}
	for _, e := range pn.pAL {
		if e == c*ChunkSize/ALExtentSize {
			return true
		}
	}
	return false
}

// process drains one node's Ready, in the documented order, checking the
// release invariants on the primary.
func (ps *propSim) process(pn *propNode) bool {
	did := false
	for pn.n.HasReady() {
		did = true
		for _, sp := range pn.n.sentA {
			ps.sentA[sp.id] = true
		}
		rd := pn.n.Ready()
		if rd.Persist.BitmapChanged {
			pn.pBM = rd.Persist.Bitmap
		}
		if rd.Persist.ALChanged {
			pn.pAL = rd.Persist.AL
		}
		if ps.linkUp {
			for _, m := range rd.Send {
				k := 0
				if pn == ps.s {
					k = 2
				}
				if m.Type.Control() {
					k++
				}
				b := AppendEncode(nil, &m)
				dm, _, err := Decode(b)
				if err != nil {
					ps.fatalf("codec: %v", err)
				}
				ps.q[k] = append(ps.q[k], dm)
			}
		}
		for _, a := range rd.Apply {
			// The engine never reorders overlapping requests: apply the
			// data in submission order, complete in any order.
			switch a.Op {
			case OpWrite:
				copy(pn.disk[a.Offset:], a.Data)
			case OpTrim, OpZero:
				clear(pn.disk[a.Offset : a.Offset+a.Length])
			}
			pn.applies = append(pn.applies, a)
		}
		pn.reads = append(pn.reads, rd.Reads...)
		for _, r := range rd.Release {
			if pn != ps.p {
				ps.fatalf("release on the secondary")
			}
			ps.checkRelease(r)
		}
		if rd.Disconnect != "" {
			ps.discs++
			ps.cut()
		}
	}
	return did
}

func (ps *propSim) checkRelease(r Release) {
	isData, ok := ps.proposed[r.ID]
	if !ok {
		ps.fatalf("release of unknown id %d", r.ID)
	}
	ps.released[r.ID]++
	if ps.released[r.ID] > 1 {
		ps.fatalf("id %d released %d times", r.ID, ps.released[r.ID])
	}
	if !isData || ps.acked[r.ID] {
		return
	}
	if ps.proto == ProtoA && ps.sentA[r.ID] && ps.inFlightA(r.ID) {
		// Protocol A answers before the peer confirms; what matters is
		// that a later disconnect marks it (checked at the disconnect).
		ps.earlyA[r.ID] = true
		return
	}
	ps.checkMarked(r.ID)
}

// inFlightA: id was sent on the current connection and not yet reported
// received.
func (ps *propSim) inFlightA(id uint64) bool {
	for _, sp := range ps.p.n.sentA {
		if sp.id == id {
			return true
		}
	}
	return false
}

// checkMarked: the write's chunks are out of sync in memory and durably.
func (ps *propSim) checkMarked(id uint64) {
	w := ps.writes[id]
	r := Release{ID: id}
	bm := ps.p.n.Bitmap()
	for c := w.Offset / ChunkSize; c*ChunkSize < w.Offset+w.Length; c++ {
		if !bm.Test(c) {
			ps.fatalf("id %d (%d+%d, proto %v) released without a peer ack but chunk %d is not out of sync", r.ID, w.Offset, w.Length, ps.proto, c)
		}
		if !ps.p.durable(c) {
			ps.fatalf("id %d released without a peer ack but chunk %d is not durably marked", r.ID, c)
		}
	}
}

func (ps *propSim) processAll() {
	for ps.process(ps.p) || ps.process(ps.s) {
	}
	if ps.checkCut {
		ps.checkCut = false
		for id := range ps.earlyA {
			ps.checkMarked(id)
		}
		clear(ps.earlyA)
	}
}

func (ps *propSim) cut() {
	if !ps.linkUp {
		return
	}
	ps.linkUp = false
	ps.q = [4][]Message{}
	ps.p.n.Disconnect("link down")
	ps.s.n.Disconnect("link down")
	ps.checkCut = true
}

func (ps *propSim) connect() {
	if ps.linkUp {
		return
	}
	for _, pn := range []*propNode{ps.p, ps.s} {
		if c := pn.n.Status().Conn; c == StandAlone {
			ps.fatalf("%d went StandAlone: %s", pn.n.cfg.NodeID, pn.n.Status().LastError)
		}
	}
	ps.linkUp = true
	ps.p.n.Connect()
	ps.s.n.Connect()
}

// deliver hands the head of queue k to its receiver.
func (ps *propSim) deliver(k int) {
	if len(ps.q[k]) == 0 {
		return
	}
	m := ps.q[k][0]
	ps.q[k] = ps.q[k][1:]
	to := ps.s
	if k >= 2 {
		to = ps.p
		if (m.Type == MsgWriteAck || m.Type == MsgRecvAck) && m.Flags&FlagErr == 0 {
			if p, ok := ps.p.n.bySeq[m.Seq]; ok && (m.Type == MsgWriteAck) == (ps.proto != ProtoB) {
				ps.acked[p.id] = true
			}
			if sp, ok := ps.p.n.sentA[m.Seq]; ok && ps.proto == ProtoA {
				// Received by the peer: no longer needs marking.
				ps.acked[sp.id] = true
				delete(ps.earlyA, sp.id)
			}
		}
	}
	to.n.Step(m)
}

func (ps *propSim) completeOne(pn *propNode) bool {
	if len(pn.applies) == 0 && len(pn.reads) == 0 {
		return false
	}
	i := ps.rng.Intn(len(pn.applies) + len(pn.reads))
	if i < len(pn.applies) {
		a := pn.applies[i]
		pn.applies = append(pn.applies[:i], pn.applies[i+1:]...)
		pn.n.LocalDone(a.ID, nil)
		return true
	}
	i -= len(pn.applies)
	r := pn.reads[i]
	pn.reads = append(pn.reads[:i], pn.reads[i+1:]...)
	pn.n.ReadDone(r.ID, readPieces(pn.disk, r), nil)
	return true
}

func (ps *propSim) propose() {
	var w Write
	switch x := ps.rng.Intn(20); {
	case x == 0:
		w.Op = OpFlush
	default:
		w.Op = OpWrite
		if x == 1 {
			w.Op = OpTrim
		}
		w.Length = int64(1+ps.rng.Intn(8)) * 4096
		if ps.rng.Intn(4) == 0 {
			w.Length += ChunkSize // spans chunks
		}
		w.Offset = int64(ps.rng.Int63n((ps.size-w.Length)/4096+1)) * 4096
		if w.Op == OpWrite {
			w.Data = bytes.Repeat([]byte{byte(1 + ps.rng.Intn(255))}, int(w.Length))
		}
		w.FUA = ps.rng.Intn(8) == 0
	}
	id, err := ps.p.n.Propose(w)
	if err != nil {
		ps.fatalf("propose: %v", err)
	}
	if _, dup := ps.proposed[id]; dup {
		ps.fatalf("id %d reused", id)
	}
	ps.proposed[id] = w.Op != OpFlush
	ps.writes[id] = w
}

// doStep performs one random action.
func (ps *propSim) doStep() {
	ps.step++
	switch x := ps.rng.Intn(100); {
	case x < 20:
		ps.propose()
	case x < 35:
		ps.completeOne(ps.p)
	case x < 50:
		ps.completeOne(ps.s)
	case x < 85:
		if ps.linkUp {
			ps.deliver(ps.rng.Intn(4))
		}
	case x < 93:
		ps.p.n.Tick()
		ps.s.n.Tick()
	default:
		// Link cuts: from rare (resyncs finish) to frequent, per seed.
		if ps.rng.Intn(1000) < ps.cutPerMille {
			ps.cut()
		} else if ps.rng.Intn(3) == 0 {
			ps.connect()
		}
	}
	ps.processAll()
}

// settle runs every queue and I/O to completion (ticks only if needed).
func (ps *propSim) settle(limit int) {
	for i := 0; i < limit; i++ {
		did := ps.process(ps.p) || ps.process(ps.s)
		for k := range ps.q {
			for len(ps.q[k]) > 0 && ps.linkUp {
				ps.deliver(k)
				ps.processAll()
				did = true
			}
		}
		for ps.completeOne(ps.p) || ps.completeOne(ps.s) {
			ps.processAll()
			did = true
		}
		if !did {
			return
		}
	}
	ps.fatalf("no quiescence")
}

func runProperty(t *testing.T, seed int64, steps int) {
	ps := newPropSim(t, seed)

	ps.connect()
	ps.processAll()
	for ps.step < steps {
		ps.doStep()
	}
	// The peer goes away for good; every local I/O completes.
	ps.cut()
	ps.processAll()
	for ps.completeOne(ps.p) {
		ps.processAll()
	}
	for id := range ps.proposed {
		if ps.released[id] != 1 {
			w := ps.writes[id]
			ps.fatalf("seed %d proto %v: id %d (op %v %d+%d) released %d times after the peer left and all local I/O completed", seed, ps.proto, id, w.Op, w.Offset, w.Length, ps.released[id])
		}
	}
	if n := ps.p.n; len(n.writes) != 0 || len(n.order) != 0 || len(n.held) != 0 {
		ps.fatalf("seed %d: pending after the peer left: writes=%d order=%d held=%d", seed, len(n.writes), len(n.order), len(n.held))
	}
	// Reconnect and resync: the replicas must end up identical.
	for ps.completeOne(ps.s) {
	}
	ps.processAll()
	ps.connect()
	ps.settle(100000)
	if st := ps.p.n.Status(); st.Conn != Connected || st.OutOfSync != 0 {
		ps.fatalf("seed %d: after the final reconnect: %v oos=%d err=%s", seed, st.Conn, st.OutOfSync, st.LastError)
	}
	if !bytes.Equal(ps.p.disk, ps.s.disk) {
		ps.fatalf("seed %d proto %v: disks differ after resync", seed, ps.proto)
	}
}

func TestPropertyDisconnects(t *testing.T) {
	seeds, steps := 200, 3000
	if raceDetector {
		seeds = 20
	}
	if os.Getenv("VMSAN_SOAK") == "1" {
		seeds, steps = 2000, 10000
	}
	if s := os.Getenv("VMSAN_PROP_SEED"); s != "" {
		x, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		runProperty(t, x, steps)
		return
	}
	for seed := int64(1); seed <= int64(seeds); seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { runProperty(t, seed, steps) })
		if t.Failed() {
			return
		}
	}
}
