package target

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vmsan/vmsan/internal/iscsi/pdu"
	"github.com/vmsan/vmsan/internal/iscsi/text"
	"github.com/vmsan/vmsan/internal/scsi"
	"github.com/vmsan/vmsan/internal/volrt"
)

// session is one iSCSI session in full feature phase (one connection).
type session struct {
	c         *conn
	s         *Server
	isid      pdu.ISID
	tsih      uint16
	discovery bool
	target    Target
	params    text.Params
	nexus     *scsi.Nexus
	cid       uint16
	// auth is the CHAP credentials the login was checked against (nil:
	// none), for DropRevoked.
	auth *CHAP

	// CmdSN window. INVARIANT: maxCmdSN - expCmdSN + 1 == QueueDepth -
	// (commands received and not yet completed); expCmdSN advances in the
	// reader as commands arrive, maxCmdSN wherever one completes.
	expCmdSN atomic.Uint32
	maxCmdSN atomic.Uint32

	mu      sync.Mutex
	cond    sync.Cond // signalled when a task ends
	tasks   map[uint32]*task
	r2ts    map[uint32]*r2t
	nextTTT uint32
	used    int64 // budget bytes held by tasks
	tmfs    int   // task management functions in progress

	loggingOut bool
	textAcc    text.Accumulator
	textRest   []byte // the rest of a long Text Response
	textTTT    uint32
	textIn     bool // the initiator's Text Request continues (C bit) under textTTT

	volIDs []uint64
	ended  chan struct{}

	// immBuf is the pooled buffer the reader chose for the immediate data
	// of the SCSI Command being handled (dataBuffer); command takes it
	// as the task's buffer, else the reader loop returns it to the pool.
	// Only the reader goroutine touches it. immRes is what the reader
	// reserved of the daemon-wide budget (Config.Budget) for immBuf:
	// command hands it to the task, dropImm gives it back.
	immBuf *[]byte
	immRes int64
}

// task is one SCSI command in the session.
type task struct {
	itt     uint32
	rawLUN  uint64
	lun     uint64
	counted bool // took a CmdSN slot (non-immediate)
	cdb     []byte
	attr    uint8
	expOut  uint32
	expIn   uint32
	budget  int64 // of the session's budget (SessionBudget)
	global  int64 // of the daemon-wide budget (Config.Budget)
	// awaiting is what the task counts in Server.awaiting while it waits
	// for write data (0 once the data is in or the task ended), and
	// lastData (unix nanos) when it was created or last got a Data-Out:
	// the Data-Out timeout counts from there. Both under session.mu.
	awaiting  int64
	lastData  int64
	buf       []byte  // data-out: all expOut bytes, (*bufp)[:expOut]
	bufp      *[]byte // buf's pool handle (volrt.GetBuf)
	received  uint32
	unsolEnd  uint32
	unsolNext uint32
	unsolSN   uint32
	nextR2T   uint32
	r2tSN     uint32
	pending   int  // outstanding R2Ts
	crcError  bool // a Data-Out of the task failed its data digest
	executing bool
	aborted   bool // INVARIANT: read and written under session.mu
	done      chan struct{}

	// Storage that saves allocations per command: the CDB when no AHS
	// extends it, the Task handed to the logical units, the result's
	// writer item.
	cdbArr [16]byte
	st     scsi.Task
	out    out
}

// r2t is one outstanding R2T.
type r2t struct {
	t        *task
	ttt      uint32
	off, len uint32
	got      uint32
	dataSN   uint32
}

func newSession(c *conn, isid pdu.ISID, discovery bool, t Target, p text.Params, cmdSN uint32) *session {
	ss := &session{c: c, s: c.s, isid: isid, discovery: discovery, target: t, params: p,
		tasks: map[uint32]*task{}, r2ts: map[uint32]*r2t{}, ended: make(chan struct{})}
	ss.cond.L = &ss.mu
	c.qmu.Lock()
	c.sess = ss
	c.qmu.Unlock()
	ss.expCmdSN.Store(cmdSN)
	ss.maxCmdSN.Store(cmdSN + uint32(c.s.cfg.QueueDepth) - 1)
	return ss
}

// window returns ExpCmdSN and MaxCmdSN for an outgoing PDU.
func (ss *session) window() (uint32, uint32) {
	e := ss.expCmdSN.Load() // first: MaxCmdSN only grows, so max >= exp-1 holds
	return e, ss.maxCmdSN.Load()
}

// slotDone frees one CmdSN slot (a non-immediate command completed).
func (ss *session) slotDone() { ss.maxCmdSN.Add(1) }

func (ss *session) start() {
	if ss.discovery {
		return
	}
	remote := ss.c.nc.RemoteAddr().String()
	for _, v := range ss.target.Volumes {
		ss.volIDs = append(ss.volIDs, ss.s.cfg.Sessions.Add(v, remote))
	}
}

// logLogin logs a successful login.
func (ss *session) logLogin() {
	auth := "None"
	if ss.auth != nil {
		auth = "CHAP"
	}
	typ := "normal"
	if ss.discovery {
		typ = "discovery"
	}
	ss.s.cfg.Logger.Info("iscsi: login", "session_type", typ, "initiator", ss.nexus.InitiatorName, "target", ss.nexus.TargetName,
		"portal", ss.c.nc.LocalAddr().String(), "remote", ss.c.log(), "tsih", ss.tsih, "auth", auth)
}

