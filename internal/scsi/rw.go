package scsi

import (
	"bytes"
	"encoding/binary"
	"errors"

	"github.com/vmsan/vmsan/internal/alignbuf"
	"github.com/vmsan/vmsan/internal/export"
	"github.com/vmsan/vmsan/internal/volrt"
)

// Data-path stages (cmd.stage): what engineDone does next.
//
// INVARIANT: every command is at most one engine request: a command made
// of several steps (a pattern WRITE SAME, an UNMAP's descriptors, the
// read-then-write of COMPARE AND WRITE and ORWRITE) is one compound
// request, ordered and executed by the engine as one. So engineDone never
// submits, and no ordering is taken here: the engine's (its range
// ordering, a snapshot's barrier) is the only one, and it is the same for
// every front end.
const (
	stNone uint8 = iota
	stRead
	stWrite
	stFlush
	stVerify
	stCAW
)

// rwParams decodes the LBA and transfer length of a READ/WRITE/VERIFY
// family CDB, with the byte offset of the length field (field pointers).
func rwParams(cdb []byte) (lba, nblk uint64, lenField int) {
	switch len6, op := cdb[0]>>5, cdb[0]; {
	case len6 == 0: // 6-byte
		lba = uint64(cdb[1]&0x1F)<<16 | uint64(cdb[2])<<8 | uint64(cdb[3])
		nblk = uint64(cdb[4])
		if nblk == 0 && (op == opRead6 || op == opWrite6) {
			nblk = 256 // SBC-3: 0 means 256 blocks for READ(6)/WRITE(6)
		}
		return lba, nblk, 4
	case len6 == 1 || len6 == 2: // 10-byte
		return uint64(binary.BigEndian.Uint32(cdb[2:6])), uint64(binary.BigEndian.Uint16(cdb[7:9])), 7
	case len6 == 5: // 12-byte
		return uint64(binary.BigEndian.Uint32(cdb[2:6])), uint64(binary.BigEndian.Uint32(cdb[6:10])), 6
	}
	return binary.BigEndian.Uint64(cdb[2:10]), uint64(binary.BigEndian.Uint32(cdb[10:14])), 10
}

// checkRange fails c with LOGICAL BLOCK ADDRESS OUT OF RANGE unless
// [lba, lba+nblk) lies on the medium (nblk 0 at the capacity is allowed).
func (c *cmd) checkRange(lba, nblk uint64) bool {
	cap := c.lu.blocks()
	if lba > cap || nblk > cap-lba {
		c.fail(senseLBAOutOfRange)
		return false
	}
	return true
}

// checkWritable fails c with DATA PROTECT on a read-only or software
// write-protected logical unit.
func (c *cmd) checkWritable() bool {
	if c.lu.readOnly.Load() {
		c.fail(senseWriteProtected)
		return false
	}
	if c.lu.swp.Load() {
		c.fail(senseSoftwareWP)
		return false
	}
	return true
}

// maxUnmap is MAXIMUM UNMAP LBA COUNT (blocks per descriptor).
func (l *lu) maxUnmap() uint64 {
	return min(uint64(maxWriteSameBytes)>>l.bsShift, maxUnmapBlocks)
}

func (c *cmd) maxXferBlocks() uint64 {
	return uint64(c.lu.maxTransfer()) >> c.lu.bsShift
}

// maxTransfer is the largest READ/WRITE in bytes (Block Limits VPD).
func (l *lu) maxTransfer() uint32 { return l.maxXfer }

// submit sends c.req to the device, from Execute (never from a
// completion: see the stages). inline: the engine may run it on the
// submitting goroutine.
func (c *cmd) submit(op export.Op, off, length int64, data []byte, inline bool) {
	c.req = export.Request{Op: op, Offset: off, Length: length, Data: data, FUA: c.fua, Inline: inline, Done: c.onDone}
	if inline {
		// The hints volrt.Lifecycle.Submit gives on the NBD path: nothing
		// more buffered means the initiator likely waits for this one.
		c.req.More = c.task.More
		c.req.Idle = !c.task.More
	}
	c.lu.dev.Submit(&c.req)
}

func (c *cmd) read() {
	cdb := c.task.CDB
	lba, nblk, lf := rwParams(cdb)
	if !c.checkRange(lba, nblk) {
		return
	}
	if nblk > c.maxXferBlocks() {
		c.fail(invalidCDB(lf, -1))
		return
	}
	c.xfer = nblk << c.lu.bsShift
	// Read only what can be sent: the initiator's buffer may be smaller
	// than the CDB says (overflow residual).
	n := min(c.xfer, uint64(c.task.ExpectedIn)+uint64(c.lu.bs)-1) &^ uint64(c.lu.bs-1)
	if n == 0 {
		c.finishStatus(StatusGood)
		return
	}
	c.bufp = volrt.GetBuf(int(n))
	c.stage = stRead
	c.submit(export.OpRead, int64(lba<<c.lu.bsShift), int64(n), *c.bufp, true)
}

