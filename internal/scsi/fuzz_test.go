package scsi

import (
	"sync/atomic"
	"testing"

	"github.com/vmsan/vmsan/internal/export/exporttest"
)

// checkResult asserts what every Result must satisfy whatever the CDB:
// a known status, well-formed sense exactly on CHECK CONDITION, data-in
// within the expected length, consistent residual flags.
func checkResult(t testing.TB, cdb []byte, r *Result, expIn uint32) {
	switch r.Status {
	case StatusGood, StatusCheckCondition, StatusReservationConflict, StatusConditionMet, StatusBusy, StatusTaskSetFull:
	default:
		t.Fatalf("cdb % x: status %#x", cdb, r.Status)
	}
	if r.Status == StatusCheckCondition {
		s := r.Sense
		switch {
		case len(s) == 18 && s[0]&0x7F == 0x70:
			if int(s[7])+8 != len(s) {
				t.Fatalf("cdb % x: fixed sense length % x", cdb, s)
			}
		case len(s) >= 8 && s[0] == 0x72:
			if int(s[7])+8 != len(s) {
				t.Fatalf("cdb % x: descriptor sense length % x", cdb, s)
			}
		default:
			t.Fatalf("cdb % x: malformed sense % x", cdb, s)
		}
	} else if r.Sense != nil {
		t.Fatalf("cdb % x: sense with status %#x", cdb, r.Status)
	}
	if uint32(len(r.DataIn)) > expIn {
		t.Fatalf("cdb % x: %d bytes data-in, expected at most %d", cdb, len(r.DataIn), expIn)
	}
	if r.Overflow && r.Underflow || (r.Residual != 0) != (r.Overflow || r.Underflow) {
		t.Fatalf("cdb % x: residual %d over %v under %v", cdb, r.Residual, r.Overflow, r.Underflow)
	}
}

// FuzzExecute runs random CDBs (with random data-out and expected
// lengths) against a logical unit over the production runtime: no panic,
// done exactly once, every Result well-formed.
func FuzzExecute(f *testing.F) {
	for _, c := range [][]byte{
		{opInquiry, 1, 0x83, 0, 255, 0}, {opInquiry, 0, 0, 0, 96, 0},
		cdb10(opRead10, 0, 0, 8), cdb10(opWrite10, 0x08, 8, 1), cdb16(opRead16, 0, 1, 2),
		cdb16(opWriteSame16, 0x08, 0, 8), cdb16(opWriteSame16, 0x01, 0, 8), cdb10(opWriteSame10, 0, 4, 4),
		{opUnmap, 0, 0, 0, 0, 0, 0, 0, 24, 0}, cdb16(opCompareAndWrite, 0, 0, 1),
		{opModeSense6, 0, 0x3F, 0, 255, 0}, {opModeSelect6, 0x10, 0, 0, 16, 0},
		{opModeSense10, 0x10, 0x3F, 0xFF, 0, 0, 0, 1, 0, 0},
		{opPROut, prRegister, 0, 0, 0, 0, 0, 0, 24, 0}, {opPROut, prReserve, 1, 0, 0, 0, 0, 0, 24, 0},
		{opPRIn, prInReadFullStatus, 0, 0, 0, 0, 0, 1, 0, 0}, {opPROut, prRegisterMove, 1, 0, 0, 0, 0, 0, 40, 0},
		{opMaintenanceIn, saReportOpcodes, 0x82, opServiceActionIn, 0, 0x10, 0, 0, 1, 0, 0, 0},
		{opMaintenanceIn, 0x20 | saReportTPG, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0},
		{opReportLUNs, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0}, {opRequestSense, 1, 0, 0, 252, 0},
		cdb16(opServiceActionIn, saGetLBAStatus, 0, 64), cdb16(opServiceActionIn, saReadCapacity16, 0, 32),
		cdb16(opORWrite, 0x08, 0, 1), cdb10(opVerify10, 0x02, 0, 1), cdb16(opVerify16, 0x06, 0, 2), cdb10(opSyncCache10, 0, 0, 0),
		{opReserve6, 0, 0, 0, 0, 0}, {opRelease10, 0, 0, 0, 0, 0, 0, 0, 0, 0},
	} {
		f.Add(c, []byte{0, 0, 0, 24, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 8}, uint16(512), byte(0))
	}
	dev := exporttest.NewMemDevice(f, "vol", 1<<20)
	dev.Meta.UUID = "fuzz"
	reg := exporttest.NewRegistry(dev)
	dir := f.TempDir()
	luns := []LUN{{0, "vol"}, {1, "missing"}}
	tg := New(Config{Registry: reg, LUNs: func() []LUN { return luns }, StateDir: func(string) (string, error) { return dir, nil }})
	f.Cleanup(tg.Close)
	nexuses := []*Nexus{nexus("iqn.a", 1), nexus("iqn.b", 2)}
	f.Fuzz(func(t *testing.T, cdb, data []byte, expIn uint16, sel byte) {
		if len(cdb) > 260 || len(data) > 1<<16 {
			return
		}
		n := nexuses[sel&1]
		lun := uint64(sel>>1) & 3
		var calls atomic.Int32
		ch := make(chan struct{})
		tg.Execute(&Task{Nexus: n, LUN: lun, CDB: cdb, DataOut: data, ExpectedOut: uint32(len(data)), ExpectedIn: uint32(expIn)}, func(r *Result) {
			checkResult(t, cdb, r, uint32(expIn))
			r.Release()
			if calls.Add(1) == 1 {
				close(ch)
			}
		})
		<-ch
		if calls.Load() != 1 {
			t.Fatalf("cdb % x: done called %d times", cdb, calls.Load())
		}
		if sel&0x80 != 0 {
			tg.TaskManagement(sel&7, n, lun)
		}
	})
}