// end aborts the session's tasks, waits for those executing, tells the
// logical units the nexus is gone and unregisters the session.
func (ss *session) end() {
	waits := ss.abortTasks(func(*task) bool { return true })
	for _, ch := range waits {
		<-ch
	}
	ss.mu.Lock()
	for ss.tmfs > 0 {
		ss.cond.Wait()
	}
	ss.mu.Unlock()
	for _, id := range ss.volIDs {
		ss.s.cfg.Sessions.Remove(id)
	}
	how := "connection closed"
	if ss.loggingOut {
		how = "logout"
	}
	ss.s.cfg.Logger.Info("iscsi: session ended", "how", how, "initiator", ss.nexus.InitiatorName, "target", ss.nexus.TargetName,
		"portal", ss.c.nc.LocalAddr().String(), "remote", ss.c.log(), "tsih", ss.tsih)
	if !ss.discovery && ss.target.LUs != nil {
		ss.target.LUs.NexusLost(ss.nexus)
	}
	ss.s.unregister(ss)
	close(ss.ended)
}

// run is the reader loop of full feature phase.
func (ss *session) run() {
	c := ss.c
	if !ss.discovery {
		c.rd.DataBuffer = ss.dataBuffer
		if to := ss.s.cfg.DataOutTimeout; to > 0 {
			stop := make(chan struct{})
			defer close(stop)
			go ss.dataOutWatch(to, stop)
		}
	}
	defer ss.dropImm()
	for {
		f, err := c.rd.Read()
		if err != nil {
			ok := ss.readError(f, err)
			ss.dropImm()
			if ok {
				continue
			}
			return
		}
		c.lastRecv.Store(nowNano())
		c.busy.Store(true)
		err = ss.handle(f)
		ss.dropImm()
		// Back to the socket: silence counts from here.
		c.lastRecv.Store(nowNano())
		c.busy.Store(false)
		if err != nil {
			c.s.cfg.Logger.Info("iscsi: closing connection", "remote", c.log(), "initiator", ss.nexus.InitiatorName, "why", err)
			return
		}
	}
}

// dataOutWatch closes the connection when a command has waited longer
// than to for the next part of its write data (Config.DataOutTimeout):
// at ErrorRecoveryLevel 0 there is no recovery R2T, and the session's
// end releases what it held. Silence counts only while the reader waits
// on the socket (as for the pinger): a reader held up by its own
// backpressure is not reading the Data-Outs.
func (ss *session) dataOutWatch(to time.Duration, stop chan struct{}) {
	tick := time.NewTicker(max(to/8, 10*time.Millisecond))
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case now := <-tick.C:
			if ss.c.busy.Load() {
				continue
			}
			ss.mu.Lock()
			var late *task
			for _, t := range ss.tasks {
				if t.awaiting != 0 && !t.executing && !t.aborted && now.UnixNano()-t.lastData > to.Nanoseconds() {
					late = t
					break
				}
			}
			var itt, got, want uint32
			if late != nil {
				itt, got, want = late.itt, late.received, late.expOut
			}
			ss.mu.Unlock()
			if late == nil {
				continue
			}
			ss.s.dataOutTimeouts.Add(1)
			ss.s.cfg.Logger.Warn("iscsi: no Data-Out for a write within dataout_timeout; closing the connection",
				"remote", ss.c.log(), "initiator", ss.nexus.InitiatorName, "isid", fmt.Sprintf("%x", ss.isid[:]),
				"tsih", ss.tsih, "target", ss.target.Name, "itt", itt, "received", got, "expected", want,
				"dataout_timeout", to)
			ss.c.abort()
			return
		}
	}
}

// dataBuffer is the reader's pdu.Reader.DataBuffer: write data is read
// straight into the pooled buffer the command executes from, as the NBD
// server reads its payloads, instead of into a fresh segment that is then
// copied (two allocations and a copy of every byte written). A SCSI
// Command's immediate data goes to the start of a new EDTL-sized buffer
// (immBuf, adopted by command); a Data-Out's data to its offset in its
// task's buffer. Whatever does not fit, or has no live task collecting
// data, gets nil (a fresh segment): the handlers then refuse or discard
// it as before.
//
// A Data-Out that fails its checks in dataOut (offset, DataSN, TTT) has
// already been written into the task's buffer; each such failure ends
// the connection, and with it the task, so the bytes are never used.
func (ss *session) dataBuffer(h pdu.PDU, n int) []byte {
	switch h := h.(type) {
	case *pdu.SCSICommand:
		edtl := h.ExpectedDataTransferLength
		if !h.Write || uint64(n) > uint64(edtl) || uint64(edtl) > uint64(ss.s.cfg.MaxTransfer) {
			return nil
		}
		ss.dropImm()
		// The EDTL-sized buffer counts against the daemon-wide budget
		// from now on, or a client could make every session hold one
		// while it trickles the segment in; without room, a fresh
		// segment of n bytes (bounded by MaxRecvDataSegmentLength).
		if g := ss.s.cfg.Budget; g != nil {
			if !g.Fits(int64(edtl)) || !g.TryReserve(int64(edtl)) {
				return nil
			}
			ss.immRes = int64(edtl)
		}
		ss.immBuf = volrt.GetBuf(int(edtl))
		return (*ss.immBuf)[:n]
	case *pdu.DataOut:
		ss.mu.Lock()
		defer ss.mu.Unlock()
		t := ss.tasks[h.ITT]
		if t == nil || t.executing || t.aborted || uint64(h.BufferOffset)+uint64(n) > uint64(len(t.buf)) {
			return nil
		}
		return t.buf[h.BufferOffset : int(h.BufferOffset)+n]
	}
	return nil
}

