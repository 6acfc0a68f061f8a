package scsi

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"

	"github.com/vmsan/vmsan/internal/atomicfile"
	"github.com/vmsan/vmsan/internal/vfs"
)

// Persistent reservations (SPC-4 5.13) and RESERVE/RELEASE (SPC-2).

// PERSISTENT RESERVE OUT service actions.
const (
	prRegister       = 0x00
	prReserve        = 0x01
	prRelease        = 0x02
	prClear          = 0x03
	prPreempt        = 0x04
	prPreemptAbort   = 0x05
	prRegisterIgnore = 0x06
	prRegisterMove   = 0x07
)

// Persistent reservation types.
const (
	prTypeWE   = 1 // write exclusive
	prTypeEA   = 3 // exclusive access
	prTypeWERO = 5 // write exclusive, registrants only
	prTypeEARO = 6 // exclusive access, registrants only
	prTypeWEAR = 7 // write exclusive, all registrants
	prTypeEAAR = 8 // exclusive access, all registrants
)

func validPRType(t uint8) bool {
	switch t {
	case prTypeWE, prTypeEA, prTypeWERO, prTypeEARO, prTypeWEAR, prTypeEAAR:
		return true
	}
	return false
}

func allRegs(t uint8) bool { return t == prTypeWEAR || t == prTypeEAAR }

// prFile is the name of the APTPL state file in the volume's state dir.
const prFile = "scsi-pr.json"

type prReg struct {
	k   itKey
	key uint64
}

// prState is a logical unit's persistent reservation state.
type prState struct {
	gen    uint32
	regs   []prReg
	held   bool
	holder itKey // meaningful when held and !allRegs(typ)
	typ    uint8
	aptpl  bool
}

func (p *prState) clone() prState {
	q := *p
	q.regs = append([]prReg(nil), p.regs...)
	return q
}

func (p *prState) find(k itKey) int {
	for i, r := range p.regs {
		if r.k == k {
			return i
		}
	}
	return -1
}

func (p *prState) isHolder(k itKey) bool {
	if !p.held {
		return false
	}
	if allRegs(p.typ) {
		return p.find(k) >= 0
	}
	return p.holder == k
}

// holderKey is the key READ RESERVATION reports (0 for all-registrants).
func (p *prState) holderKey() uint64 {
	if !p.held || allRegs(p.typ) {
		return 0
	}
	if i := p.find(p.holder); i >= 0 {
		return p.regs[i].key
	}
	return 0
}

// remove deletes registration i, releasing the reservation when it was
// the holder's (or the last registrant's, for all-registrants types);
// it reports whether the reservation was released.
func (p *prState) remove(i int) (released bool) {
	k := p.regs[i].k
	p.regs = append(p.regs[:i], p.regs[i+1:]...)
	if !p.held {
		return false
	}
	if (allRegs(p.typ) && len(p.regs) == 0) || (!allRegs(p.typ) && p.holder == k) {
		p.held = false
		p.holder = itKey{}
		return true
	}
	return false
}

// updateRsvActiveLocked refreshes the fast-path flag. REQUIRES: l.mu held.
func (l *lu) updateRsvActiveLocked() {
	l.rsvActive.Store(l.spc2 != nil || l.pr.held || len(l.pr.regs) > 0)
}

// conflict applies the reservation rules (SPC-4 table 44 family, and the
// SPC-2 RESERVE rules) to c; true means RESERVATION CONFLICT.
func (l *lu) conflict(c *cmd) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	k := keyOf(c.task.Nexus)
	f := c.d.flags
	if l.spc2 != nil && *l.spc2 != k {
		return f&fSPC2OK == 0
	}
	p := &l.pr
	if !p.held || p.isHolder(k) {
		return false
	}
	registered := p.find(k) >= 0
	switch p.typ {
	case prTypeWE:
		return f&fPRWrite != 0
	case prTypeEA:
		return f&(fPRRead|fPRWrite) != 0
	case prTypeWERO, prTypeWEAR:
		return !registered && f&fPRWrite != 0
	case prTypeEARO, prTypeEAAR:
		return !registered && f&(fPRRead|fPRWrite) != 0
	}
	return false
}

