package scsi

// The command table: every supported operation code (and service action)
// with its CDB usage mask (what REPORT SUPPORTED OPERATION CODES returns,
// and what Execute enforces: a bit set outside the mask is INVALID FIELD
// IN CDB with a field pointer) and its class for unit attentions, ALUA
// states and reservations.

// Operation codes.
const (
	opTestUnitReady    = 0x00
	opRequestSense     = 0x03
	opRead6            = 0x08
	opWrite6           = 0x0A
	opInquiry          = 0x12
	opModeSelect6      = 0x15
	opReserve6         = 0x16
	opRelease6         = 0x17
	opModeSense6       = 0x1A
	opStartStopUnit    = 0x1B
	opPreventAllow     = 0x1E
	opReadCapacity10   = 0x25
	opRead10           = 0x28
	opWrite10          = 0x2A
	opWriteVerify10    = 0x2E
	opVerify10         = 0x2F
	opPreFetch10       = 0x34
	opSyncCache10      = 0x35
	opWriteSame10      = 0x41
	opUnmap            = 0x42
	opModeSelect10     = 0x55
	opReserve10        = 0x56
	opRelease10        = 0x57
	opModeSense10      = 0x5A
	opPRIn             = 0x5E
	opPROut            = 0x5F
	opRead16           = 0x88
	opCompareAndWrite  = 0x89
	opWrite16          = 0x8A
	opORWrite          = 0x8B
	opWriteVerify16    = 0x8E
	opVerify16         = 0x8F
	opPreFetch16       = 0x90
	opSyncCache16      = 0x91
	opWriteSame16      = 0x93
	opServiceActionIn  = 0x9E
	opReportLUNs       = 0xA0
	opMaintenanceIn    = 0xA3
	opRead12           = 0xA8
	opWrite12          = 0xAA
	opWriteVerify12    = 0xAE
	opVerify12         = 0xAF
	saReadCapacity16   = 0x10
	saGetLBAStatus     = 0x12
	saReportTPG        = 0x0A
	saReportOpcodes    = 0x0C
	saReportTMFs       = 0x0D
	prInReadKeys       = 0x00
	prInReadResv       = 0x01
	prInReportCaps     = 0x02
	prInReadFullStatus = 0x03
)

type cmdFlags uint16

const (
	// fNoUA: not blocked by a pending unit attention (SPC-4 5.14:
	// INQUIRY, REPORT LUNS, REQUEST SENSE).
	fNoUA cmdFlags = 1 << iota
	// fNoLU: executes on a LUN that does not exist.
	fNoLU
	// fDataOut: the data phase is data-out (residuals against ExpectedOut).
	fDataOut
	// fALUAAll: allowed in every ALUA state; fALUAStandby: also in
	// standby (SPC-4 5.16.2.4.4).
	fALUAAll
	fALUAStandby
	// Reservation classes: fPRRead conflicts under the exclusive access
	// types, fPRWrite under every type, for non-holders (non-registrants
	// for the registrants-only/all-registrants types).
	fPRRead
	fPRWrite
	// fSPC2OK: allowed while another I_T nexus holds a RESERVE(6)/(10)
	// reservation.
	fSPC2OK
)

type cmdDesc struct {
	op    uint8
	sa    uint8
	hasSA bool
	mask  []byte // CDB usage data; len is the CDB length
	flags cmdFlags
	run   func(c *cmd)
}

// saOf returns the service action of a CDB whose opcode has them.
func saOf(cdb []byte) uint8 {
	if len(cdb) < 2 {
		return 0
	}
	return cdb[1] & 0x1F
}

var (
	cmdByOp [256]*cmdDesc
	cmdBySA [256][]*cmdDesc
	cmdList []*cmdDesc
)

