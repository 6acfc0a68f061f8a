package scsi

import (
	"encoding/binary"
)

// padded copies s into b, space-padded (SPC-4 ASCII fields).
func padded(b []byte, s string) {
	for i := range b {
		b[i] = ' '
	}
	copy(b, s)
}

func (c *cmd) inquiry() {
	cdb := c.task.CDB
	alloc := uint64(binary.BigEndian.Uint16(cdb[3:5]))
	evpd := cdb[1]&0x01 != 0
	if !evpd {
		if cdb[2] != 0 {
			c.fail(invalidCDB(2, -1))
			return
		}
		c.standardInquiry(alloc)
		return
	}
	if c.lu == nil {
		// No logical unit: peripheral qualifier 3 on every page.
		c.fail(senseLUNotSupported)
		return
	}
	switch cdb[2] {
	case 0x00:
		c.vpdSupported(alloc)
	case 0x80:
		c.vpdSerial(alloc)
	case 0x83:
		c.vpdDeviceID(alloc)
	case 0xB0:
		c.vpdBlockLimits(alloc)
	case 0xB1:
		c.vpdCharacteristics(alloc)
	case 0xB2:
		c.vpdProvisioning(alloc)
	default:
		c.fail(invalidCDB(2, -1))
	}
}

// standardInquiryLen is the standard INQUIRY data length (with version
// descriptors).
const standardInquiryLen = 96

func (c *cmd) standardInquiry(alloc uint64) {
	b := c.dataIn(standardInquiryLen)
	if c.lu == nil {
		b[0] = 0x7F // peripheral qualifier 3: no logical unit here
	}
	b[2] = 0x06 // SPC-4
	b[3] = 0x12 // HISUP, response data format 2
	b[4] = standardInquiryLen - 5
	b[5] = 0x10 // TPGS=01b: implicit ALUA
	b[6] = 0x10 // MULTIP: a device with (possibly) several ports
	b[7] = 0x02 // CMDQUE
	cfg := &c.t.cfg
	padded(b[8:16], cfg.Vendor)
	padded(b[16:32], cfg.Product)
	padded(b[32:36], cfg.Revision)
	// Version descriptors: SAM-5, iSCSI, SPC-4, SBC-3.
	for i, v := range []uint16{0x00A0, 0x0960, 0x0460, 0x04C0} {
		binary.BigEndian.PutUint16(b[58+2*i:], v)
	}
	c.reply(b, alloc)
}

var vpdPages = []byte{0x00, 0x80, 0x83, 0xB0, 0xB1, 0xB2}

func (c *cmd) vpdSupported(alloc uint64) {
	b := c.dataIn(4 + len(vpdPages))
	b[3] = byte(len(vpdPages))
	copy(b[4:], vpdPages)
	c.reply(b, alloc)
}

func (c *cmd) vpdSerial(alloc uint64) {
	s := c.lu.serial
	b := c.dataIn(4 + len(s))
	b[1] = 0x80
	b[3] = byte(len(s))
	copy(b[4:], s)
	c.reply(b, alloc)
}

func (c *cmd) vpdDeviceID(alloc uint64) {
	l := c.lu
	n := c.task.Nexus
	b := c.dataIn(256)
	b[1] = 0x83
	p := 4
	// NAA (IEEE Registered Extended), logical unit association, binary.
	b[p], b[p+1], b[p+3] = 0x01, 0x03, 16
	copy(b[p+4:], l.naa[:])
	p += 4 + 16
	// T10 vendor id: vendor, then the serial (ASCII).
	t10 := 8 + len(l.serial)
	b[p], b[p+1], b[p+3] = 0x02, 0x01, byte(t10)
	padded(b[p+4:p+12], c.t.cfg.Vendor)
	copy(b[p+12:], l.serial)
	p += 4 + t10
	// Relative target port (type 4) and target port group (type 5), of
	// the port the command came in on: iSCSI protocol, PIV, target port
	// association.
	b[p], b[p+1], b[p+3] = 0x51, 0x94, 4
	binary.BigEndian.PutUint16(b[p+6:], relPort(n))
	p += 8
	b[p], b[p+1], b[p+3] = 0x51, 0x95, 4
	binary.BigEndian.PutUint16(b[p+6:], n.PortGroup)
	p += 8
	binary.BigEndian.PutUint16(b[2:4], uint16(p-4))
	c.reply(b[:p], alloc)
}