func (c *cmd) reserve() {
	l := c.lu
	k := keyOf(c.task.Nexus)
	l.mu.Lock()
	status := uint8(StatusGood)
	switch {
	case l.pr.held || len(l.pr.regs) > 0:
		// SPC-4 5.13.3 (CRH=1): a persistent reservation holder's RESERVE
		// succeeds without effect; anyone else conflicts.
		if !l.pr.isHolder(k) {
			status = StatusReservationConflict
		}
	case l.spc2 != nil && *l.spc2 != k:
		status = StatusReservationConflict
	default:
		l.spc2 = &k
		l.updateRsvActiveLocked()
	}
	l.mu.Unlock()
	c.finishStatus(status)
}

func (c *cmd) release6() {
	l := c.lu
	k := keyOf(c.task.Nexus)
	l.mu.Lock()
	if l.spc2 != nil && *l.spc2 == k {
		l.spc2 = nil
		l.updateRsvActiveLocked()
	}
	l.mu.Unlock()
	// Releasing a reservation one does not hold is not an error (SPC-2).
	c.finishStatus(StatusGood)
}

func (c *cmd) prIn() {
	cdb := c.task.CDB
	alloc := uint64(binary.BigEndian.Uint16(cdb[7:9]))
	l := c.lu
	l.mu.Lock()
	p := l.pr.clone()
	l.mu.Unlock()
	var b []byte
	switch saOf(cdb) {
	case prInReadKeys:
		b = c.dataIn(8 + 8*len(p.regs))
		binary.BigEndian.PutUint32(b[0:4], p.gen)
		binary.BigEndian.PutUint32(b[4:8], uint32(8*len(p.regs)))
		for i, r := range p.regs {
			binary.BigEndian.PutUint64(b[8+8*i:], r.key)
		}
	case prInReadResv:
		if !p.held {
			b = c.dataIn(8)
		} else {
			b = c.dataIn(24)
			binary.BigEndian.PutUint32(b[4:8], 16)
			binary.BigEndian.PutUint64(b[8:16], p.holderKey())
			b[21] = p.typ & 0x0F // scope 0: logical unit
		}
		binary.BigEndian.PutUint32(b[0:4], p.gen)
	case prInReportCaps:
		b = c.dataIn(8)
		b[1] = 8
		b[2] = 0x10 // CRH
		if l.aptplOK {
			b[2] |= 0x01 // PTPL_C
		}
		b[3] = 0x80 // TMV: the type mask is valid
		if p.aptpl {
			b[3] |= 0x01 // PTPL_A
		}
		b[4] = 0x80 | 0x40 | 0x20 | 0x08 | 0x02 // WR_EX_AR, EX_AC_RO, WR_EX_RO, EX_AC, WR_EX
		b[5] = 0x01                             // EX_AC_AR
	case prInReadFullStatus:
		size := 8
		for _, r := range p.regs {
			size += 24 + len(transportID(r.k.initiator))
		}
		b = c.dataIn(size)
		binary.BigEndian.PutUint32(b[0:4], p.gen)
		binary.BigEndian.PutUint32(b[4:8], uint32(size-8))
		o := 8
		for _, r := range p.regs {
			tid := transportID(r.k.initiator)
			binary.BigEndian.PutUint64(b[o:], r.key)
			if p.isHolder(r.k) {
				b[o+12] = 0x01 // R_HOLDER
				b[o+13] = p.typ & 0x0F
			}
			binary.BigEndian.PutUint16(b[o+18:], r.k.rel)
			binary.BigEndian.PutUint32(b[o+20:], uint32(len(tid)))
			copy(b[o+24:], tid)
			o += 24 + len(tid)
		}
	}
	c.reply(b, alloc)
}

// transportID encodes an iSCSI initiator port name as a TransportID
// (SPC-4 7.6.4.6): format 01b "NAME,i,0xISID", or format 00b for a bare
// name; NUL-terminated, padded to a multiple of 4, at least 20 bytes.
func transportID(port string) []byte {
	n := len(port) + 1
	n = max((n+3)&^3, 16)
	b := make([]byte, 4+n)
	b[0] = 0x05 // iSCSI
	if strings.Contains(port, ",i,0x") {
		b[0] |= 0x40
	}
	binary.BigEndian.PutUint16(b[2:4], uint16(n))
	copy(b[4:], port)
	return b
}

