package scsi

import (
	"errors"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vmsan/vmsan/internal/export"
	"github.com/vmsan/vmsan/internal/vfs"
	"github.com/vmsan/vmsan/internal/volrt"
)

// LUN maps a logical unit number to the volume it serves.
type LUN struct {
	Number uint64
	Volume string
}

// Port is a target port (a portal of the transport) and its target port
// group, for REPORT TARGET PORT GROUPS.
type Port struct {
	Relative uint16
	Group    uint16
}

// ALUA asymmetric access states (SPC-4 6.37, REPORT TARGET PORT GROUPS).
const (
	ALUAActiveOptimized    uint8 = 0x0
	ALUAActiveNonOptimized uint8 = 0x1
	ALUAStandby            uint8 = 0x2
	ALUAUnavailable        uint8 = 0x3
	ALUATransitioning      uint8 = 0xF
)

// Defaults for Config.
const (
	DefaultVendor   = "VMSAN"
	DefaultProduct  = "VOLUME"
	DefaultRevision = "0001"
	// DefaultMaxTransfer is the largest READ/WRITE a Target accepts when
	// Config.MaxTransfer is 0 (advertised in the Block Limits VPD page;
	// larger transfers fail with INVALID FIELD IN CDB): it bounds the
	// memory one command pins. The device's Info.MaxBlock (the NBD
	// maximum payload, 32 MiB by default) lowers it. libiscsi's
	// WriteSame16.Unmap writes and reads 65536 blocks in one command
	// regardless of the advertised limit, hence not less than 32 MiB.
	DefaultMaxTransfer = 32 << 20
	// maxWriteSameBytes bounds WRITE SAME and one UNMAP descriptor
	// (advertised as MAXIMUM WRITE SAME LENGTH and MAXIMUM UNMAP LBA
	// COUNT): a pattern write that large is written in chunks, so only
	// the time per command is bounded by it, not memory.
	maxWriteSameBytes = 1 << 30
	// maxUnmapBlocks caps MAXIMUM UNMAP LBA COUNT further (initiators and
	// libiscsi's BlockLimits test treat more than 1M blocks as insane).
	maxUnmapBlocks = 1 << 20
	// maxUnmapDescriptors is MAXIMUM UNMAP BLOCK DESCRIPTOR COUNT.
	maxUnmapDescriptors = 256
	// maxCompareAndWrite is MAXIMUM COMPARE AND WRITE LENGTH (blocks).
	maxCompareAndWrite = 255
	// wsChunk is the largest engine write a pattern WRITE SAME issues.
	wsChunk = 1 << 20
)

// Config configures a Target.
type Config struct {
	// Registry opens volumes by name.
	Registry export.Registry
	// LUNs returns the LUN map; it is read on every command (keep it
	// cheap: return a cached slice) and must not be modified by the
	// Target.
	LUNs func() []LUN
	// StateDir returns the directory that keeps a volume's persistent
	// state: reservations with APTPL are written there. nil: APTPL is
	// refused (REPORT CAPABILITIES says PTPL_C=0).
	StateDir func(volume string) (string, error)
	// FS is the filesystem the APTPL state goes through (nil: the real
	// one; a vfs.MemFS in crash tests).
	FS vfs.FS
	// Identity in standard INQUIRY data (defaults DefaultVendor...).
	Vendor, Product, Revision string
	// Ports lists the transport's target ports and their groups, so that
	// REPORT TARGET PORT GROUPS lists ports no session came in on yet
	// (ports seen in a Nexus are added). nil: only ports seen.
	Ports func() []Port
	// MaxTransfer caps a READ/WRITE in bytes (0: DefaultMaxTransfer).
	// Target.MaxDataOut derives from it the most data-out any command
	// uses, which a transport may use to bound its buffers.
	MaxTransfer uint32
	// Abort, when set, is called by PREEMPT AND ABORT for every I_T
	// nexus whose registration was preempted: the transport aborts that
	// nexus's tasks for lun (without waiting: it is called from inside
	// Execute). nil: tasks are not aborted, only registrations removed.
	Abort func(n *Nexus, lun uint64)
}