func (c *cmd) vpdBlockLimits(alloc uint64) {
	l := c.lu
	info := l.dev.Info()
	b := c.dataIn(64)
	b[1] = 0xB0
	b[3] = 0x3C
	// WSNZ=0: WRITE SAME with 0 blocks writes through the last block.
	b[5] = l.maxCAW
	gran := max(info.PrefBlock>>l.bsShift, 1)
	binary.BigEndian.PutUint16(b[6:8], uint16(min(gran, 0xFFFF)))
	mt := l.maxTransfer() >> l.bsShift
	binary.BigEndian.PutUint32(b[8:12], mt)
	binary.BigEndian.PutUint32(b[12:16], mt)
	binary.BigEndian.PutUint32(b[20:24], uint32(l.maxUnmap()))
	binary.BigEndian.PutUint32(b[24:28], maxUnmapDescriptors)
	binary.BigEndian.PutUint32(b[28:32], gran)
	binary.BigEndian.PutUint64(b[36:44], uint64(maxWriteSameBytes>>l.bsShift))
	c.reply(b, alloc)
}

func (c *cmd) vpdCharacteristics(alloc uint64) {
	b := c.dataIn(64)
	b[1] = 0xB1
	b[3] = 0x3C
	if !c.lu.rotation {
		b[5] = 1 // non-rotating medium
	}
	c.reply(b, alloc)
}

func (c *cmd) vpdProvisioning(alloc uint64) {
	b := c.dataIn(8)
	b[1] = 0xB2
	b[3] = 4
	// LBPU, LBPWS, LBPWS10, LBPRZ=1, ANC_SUP.
	b[5] = 0x80 | 0x40 | 0x20 | 0x04 | 0x02
	b[6] = 0x02 // thin provisioned
	c.reply(b, alloc)
}

// appendLUN encodes a LUN in SAM's 8-byte format (peripheral addressing
// below 256, flat space addressing above).
func appendLUN(b []byte, lun uint64) {
	if lun < 256 {
		b[1] = byte(lun)
		return
	}
	b[0] = 0x40 | byte(lun>>8)&0x3F
	b[1] = byte(lun)
}

func (c *cmd) reportLUNs() {
	cdb := c.task.CDB
	alloc := uint64(binary.BigEndian.Uint32(cdb[6:10]))
	sel := cdb[2]
	if sel != 0 && sel != 1 && sel != 2 {
		c.fail(invalidCDB(2, -1))
		return
	}
	// An allocation length under 16 only truncates (SPC-4 says it
	// "should" be at least 16; SPC-3 made it an error, initiators probing
	// with 8 bytes for the list length exist).
	var luns []LUN
	if sel != 1 { // 1: well-known logical units only (there are none)
		luns = c.t.cfg.LUNs()
	}
	n := 0
	for _, l := range luns {
		if l.Number < 16384 {
			n++
		}
	}
	b := c.dataIn(8 + 8*n)
	binary.BigEndian.PutUint32(b[0:4], uint32(8*n))
	i := 0
	for _, l := range luns {
		if l.Number < 16384 {
			appendLUN(b[8+8*i:], l.Number)
			i++
		}
	}
	if c.lu != nil {
		c.lu.clearUA(c.lu.itl(c.task.Nexus), uaLUNsChanged)
	}
	c.reply(b, alloc)
}

func (c *cmd) requestSense() {
	cdb := c.task.CDB
	alloc := uint64(cdb[4])
	desc := cdb[1]&0x01 != 0
	var s senseInfo
	switch {
	case c.lu == nil:
		s = senseLUNotSupported
	default:
		l := c.lu
		n := c.task.Nexus
		if n == nil {
			n = &noNexus
		}
		if u, ok := l.popUA(l.itl(n)); ok {
			s = u
		}
	}
	b := c.dataIn(maxSense)
	sb := s.encode(b[:0], desc)
	c.reply(sb, alloc)
}

