package scsi

import "encoding/binary"

// Mode pages: caching (08h), control (0Ah), informational exceptions
// (1Ch). Page controls: current, changeable, default; saved pages are not
// kept, so saved returns the defaults (what a reset restores).
const (
	pcCurrent    = 0
	pcChangeable = 1
	pcDefault    = 2
	pcSaved      = 3
)

var modePageCodes = []uint8{0x08, 0x0A, 0x1C}

// modePage writes page code's data for page control pc into b and returns
// its length (0: no such page).
func (l *lu) modePage(b []byte, code, pc uint8) int {
	switch code {
	case 0x08: // caching
		b[0], b[1] = 0x08, 0x12
		if pc != pcChangeable && l.wce {
			b[2] = 0x04 // WCE
		}
		return 20
	case 0x0A: // control
		b[0], b[1] = 0x0A, 0x0A
		switch pc {
		case pcChangeable:
			b[2] = 0x04 // D_SENSE
			b[4] = 0x08 // SWP
		case pcCurrent:
			if l.dsense.Load() {
				b[2] |= 0x04
			}
			if l.swp.Load() {
				b[4] |= 0x08
			}
			fallthrough
		default:
			// TST 001b: a task set per I_T nexus (the transport keeps task
			// lists per session, so ABORT/CLEAR TASK SET touch only the
			// caller's tasks); QUEUE ALGORITHM MODIFIER 1: unrestricted
			// reordering (the engine may reorder independent requests).
			b[2] |= 0x20
			b[3] = 0x10
		}
		return 12
	case 0x1C: // informational exceptions: none are reported
		b[0], b[1] = 0x1C, 0x0A
		if pc != pcChangeable {
			b[2] = 0x08 // DEXCPT
		}
		return 12
	}
	return 0
}

func (c *cmd) modeSense() {
	cdb := c.task.CDB
	ten := cdb[0] == opModeSense10
	dbd := cdb[1]&0x08 != 0
	llbaa := ten && cdb[1]&0x10 != 0
	pc, page, sub := cdb[2]>>6, cdb[2]&0x3F, cdb[3]
	var alloc uint64
	hdr := 4
	if ten {
		alloc, hdr = uint64(binary.BigEndian.Uint16(cdb[7:9])), 8
	} else {
		alloc = uint64(cdb[4])
	}
	if sub != 0 && sub != 0xFF {
		c.fail(invalidCDB(3, -1))
		return
	}
	l := c.lu
	b := c.dataIn(256)
	p := hdr
	if !dbd {
		if llbaa {
			binary.BigEndian.PutUint64(b[p:], l.blocks())
			binary.BigEndian.PutUint32(b[p+12:], l.bs)
			p += 16
		} else {
			binary.BigEndian.PutUint32(b[p:], uint32(min(l.blocks(), 0xFFFFFFFF)))
			binary.BigEndian.PutUint32(b[p+4:], l.bs&0xFFFFFF)
			p += 8
		}
	}
	bdlen := p - hdr
	if page == 0x3F {
		for _, code := range modePageCodes {
			p += l.modePage(b[p:], code, pc)
		}
	} else {
		n := l.modePage(b[p:], page, pc)
		if n == 0 {
			c.fail(invalidCDB(2, 5))
			return
		}
		p += n
	}
	dsp := byte(0x10) // DPOFUA
	// WP: the software write protect, and a read-only device except
	// through a standby port. A replicated secondary's device is
	// read-only and its ports are standby; the logical unit is writable
	// through the active (primary's) ports. Linux's sd sets the disk
	// read-only from WP when it scans a path and does not re-read it when
	// the port turns active, and dm-multipath cannot load a map over a
	// read-only path (EROFS): reporting WP there would leave the pair
	// without a usable path after a promote.
	if l.swp.Load() || l.readOnly.Load() && !c.standbyPort() {
		dsp |= 0x80 // WP
	}
	if ten {
		binary.BigEndian.PutUint16(b[0:2], uint16(p-2))
		b[3] = dsp
		if llbaa && !dbd {
			b[4] = 0x01 // LONGLBA
		}
		binary.BigEndian.PutUint16(b[6:8], uint16(bdlen))
	} else {
		b[0] = byte(p - 1)
		b[2] = dsp
		b[3] = byte(bdlen)
	}
	c.reply(b[:p], alloc)
}

func (c *cmd) modeSelect() {
	cdb := c.task.CDB
	ten := cdb[0] == opModeSelect10
	var plen, hdr int
	if ten {
		plen, hdr = int(binary.BigEndian.Uint16(cdb[7:9])), 8
	} else {
		plen, hdr = int(cdb[4]), 4
	}
	c.xfer = uint64(plen)
	if cdb[1]&0x01 != 0 { // SP: no saved pages
		c.fail(invalidCDB(1, 0))
		return
	}
	if plen == 0 {
		c.finishStatus(StatusGood)
		return
	}
	data := c.task.DataOut[:min(plen, len(c.task.DataOut))]
	if len(data) < hdr {
		c.fail(senseParamLenError)
		return
	}
	var bdlen int
	if ten {
		bdlen = int(binary.BigEndian.Uint16(data[6:8]))
	} else {
		bdlen = int(data[3])
	}
	l := c.lu
	if hdr+bdlen > len(data) {
		c.fail(senseParamLenError)
		return
	}
	if bdlen == 8 || bdlen == 16 {
		bl := binary.BigEndian.Uint32(data[hdr+bdlen-4:]) & 0xFFFFFF
		if bl != 0 && bl != l.bs {
			c.fail(invalidParam(hdr+bdlen-3, -1))
			return
		}
	} else if bdlen != 0 {
		c.fail(invalidParam(hdr-1, -1))
		return
	}
	var cur, chg [32]byte
	dsense, swp := l.dsense.Load(), l.swp.Load()
	for p := hdr + bdlen; p < len(data); {
		if data[p]&0x40 != 0 { // SPF: no subpages
			c.fail(invalidParam(p, 6))
			return
		}
		if p+2 > len(data) {
			c.fail(senseParamLenError)
			return
		}
		code, n := data[p]&0x3F, int(data[p+1])+2
		if p+n > len(data) {
			c.fail(senseParamLenError)
			return
		}
		clear(cur[:])
		clear(chg[:])
		cn := l.modePage(cur[:], code, pcCurrent)
		l.modePage(chg[:], code, pcChangeable)
		if cn == 0 {
			c.fail(invalidParam(p, 5))
			return
		}
		if n != cn {
			c.fail(invalidParam(p+1, -1))
			return
		}
		for i := 2; i < n; i++ {
			if (data[p+i]^cur[i])&^chg[i] != 0 {
				c.fail(invalidParam(p+i, -1))
				return
			}
		}
		if code == 0x0A {
			dsense = data[p+2]&0x04 != 0
			swp = data[p+4]&0x08 != 0
		}
		p += n
	}
	changed := l.dsense.Swap(dsense) != dsense
	changed = l.swp.Swap(swp) != swp || changed
	if changed {
		l.addUAAll(c.task.Nexus, uaModeChanged)
	}
	c.finishStatus(StatusGood)
}