// Target is a set of SCSI logical units (one per LUN of Config.LUNs).
//
// Concurrency: safe for concurrent use (see the package doc).
type Target struct {
	cfg Config

	mu  sync.Mutex
	lus map[uint64]*lu // by LUN number; guarded by mu
	// fast mirrors lus for lock-free lookups while the LUN map slice is
	// the one in snap (writes under mu).
	fast   sync.Map // uint64 -> *lu
	snap   atomic.Pointer[lunSnap]
	closed bool
	lunFP  uint64 // fingerprint of the last LUN map seen (3F/0E)
	// ALUA: state per port group, ports seen per group.
	alua    map[uint16]uint8
	altered map[uint16]bool // state set by SetPortGroupState (RTPG status)
	ports   map[uint16]map[uint16]bool
	aluaAny atomic.Bool // some group is not active/optimized
	// admitted counts commands subject to ALUA states (those an ALUA state
	// may refuse: media and state-changing ones) from their ALUA check to
	// their completion (WaitAdmitted).
	admitted atomic.Int64
}

// New returns a Target; it opens volumes lazily, on the first command
// that addresses them.
func New(cfg Config) *Target {
	if cfg.Vendor == "" {
		cfg.Vendor = DefaultVendor
	}
	if cfg.Product == "" {
		cfg.Product = DefaultProduct
	}
	if cfg.Revision == "" {
		cfg.Revision = DefaultRevision
	}
	if cfg.MaxTransfer == 0 {
		cfg.MaxTransfer = DefaultMaxTransfer
	}
	if cfg.LUNs == nil {
		cfg.LUNs = func() []LUN { return nil }
	}
	return &Target{cfg: cfg, lus: map[uint64]*lu{}, alua: map[uint16]uint8{}, altered: map[uint16]bool{}, ports: map[uint16]map[uint16]bool{}}
}

// MaxDataOut is the largest data-out any command consumes: a transport
// may refuse (or not buffer) more. READ/WRITE-class commands are bounded
// by MaxTransfer (COMPARE AND WRITE's 2×N blocks too, see lu.maxCAW), the
// parameter lists of UNMAP, MODE SELECT and PERSISTENT RESERVE OUT by
// their 16-bit length fields in practice.
func (t *Target) MaxDataOut() uint32 { return max(t.cfg.MaxTransfer, 64<<10) }

// Close releases every opened device. Commands executed afterwards fail
// with LOGICAL UNIT NOT SUPPORTED.
func (t *Target) Close() {
	t.mu.Lock()
	lus := t.lus
	t.lus = map[uint64]*lu{}
	t.fast.Clear()
	t.closed = true
	t.mu.Unlock()
	for _, l := range lus {
		l.close()
	}
}

// ReleaseVolume closes the logical units open on volume vol, releasing
// their devices; a later command opens the volume again (a new logical
// unit: reservations not persisted with APTPL, pending unit attentions and
// mode page changes are lost, as after a power cycle). It returns how
// many it closed. The daemon calls it on an idle volume before reopening
// it with new settings. REQUIRES: no command on those logical units is in
// flight (no session uses the volume), or such commands may fail.
func (t *Target) ReleaseVolume(vol string) int {
	t.mu.Lock()
	var lus []*lu
	for n, l := range t.lus {
		if l.vol == vol {
			lus = append(lus, l)
			delete(t.lus, n)
			t.fast.Delete(n)
		}
	}
	t.mu.Unlock()
	for _, l := range lus {
		l.close()
	}
	return len(lus)
}