// parseTransportID decodes an iSCSI TransportID into an initiator port
// name; ok false for another protocol or a malformed one.
func parseTransportID(b []byte) (port string, n int, ok bool) {
	if len(b) < 4 || b[0]&0x0F != 0x05 {
		return "", 0, false
	}
	l := int(binary.BigEndian.Uint16(b[2:4]))
	if l < 1 || 4+l > len(b) {
		return "", 0, false
	}
	s := b[4 : 4+l]
	if i := strings.IndexByte(string(s), 0); i >= 0 {
		s = s[:i]
	}
	if len(s) == 0 {
		return "", 0, false
	}
	return string(s), 4 + l, true
}

// prOutReq is one PERSISTENT RESERVE OUT as its service action sees it
// (the parameters, parsed) and what the action decided (status, sense, unit
// attentions, nexuses to abort, whether APTPL is taken from the request).
// A service action changes only the prState copy it is given; prOut
// commits that copy (and its APTPL file) only when the action succeeded.
type prOutReq struct {
	k             itKey // the requesting I_T nexus
	me            int   // its registration in the copy, -1 if none
	resKey, saKey uint64
	typ, scope    uint8
	data          []byte

	status   uint8
	sense    *senseInfo
	uas      []prUA
	victims  []itKey // nexuses whose tasks PREEMPT AND ABORT aborts
	setAPTPL bool
}

type prUA struct {
	k    itKey
	code uaCode
}

func (o *prOutReq) ua(k itKey, code uaCode) { o.uas = append(o.uas, prUA{k, code}) }
func (o *prOutReq) bad(s senseInfo)         { o.sense = &s }
func (o *prOutReq) conflict()               { o.status = StatusReservationConflict }
func (o *prOutReq) failed() bool            { return o.status != StatusGood || o.sense != nil }

// keyMismatch reports (and answers RESERVATION CONFLICT) when the
// requester is not registered or gave another reservation key.
func (o *prOutReq) keyMismatch(p *prState) bool {
	if o.me < 0 || o.resKey != p.regs[o.me].key {
		o.conflict()
		return true
	}
	return false
}

// prOutActions is the PERSISTENT RESERVE OUT dispatch table: one function
// per service action (SPC-4 5.13).
var prOutActions = map[uint8]func(p *prState, o *prOutReq){
	prRegister:       (*prState).outRegister,
	prRegisterIgnore: (*prState).outRegisterIgnore,
	prReserve:        (*prState).outReserve,
	prRelease:        (*prState).outRelease,
	prClear:          (*prState).outClear,
	prPreempt:        (*prState).outPreempt,
	prPreemptAbort:   (*prState).outPreemptAbort,
	prRegisterMove:   (*prState).outRegisterMove,
}