// dropImm returns an immediate-data buffer no command adopted.
func (ss *session) dropImm() {
	if ss.immBuf != nil {
		volrt.PutBuf(ss.immBuf)
		ss.immBuf = nil
	}
	if ss.immRes != 0 {
		ss.s.cfg.Budget.Release(ss.immRes)
		ss.immRes = 0
	}
}

// readError answers a PDU the reader refused; true means the stream is
// still in sync and reading continues.
func (ss *session) readError(f pdu.Frame, err error) bool {
	var de *pdu.DigestError
	var fe *pdu.FieldError
	switch {
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, net.ErrClosed):
		return false
	case errors.As(err, &de) && !de.Header:
		// Data digest error: the PDU was consumed; Reject it (RFC 7143
		// 7.8). A command with bad immediate data is discarded and its
		// CmdSN not taken: the initiator resends it or aborts it (RFC
		// 7143 11.17.1).
		ss.reject(pdu.RejectDataDigestError, f.BHS)
		if h, ok := f.Header.(*pdu.DataOut); ok && !ss.discovery {
			// A Data-Out: without recovery R2Ts (ErrorRecoveryLevel 0)
			// the task ends in CHECK CONDITION once all its data is in
			// (RFC 7143 7.8 b); until then the PDU counts as received
			// so that the rest of the sequence is accepted.
			if err := ss.dataOut(h, f, true); err != nil {
				ss.s.cfg.Logger.Info("iscsi: closing connection", "remote", ss.c.log(), "initiator", ss.nexus.InitiatorName, "why", err)
				return false
			}
		}
		return true
	case errors.Is(err, pdu.ErrTooLong):
		// The data segment was not read: the stream is out of sync.
		ss.reject(pdu.RejectProtocolError, f.BHS)
		ss.c.closeQueueAfterFlush()
		return false
	case errors.As(err, &fe) && !errors.Is(err, pdu.ErrShort):
		ss.reject(fe.Reason, f.BHS)
		return true
	}
	return false
}

// closeQueueAfterFlush queues a close marker so a pending Reject is
// written before the connection closes.
func (c *conn) closeQueueAfterFlush() {
	c.post(&out{closeAfter: true})
}

func (ss *session) reject(reason pdu.RejectReason, bhs [pdu.BHSLen]byte) {
	ss.s.rejects.Add(1)
	h, data := pdu.NewReject(reason, bhs, pdu.StatusSNs{})
	ss.c.send(&out{h: h, data: data, status: true})
}

// acceptCmdSN applies the CmdSN rules to a non-immediate command: only
// CmdSN == ExpCmdSN is taken (one connection delivers in order; RFC 7143
// 4.2.2.1 says commands outside the window, and duplicates, are ignored).
func (ss *session) acceptCmdSN(sn uint32) bool {
	e := ss.expCmdSN.Load()
	if sn != e || pdu.SNGreater(sn, ss.maxCmdSN.Load()) {
		return false
	}
	ss.expCmdSN.Store(e + 1)
	return true
}

func (ss *session) handle(f pdu.Frame) error {
	switch h := f.Header.(type) {
	case *pdu.NOPOut:
		return ss.nopOut(h, f)
	case *pdu.SCSICommand:
		if ss.discovery {
			ss.reject(pdu.RejectProtocolError, f.BHS)
			return nil
		}
		return ss.command(h, f)
	case *pdu.DataOut:
		if ss.discovery {
			ss.reject(pdu.RejectProtocolError, f.BHS)
			return nil
		}
		return ss.dataOut(h, f, false)
	case *pdu.TaskMgmtRequest:
		if ss.discovery {
			ss.reject(pdu.RejectProtocolError, f.BHS)
			return nil
		}
		return ss.taskMgmt(h, f)
	case *pdu.TextRequest:
		return ss.textReq(h, f)
	case *pdu.LogoutRequest:
		return ss.logout(h, f)
	case *pdu.SNACKRequest:
		// ErrorRecoveryLevel 0: SNACK is not supported (RFC 7143 11.16).
		ss.reject(pdu.RejectProtocolError, f.BHS)
		return nil
	default:
		// Login in full feature phase, or a target opcode.
		ss.reject(pdu.RejectProtocolError, f.BHS)
		return nil
	}
}

func (ss *session) nopOut(h *pdu.NOPOut, f pdu.Frame) error {
	if h.ITT == pdu.ReservedTag {
		// The answer to our ping (lastRecv already updated).
		return nil
	}
	counted := false
	if !h.Immediate {
		if !ss.acceptCmdSN(h.CmdSN) {
			return nil
		}
		counted = true
	}
	data := f.Data
	if len(data) > ss.c.peerMax {
		data = data[:ss.c.peerMax]
	}
	o := &out{h: &pdu.NOPIn{LUN: h.LUN, ITT: h.ITT, TTT: pdu.ReservedTag}, data: data, status: true}
	if counted {
		o.then = ss.slotDone
	}
	ss.c.send(o)
	return nil
}

// decodeLUN decodes SAM's 8-byte LUN (peripheral and flat addressing);
// other methods give a number no LUN map holds.
func decodeLUN(raw uint64) uint64 {
	b0, b1 := byte(raw>>56), byte(raw>>48)
	switch b0 >> 6 {
	case 0:
		if b0&0x3f != 0 {
			return 1 << 62 // bus identifier: not a LUN we have
		}
		return uint64(b1)
	case 1:
		return uint64(b0&0x3f)<<8 | uint64(b1)
	}
	return 1 << 62
}