func (c *cmd) reportTPG() {
	cdb := c.task.CDB
	format := cdb[1] >> 5
	if format > 1 {
		c.fail(invalidCDB(1, 7))
		return
	}
	alloc := uint64(binary.BigEndian.Uint32(cdb[6:10]))
	groups, ports, states, altered := c.t.portGroups()
	size := 4
	if format == 1 {
		size = 8
	}
	for _, g := range groups {
		size += 8 + 4*len(ports[g])
	}
	b := c.dataIn(size)
	p := 4
	if format == 1 {
		b[4] = 0x10 // format 1: extended header
		b[5] = 10   // implicit transition time (s)
		p = 8
	}
	for _, g := range groups {
		b[p] = states[g] & 0x0F
		// Supported: T_SUP, U_SUP, S_SUP, AN_SUP, AO_SUP.
		b[p+1] = 0x80 | 0x08 | 0x04 | 0x02 | 0x01
		binary.BigEndian.PutUint16(b[p+2:], g)
		if altered[g] {
			b[p+5] = 0x02 // altered by implicit asymmetric access behaviour
		}
		b[p+7] = byte(len(ports[g]))
		p += 8
		for _, rp := range ports[g] {
			binary.BigEndian.PutUint16(b[p+2:], rp)
			p += 4
		}
	}
	binary.BigEndian.PutUint32(b[0:4], uint32(size-4))
	c.reply(b, alloc)
}

func (c *cmd) reportOpcodes() {
	cdb := c.task.CDB
	rctd := cdb[2]&0x80 != 0
	opts := cdb[2] & 0x07
	reqOp, reqSA := cdb[3], binary.BigEndian.Uint16(cdb[4:6])
	alloc := uint64(binary.BigEndian.Uint32(cdb[6:10]))
	tdLen := 0
	if rctd {
		tdLen = 12 // command timeouts descriptor
	}
	switch opts {
	case 0: // all commands
		size := 4
		size += len(cmdList) * (8 + tdLen)
		b := c.dataIn(size)
		p := 4
		for _, d := range cmdList {
			b[p] = d.op
			if d.hasSA {
				binary.BigEndian.PutUint16(b[p+2:], uint16(d.sa))
				b[p+5] = 0x01 // SERVACTV
			}
			if rctd {
				b[p+5] |= 0x02 // CTDP
			}
			binary.BigEndian.PutUint16(b[p+6:], uint16(len(d.mask)))
			p += 8
			if rctd {
				binary.BigEndian.PutUint16(b[p:], 10)
				p += tdLen
			}
		}
		binary.BigEndian.PutUint32(b[0:4], uint32(size-4))
		c.reply(b, alloc)
		return
	case 1, 2, 3:
	default:
		c.fail(invalidCDB(2, 2))
		return
	}
	// One command: 1 = opcode without service action, 2 = with, 3 = either.
	var found *cmdDesc
	switch {
	case opts == 1 && len(cmdBySA[reqOp]) > 0,
		opts == 2 && cmdByOp[reqOp] != nil:
		c.fail(invalidCDB(2, 2))
		return
	case cmdByOp[reqOp] != nil:
		found = cmdByOp[reqOp]
	default:
		for _, d := range cmdBySA[reqOp] {
			if uint16(d.sa) == reqSA {
				found = d
			}
		}
	}
	mlen := 0
	if found != nil {
		mlen = len(found.mask)
	}
	b := c.dataIn(4 + mlen + tdLen)
	if found == nil {
		b[1] = 0x01 // SUPPORT: not supported
		c.reply(b[:4], alloc)
		return
	}
	b[1] = 0x03 // supported, conforming to the standard
	if rctd {
		b[1] |= 0x80
	}
	binary.BigEndian.PutUint16(b[2:4], uint16(mlen))
	copy(b[4:], found.mask)
	b[4] = found.op // usage data starts with the opcode itself
	if found.hasSA {
		// ...and carries the service action where the CDB does.
		b[5] = found.mask[1]&^0x1F | found.sa
	}
	if rctd {
		binary.BigEndian.PutUint16(b[4+mlen:], 10)
	}
	c.reply(b, alloc)
}

func (c *cmd) reportTMFs() {
	cdb := c.task.CDB
	alloc := uint64(binary.BigEndian.Uint32(cdb[6:10]))
	repd := cdb[2]&0x80 != 0
	n := 4
	if repd {
		n = 16
	}
	b := c.dataIn(n)
	// ATS (abort task), ATSS (abort task set), CTSS (clear task set),
	// LURS (logical unit reset), TRS (target reset).
	b[0] = 0x80 | 0x40 | 0x10 | 0x08 | 0x02
	if repd {
		b[3] = 0x0C // additional data length
	}
	c.reply(b, alloc)
}