func (c *cmd) write() {
	cdb := c.task.CDB
	lba, n, ok := c.writeSpan()
	if !ok {
		return
	}
	c.fua = cdb[0]>>5 != 0 && cdb[1]&0x08 != 0
	c.stage = stWrite
	c.submit(export.OpWrite, int64(lba<<c.lu.bsShift), int64(n), c.task.DataOut[:n], true)
}

// writeSpan checks a data-out write CDB (READ/WRITE family layout: the
// volume writable, the range inside it, the length within the maximum
// transfer) and returns its LBA and the bytes to write: only whole blocks
// the initiator sent (an EDTL smaller than the CDB's length writes a
// prefix, with an overflow residual). ok is false when the command is
// already answered (an error, or GOOD for nothing to write).
func (c *cmd) writeSpan() (lba, n uint64, ok bool) {
	cdb := c.task.CDB
	lba, nblk, lf := rwParams(cdb)
	c.xfer = nblk << c.lu.bsShift
	if !c.checkWritable() || !c.checkRange(lba, nblk) {
		return 0, 0, false
	}
	if nblk > c.maxXferBlocks() {
		c.fail(invalidCDB(lf, -1))
		return 0, 0, false
	}
	n = min(c.xfer, uint64(len(c.task.DataOut))) &^ uint64(c.lu.bs-1)
	if n == 0 {
		c.finishStatus(StatusGood)
		return 0, 0, false
	}
	return lba, n, true
}

func (c *cmd) verify() {
	cdb := c.task.CDB
	lba, nblk, lf := rwParams(cdb)
	bytchk := cdb[1] >> 1 & 3
	if bytchk == 2 {
		c.fail(invalidCDB(1, 2))
		return
	}
	switch bytchk {
	case 1:
		c.xfer = nblk << c.lu.bsShift
	case 3:
		c.xfer = uint64(c.lu.bs)
	}
	if !c.checkRange(lba, nblk) {
		return
	}
	if bytchk == 0 || nblk == 0 {
		// Medium verification of a software device: the range is valid
		// and every block is readable (the engine reports errors on
		// access, there is no medium scan to do).
		c.finishStatus(StatusGood)
		return
	}
	if nblk > c.maxXferBlocks() {
		c.fail(invalidCDB(lf, -1))
		return
	}
	if uint64(len(c.task.DataOut)) < c.xfer {
		c.fail(senseParamLenError)
		return
	}
	c.nblk = nblk
	c.bufp = volrt.GetBuf(int(nblk << c.lu.bsShift))
	c.stage = stVerify
	c.submit(export.OpRead, int64(lba<<c.lu.bsShift), int64(len(*c.bufp)), *c.bufp, true)
}

func (c *cmd) syncCache() {
	cdb := c.task.CDB
	var lba, nblk uint64
	if cdb[0] == opSyncCache10 {
		lba, nblk = uint64(binary.BigEndian.Uint32(cdb[2:6])), uint64(binary.BigEndian.Uint16(cdb[7:9]))
	} else {
		lba, nblk = binary.BigEndian.Uint64(cdb[2:10]), uint64(binary.BigEndian.Uint32(cdb[10:14]))
	}
	if !c.checkRange(lba, nblk) {
		return
	}
	// The engine flushes the whole volume: a superset of the range.
	c.stage = stFlush
	c.submit(export.OpFlush, 0, 0, nil, true)
}