func (c *cmd) prOut() {
	cdb := c.task.CDB
	sa, scope, typ := saOf(cdb), cdb[2]>>4, cdb[2]&0x0F
	plen := uint64(binary.BigEndian.Uint32(cdb[5:9]))
	c.xfer = plen
	data := c.task.DataOut[:min(plen, uint64(len(c.task.DataOut)))]
	if sa == prRegisterMove {
		if plen < 24 || len(data) < 24 {
			c.fail(senseParamLenError)
			return
		}
	} else if plen != 24 || len(data) < 24 {
		c.fail(senseParamLenError)
		return
	}
	resKey, saKey := binary.BigEndian.Uint64(data[0:8]), binary.BigEndian.Uint64(data[8:16])
	flags := data[20]
	aptpl := flags&0x01 != 0
	if sa == prRegisterMove {
		aptpl = data[17]&0x01 != 0
	} else {
		if flags&0x08 != 0 { // SPEC_I_PT: SIP_C=0
			c.fail(invalidParam(20, 3))
			return
		}
		if flags&0x04 != 0 { // ALL_TG_PT: ATP_C=0
			c.fail(invalidParam(20, 2))
			return
		}
	}
	l := c.lu
	if aptpl && !l.aptplOK {
		c.fail(invalidParam(20, 0))
		return
	}
	action := prOutActions[sa]
	if action == nil {
		// The command table admits only the service actions above.
		c.fail(invalidCDB(1, 4))
		return
	}
	k := keyOf(c.task.Nexus)
	l.mu.Lock()
	p := l.pr.clone()
	o := &prOutReq{k: k, me: p.find(k), resKey: resKey, saKey: saKey, typ: typ, scope: scope, data: data, status: StatusGood}
	action(&p, o)
	if o.failed() {
		l.mu.Unlock()
		if o.sense != nil {
			c.fail(*o.sense)
		} else {
			c.finishStatus(o.status)
		}
		return
	}
	if o.setAPTPL {
		p.aptpl = aptpl
	}
	if p.aptpl || l.pr.aptpl {
		if err := l.savePR(&p); err != nil {
			l.mu.Unlock()
			c.fail(senseInternalFailure)
			return
		}
	}
	l.pr = p
	for _, u := range o.uas {
		l.addUAKeyLocked(u.k, u.code)
	}
	l.updateRsvActiveLocked()
	var abort []*Nexus
	if len(o.victims) > 0 && l.t.cfg.Abort != nil {
		l.nexus.Range(func(nk, _ any) bool {
			nn := nk.(*Nexus)
			for _, v := range o.victims {
				if keyOf(nn) == v {
					abort = append(abort, nn)
				}
			}
			return true
		})
	}
	l.mu.Unlock()
	for _, nn := range abort {
		l.t.cfg.Abort(nn, l.num)
	}
	c.finishStatus(StatusGood)
}

// outRegister is REGISTER (SPC-4 5.13.2): register a key, change it, or
// unregister with a zero service action key; the reservation key must
// match the current registration.
func (p *prState) outRegister(o *prOutReq) { p.register(o, false) }

// outRegisterIgnore is REGISTER AND IGNORE EXISTING KEY: REGISTER without
// the reservation key check.
func (p *prState) outRegisterIgnore(o *prOutReq) { p.register(o, true) }

func (p *prState) register(o *prOutReq, ignore bool) {
	switch {
	case o.me < 0:
		if !ignore && o.resKey != 0 {
			o.conflict()
		} else if o.saKey != 0 {
			p.regs = append(p.regs, prReg{k: o.k, key: o.saKey})
			p.gen++
			o.setAPTPL = true
		}
	case !ignore && o.resKey != p.regs[o.me].key:
		o.conflict()
	case o.saKey == 0:
		typ := p.typ
		if p.remove(o.me) && (typ == prTypeWERO || typ == prTypeEARO) {
			for _, r := range p.regs {
				o.ua(r.k, uaResvReleased)
			}
		}
		p.gen++
		o.setAPTPL = true
	default:
		p.regs[o.me].key = o.saKey
		p.gen++
		o.setAPTPL = true
	}
}

// outReserve is RESERVE (SPC-4 5.13.9): a registrant takes the
// reservation of the given type; asking again for the type held is a
// no-op.
func (p *prState) outReserve(o *prOutReq) {
	switch {
	case o.keyMismatch(p):
	case o.scope != 0:
		o.bad(invalidCDB(2, 7))
	case !validPRType(o.typ):
		o.bad(invalidCDB(2, 3))
	case !p.held:
		p.held, p.typ, p.holder = true, o.typ, o.k
	case p.isHolder(o.k) && p.typ == o.typ:
		// Already held with that type: no change.
	default:
		o.conflict()
	}
}

// outRelease is RELEASE (SPC-4 5.13.10): the holder releases; the other
// registrants of a registrants-only or all-registrants reservation get a
// RESERVATIONS RELEASED unit attention.
func (p *prState) outRelease(o *prOutReq) {
	switch {
	case o.keyMismatch(p):
	case !p.held || !p.isHolder(o.k):
		// Nothing to release.
	case o.scope != 0 || p.typ != o.typ:
		o.bad(senseInvalidRelease)
	default:
		old := p.typ
		p.held, p.holder = false, itKey{}
		if old != prTypeWE && old != prTypeEA {
			for _, r := range p.regs {
				if r.k != o.k {
					o.ua(r.k, uaResvReleased)
				}
			}
		}
	}
}