// lunFingerprint hashes the LUN map (FNV-1a, no allocation).
func lunFingerprint(luns []LUN) uint64 {
	h := uint64(14695981039346656037)
	mix := func(b byte) { h = (h ^ uint64(b)) * 1099511628211 }
	for _, l := range luns {
		for i := 0; i < 64; i += 8 {
			mix(byte(l.Number >> i))
		}
		for i := 0; i < len(l.Volume); i++ {
			mix(l.Volume[i])
		}
		mix(0)
	}
	return h | 1 // never 0 (0 means "not seen yet")
}

// lunSnap identifies the LUN map slice last seen, so that a Config.LUNs
// returning the same cached slice costs no hashing and no lock.
type lunSnap struct {
	first *LUN
	n     int
}

// lookup returns the logical unit for lun, opening its volume on first
// use; nil when the LUN is not in the map (or its volume cannot be
// opened). It also notices LUN map changes (REPORTED LUNS DATA HAS
// CHANGED to every nexus).
func (t *Target) lookup(lun uint64) *lu {
	luns := t.cfg.LUNs()
	if s := t.snap.Load(); s != nil && s.n == len(luns) && (s.n == 0 || s.first == &luns[0]) {
		// Same map as last time: the open logical unit, if any, is current.
		if v, ok := t.fast.Load(lun); ok && !v.(*lu).stale.Load() {
			return v.(*lu)
		}
	}
	vol, found := "", false
	for _, l := range luns {
		if l.Number == lun {
			vol, found = l.Volume, true
			break
		}
	}
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil
	}
	snap := &lunSnap{n: len(luns)}
	if len(luns) > 0 {
		snap.first = &luns[0]
	}
	t.snap.Store(snap)
	fp := lunFingerprint(luns)
	if t.lunFP == 0 {
		t.lunFP = fp
	} else if fp != t.lunFP {
		t.lunFP = fp
		for _, l := range t.lus {
			l.addUAAll(nil, uaLUNsChanged)
		}
	}
	l := t.lus[lun]
	if l != nil && (!found || l.vol != vol || l.stale.Load()) {
		// The LUN was removed or now names another volume, or its volume
		// was deleted under it (a volume of that name may exist again).
		delete(t.lus, lun)
		t.fast.Delete(lun)
		go l.close()
		l = nil
	}
	if l != nil || !found {
		t.mu.Unlock()
		return l
	}
	t.mu.Unlock()
	// Open outside the lock (the registry may block); a racing opener
	// loses and releases its device.
	dev, err := t.cfg.Registry.Open(vol)
	if err != nil {
		return nil
	}
	nl := newLU(t, lun, vol, dev)
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		nl.close()
		return nil
	}
	if l = t.lus[lun]; l == nil {
		t.lus[lun] = nl
		t.fast.Store(lun, nl)
		l = nl
		nl = nil
	}
	t.mu.Unlock()
	if nl != nil {
		nl.close()
	}
	return l
}

// seePort records a nexus's target port in its group.
func (t *Target) seePort(n *Nexus) {
	t.mu.Lock()
	g := t.ports[n.PortGroup]
	if g == nil {
		g = map[uint16]bool{}
		t.ports[n.PortGroup] = g
	}
	g[relPort(n)] = true
	t.mu.Unlock()
}

func relPort(n *Nexus) uint16 {
	if n == nil || n.RelativePort == 0 {
		return 1 // 0 is reserved (SPC-4 7.8.6.4)
	}
	return n.RelativePort
}

// SetPortGroupState sets the ALUA state of a target port group (one of the
// ALUA* constants); every I_T nexus gets ASYMMETRIC ACCESS STATE CHANGED
// (2A/06) on every logical unit.
func (t *Target) SetPortGroupState(group uint16, state uint8) {
	t.mu.Lock()
	old, ok := t.alua[group]
	if !ok {
		old = ALUAActiveOptimized
	}
	t.alua[group] = state
	if old != state {
		t.altered[group] = true
	}
	any := false
	for _, s := range t.alua {
		if s != ALUAActiveOptimized {
			any = true
		}
	}
	t.aluaAny.Store(any)
	lus := make([]*lu, 0, len(t.lus))
	for _, l := range t.lus {
		lus = append(lus, l)
	}
	t.mu.Unlock()
	if old == state {
		return
	}
	for _, l := range lus {
		l.addUAAll(nil, uaALUAChanged)
	}
}