func (c *cmd) writeSame() {
	cdb := c.task.CDB
	var lba, nblk uint64
	lf := 7
	ndob := false
	if cdb[0] == opWriteSame10 {
		lba, nblk = uint64(binary.BigEndian.Uint32(cdb[2:6])), uint64(binary.BigEndian.Uint16(cdb[7:9]))
	} else {
		lba, nblk, lf = binary.BigEndian.Uint64(cdb[2:10]), uint64(binary.BigEndian.Uint32(cdb[10:14])), 10
		ndob = cdb[1]&0x01 != 0
	}
	anchor, unmap := cdb[1]&0x10 != 0, cdb[1]&0x08 != 0
	if !ndob {
		c.xfer = uint64(c.lu.bs)
	}
	if !c.checkWritable() {
		return
	}
	if anchor && !unmap {
		c.fail(invalidCDB(1, 4))
		return
	}
	if !c.checkRange(lba, nblk) {
		return
	}
	if nblk == 0 {
		// WSNZ=0: zero blocks means through the last block.
		nblk = c.lu.blocks() - lba
		if nblk == 0 {
			c.finishStatus(StatusGood)
			return
		}
	}
	if nblk<<c.lu.bsShift > maxWriteSameBytes {
		c.fail(invalidCDB(lf, -1))
		return
	}
	var pattern []byte
	if !ndob {
		// Exactly one block of data-out (not a prefix, not more).
		if len(c.task.DataOut) < int(c.lu.bs) || c.task.ExpectedOut != c.lu.bs {
			c.fail(invalidCDB(lf, -1))
			return
		}
		pattern = c.task.DataOut[:c.lu.bs]
	}
	off, end := int64(lba<<c.lu.bsShift), int64((lba+nblk)<<c.lu.bsShift)
	c.stage = stWrite
	switch {
	case unmap && !anchor:
		// An unmap operation (SBC-3 5.42): the blocks are deallocated
		// whatever the data-out holds, and read as zeroes (LBPRZ=1).
		c.submit(export.OpTrim, off, end-off, nil, true)
		return
	case unmap || pattern == nil || alignbuf.IsZero(pattern):
		// Anchored, or zeroes written: the range stays allocated.
		c.req = export.Request{Op: export.OpWriteZeroes, Offset: off, Length: end - off, NoHole: true, Inline: true, Done: c.onDone}
		c.lu.dev.Submit(&c.req)
		return
	}
	// A non-zero pattern: one engine request repeating a chunk of whole
	// pattern copies over the range (bounded memory, one ordering for
	// the whole command).
	n := min(end-off, wsChunk)
	c.bufp = volrt.GetBuf(int(n))
	buf := *c.bufp
	for i := 0; i < len(buf); i += len(pattern) {
		copy(buf[i:], pattern)
	}
	c.req = export.Request{Op: export.OpWriteRepeat, Offset: off, Length: end - off, Data: buf, Done: c.onDone}
	c.lu.dev.Submit(&c.req)
}

func (c *cmd) unmap() {
	cdb := c.task.CDB
	plen := int(binary.BigEndian.Uint16(cdb[7:9]))
	c.xfer = uint64(plen)
	if !c.checkWritable() {
		return
	}
	if plen == 0 {
		c.finishStatus(StatusGood)
		return
	}
	data := c.task.DataOut[:min(plen, len(c.task.DataOut))]
	if plen < 8 || len(data) < 8 {
		c.fail(senseParamLenError)
		return
	}
	bddl := int(binary.BigEndian.Uint16(data[2:4]))
	nd := min(bddl, len(data)-8) / 16
	if nd > maxUnmapDescriptors {
		c.fail(invalidParam(2, -1))
		return
	}
	maxN := c.lu.maxUnmap()
	for i := 0; i < nd; i++ {
		d := data[8+16*i:]
		lba, n := binary.BigEndian.Uint64(d[0:8]), uint64(binary.BigEndian.Uint32(d[8:12]))
		if n > maxN {
			c.fail(invalidParam(8+16*i+8, -1))
			return
		}
		if !c.checkRange(lba, n) {
			return
		}
	}
	// One engine request for the whole list (Ranges), ordered over the
	// span of its descriptors. ANCHOR keeps the blocks mapped (zeroes).
	c.ranges = c.ranges[:0]
	lo, hi := int64(-1), int64(0)
	for i := 0; i < nd; i++ {
		d := data[8+16*i:]
		lba, n := binary.BigEndian.Uint64(d[0:8]), uint64(binary.BigEndian.Uint32(d[8:12]))
		if n == 0 {
			continue
		}
		off, l := int64(lba<<c.lu.bsShift), int64(n<<c.lu.bsShift)
		c.ranges = append(c.ranges, export.Range{Offset: off, Length: l})
		if lo < 0 || off < lo {
			lo = off
		}
		hi = max(hi, off+l)
	}
	if len(c.ranges) == 0 {
		c.finishStatus(StatusGood)
		return
	}
	op, anchor := export.OpTrim, cdb[1]&0x01 != 0
	if anchor {
		op = export.OpWriteZeroes
	}
	c.stage = stWrite
	c.req = export.Request{Op: op, Offset: lo, Length: hi - lo, Ranges: c.ranges, NoHole: anchor, Done: c.onDone}
	c.lu.dev.Submit(&c.req)
}

