package scsi

import (
	"crypto/sha256"
	"sync"
	"sync/atomic"

	"github.com/vmsan/vmsan/internal/backend"
	"github.com/vmsan/vmsan/internal/export"
)

// Unit attention conditions (ASC/ASCQ, SPC-4 annex D).
type uaCode uint16

const (
	uaPowerOn           uaCode = 0x2900
	uaBusDeviceReset    uaCode = 0x2903
	uaModeChanged       uaCode = 0x2A01
	uaResvPreempted     uaCode = 0x2A03
	uaResvReleased      uaCode = 0x2A04
	uaRegsPreempted     uaCode = 0x2A05
	uaALUAChanged       uaCode = 0x2A06
	uaCapacityChanged   uaCode = 0x2A09
	uaLUNsChanged       uaCode = 0x3F0E
	maxPendingUA               = 16
	uaReset29Mask       uaCode = 0xFF00
	uaReset29ASC        uaCode = 0x2900
	vpdSerialLen               = 32
	defaultLogicalBlock        = 512
)

// itl is the state of one I_T nexus on one logical unit (an I_T_L nexus):
// its pending unit attentions.
type itl struct {
	ua      atomic.Int32 // len(pending), readable without lu.mu
	pending []uaCode     // guarded by lu.mu
}

// itKey identifies an I_T nexus across sessions (reservations outlive
// a session: the same initiator port on the same target port is the same
// I_T nexus again).
type itKey struct {
	initiator string // SPC-4 initiator port name
	target    string // target name
	rel       uint16 // relative target port
}

func keyOf(n *Nexus) itKey {
	return itKey{initiator: n.InitiatorPort, target: n.TargetName, rel: relPort(n)}
}

// lu is one logical unit: an opened device and its SCSI state.
type lu struct {
	t   *Target
	num uint64
	vol string
	dev export.Device

	// Set at open, read-only.
	bs      uint32 // logical block size
	bsShift uint
	ppbExp  uint8  // logical blocks per physical block exponent
	maxXfer uint32 // bytes, a multiple of bs
	maxCAW  uint8  // blocks per COMPARE AND WRITE: 2×maxCAW blocks ≤ maxXfer
	// readOnly follows the device's Info (checkSize): a replicated
	// volume is read-only while its node is secondary and writable once
	// promoted, under the same open logical unit.
	readOnly atomic.Bool
	rotation bool
	wce      bool
	naa      [16]byte
	serial   string
	uuid     string

	size      atomic.Int64 // bytes, as last seen (capacity UA)
	dsense    atomic.Bool  // control page D_SENSE
	swp       atomic.Bool  // control page SWP
	rsvActive atomic.Bool  // a reservation or registration exists
	// stale is set when the device reported its volume deleted
	// (volrt.ErrVolumeGone): the next lookup opens the name again.
	stale atomic.Bool

	mu    sync.Mutex
	nexus sync.Map // *Nexus -> *itl (creation under mu)
	pr    prState  // guarded by mu
	// spc2 is the RESERVE(6)/(10) holder (nil: none); guarded by mu.
	spc2    *itKey
	aptplOK bool // StateDir set: APTPL can persist
}

func newLU(t *Target, num uint64, vol string, dev export.Device) *lu {
	info := dev.Info()
	l := &lu{t: t, num: num, vol: vol, dev: dev}
	l.bs = defaultLogicalBlock
	if info.MinBlock >= 4096 && info.MinBlock&(info.MinBlock-1) == 0 {
		l.bs = info.MinBlock
	}
	for 1<<l.bsShift < l.bs {
		l.bsShift++
	}
	if info.PrefBlock > l.bs && info.PrefBlock&(info.PrefBlock-1) == 0 {
		for l.bs<<l.ppbExp < info.PrefBlock && l.ppbExp < 15 {
			l.ppbExp++
		}
	}
	l.maxXfer = t.cfg.MaxTransfer
	if info.MaxBlock != 0 && info.MaxBlock < l.maxXfer {
		l.maxXfer = info.MaxBlock
	}
	l.maxXfer = max(l.maxXfer&^(l.bs-1), l.bs)
	l.maxCAW = uint8(max(min(maxCompareAndWrite, l.maxXfer/l.bs/2), 1))
	l.readOnly.Store(info.ReadOnly)
	l.rotation = info.Rotational
	// QEMU's rule: every cache mode but writethrough has a volatile cache
	// the initiator must flush (SYNCHRONIZE CACHE / FUA).
	l.wce = info.Cache != backend.CacheWritethrough
	l.uuid = info.UUID
	id := info.UUID
	if id == "" {
		id = "name:" + vol
	}
	sum := sha256.Sum256([]byte("vmsan-lu:" + id))
	// NAA 6 (IEEE Registered Extended): NAA nibble, 24-bit company id
	// (a locally administered one: bit 1 of its first octet set), then 100
	// bits derived from the volume UUID, so every path and every node of
	// a replicated pair reports the same identifier.
	l.naa[0] = 0x60 | naaCompanyID>>20&0x0F
	l.naa[1] = naaCompanyID >> 12 & 0xFF
	l.naa[2] = naaCompanyID >> 4 & 0xFF
	l.naa[3] = naaCompanyID<<4&0xF0 | sum[0]&0x0F
	copy(l.naa[4:], sum[1:13])
	const hexd = "0123456789abcdef"
	s := make([]byte, 0, vpdSerialLen)
	for _, b := range sum[16 : 16+vpdSerialLen/2] {
		s = append(s, hexd[b>>4], hexd[b&15])
	}
	if u := hexOnly(info.UUID); len(u) == 32 {
		s = []byte(u)
	}
	l.serial = string(s)
	l.size.Store(info.Size)
	l.aptplOK = t.cfg.StateDir != nil
	l.loadPR()
	return l
}