// ErrAdmittedTimeout: WaitAdmitted gave up with commands still running.
var ErrAdmittedTimeout = errors.New("scsi: commands admitted before the ALUA state change are still running")

// WaitAdmitted waits (polling, bounded by timeout) until no command that
// is subject to ALUA states is between its ALUA check and its completion.
// After SetPortGroupState(g, ALUATransitioning) for every group of this
// node, that means every media command that may still reach the device
// has completed: the caller may then change what the device does (e.g.
// make it read-only) without a command admitted earlier seeing it.
// Commands exempt from ALUA states (INQUIRY, REPORT TARGET PORT GROUPS...)
// are not waited for.
func (t *Target) WaitAdmitted(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		n := t.admitted.Load()
		if n == 0 {
			return nil
		}
		if !time.Now().Before(deadline) {
			return fmt.Errorf("%w (%d after %v)", ErrAdmittedTimeout, n, timeout)
		}
		time.Sleep(time.Millisecond)
	}
}

// Admitted returns how many commands subject to ALUA states are between
// their ALUA check and their completion.
func (t *Target) Admitted() int64 { return t.admitted.Load() }

// PortGroupState returns a group's ALUA state (active/optimized unless set).
func (t *Target) PortGroupState(group uint16) uint8 {
	if !t.aluaAny.Load() {
		return ALUAActiveOptimized
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if s, ok := t.alua[group]; ok {
		return s
	}
	return ALUAActiveOptimized
}

// portGroups returns the groups in use (with at least one port) and their
// ports, sorted, with their states and whether a state was set.
func (t *Target) portGroups() (groups []uint16, ports map[uint16][]uint16, states map[uint16]uint8, altered map[uint16]bool) {
	var extra []Port
	if t.cfg.Ports != nil {
		extra = t.cfg.Ports()
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	ports = map[uint16][]uint16{}
	states = map[uint16]uint8{}
	altered = map[uint16]bool{}
	set := map[uint16]map[uint16]bool{}
	for g, ps := range t.ports {
		set[g] = map[uint16]bool{}
		for p := range ps {
			set[g][p] = true
		}
	}
	for _, p := range extra {
		if set[p.Group] == nil {
			set[p.Group] = map[uint16]bool{}
		}
		set[p.Group][max(p.Relative, 1)] = true
	}
	if len(set) == 0 {
		set[0] = map[uint16]bool{1: true}
	}
	for g, ps := range set {
		if len(ps) == 0 {
			continue
		}
		altered[g] = t.altered[g]
		groups = append(groups, g)
		for p := range ps {
			ports[g] = append(ports[g], p)
		}
		sort.Slice(ports[g], func(i, j int) bool { return ports[g][i] < ports[g][j] })
		s, ok := t.alua[g]
		if !ok {
			s = ALUAActiveOptimized
		}
		states[g] = s
	}
	sort.Slice(groups, func(i, j int) bool { return groups[i] < groups[j] })
	return groups, ports, states, altered
}

// TaskManagement performs the SCSI side of a task management function
// after the transport aborted (and waited for) the affected tasks.
func (t *Target) TaskManagement(fn uint8, n *Nexus, lun uint64) uint8 {
	switch fn {
	case TMFAbortTask, TMFAbortTaskSet, TMFClearTaskSet:
		if t.lookup(lun) == nil {
			return TMFLUNDoesNotExist
		}
		return TMFComplete
	case TMFLogicalUnitReset:
		l := t.lookup(lun)
		if l == nil {
			return TMFLUNDoesNotExist
		}
		l.reset(n)
		return TMFComplete
	case TMFTargetWarmReset, TMFTargetColdReset:
		t.mu.Lock()
		lus := make([]*lu, 0, len(t.lus))
		for _, l := range t.lus {
			lus = append(lus, l)
		}
		t.mu.Unlock()
		for _, l := range lus {
			l.reset(n)
		}
		return TMFComplete
	case TMFClearACA:
		// NACA is not supported (the mask refuses it in every CDB), so no
		// ACA condition can exist.
		return TMFNotSupported
	}
	return TMFNotSupported
}

// NexusLost forgets an I_T nexus: its unit attentions and its RESERVE(6)
// reservation go; persistent reservations and registrations stay (SPC-4).
func (t *Target) NexusLost(n *Nexus) {
	t.mu.Lock()
	lus := make([]*lu, 0, len(t.lus))
	for _, l := range t.lus {
		lus = append(lus, l)
	}
	t.mu.Unlock()
	for _, l := range lus {
		l.nexusLost(n)
	}
}

// cmd is one task in execution: pooled with its Result, engine request and
// sense buffer so the READ/WRITE path allocates nothing in steady state.
type cmd struct {
	t    *Target
	lu   *lu
	task *Task
	d    *cmdDesc
	done func(*Result)
	desc bool // descriptor sense for this nexus/LU

	res      Result
	senseBuf [maxSense]byte
	req      export.Request
	bufp     *[]byte // pooled data-in or scratch buffer (released with res)
	// ranges is UNMAP's descriptor list for its one engine request
	// (kept across pool reuse: no allocation per command).
	ranges []export.Range

	// Data-path state across engine completions.
	stage  uint8
	lba    uint64
	nblk   uint64
	xfer   uint64 // the CDB's transfer length in bytes (residuals)
	fua    bool
	onDone func(*export.Request)
	relFn  func()
	// admitted: counted in t.admitted until finishStatus.
	admitted bool
}

var cmdPool sync.Pool

func init() {
	cmdPool.New = func() any {
		c := &cmd{}
		c.onDone = c.engineDone
		c.relFn = c.release
		return c
	}
}

func getCmd() *cmd { return cmdPool.Get().(*cmd) }

// release is Result.Release's function: back to the pools.
func (c *cmd) release() {
	if c.bufp != nil {
		volrt.PutBuf(c.bufp)
		c.bufp = nil
	}
	c.t, c.lu, c.task, c.d, c.done = nil, nil, nil, nil, nil
	c.req = export.Request{}
	c.res = Result{}
	cmdPool.Put(c)
}

// Execute runs task and calls done exactly once with its result, possibly
// before Execute returns.
func (t *Target) Execute(task *Task, done func(*Result)) {
	c := getCmd()
	c.t, c.task, c.done = t, task, done
	c.stage, c.fua, c.desc, c.admitted = 0, false, false, false
	c.xfer = 0
	cdb := task.CDB
	if len(cdb) == 0 {
		c.fail(senseInvalidOpcode)
		return
	}
	d, known := lookupCmd(cdb)
	if d == nil {
		if known {
			c.fail(invalidCDB(1, 4))
		} else {
			c.fail(senseInvalidOpcode)
		}
		return
	}
	c.d = d
	if len(cdb) < len(d.mask) {
		c.fail(invalidCDB(0, -1))
		return
	}
	l := t.lookup(task.LUN)
	c.lu = l
	if l != nil {
		c.desc = l.dsense.Load()
	}
	if s, ok := d.checkMask(cdb); !ok {
		c.fail(s)
		return
	}
	if l == nil {
		if d.flags&fNoLU == 0 {
			c.fail(senseLUNotSupported)
			return
		}
		d.run(c)
		return
	}
	n := task.Nexus
	if n == nil {
		n = &noNexus
		task.Nexus = n
	}
	it := l.itl(n)
	l.checkSize()
	if d.flags&fNoUA == 0 && it.ua.Load() != 0 {
		if s, ok := l.popUA(it); ok {
			c.fail(s)
			return
		}
	}
	if d.flags&fALUAAll == 0 {
		// INVARIANT: counted before the state is read (both seq-cst), so
		// that WaitAdmitted after SetPortGroupState either sees this
		// command or the command sees the new state.
		t.admitted.Add(1)
		c.admitted = true
		if t.aluaAny.Load() {
			switch t.PortGroupState(n.PortGroup) {
			case ALUAStandby:
				if d.flags&fALUAStandby == 0 {
					c.fail(senseStandby)
					return
				}
			case ALUAUnavailable:
				c.fail(senseUnavailable)
				return
			case ALUATransitioning:
				c.fail(senseTransitioning)
				return
			}
		}
	}
	if l.rsvActive.Load() && l.conflict(c) {
		c.finishStatus(StatusReservationConflict)
		return
	}
	d.run(c)
}

// standbyPort reports whether c came in through a port group in the
// standby state (the only non-active state in which MODE SENSE is served).
func (c *cmd) standbyPort() bool {
	if !c.t.aluaAny.Load() || c.task.Nexus == nil {
		return false
	}
	return c.t.PortGroupState(c.task.Nexus.PortGroup) == ALUAStandby
}

// noNexus stands in for a transport that passes no Nexus (tests, tools).
var noNexus = Nexus{InitiatorPort: "-", RelativePort: 1}

// fail completes c with CHECK CONDITION and s.
func (c *cmd) fail(s senseInfo) {
	c.res.Sense = s.encode(c.senseBuf[:0], c.desc)
	c.res.DataIn = nil
	c.finishStatus(StatusCheckCondition)
}

func (c *cmd) good() { c.finishStatus(StatusGood) }

// finishStatus completes c with status and the data-in set so far,
// computing residuals.
func (c *cmd) finishStatus(status uint8) {
	if c.admitted {
		c.admitted = false
		c.t.admitted.Add(-1)
	}
	c.res.Status = status
	if status != StatusGood && status != StatusCheckCondition {
		c.res.Sense = nil
	}
	c.residuals()
	c.res.SetRelease(c.relFn)
	done := c.done
	done(&c.res)
}

// residuals sets the residual fields: data-out commands against
// ExpectedOut and the CDB's transfer length, data-in ones against
// ExpectedIn and the data produced (already cut to ExpectedIn, with the
// CDB's transfer length in c.xfer for media reads).
func (c *cmd) residuals() {
	r, task := &c.res, c.task
	r.Residual, r.Overflow, r.Underflow = 0, false, false
	if c.d != nil && c.d.flags&fDataOut != 0 {
		exp := uint64(task.ExpectedOut)
		switch {
		case c.xfer > exp:
			r.Residual, r.Overflow = uint32(min(c.xfer-exp, 0xFFFFFFFF)), true
		case c.xfer < exp:
			r.Residual, r.Underflow = uint32(exp-c.xfer), true
		}
		return
	}
	want := max(c.xfer, uint64(len(r.DataIn)))
	exp := uint64(task.ExpectedIn)
	if uint64(len(r.DataIn)) > exp {
		r.DataIn = r.DataIn[:exp]
	}
	switch {
	case want > exp:
		r.Residual, r.Overflow = uint32(min(want-exp, 0xFFFFFFFF)), true
	case want < exp:
		r.Residual, r.Underflow = uint32(exp-want), true
	}
}

// dataIn returns a pooled buffer of n bytes, zeroed, for a response.
func (c *cmd) dataIn(n int) []byte {
	if c.bufp != nil {
		volrt.PutBuf(c.bufp)
	}
	c.bufp = volrt.GetBuf(n)
	b := *c.bufp
	clear(b)
	return b
}

// reply completes c with GOOD and data (cut to alloc, the CDB's
// allocation length).
func (c *cmd) reply(data []byte, alloc uint64) {
	if uint64(len(data)) > alloc {
		data = data[:alloc]
	}
	c.res.DataIn = data
	c.finishStatus(StatusGood)
}