func scsiAttr(a pdu.TaskAttr) uint8 {
	switch a {
	case pdu.AttrOrdered:
		return scsi.AttrOrdered
	case pdu.AttrHeadOfQueue:
		return scsi.AttrHead
	case pdu.AttrACA:
		return scsi.AttrACA
	}
	return scsi.AttrSimple
}

// Sense for commands the transport answers itself (fixed format).
func senseFixed(key, asc, ascq byte) []byte {
	s := make([]byte, 18)
	s[0], s[2], s[7], s[12], s[13] = 0x70, key, 10, asc, ascq
	return s
}

// noBudgetIn is the largest data-in of a command without write data that
// takes nothing of the daemon-wide budget (see command).
const noBudgetIn = 4096

// command takes one SCSI Command PDU: CmdSN window, PDU checks, the task,
// the budgets, then either R2Ts for the data still to come or execution.
func (ss *session) command(h *pdu.SCSICommand, f pdu.Frame) error {
	counted := false
	if !h.Immediate {
		if !ss.acceptCmdSN(h.CmdSN) {
			return nil
		}
		counted = true
	}
	ahs, reason, ok := ss.checkCommand(h, f)
	if !ok {
		ss.reject(reason, f.BHS)
		if counted {
			ss.slotDone()
		}
		return nil
	}
	t := newTask(h, ahs, counted)
	ss.s.commands.Add(1)
	if ss.c.draining.Load() {
		// Shutting down: the command is not started; the initiator
		// retries it after logging in again.
		if counted {
			ss.slotDone()
		}
		return nil
	}
	if uint64(t.expOut)+uint64(t.expIn) > uint64(ss.s.cfg.MaxTransfer) {
		ss.s.checks.Add(1)
		ss.answer(t, 0x02, senseFixed(0x05, 0x24, 0x00)) // ILLEGAL REQUEST, INVALID FIELD IN CDB
		return nil
	}
	ss.mu.Lock()
	if st := ss.admitLocked(t, len(f.Data)); st != 0 {
		ss.mu.Unlock()
		ss.answer(t, st, nil)
		return nil
	}
	r2ts, waits := ss.takeImmediateLocked(t, h, f)
	ss.mu.Unlock()
	if waits {
		ss.sendR2Ts(r2ts)
		return nil
	}
	ss.execute(t)
	return nil
}

// checkCommand checks a SCSI Command PDU against the session (logout in
// progress, AHS, immediate and unsolicited data allowed by the login
// parameters, a tag in use); ok=false gives the Reject reason.
func (ss *session) checkCommand(h *pdu.SCSICommand, f pdu.Frame) (ahs []pdu.AHS, reason pdu.RejectReason, ok bool) {
	if ss.loggingOut {
		return nil, pdu.RejectWaitingForLogout, false
	}
	ahs, err := pdu.ParseAHS(f.AHS)
	if err != nil {
		return nil, pdu.RejectProtocolError, false
	}
	edtl := h.ExpectedDataTransferLength
	if len(f.Data) > 0 && (!h.Write || uint32(len(f.Data)) > edtl || !ss.params.ImmediateData ||
		len(f.Data) > int(ss.params.FirstBurstLength)) {
		return nil, pdu.RejectProtocolError, false
	}
	if h.Write && !h.Final && ss.params.InitialR2T {
		// Unsolicited Data-Out announced where InitialR2T=Yes forbids it.
		return nil, pdu.RejectProtocolError, false
	}
	ss.mu.Lock()
	_, dup := ss.tasks[h.ITT]
	ss.mu.Unlock()
	if dup || h.ITT == pdu.ReservedTag {
		return nil, pdu.RejectInvalidPDUField, false
	}
	return ahs, 0, true
}

// newTask is the task of a checked SCSI Command PDU: its CDB (with an
// extended CDB AHS) and expected data lengths in each direction.
func newTask(h *pdu.SCSICommand, ahs []pdu.AHS, counted bool) *task {
	t := &task{itt: h.ITT, rawLUN: h.LUN, lun: decodeLUN(h.LUN), counted: counted,
		attr: scsiAttr(h.Attr), done: make(chan struct{})}
	if len(ahs) == 0 {
		t.cdbArr = h.CDB
		t.cdb = t.cdbArr[:]
	} else {
		t.cdb = pdu.FullCDB(h, ahs)
	}
	edtl := h.ExpectedDataTransferLength
	if h.Write {
		t.expOut = edtl
		if h.Read {
			t.expIn, _ = pdu.BidiRead(ahs)
		}
	} else if h.Read {
		t.expIn = edtl
	}
	return t
}

// answer ends a task the transport answers itself, without executing it
// (no data moved: the whole expected transfer is the residual).
func (ss *session) answer(t *task, status uint8, sense []byte) {
	r := &scsi.Result{Status: status, Sense: sense}
	if t.expIn > 0 {
		r.Underflow, r.Residual = true, t.expIn
	} else if t.expOut > 0 {
		r.Underflow, r.Residual = true, t.expOut
	}
	o := &out{task: t, res: r}
	if t.counted {
		o.then = ss.slotDone
	}
	ss.c.send(o)
}