// naaCompanyID is the IEEE company id in vmsan's NAA designators: a
// locally administered value (no registered OUI is claimed).
const naaCompanyID = 0x0A564D

func hexOnly(s string) string {
	b := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c >= '0' && c <= '9', c >= 'a' && c <= 'f':
			b = append(b, c)
		case c >= 'A' && c <= 'F':
			b = append(b, c+'a'-'A')
		}
	}
	return string(b)
}

func (l *lu) close() { l.dev.Release() }

// blocks is the capacity in logical blocks.
func (l *lu) blocks() uint64 { return uint64(l.size.Load()) >> l.bsShift }

// checkSize notices a resize (CAPACITY DATA HAS CHANGED to every nexus)
// and a change of the device's write protection (a promoted secondary).
func (l *lu) checkSize() {
	info := l.dev.Info()
	if info.ReadOnly != l.readOnly.Load() {
		l.readOnly.Store(info.ReadOnly)
	}
	sz := info.Size
	if old := l.size.Load(); old != sz && l.size.CompareAndSwap(old, sz) {
		l.addUAAll(nil, uaCapacityChanged)
	}
}

// itl returns n's state on l, creating it (with POWER ON, RESET, OR BUS
// DEVICE RESET OCCURRED pending) on the nexus's first command.
func (l *lu) itl(n *Nexus) *itl {
	if v, ok := l.nexus.Load(n); ok {
		return v.(*itl)
	}
	l.t.seePort(n)
	l.mu.Lock()
	defer l.mu.Unlock()
	if v, ok := l.nexus.Load(n); ok {
		return v.(*itl)
	}
	it := &itl{pending: []uaCode{uaPowerOn}}
	it.ua.Store(1)
	l.nexus.Store(n, it)
	return it
}

// addUALocked queues code for it. A reset condition (29/xx) replaces
// everything pending (SPC-4 5.14: it has the highest priority and
// subsumes the others); duplicates are not queued twice.
// REQUIRES: l.mu held.
func addUALocked(it *itl, code uaCode) {
	if code&uaReset29Mask == uaReset29ASC {
		it.pending = append(it.pending[:0], code)
		it.ua.Store(1)
		return
	}
	for _, p := range it.pending {
		if p == code {
			return
		}
	}
	if len(it.pending) >= maxPendingUA {
		return
	}
	it.pending = append(it.pending, code)
	it.ua.Store(int32(len(it.pending)))
}

// addUAAll queues code for every nexus on l except skip.
func (l *lu) addUAAll(skip *Nexus, code uaCode) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.nexus.Range(func(k, v any) bool {
		if k.(*Nexus) != skip {
			addUALocked(v.(*itl), code)
		}
		return true
	})
}

// addUAKeyLocked queues code for every nexus with I_T key k.
// REQUIRES: l.mu held.
func (l *lu) addUAKeyLocked(k itKey, code uaCode) {
	l.nexus.Range(func(n, v any) bool {
		if keyOf(n.(*Nexus)) == k {
			addUALocked(v.(*itl), code)
		}
		return true
	})
}

// popUA takes the oldest (highest priority) pending unit attention.
func (l *lu) popUA(it *itl) (senseInfo, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(it.pending) == 0 {
		return senseInfo{}, false
	}
	code := it.pending[0]
	it.pending = append(it.pending[:0], it.pending[1:]...)
	it.ua.Store(int32(len(it.pending)))
	return senseInfo{key: KeyUnitAttention, asc: uint8(code >> 8), ascq: uint8(code)}, true
}

// clearUA drops a pending code (REPORT LUNS clears 3F/0E).
func (l *lu) clearUA(it *itl, code uaCode) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, p := range it.pending {
		if p == code {
			it.pending = append(it.pending[:i], it.pending[i+1:]...)
			it.ua.Store(int32(len(it.pending)))
			return
		}
	}
}

// reset is a LOGICAL UNIT RESET (or target reset) from n: RESERVE(6)
// reservations are released, mode pages return to their defaults, every
// nexus gets BUS DEVICE RESET FUNCTION OCCURRED (29/03), n included.
// Persistent reservations are not affected (SPC-4).
func (l *lu) reset(n *Nexus) {
	l.mu.Lock()
	l.spc2 = nil
	l.updateRsvActiveLocked()
	l.mu.Unlock()
	l.dsense.Store(false)
	l.swp.Store(false)
	// SAM-5 6.3 (logical unit reset): a unit attention for every I_T
	// nexus, the one that asked for the reset included; a multipath
	// initiator relies on seeing it on every path (libiscsi's
	// MultipathIO.Reset checks each path, the resetting one too).
	l.addUAAll(nil, uaBusDeviceReset)
}

// nexusLost drops n's state on l.
func (l *lu) nexusLost(n *Nexus) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.nexus.Delete(n)
	if l.spc2 != nil && *l.spc2 == keyOf(n) {
		// Only if no other live session is the same I_T nexus.
		still := false
		l.nexus.Range(func(k, _ any) bool {
			if keyOf(k.(*Nexus)) == *l.spc2 {
				still = true
			}
			return !still
		})
		if !still {
			l.spc2 = nil
			l.updateRsvActiveLocked()
		}
	}
}