// outClear is CLEAR (SPC-4 5.13.11): every registration and the
// reservation go; the others get RESERVATIONS PREEMPTED.
func (p *prState) outClear(o *prOutReq) {
	if o.keyMismatch(p) {
		return
	}
	for _, r := range p.regs {
		if r.k != o.k {
			o.ua(r.k, uaResvPreempted)
		}
	}
	p.regs = p.regs[:0]
	p.held, p.holder = false, itKey{}
	p.gen++
}

// outPreempt is PREEMPT (SPC-4 5.13.12): remove the registrations with
// the service action key (and take the reservation when they held it).
func (p *prState) outPreempt(o *prOutReq) {
	p.preempt(o)
	o.victims = nil
}

// outPreemptAbort is PREEMPT AND ABORT: PREEMPT, then the preempted
// nexuses' tasks are aborted (Config.Abort).
func (p *prState) outPreemptAbort(o *prOutReq) { p.preempt(o) }

// preempt does PREEMPT's work and records the preempted nexuses in
// o.victims.
func (p *prState) preempt(o *prOutReq) {
	if o.keyMismatch(p) {
		return
	}
	k := o.k
	if p.held && (o.scope != 0 || !validPRType(o.typ)) {
		if o.scope != 0 {
			o.bad(invalidCDB(2, 7))
		} else {
			o.bad(invalidCDB(2, 3))
		}
		return
	}
	removeKey := func(key uint64) int {
		nrem := 0
		for i := 0; i < len(p.regs); {
			if r := p.regs[i]; r.key == key && r.k != k {
				o.victims = append(o.victims, r.k)
				o.ua(r.k, uaRegsPreempted)
				p.regs = append(p.regs[:i], p.regs[i+1:]...)
				nrem++
				continue
			}
			i++
		}
		return nrem
	}
	switch {
	case p.held && allRegs(p.typ) && o.saKey == 0:
		// Every other registrant goes; the preempter holds.
		for _, r := range p.regs {
			if r.k != k {
				o.victims = append(o.victims, r.k)
				o.ua(r.k, uaRegsPreempted)
			}
		}
		p.regs = []prReg{p.regs[o.me]}
		p.typ, p.holder = o.typ, k
		p.gen++
	case p.held && !allRegs(p.typ) && p.holderKey() == o.saKey:
		oldTyp := p.typ
		removeKey(o.saKey)
		p.typ, p.holder = o.typ, k
		if oldTyp != o.typ {
			for _, r := range p.regs {
				if r.k != k {
					o.ua(r.k, uaResvReleased)
				}
			}
		}
		p.gen++
	case o.saKey == 0:
		o.bad(invalidParam(8, -1))
	default:
		if removeKey(o.saKey) == 0 {
			o.conflict()
			return
		}
		p.gen++
	}
}

// outRegisterMove is REGISTER AND MOVE (registerMove).
func (p *prState) outRegisterMove(o *prOutReq) {
	o.status, o.sense = p.registerMove(o.k, o.me, o.resKey, o.saKey, o.typ, o.scope, o.data)
	if !o.failed() {
		o.setAPTPL = true
	}
}

// registerMove is REGISTER AND MOVE (SPC-4 5.13.8): the holder registers
// another I_T nexus (given by a TransportID and relative port) and moves
// the reservation to it.
func (p *prState) registerMove(k itKey, me int, resKey, saKey uint64, typ, scope uint8, data []byte) (uint8, *senseInfo) {
	bad := func(s senseInfo) (uint8, *senseInfo) { return StatusGood, &s }
	if me < 0 || resKey != p.regs[me].key {
		return StatusReservationConflict, nil
	}
	if !p.held || allRegs(p.typ) || p.holder != k {
		return StatusReservationConflict, nil
	}
	if saKey == 0 {
		return bad(invalidParam(8, -1))
	}
	if scope != 0 || typ != p.typ {
		// The type in the CDB must match the reservation being moved.
		if !validPRType(typ) {
			return bad(invalidCDB(2, 3))
		}
	}
	tlen := int(binary.BigEndian.Uint32(data[20:24]))
	if 24+tlen > len(data) {
		return bad(senseParamLenError)
	}
	port, _, ok := parseTransportID(data[24 : 24+tlen])
	if !ok {
		return bad(invalidParam(24, -1))
	}
	rel := binary.BigEndian.Uint16(data[18:20])
	if rel == 0 {
		return bad(invalidParam(18, -1))
	}
	dst := itKey{initiator: port, target: k.target, rel: rel}
	if dst == k {
		return bad(invalidParam(24, -1))
	}
	if i := p.find(dst); i >= 0 {
		p.regs[i].key = saKey
	} else {
		p.regs = append(p.regs, prReg{k: dst, key: saKey})
	}
	p.holder = dst
	p.typ = typ
	if data[17]&0x02 != 0 { // UNREG
		if i := p.find(k); i >= 0 {
			p.regs = append(p.regs[:i], p.regs[i+1:]...)
		}
	}
	p.gen++
	return StatusGood, nil
}