func init() {
	m := func(b ...byte) []byte { return b }
	lba8 := []byte{0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF}
	cat := func(parts ...[]byte) []byte {
		var r []byte
		for _, p := range parts {
			r = append(r, p...)
		}
		return r
	}
	const (
		info    = fNoUA | fNoLU | fALUAAll | fSPC2OK
		rd      = fPRRead
		wr      = fPRWrite | fDataOut
		anyPR   = fALUAAll | fSPC2OK
		standby = fALUAStandby
	)
	add := func(op uint8, sa int, mask []byte, flags cmdFlags, run func(c *cmd)) {
		d := &cmdDesc{op: op, mask: mask, flags: flags, run: run}
		if sa >= 0 {
			d.sa, d.hasSA = uint8(sa), true
			cmdBySA[op] = append(cmdBySA[op], d)
		} else {
			cmdByOp[op] = d
		}
		cmdList = append(cmdList, d)
	}
	add(opTestUnitReady, -1, m(0xFF, 0, 0, 0, 0, 0), 0, (*cmd).testUnitReady)
	add(opRequestSense, -1, m(0xFF, 0x01, 0, 0, 0xFF, 0), info, (*cmd).requestSense)
	add(opInquiry, -1, m(0xFF, 0x01, 0xFF, 0xFF, 0xFF, 0), info, (*cmd).inquiry)
	add(opReportLUNs, -1, m(0xFF, 0, 0xFF, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0), info, (*cmd).reportLUNs)
	add(opRead6, -1, m(0xFF, 0x1F, 0xFF, 0xFF, 0xFF, 0), rd, (*cmd).read)
	add(opRead10, -1, m(0xFF, 0x1A, 0xFF, 0xFF, 0xFF, 0xFF, 0x1F, 0xFF, 0xFF, 0), rd, (*cmd).read)
	add(opRead12, -1, m(0xFF, 0x1A, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x1F, 0), rd, (*cmd).read)
	add(opRead16, -1, cat(m(0xFF, 0x1A), lba8, m(0xFF, 0xFF, 0xFF, 0xFF, 0x1F, 0)), rd, (*cmd).read)
	add(opWrite6, -1, m(0xFF, 0x1F, 0xFF, 0xFF, 0xFF, 0), wr, (*cmd).write)
	add(opWrite10, -1, m(0xFF, 0x1A, 0xFF, 0xFF, 0xFF, 0xFF, 0x1F, 0xFF, 0xFF, 0), wr, (*cmd).write)
	add(opWrite12, -1, m(0xFF, 0x1A, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x1F, 0), wr, (*cmd).write)
	add(opWrite16, -1, cat(m(0xFF, 0x1A), lba8, m(0xFF, 0xFF, 0xFF, 0xFF, 0x1F, 0)), wr, (*cmd).write)
	add(opWriteVerify10, -1, m(0xFF, 0x12, 0xFF, 0xFF, 0xFF, 0xFF, 0x1F, 0xFF, 0xFF, 0), wr, (*cmd).write)
	add(opWriteVerify12, -1, m(0xFF, 0x12, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x1F, 0), wr, (*cmd).write)
	add(opWriteVerify16, -1, cat(m(0xFF, 0x12), lba8, m(0xFF, 0xFF, 0xFF, 0xFF, 0x1F, 0)), wr, (*cmd).write)
	add(opVerify10, -1, m(0xFF, 0x16, 0xFF, 0xFF, 0xFF, 0xFF, 0x1F, 0xFF, 0xFF, 0), rd|fDataOut, (*cmd).verify)
	add(opVerify12, -1, m(0xFF, 0x16, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x1F, 0), rd|fDataOut, (*cmd).verify)
	add(opVerify16, -1, cat(m(0xFF, 0x16), lba8, m(0xFF, 0xFF, 0xFF, 0xFF, 0x1F, 0)), rd|fDataOut, (*cmd).verify)
	add(opSyncCache10, -1, m(0xFF, 0x06, 0xFF, 0xFF, 0xFF, 0xFF, 0x1F, 0xFF, 0xFF, 0), fPRWrite, (*cmd).syncCache)
	add(opSyncCache16, -1, cat(m(0xFF, 0x06), lba8, m(0xFF, 0xFF, 0xFF, 0xFF, 0x1F, 0)), fPRWrite, (*cmd).syncCache)
	add(opPreFetch10, -1, m(0xFF, 0x02, 0xFF, 0xFF, 0xFF, 0xFF, 0x1F, 0xFF, 0xFF, 0), rd, (*cmd).preFetch)
	add(opPreFetch16, -1, cat(m(0xFF, 0x02), lba8, m(0xFF, 0xFF, 0xFF, 0xFF, 0x1F, 0)), rd, (*cmd).preFetch)
	add(opWriteSame10, -1, m(0xFF, 0x18, 0xFF, 0xFF, 0xFF, 0xFF, 0x1F, 0xFF, 0xFF, 0), wr, (*cmd).writeSame)
	add(opWriteSame16, -1, cat(m(0xFF, 0x19), lba8, m(0xFF, 0xFF, 0xFF, 0xFF, 0x1F, 0)), wr, (*cmd).writeSame)
	add(opUnmap, -1, m(0xFF, 0x01, 0, 0, 0, 0, 0x1F, 0xFF, 0xFF, 0), wr, (*cmd).unmap)
	add(opORWrite, -1, cat(m(0xFF, 0x18), lba8, m(0xFF, 0xFF, 0xFF, 0xFF, 0x1F, 0)), wr, (*cmd).orWrite)
	add(opCompareAndWrite, -1, cat(m(0xFF, 0x18), lba8, m(0, 0, 0, 0xFF, 0x1F, 0)), rd|wr, (*cmd).compareAndWrite)
	// READ CAPACITY works on standby paths too, so an initiator learns the
	// size on every path (dm-multipath wants equal sizes to group them).
	add(opReadCapacity10, -1, m(0xFF, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0, 0x01, 0), standby, (*cmd).readCapacity10)
	add(opServiceActionIn, saReadCapacity16, cat(m(0xFF, 0x1F), lba8, m(0xFF, 0xFF, 0xFF, 0xFF, 0x01, 0)), standby, (*cmd).readCapacity16)
	add(opServiceActionIn, saGetLBAStatus, cat(m(0xFF, 0x1F), lba8, m(0xFF, 0xFF, 0xFF, 0xFF, 0, 0)), 0, (*cmd).getLBAStatus)
	add(opModeSense6, -1, m(0xFF, 0x08, 0xFF, 0xFF, 0xFF, 0), rd|standby, (*cmd).modeSense)
	add(opModeSense10, -1, m(0xFF, 0x18, 0xFF, 0xFF, 0, 0, 0, 0xFF, 0xFF, 0), rd|standby, (*cmd).modeSense)
	add(opModeSelect6, -1, m(0xFF, 0x11, 0, 0, 0xFF, 0), wr|standby, (*cmd).modeSelect)
	add(opModeSelect10, -1, m(0xFF, 0x11, 0, 0, 0, 0, 0, 0xFF, 0xFF, 0), wr|standby, (*cmd).modeSelect)
	add(opStartStopUnit, -1, m(0xFF, 0x01, 0, 0x0F, 0xF7, 0), fPRWrite, (*cmd).good)
	add(opPreventAllow, -1, m(0xFF, 0, 0, 0, 0x03, 0), fPRRead, (*cmd).good)
	add(opReserve6, -1, m(0xFF, 0, 0, 0, 0, 0), fPRWrite|fSPC2OK, (*cmd).reserve)
	add(opReserve10, -1, m(0xFF, 0, 0, 0, 0, 0, 0, 0, 0, 0), fPRWrite|fSPC2OK, (*cmd).reserve)
	add(opRelease6, -1, m(0xFF, 0, 0, 0, 0, 0), fPRWrite|fSPC2OK, (*cmd).release6)
	add(opRelease10, -1, m(0xFF, 0, 0, 0, 0, 0, 0, 0, 0, 0), fPRWrite|fSPC2OK, (*cmd).release6)
	prIn := m(0xFF, 0x1F, 0, 0, 0, 0, 0, 0xFF, 0xFF, 0)
	for _, sa := range []int{prInReadKeys, prInReadResv, prInReportCaps, prInReadFullStatus} {
		add(opPRIn, sa, prIn, standby, (*cmd).prIn)
	}
	prOut := m(0xFF, 0x1F, 0xFF, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0)
	for _, sa := range []int{prRegister, prReserve, prRelease, prClear, prPreempt, prPreemptAbort, prRegisterIgnore, prRegisterMove} {
		add(opPROut, sa, prOut, fDataOut|standby, (*cmd).prOut)
	}
	add(opMaintenanceIn, saReportTPG, m(0xFF, 0xFF, 0, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0), anyPR|fNoLU, (*cmd).reportTPG)
	add(opMaintenanceIn, saReportOpcodes, m(0xFF, 0x1F, 0x87, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0), anyPR, (*cmd).reportOpcodes)
	add(opMaintenanceIn, saReportTMFs, m(0xFF, 0x1F, 0x80, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0), anyPR, (*cmd).reportTMFs)
}

// lookupCmd finds cdb's descriptor; known says the opcode exists (so a
// miss is an unsupported service action, INVALID FIELD IN CDB, rather than
// INVALID COMMAND OPERATION CODE).
func lookupCmd(cdb []byte) (d *cmdDesc, known bool) {
	op := cdb[0]
	if d := cmdByOp[op]; d != nil {
		return d, true
	}
	sas := cmdBySA[op]
	if len(sas) == 0 {
		return nil, false
	}
	sa := saOf(cdb)
	for _, d := range sas {
		if d.sa == sa {
			return d, true
		}
	}
	return nil, true
}

// checkMask returns the first CDB bit set outside d's usage mask.
func (d *cmdDesc) checkMask(cdb []byte) (senseInfo, bool) {
	for i := 1; i < len(d.mask) && i < len(cdb); i++ {
		if bad := cdb[i] &^ d.mask[i]; bad != 0 {
			bit := 7
			for bad&(1<<uint(bit)) == 0 {
				bit--
			}
			return invalidCDB(i, bit), false
		}
	}
	return senseInfo{}, true
}