func (c *cmd) compareAndWrite() {
	cdb := c.task.CDB
	lba, nblk := binary.BigEndian.Uint64(cdb[2:10]), uint64(cdb[13])
	c.xfer = 2 * nblk << c.lu.bsShift
	if !c.checkWritable() || !c.checkRange(lba, nblk) {
		return
	}
	// The data-out must be exactly the verify and write instances: a
	// mismatch with the CDB is refused, not truncated (unlike WRITE, whose
	// residual semantics let a prefix be written). This also catches 256
	// blocks sent with the one-byte NUMBER OF LOGICAL BLOCKS wrapped to 0.
	if uint64(c.task.ExpectedOut) != c.xfer || uint64(len(c.task.DataOut)) < c.xfer {
		c.fail(invalidCDB(13, -1))
		return
	}
	if nblk == 0 {
		c.finishStatus(StatusGood)
		return
	}
	if nblk > uint64(c.lu.maxCAW) {
		c.fail(invalidCDB(13, -1))
		return
	}
	c.lba, c.nblk = lba, nblk
	c.fua = cdb[1]&0x08 != 0
	// INVARIANT: the compare and the write are one engine request
	// (OpCompareWrite): no request overlapping it, from any front end
	// (an NBD write to the same volume included), runs between them.
	n := nblk << c.lu.bsShift
	c.bufp = volrt.GetBuf(int(n))
	c.stage = stCAW
	c.req = export.Request{Op: export.OpCompareWrite, Offset: int64(lba << c.lu.bsShift), Length: int64(n),
		Data: c.task.DataOut[:2*n], Aux: *c.bufp, FUA: c.fua, Done: c.onDone}
	c.lu.dev.Submit(&c.req)
}

// orWrite is ORWRITE(16): the data-out is ORed into the blocks, atomic
// against every other request like COMPARE AND WRITE (one engine
// request, OpOrWrite: read, OR, write).
func (c *cmd) orWrite() {
	cdb := c.task.CDB
	lba, n, ok := c.writeSpan()
	if !ok {
		return
	}
	c.lba, c.nblk = lba, n>>c.lu.bsShift
	c.fua = cdb[1]&0x08 != 0
	c.bufp = volrt.GetBuf(int(n))
	c.stage = stWrite
	c.req = export.Request{Op: export.OpOrWrite, Offset: int64(lba << c.lu.bsShift), Length: int64(n),
		Data: c.task.DataOut[:n], Aux: *c.bufp, FUA: c.fua, Done: c.onDone}
	c.lu.dev.Submit(&c.req)
}

// miscompareAt is MISCOMPARE DURING VERIFY OPERATION with the offset of
// the first differing byte in INFORMATION.
func miscompareAt(a, b []byte) (senseInfo, bool) {
	if bytes.Equal(a, b) {
		return senseInfo{}, false
	}
	i := 0
	for i < len(a) && a[i] == b[i] {
		i++
	}
	s := senseMiscompare
	s.info, s.hasInfo = uint64(i), true
	return s, true
}

// engineDone is every engine request's Done: it completes the command
// according to c.stage (it never submits: see the stages).
func (c *cmd) engineDone(r *export.Request) {
	if c.stage == stCAW && errors.Is(r.Err, export.ErrMiscompare) {
		n := int(c.nblk << c.lu.bsShift)
		if s, bad := miscompareAt(c.task.DataOut[:n], r.Aux[:n]); bad {
			c.fail(s)
			return
		}
	}
	if r.Err != nil {
		if errors.Is(r.Err, volrt.ErrVolumeGone) {
			c.lu.stale.Store(true)
		}
		write := c.stage != stRead && c.stage != stVerify
		c.res.DataIn = nil
		c.fail(errSense(r.Err, write))
		return
	}
	switch c.stage {
	case stRead:
		c.res.DataIn = r.Data
	case stVerify:
		data := c.task.DataOut
		bs := int(c.lu.bs)
		if c.task.CDB[1]>>1&3 == 3 {
			for i := 0; i < len(r.Data); i += bs {
				if s, bad := miscompareAt(data[:bs], r.Data[i:i+bs]); bad {
					s.info += uint64(i)
					c.fail(s)
					return
				}
			}
		} else if s, bad := miscompareAt(data[:len(r.Data)], r.Data); bad {
			c.fail(s)
			return
		}
	}
	c.finishStatus(StatusGood)
}

func (c *cmd) readCapacity10() {
	cdb := c.task.CDB
	if cdb[8]&1 == 0 && binary.BigEndian.Uint32(cdb[2:6]) != 0 {
		c.fail(invalidCDB(2, -1))
		return
	}
	b := c.dataIn(8)
	last := c.lu.blocks() - 1
	if c.lu.blocks() == 0 {
		last = 0
	}
	binary.BigEndian.PutUint32(b[0:4], uint32(min(last, 0xFFFFFFFF)))
	binary.BigEndian.PutUint32(b[4:8], c.lu.bs)
	c.reply(b, 8)
}