// admitLocked takes t's share of the session's and the daemon's budgets
// and registers t in the session, or returns the status to refuse it with
// (BUSY, TASK SET FULL: the initiator retries); 0 means admitted. have is
// the immediate data that came with the command. REQUIRES: mu.
func (ss *session) admitLocked(t *task, have int) (refusal uint8) {
	need := int64(t.expOut) + int64(t.expIn)
	// A command that moves no write data and at most noBudgetIn bytes of
	// read data (INQUIRY, TEST UNIT READY, READ CAPACITY, MODE SENSE,
	// REPORT LUNS...) takes nothing of the daemon-wide budget: it stays
	// answerable however the budget is used (bounded per session by the
	// CmdSN window times noBudgetIn).
	global := need
	if t.expOut == 0 && t.expIn <= noBudgetIn {
		global = 0
	}
	// A write whose data is not all here yet (R2T, or unsolicited
	// Data-Out to come) waits for the initiator: over all sessions such
	// commands hold at most the awaiting share of the daemon budget, so
	// initiators that withhold data cannot take the rest.
	waits := t.expOut > uint32(have)
	if ss.used > 0 && ss.used+need > ss.s.cfg.SessionBudget {
		return 0x08 // BUSY: the initiator retries
	}
	refuse := func() uint8 {
		// SAM-5 5.3: TASK SET FULL when the nexus has commands in the
		// task set (Linux then lowers the queue depth), BUSY when it has
		// none; both are retried by the initiator.
		ss.s.budgetRefused.Add(1)
		if ss.used == 0 {
			return 0x08 // BUSY
		}
		return 0x28 // TASK SET FULL
	}
	if waits && global > 0 && !ss.s.takeAwaiting(global) {
		if g := ss.s.cfg.Budget; g != nil {
			g.NoteRefused()
		}
		return refuse()
	}
	// The reader may already hold part of it for the immediate data
	// (dataBuffer); the task takes that over.
	held := min(ss.immRes, global)
	if g := ss.s.cfg.Budget; g != nil && global > held && !g.TryReserve(global-held) {
		// The daemon-wide budget is spent (by other sessions or front
		// ends). Not waiting: the reader must keep reading this
		// session's Data-Outs, NOP-Outs and task management, or two
		// sessions each waiting for the other's memory would deadlock.
		if waits && global > 0 {
			ss.s.awaiting.Add(-global)
		}
		return refuse()
	}
	if waits && global > 0 {
		t.awaiting = global
	}
	t.lastData = nowNano()
	ss.immRes -= held // the rest, if any, dropImm gives back
	ss.used += need
	t.budget, t.global = need, global
	ss.tasks[t.itt] = t
	return 0
}

// takeImmediateLocked gives an admitted write its buffer with the
// immediate data in it; waits says data is still to come, with the R2Ts
// to send for it (none while only unsolicited Data-Out is due).
// REQUIRES: mu.
func (ss *session) takeImmediateLocked(t *task, h *pdu.SCSICommand, f pdu.Frame) (r2ts []*r2t, waits bool) {
	if t.expOut == 0 {
		return nil, false
	}
	if p := ss.immBuf; p != nil && len(*p) == int(t.expOut) {
		// The reader put the immediate data in place (dataBuffer).
		t.bufp, ss.immBuf = p, nil
	} else {
		t.bufp = volrt.GetBuf(int(t.expOut))
		copy(*t.bufp, f.Data)
	}
	t.buf = *t.bufp
	t.received = uint32(len(f.Data))
	t.unsolNext = t.received
	t.unsolEnd = t.received
	if !h.Final {
		t.unsolEnd = min(uint32(ss.params.FirstBurstLength), t.expOut)
	}
	t.nextR2T = t.unsolEnd
	if t.received < t.expOut {
		return ss.moreR2Ts(t), true
	}
	return nil, false
}

// releaseBudget gives back what t holds of the session's and the
// daemon's budgets; a second call does nothing. REQUIRES: mu.
func (ss *session) releaseBudget(t *task) {
	ss.doneAwaiting(t)
	ss.used -= t.budget
	if g := ss.s.cfg.Budget; g != nil {
		g.Release(t.global)
	}
	t.budget, t.global = 0, 0
}

// doneAwaiting ends t's count in Server.awaiting (its data is in, or it
// ended); a second call does nothing. REQUIRES: mu.
func (ss *session) doneAwaiting(t *task) {
	if t.awaiting != 0 {
		ss.s.awaiting.Add(-t.awaiting)
		t.awaiting = 0
	}
}

// moreR2Ts creates the R2Ts the task may have outstanding. REQUIRES: mu.
func (ss *session) moreR2Ts(t *task) []*r2t {
	var out []*r2t
	for t.pending < int(ss.params.MaxOutstandingR2T) && t.nextR2T < t.expOut {
		n := min(uint32(ss.params.MaxBurstLength), t.expOut-t.nextR2T)
		ss.nextTTT++
		if ss.nextTTT == pdu.ReservedTag {
			ss.nextTTT = 1
		}
		r := &r2t{t: t, ttt: ss.nextTTT, off: t.nextR2T, len: n, dataSN: 0}
		ss.r2ts[r.ttt] = r
		t.nextR2T += n
		t.pending++
		out = append(out, r)
	}
	return out
}

func (ss *session) sendR2Ts(rs []*r2t) {
	for _, r := range rs {
		t := r.t
		ss.mu.Lock()
		sn := t.r2tSN
		t.r2tSN++
		ss.mu.Unlock()
		ss.c.send(&out{h: &pdu.R2T{LUN: t.rawLUN, ITT: t.itt, TTT: r.ttt, R2TSN: sn,
			BufferOffset: r.off, DesiredDataTransferLength: r.len}})
	}
}