// prJSON is the persisted (APTPL) state.
type prJSON struct {
	Generation    uint32      `json:"generation"`
	Registrations []prRegJSON `json:"registrations"`
	Held          bool        `json:"held"`
	Type          uint8       `json:"type,omitempty"`
	Holder        *prRegJSON  `json:"holder,omitempty"`
}

type prRegJSON struct {
	Initiator string `json:"initiator"`
	Target    string `json:"target"`
	Relative  uint16 `json:"relative_port"`
	Key       uint64 `json:"key,omitempty"`
}

func (l *lu) prPath() (string, error) {
	dir, err := l.t.cfg.StateDir(l.vol)
	if err != nil {
		return "", err
	}
	return filepath.Join(dir, prFile), nil
}

// savePR persists p (APTPL set) or removes the file (APTPL cleared).
// REQUIRES: l.mu held (PR OUT calls are serialised by it).
func (l *lu) savePR(p *prState) error {
	path, err := l.prPath()
	if err != nil {
		return err
	}
	fsys := l.fsys()
	if !p.aptpl {
		err := fsys.Remove(path)
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		// Durably: a crash must not bring back reservations the
		// initiator was told no longer persist.
		return fsys.SyncDir(filepath.Dir(path))
	}
	j := prJSON{Generation: p.gen, Held: p.held, Type: p.typ, Registrations: []prRegJSON{}}
	for _, r := range p.regs {
		j.Registrations = append(j.Registrations, prRegJSON{Initiator: r.k.initiator, Target: r.k.target, Relative: r.k.rel, Key: r.key})
	}
	if p.held && !allRegs(p.typ) {
		j.Holder = &prRegJSON{Initiator: p.holder.initiator, Target: p.holder.target, Relative: p.holder.rel}
	}
	b, err := json.MarshalIndent(j, "", "  ")
	if err != nil {
		return err
	}
	if err := vfs.MkdirAllSync(fsys, filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return atomicfile.WriteFileFS(fsys, path, append(b, '\n'), 0o644)
}

func (l *lu) fsys() vfs.FS {
	if l.t.cfg.FS != nil {
		return l.t.cfg.FS
	}
	return vfs.OS
}

// loadPR restores persisted (APTPL) reservations when the logical unit is
// opened. A missing file is no state; an unreadable one is ignored (the
// initiators re-register) rather than keeping the volume from serving.
func (l *lu) loadPR() {
	if !l.aptplOK {
		return
	}
	path, err := l.prPath()
	if err != nil {
		return
	}
	b, err := vfs.ReadFile(l.fsys(), path)
	if err != nil {
		return
	}
	var j prJSON
	if json.Unmarshal(b, &j) != nil {
		return
	}
	p := prState{gen: j.Generation, aptpl: true}
	for _, r := range j.Registrations {
		if r.Key == 0 {
			continue
		}
		p.regs = append(p.regs, prReg{k: itKey{initiator: r.Initiator, target: r.Target, rel: r.Relative}, key: r.Key})
	}
	if j.Held && validPRType(j.Type) {
		p.held, p.typ = true, j.Type
		if !allRegs(j.Type) {
			if j.Holder == nil {
				p.held = false
			} else {
				p.holder = itKey{initiator: j.Holder.Initiator, target: j.Holder.Target, rel: j.Holder.Relative}
				if p.find(p.holder) < 0 {
					p.held = false
				}
			}
		}
	}
	l.pr = p
	l.updateRsvActiveLocked()
}