func (c *cmd) readCapacity16() {
	cdb := c.task.CDB
	if cdb[14]&1 == 0 && binary.BigEndian.Uint64(cdb[2:10]) != 0 {
		c.fail(invalidCDB(2, -1))
		return
	}
	alloc := uint64(binary.BigEndian.Uint32(cdb[10:14]))
	b := c.dataIn(32)
	last := c.lu.blocks()
	if last > 0 {
		last--
	}
	binary.BigEndian.PutUint64(b[0:8], last)
	binary.BigEndian.PutUint32(b[8:12], c.lu.bs)
	b[13] = c.lu.ppbExp
	b[14] = 0x80 | 0x40 // LBPME (thin provisioning), LBPRZ (unmapped reads zero)
	c.reply(b, alloc)
}

func (c *cmd) getLBAStatus() {
	cdb := c.task.CDB
	lba := binary.BigEndian.Uint64(cdb[2:10])
	alloc := uint64(binary.BigEndian.Uint32(cdb[10:14]))
	cap := c.lu.blocks()
	if lba >= cap {
		c.fail(senseLBAOutOfRange)
		return
	}
	if alloc < 24 {
		// Room for the header and one descriptor at least; less is
		// answered with the header alone.
		b := c.dataIn(8)
		binary.BigEndian.PutUint32(b[0:4], 4)
		c.reply(b, alloc)
		return
	}
	maxDesc := min((alloc-8)/16, 64)
	span := min(cap-lba, uint64(maxWriteSameBytes)>>c.lu.bsShift)
	bs := int64(c.lu.bs)
	exts, err := c.lu.dev.Extents(int64(lba)*bs, int64(span)*bs)
	if err != nil {
		if errors.Is(err, volrt.ErrVolumeGone) {
			c.lu.stale.Store(true)
		}
		c.fail(errSense(err, false))
		return
	}
	b := c.dataIn(int(8 + 16*maxDesc))
	nd := uint64(0)
	next := lba
	end := lba + span
	for _, e := range exts {
		if nd == maxDesc || next >= end {
			break
		}
		// Block-granular: a block is deallocated only if all of it is a
		// hole; a partial hole rounds to mapped.
		s, f := e.Offset, e.Offset+e.Length
		var from, to uint64
		if e.Hole {
			from, to = uint64((s+bs-1)/bs), uint64(f/bs)
		} else {
			from, to = uint64(s/bs), uint64((f+bs-1)/bs)
		}
		from, to = max(from, next), min(to, end)
		if to <= from {
			continue
		}
		if from > next { // a gap rounded away: mapped
			nd = appendLBAStatus(b, nd, next, from-next, 0)
			if nd == maxDesc {
				break
			}
		}
		st := uint8(0)
		if e.Hole {
			st = 1
		}
		nd = appendLBAStatus(b, nd, from, to-from, st)
		next = to
	}
	if nd == 0 {
		nd = appendLBAStatus(b, nd, lba, 1, 0)
	}
	binary.BigEndian.PutUint32(b[0:4], uint32(4+16*nd))
	c.reply(b[:8+16*nd], alloc)
}

// appendLBAStatus writes descriptor nd (merging with the previous one when
// it continues it with the same status) and returns the new count.
func appendLBAStatus(b []byte, nd, lba, n uint64, st uint8) uint64 {
	if nd > 0 {
		p := b[8+16*(nd-1):]
		pl, pn := binary.BigEndian.Uint64(p[0:8]), uint64(binary.BigEndian.Uint32(p[8:12]))
		if p[12] == st && pl+pn == lba && pn+n <= 0xFFFFFFFF {
			binary.BigEndian.PutUint32(p[8:12], uint32(pn+n))
			return nd
		}
	}
	d := b[8+16*nd:]
	binary.BigEndian.PutUint64(d[0:8], lba)
	binary.BigEndian.PutUint32(d[8:12], uint32(min(n, 0xFFFFFFFF)))
	d[12] = st
	return nd + 1
}

func (c *cmd) testUnitReady() { c.finishStatus(StatusGood) }

// preFetch checks the range and succeeds: the engine reads on demand and
// the page cache does the rest, so there is nothing to load ahead (GOOD,
// not CONDITION MET: no promise that the blocks fit a cache).
func (c *cmd) preFetch() {
	lba, nblk, _ := rwParams(c.task.CDB)
	if c.checkRange(lba, nblk) {
		c.finishStatus(StatusGood)
	}
}