// dataOut takes one Data-Out; corrupt says its data failed the digest
// (the sequence is checked and advanced, the data is not used).
func (ss *session) dataOut(h *pdu.DataOut, f pdu.Frame, corrupt bool) error {
	ss.mu.Lock()
	t := ss.tasks[h.ITT]
	if t == nil || t.executing || t.aborted {
		// Data for an aborted or finished task is discarded (RFC 7143
		// 4.2.3.4 for aborted tasks; an unknown ITT is treated alike).
		ss.mu.Unlock()
		return nil
	}
	n := uint32(len(f.Data))
	var more []*r2t
	if h.TTT == pdu.ReservedTag {
		if h.BufferOffset != t.unsolNext || h.DataSN != t.unsolSN || uint64(t.unsolNext)+uint64(n) > uint64(t.unsolEnd) {
			ss.mu.Unlock()
			ss.reject(pdu.RejectProtocolError, f.BHS)
			return errors.New("unsolicited Data-Out out of sequence or beyond FirstBurstLength")
		}
		t.unsolNext += n
		t.unsolSN++
	} else {
		r := ss.r2ts[h.TTT]
		if r == nil || r.t != t || h.BufferOffset != r.off+r.got || h.DataSN != r.dataSN || r.got+n > r.len {
			ss.mu.Unlock()
			ss.reject(pdu.RejectProtocolError, f.BHS)
			return errors.New("solicited Data-Out does not match its R2T")
		}
		r.got += n
		r.dataSN++
		if r.got == r.len {
			if !h.Final {
				ss.mu.Unlock()
				ss.reject(pdu.RejectProtocolError, f.BHS)
				return errors.New("R2T sequence complete without the F bit")
			}
			delete(ss.r2ts, r.ttt)
			t.pending--
			more = ss.moreR2Ts(t)
		} else if h.Final {
			ss.mu.Unlock()
			ss.reject(pdu.RejectProtocolError, f.BHS)
			return errors.New("F bit before the R2T's data was sent")
		}
	}
	if corrupt {
		t.crcError = true
	} else if dst := t.buf[h.BufferOffset:]; len(f.Data) > 0 && &dst[0] != &f.Data[0] {
		copy(dst, f.Data) // not read in place (dataBuffer)
	}
	t.received += n
	t.lastData = nowNano()
	ready := t.received == t.expOut
	if ready {
		ss.doneAwaiting(t)
	}
	ss.mu.Unlock()
	ss.sendR2Ts(more)
	if ready {
		ss.execute(t)
	}
	return nil
}

// execute hands a task whose data-out is complete to the logical units.
func (ss *session) execute(t *task) {
	ss.mu.Lock()
	if t.aborted {
		ss.mu.Unlock()
		return
	}
	t.executing = true
	crcError := t.crcError
	ss.mu.Unlock()
	if crcError {
		// ABORTED COMMAND, PROTOCOL SERVICE CRC ERROR (RFC 7143 7.8,
		// 4.5.1): the initiator retries the command.
		ss.complete(t, &scsi.Result{Status: 0x02, Sense: senseFixed(0x0b, 0x47, 0x05)})
		return
	}
	ss.s.bytesWritten.Add(uint64(len(t.buf)))
	// More: another PDU is already buffered (likely the next command),
	// the engine's write-gathering hint, as on the NBD path. Only the
	// reader goroutine calls execute, so reading br is safe.
	t.st = scsi.Task{Nexus: ss.nexus, LUN: t.lun, CDB: t.cdb, Tag: t.itt, Attr: t.attr,
		DataOut: t.buf, ExpectedOut: t.expOut, ExpectedIn: t.expIn,
		More: ss.c.br.Buffered() >= pdu.BHSLen}
	ss.target.LUs.Execute(&t.st, func(r *scsi.Result) { ss.complete(t, r) })
}

// complete is the LogicalUnits' done callback: it queues the result
// unless the task was aborted (then the response is dropped, RFC 7143
// 4.2.3.4 / TaskReporting=RFC3720).
func (ss *session) complete(t *task, r *scsi.Result) {
	if r.Status == 0x02 {
		ss.s.checks.Add(1)
	}
	ss.mu.Lock()
	aborted := t.aborted
	if ss.tasks[t.itt] == t {
		delete(ss.tasks, t.itt)
	}
	ss.releaseBudget(t)
	// The logical units are done with DataOut once they call done.
	volrt.PutBuf(t.bufp)
	t.buf, t.bufp = nil, nil
	t.st.DataOut = nil
	ss.mu.Unlock()
	if aborted {
		r.Release()
		ss.finish(t)
		return
	}
	t.out = out{task: t, res: r, finished: ss}
	ss.c.post(&t.out)
}

// finish ends a completed task once its result is written (or dropped).
func (ss *session) finish(t *task) {
	close(t.done)
	if t.counted {
		ss.slotDone()
	}
	ss.mu.Lock()
	ss.cond.Broadcast()
	ss.mu.Unlock()
}

// abortTasks marks the matching tasks aborted: those still collecting
// data-out end at once; it returns the done channels of those executing,
// to wait for.
func (ss *session) abortTasks(match func(*task) bool) []chan struct{} {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	var waits []chan struct{}
	for itt, t := range ss.tasks {
		if !match(t) {
			continue
		}
		if t.aborted {
			// Already being aborted by another TMF: wait for it too.
			if t.executing {
				waits = append(waits, t.done)
			}
			continue
		}
		t.aborted = true
		if t.executing {
			waits = append(waits, t.done)
			continue
		}
		delete(ss.tasks, itt)
		for ttt, r := range ss.r2ts {
			if r.t == t {
				delete(ss.r2ts, ttt)
			}
		}
		ss.releaseBudget(t)
		// The buffer is dropped, not pooled: abortTasks may run on
		// another session's goroutine (LUN reset) while this session's
		// reader is still reading a Data-Out into it (dataBuffer).
		t.buf, t.bufp = nil, nil
		close(t.done)
		if t.counted {
			ss.slotDone()
		}
	}
	ss.cond.Broadcast()
	return waits
}

func (ss *session) taskMgmt(h *pdu.TaskMgmtRequest, f pdu.Frame) error {
	counted := false
	if !h.Immediate {
		if !ss.acceptCmdSN(h.CmdSN) {
			return nil
		}
		counted = true
	}
	lun := decodeLUN(h.LUN)
	respond := func(code pdu.TMFResponse, after func()) {
		o := &out{h: &pdu.TaskMgmtResponse{Response: code, ITT: h.ITT}, status: true}
		o.then = func() {
			if counted {
				ss.slotDone()
			}
			if after != nil {
				after()
			}
		}
		ss.c.send(o)
	}
	var waits []chan struct{}
	var scsiFn uint8
	closeAfter := false
	switch h.Function {
	case pdu.TMFAbortTask:
		ss.mu.Lock()
		t := ss.tasks[h.ReferencedTaskTag]
		ss.mu.Unlock()
		if t == nil || t.lun != lun {
			// Not found (RFC 7143 11.5.1): a RefCmdSN inside the window
			// and below the TMF's own CmdSN names a command not received
			// yet, which the target considers received and answers
			// "function complete"; otherwise (the task completed, so its
			// CmdSN is below ExpCmdSN, or never existed) "task does not
			// exist".
			exp, mx := ss.window()
			if t == nil && pdu.SNInWindow(h.RefCmdSN, exp, mx) && pdu.SNLess(h.RefCmdSN, h.CmdSN) {
				respond(pdu.TMFFunctionComplete, nil)
			} else {
				respond(pdu.TMFTaskDoesNotExist, nil)
			}
			return nil
		}
		waits = ss.abortTasks(func(x *task) bool { return x == t })
	case pdu.TMFAbortTaskSet:
		scsiFn = scsi.TMFAbortTaskSet
		waits = ss.abortTasks(func(x *task) bool { return x.lun == lun })
	case pdu.TMFClearTaskSet, pdu.TMFLogicalUnitReset:
		scsiFn = uint8(h.Function)
		for _, o := range ss.s.sessionsOf(ss.nexus.TargetName) {
			waits = append(waits, o.abortTasks(func(x *task) bool { return x.lun == lun })...)
		}
	case pdu.TMFTargetWarmReset, pdu.TMFTargetColdReset:
		scsiFn = uint8(h.Function)
		for _, o := range ss.s.sessionsOf(ss.nexus.TargetName) {
			waits = append(waits, o.abortTasks(func(*task) bool { return true })...)
		}
		closeAfter = h.Function == pdu.TMFTargetColdReset
	case pdu.TMFClearACA:
		scsiFn = scsi.TMFClearACA
	case pdu.TMFTaskReassign:
		respond(pdu.TMFReassignmentNotSupported, nil)
		return nil
	default:
		respond(pdu.TMFFunctionRejected, nil)
		return nil
	}
	ss.mu.Lock()
	ss.tmfs++
	ss.mu.Unlock()
	// Waiting for the aborted tasks must not stop the reader (other
	// tasks' Data-Out keeps flowing), so it happens on its own goroutine.
	go func() {
		defer func() {
			ss.mu.Lock()
			ss.tmfs--
			ss.cond.Broadcast()
			ss.mu.Unlock()
		}()
		for _, ch := range waits {
			<-ch
		}
		code := pdu.TMFFunctionComplete
		if scsiFn != 0 {
			code = pdu.TMFResponse(ss.target.LUs.TaskManagement(scsiFn, ss.nexus, lun))
		}
		var after func()
		if closeAfter {
			after = func() { ss.c.post(&out{closeAfter: true}) }
		}
		respond(code, after)
	}()
	return nil
}

func (ss *session) textReq(h *pdu.TextRequest, f pdu.Frame) error {
	counted := false
	if !h.Immediate {
		if !ss.acceptCmdSN(h.CmdSN) {
			return nil
		}
		counted = true
	}
	// F is set exactly on the last response of the exchange, which
	// carries the reserved TTT (RFC 7143 11.11.1, 11.11.4); an F=0
	// response with a TTT asks for the initiator's next request.
	send := func(data []byte, cont bool, ttt uint32) {
		o := &out{h: &pdu.TextResponse{Final: ttt == pdu.ReservedTag, Continue: cont, LUN: h.LUN, ITT: h.ITT, TTT: ttt},
			data: data, status: true}
		if counted {
			o.then = ss.slotDone
		}
		ss.c.send(o)
	}
	switch {
	case h.TTT == pdu.ReservedTag:
		// A new exchange resets what an earlier one left (RFC 7143
		// 11.10.4).
		ss.textRest, ss.textIn = nil, false
		ss.textAcc.Take()
	case h.TTT == ss.textTTT && ss.textIn:
		// The next part of the initiator's continued request.
	case h.TTT == ss.textTTT && ss.textRest != nil:
		ss.sendTextChunk(send)
		return nil
	default:
		ss.textRest, ss.textIn = nil, false
		ss.textAcc.Take()
		ss.reject(pdu.RejectInvalidPDUField, f.BHS)
		if counted {
			ss.slotDone()
		}
		return nil
	}
	done, err := ss.textAcc.Add(f.Data, h.Continue)
	if err != nil {
		ss.textIn = false
		ss.reject(pdu.RejectProtocolError, f.BHS)
		if counted {
			ss.slotDone()
		}
		return nil
	}
	if !done {
		// An empty response invites the rest (RFC 7143 11.10.2).
		ss.textIn = true
		ss.nextTTT++
		if ss.nextTTT == pdu.ReservedTag {
			ss.nextTTT = 1
		}
		ss.textTTT = ss.nextTTT
		send(nil, false, ss.textTTT)
		return nil
	}
	ss.textIn = false
	pairs, err := text.Parse(ss.textAcc.Take())
	if err != nil {
		ss.reject(pdu.RejectProtocolError, f.BHS)
		if counted {
			ss.slotDone()
		}
		return nil
	}
	var answers []text.Pair
	for _, p := range pairs {
		switch p.Key {
		case "SendTargets":
			answers = append(answers, ss.sendTargets(p.Value)...)
		default:
			if _, known := text.Keys[p.Key]; known {
				// Keys that may not change in full feature phase, or that
				// the target does not renegotiate.
				answers = append(answers, text.Pair{Key: p.Key, Value: text.Reject})
			} else {
				answers = append(answers, text.Pair{Key: p.Key, Value: text.NotUnderstood})
			}
		}
	}
	data, err := text.Append(nil, answers...)
	if err != nil {
		data = nil
	}
	ss.textRest = data
	ss.sendTextChunk(send)
	return nil
}

// sendTextChunk sends the next part of a Text Response no longer than
// the initiator's MaxRecvDataSegmentLength (C bit and a TTT while more
// follows, RFC 7143 11.11).
func (ss *session) sendTextChunk(send func([]byte, bool, uint32)) {
	data := ss.textRest
	if len(data) <= ss.c.peerMax {
		ss.textRest = nil
		send(data, false, pdu.ReservedTag)
		return
	}
	ss.textRest = data[ss.c.peerMax:]
	ss.nextTTT++
	if ss.nextTTT == pdu.ReservedTag {
		ss.nextTTT = 1
	}
	ss.textTTT = ss.nextTTT
	send(data[:ss.c.peerMax], true, ss.textTTT)
}

// sendTargets answers SendTargets=All|NAME|"" (RFC 7143 appendix C).
func (ss *session) sendTargets(v string) []text.Pair {
	var ts []Target
	switch {
	case v == "All":
		ts = ss.s.cfg.Targets()
	case v == "" && !ss.discovery:
		ts = []Target{ss.target}
	case v != "":
		if t, ok := ss.s.lookup(v); ok {
			ts = []Target{t}
		}
	}
	portals := ss.s.portals(ss.c.nc.LocalAddr())
	var out []text.Pair
	for _, t := range ts {
		if !t.allows(ss.nexus.InitiatorName) {
			continue
		}
		out = append(out, text.Pair{Key: "TargetName", Value: t.Name})
		for _, p := range portals {
			out = append(out, text.Pair{Key: "TargetAddress", Value: p.Addr + "," + tpgtString(p.Tag)})
		}
	}
	return out
}

func (ss *session) logout(h *pdu.LogoutRequest, f pdu.Frame) error {
	counted := false
	if !h.Immediate {
		if !ss.acceptCmdSN(h.CmdSN) {
			return nil
		}
		counted = true
	}
	rsp := &pdu.LogoutResponse{ITT: h.ITT}
	closeAfter := true
	switch h.Reason {
	case pdu.LogoutCloseSession:
	case pdu.LogoutCloseConnection:
		if h.CID != ss.cid {
			rsp.Response, closeAfter = pdu.LogoutCIDNotFound, false
		}
	default:
		rsp.Response, closeAfter = pdu.LogoutRecoveryNotSupported, false
	}
	if !closeAfter {
		o := &out{h: rsp, status: true}
		if counted {
			o.then = ss.slotDone
		}
		ss.c.send(o)
		return nil
	}
	ss.loggingOut = true
	// Commands still waiting for Data-Out will not get it (the initiator
	// is logging out): they end now. Those executing complete and are
	// answered first (RFC 7143 11.14: the logout response ends the
	// session once they are done).
	ss.abortTasks(func(t *task) bool { return !t.executing })
	go func() {
		ss.mu.Lock()
		for len(ss.tasks) > 0 || ss.tmfs > 0 {
			ss.cond.Wait()
		}
		ss.mu.Unlock()
		o := &out{h: rsp, status: true, closeAfter: true}
		if counted {
			o.then = ss.slotDone
		}
		ss.c.post(o)
	}()
	return nil
}

// waitIdle waits until the session has no task, bounded by d.
func (ss *session) waitIdle(d time.Duration) {
	deadline := time.Now().Add(d)
	t := time.AfterFunc(d, func() {
		ss.mu.Lock()
		ss.cond.Broadcast()
		ss.mu.Unlock()
	})
	defer t.Stop()
	ss.mu.Lock()
	for (len(ss.tasks) > 0 || ss.tmfs > 0) && time.Now().Before(deadline) {
		ss.cond.Wait()
	}
	ss.mu.Unlock()
}

func nowNano() int64 { return time.Now().UnixNano() }
