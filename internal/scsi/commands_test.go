package scsi

import (
	"bytes"
	"encoding/binary"
	"errors"
	"strings"
	"syscall"
	"testing"

	"github.com/vmsan/vmsan/internal/backend"
	"github.com/vmsan/vmsan/internal/export"
	"github.com/vmsan/vmsan/internal/export/exporttest"
)

func inq(evpd bool, page uint8, alloc uint16) []byte {
	b := []byte{opInquiry, 0, page, 0, 0, 0}
	if evpd {
		b[1] = 1
	}
	binary.BigEndian.PutUint16(b[3:], alloc)
	return b
}

func TestStandardInquiry(t *testing.T) {
	f := newFixture(t)
	r := f.good(f.n, inq(false, 0, 255), nil, 255)
	d := r.data
	if len(d) != standardInquiryLen || d[0] != 0 || d[2] != 6 || d[3]&0x0F != 2 || d[5]&0x30 != 0x10 || d[7]&0x02 == 0 {
		t.Fatalf("standard inquiry % x", d)
	}
	if string(d[8:16]) != "VMSAN   " || !strings.HasPrefix(string(d[16:32]), "VOLUME") {
		t.Fatalf("identity %q %q", d[8:16], d[16:32])
	}
	// Allocation length cuts; an underflow residual against EDTL.
	r = f.good(f.n, inq(false, 0, 36), nil, 255)
	if len(r.data) != 36 || !r.under || r.resid != 255-36 {
		t.Fatalf("alloc 36: len %d resid %d under %v", len(r.data), r.resid, r.under)
	}
	// A page code without EVPD: INVALID FIELD IN CDB, field pointer byte 2.
	r = f.check(f.n, inq(false, 0x80, 255), nil, 255, KeyIllegalRequest, 0x24, 0)
	if r.sense[15] != 0xC0 || binary.BigEndian.Uint16(r.sense[16:]) != 2 {
		t.Fatalf("field pointer % x", r.sense[15:18])
	}
	// A LUN that does not exist: peripheral qualifier 3.
	r2 := execOn(t, f.tg, f.n, 5, inq(false, 0, 96), nil, 96)
	if r2.status != StatusGood || r2.data[0] != 0x7F {
		t.Fatalf("missing LUN inquiry: %#x % x", r2.status, r2.data[:1])
	}
	r2 = execOn(t, f.tg, f.n, 5, []byte{opTestUnitReady, 0, 0, 0, 0, 0}, nil, 0)
	if k, a, _ := r2.kcq(); k != KeyIllegalRequest || a != 0x25 {
		t.Fatalf("missing LUN TUR: %x/%x", k, a)
	}
}

func TestVPDPages(t *testing.T) {
	f := newFixture(t)
	r := f.good(f.n, inq(true, 0, 255), nil, 255)
	if !bytes.Equal(r.data[4:], []byte{0, 0x80, 0x83, 0xB0, 0xB1, 0xB2}) {
		t.Fatalf("VPD 00 % x", r.data)
	}
	r = f.good(f.n, inq(true, 0x80, 255), nil, 255)
	if string(r.data[4:]) != "0f1e2d3c4b5a69788796a5b4c3d2e1f0" {
		t.Fatalf("serial %q", r.data[4:])
	}
	n2 := &Nexus{InitiatorPort: "iqn.b,i,0x000000000002", TargetName: "iqn.t", RelativePort: 7, PortGroup: 3}
	r = f.good(n2, inq(true, 0x83, 255), nil, 255)
	d := r.data
	if d[1] != 0x83 || int(binary.BigEndian.Uint16(d[2:]))+4 != len(d) {
		t.Fatalf("VPD 83 header % x", d[:4])
	}
	if d[4] != 0x01 || d[5] != 0x03 || d[7] != 16 || d[8]>>4 != 6 {
		t.Fatalf("NAA designator % x", d[4:24])
	}
	naa := append([]byte(nil), d[8:24]...)
	var rel, grp bool
	for p := 4; p+4 <= len(d); p += 4 + int(d[p+3]) {
		switch d[p+1] & 0x3F {
		case 0x14:
			rel = binary.BigEndian.Uint16(d[p+6:]) == 7
		case 0x15:
			grp = binary.BigEndian.Uint16(d[p+6:]) == 3
		}
	}
	if !rel || !grp {
		t.Fatalf("relative port/port group designators missing or wrong: % x", d)
	}
	// Same volume UUID behind another Target (another node): same NAA.
	dev2 := exporttest.NewMemDevice(t, "vol", testSize)
	dev2.Meta.UUID = f.dev.Meta.UUID
	f2 := newFixtureDev(t, dev2)
	if r2 := f2.good(f2.n, inq(true, 0x83, 255), nil, 255); !bytes.Equal(r2.data[8:24], naa) {
		t.Fatal("NAA differs between two targets serving the same volume UUID")
	}
	r = f.good(f.n, inq(true, 0xB0, 255), nil, 255)
	d = r.data
	if d[3] != 0x3C || d[5] != maxCompareAndWrite || binary.BigEndian.Uint32(d[8:]) != (1<<20)/512 ||
		binary.BigEndian.Uint32(d[20:]) == 0 || binary.BigEndian.Uint32(d[20:]) > 1<<20 || binary.BigEndian.Uint32(d[24:]) != maxUnmapDescriptors ||
		binary.BigEndian.Uint64(d[36:]) == 0 || binary.BigEndian.Uint16(d[6:]) != 4096/512 {
		t.Fatalf("block limits % x", d)
	}
	r = f.good(f.n, inq(true, 0xB1, 255), nil, 255)
	if binary.BigEndian.Uint16(r.data[4:]) != 1 {
		t.Fatalf("rotation rate % x", r.data[:8])
	}
	r = f.good(f.n, inq(true, 0xB2, 255), nil, 255)
	if r.data[5]&0xE4 != 0xE4 || r.data[6]&7 != 2 {
		t.Fatalf("LBP % x", r.data)
	}
	f.check(f.n, inq(true, 0x99, 255), nil, 255, KeyIllegalRequest, 0x24, 0)
}

func TestInvalidOpcodeAndFields(t *testing.T) {
	f := newFixture(t)
	f.ready(f.n)
	f.check(f.n, []byte{0xC7, 0, 0, 0, 0, 0}, nil, 0, KeyIllegalRequest, 0x20, 0)
	// RDPROTECT set: not supported, field pointer byte 1 bit 7.
	r := f.check(f.n, cdb10(opRead10, 0x20, 0, 1), nil, 512, KeyIllegalRequest, 0x24, 0)
	if r.sense[15] != 0xC8|5 || binary.BigEndian.Uint16(r.sense[16:]) != 1 {
		t.Fatalf("sks % x", r.sense[15:18])
	}
	// An unknown service action of a known opcode.
	f.check(f.n, cdb16(opServiceActionIn, 0x1F, 0, 0), nil, 0, KeyIllegalRequest, 0x24, 0)
	// Over the maximum transfer length.
	f.check(f.n, cdb16(opRead16, 0, 0, 4096), nil, 1<<21, KeyIllegalRequest, 0x24, 0)
}

func TestResiduals(t *testing.T) {
	f := newFixture(t)
	f.ready(f.n)
	// One block read into a zero-length buffer: overflow of one block.
	r := f.good(f.n, cdb10(opRead10, 0, 0, 1), nil, 0)
	if !r.over || r.resid != 512 || len(r.data) != 0 {
		t.Fatalf("read EDTL 0: %+v", r)
	}
	// Larger buffer: underflow.
	r = f.good(f.n, cdb10(opRead10, 0, 0, 1), nil, 10000)
	if !r.under || r.resid != 10000-512 || len(r.data) != 512 {
		t.Fatalf("read EDTL 10000: under %v resid %d len %d", r.under, r.resid, len(r.data))
	}
	// Two blocks in the CDB, one sent: the first is written, overflow.
	old := f.good(f.n, cdb10(opRead10, 0, 100, 2), nil, 1024).data
	blk := pattern(512, 9)
	r = f.good(f.n, cdb10(opWrite10, 0, 100, 2), blk, 0)
	if !r.over || r.resid != 512 {
		t.Fatalf("write overflow: %+v", r)
	}
	got := f.good(f.n, cdb10(opRead10, 0, 100, 2), nil, 1024).data
	if !bytes.Equal(got[:512], blk) || !bytes.Equal(got[512:], old[512:]) {
		t.Fatal("a short data-out must write exactly the blocks sent")
	}
	// READ(6) with length 0 means 256 blocks.
	r = f.good(f.n, []byte{opRead6, 0, 0, 0, 0, 0}, nil, 256*512)
	if len(r.data) != 256*512 || r.resid != 0 {
		t.Fatalf("READ6 0: len %d", len(r.data))
	}
	// READ(10) with length 0: nothing, not an error (at the capacity too).
	f.good(f.n, cdb10(opRead10, 0, testSize/512, 0), nil, 0)
	f.check(f.n, cdb10(opRead10, 0, testSize/512+1, 0), nil, 0, KeyIllegalRequest, 0x21, 0)
}

func TestReadOnlyDataProtect(t *testing.T) {
	dev := exporttest.NewMemDevice(t, "vol", testSize)
	dev.Meta.ReadOnly = true
	f := newFixtureDev(t, dev)
	f.ready(f.n)
	for _, cdb := range [][]byte{
		cdb10(opWrite10, 0, 0, 1), cdb16(opWriteSame16, 0x08, 0, 1), {opUnmap, 0, 0, 0, 0, 0, 0, 0, 24, 0},
		cdb16(opCompareAndWrite, 0, 0, 0),
	} {
		f.check(f.n, cdb, make([]byte, 1024), 0, KeyDataProtect, 0x27, 0)
	}
	r := f.good(f.n, []byte{opModeSense6, 0, 0x3F, 0, 255, 0}, nil, 255)
	if r.data[2]&0x80 == 0 {
		t.Fatal("WP not set in the mode parameter header")
	}
}

func TestWriteSameUnmapGetLBAStatus(t *testing.T) {
	f := newFixture(t)
	f.ready(f.n)
	const lba = 1024
	f.good(f.n, cdb10(opWrite10, 0, lba, 64), pattern(64*512, 1), 0)
	lbaStatus := func(at uint64) (uint64, uint32, uint8) {
		b := cdb16(opServiceActionIn, saGetLBAStatus, at, 0)
		binary.BigEndian.PutUint32(b[10:], 24)
		d := f.good(f.n, b, nil, 24).data
		return binary.BigEndian.Uint64(d[8:]), binary.BigEndian.Uint32(d[16:]), d[20]
	}
	if l, n, st := lbaStatus(lba); l != lba || n < 64 || st != 0 {
		t.Fatalf("written range: lba %d n %d status %d", l, n, st)
	}
	// WRITE SAME(16) UNMAP with a zero block: deallocated, reads zero.
	f.good(f.n, cdb16(opWriteSame16, 0x08, lba, 16), make([]byte, 512), 0)
	if l, n, st := lbaStatus(lba); l != lba || n != 16 || st != 1 {
		t.Fatalf("after WRITE SAME UNMAP: lba %d n %d status %d", l, n, st)
	}
	if d := f.good(f.n, cdb10(opRead10, 0, lba, 16), nil, 16*512).data; !bytes.Equal(d, make([]byte, 16*512)) {
		t.Fatal("unmapped blocks do not read as zeroes (LBPRZ)")
	}
	// UNMAP deallocates whatever the data-out block holds.
	f.good(f.n, cdb10(opWrite10, 0, lba, 4), pattern(4*512, 8), 0)
	f.good(f.n, cdb10(opWriteSame10, 0x08, lba, 4), pattern(512, 9), 0)
	if d := f.good(f.n, cdb10(opRead10, 0, lba, 4), nil, 4*512).data; !bytes.Equal(d, make([]byte, 4*512)) {
		t.Fatal("WRITE SAME UNMAP with a non-zero block did not deallocate")
	}
	// Pattern WRITE SAME writes the block everywhere.
	blk := pattern(512, 77)
	f.good(f.n, cdb10(opWriteSame10, 0, lba+16, 8), blk, 0)
	d := f.good(f.n, cdb10(opRead10, 0, lba+16, 8), nil, 8*512).data
	for i := 0; i < 8; i++ {
		if !bytes.Equal(d[i*512:(i+1)*512], blk) {
			t.Fatalf("block %d not the pattern", i)
		}
	}
	// NDOB: zeroes without data-out.
	f.good(f.n, cdb16(opWriteSame16, 0x01, lba+16, 8), nil, 0)
	if d := f.good(f.n, cdb10(opRead10, 0, lba+16, 8), nil, 8*512).data; !bytes.Equal(d, make([]byte, 8*512)) {
		t.Fatal("NDOB did not zero")
	}
	// Zero blocks: through the last block (WSNZ=0); past the end: 21/00.
	f.good(f.n, cdb16(opWriteSame16, 0, testSize/512-4, 0), blk, 0)
	if d := f.good(f.n, cdb10(opRead10, 0, testSize/512-1, 1), nil, 512).data; !bytes.Equal(d, blk) {
		t.Fatal("0-block WRITE SAME did not reach the last block")
	}
	f.check(f.n, cdb16(opWriteSame16, 0, testSize/512+1, 0), blk, 0, KeyIllegalRequest, 0x21, 0)
	// ANCHOR without UNMAP, beyond the end.
	f.check(f.n, cdb16(opWriteSame16, 0x10, lba, 1), blk, 0, KeyIllegalRequest, 0x24, 0)
	f.check(f.n, cdb16(opWriteSame16, 0, testSize/512-1, 2), blk, 0, KeyIllegalRequest, 0x21, 0)
	// UNMAP two descriptors.
	f.good(f.n, cdb10(opWrite10, 0, lba+32, 32), pattern(32*512, 5), 0)
	pl := make([]byte, 8+32)
	binary.BigEndian.PutUint16(pl[0:], 6+32)
	binary.BigEndian.PutUint16(pl[2:], 32)
	binary.BigEndian.PutUint64(pl[8:], lba+32)
	binary.BigEndian.PutUint32(pl[16:], 8)
	binary.BigEndian.PutUint64(pl[24:], lba+48)
	binary.BigEndian.PutUint32(pl[32:], 8)
	um := []byte{opUnmap, 0, 0, 0, 0, 0, 0, 0, byte(len(pl)), 0}
	f.good(f.n, um, pl, 0)
	if _, n, st := lbaStatus(lba + 32); n != 8 || st != 1 {
		t.Fatalf("UNMAP: n %d status %d", n, st)
	}
	if _, n, st := lbaStatus(lba + 40); n != 8 || st != 0 {
		t.Fatalf("between the descriptors: n %d status %d", n, st)
	}
	// Parameter list shorter than the header: 1A/00; descriptor beyond
	// the end: 21/00.
	f.check(f.n, []byte{opUnmap, 0, 0, 0, 0, 0, 0, 0, 4, 0}, pl[:4], 0, KeyIllegalRequest, 0x1A, 0)
	binary.BigEndian.PutUint64(pl[24:], testSize/512)
	f.check(f.n, um, pl, 0, KeyIllegalRequest, 0x21, 0)
	// GET LBA STATUS beyond the capacity.
	b := cdb16(opServiceActionIn, saGetLBAStatus, testSize/512, 0)
	binary.BigEndian.PutUint32(b[10:], 24)
	f.check(f.n, b, nil, 24, KeyIllegalRequest, 0x21, 0)
}

func TestVerify(t *testing.T) {
	f := newFixture(t)
	f.ready(f.n)
	data := pattern(4*512, 11)
	f.good(f.n, cdb10(opWrite10, 0, 8, 4), data, 0)
	f.good(f.n, cdb10(opVerify10, 0, 8, 4), nil, 0)
	f.good(f.n, cdb10(opVerify10, 0x02, 8, 4), data, 0)
	bad := append([]byte(nil), data...)
	bad[1000] ^= 0xFF
	r := f.check(f.n, cdb16(opVerify16, 0x02, 8, 4), bad, 0, KeyMiscompare, 0x1D, 0)
	if r.sense[0]&0x80 == 0 || binary.BigEndian.Uint32(r.sense[3:]) != 1000 {
		t.Fatalf("miscompare information % x", r.sense[:8])
	}
	f.check(f.n, cdb10(opVerify10, 0x04, 8, 4), data, 0, KeyIllegalRequest, 0x24, 0) // BYTCHK 2
	f.good(f.n, cdb10(opWriteVerify10, 0x02, 8, 4), bad, 0)
	f.good(f.n, cdb10(opVerify10, 0x02, 8, 4), bad, 0)
}

func TestCompareAndWrite(t *testing.T) {
	f := newFixture(t)
	f.ready(f.n)
	old := pattern(512, 1)
	f.good(f.n, cdb10(opWrite10, 0, 50, 1), old, 0)
	nw := pattern(512, 2)
	caw := cdb16(opCompareAndWrite, 0, 50, 0)
	caw[10], caw[11], caw[12], caw[13] = 0, 0, 0, 1
	f.good(f.n, caw, append(append([]byte(nil), old...), nw...), 0)
	if d := f.good(f.n, cdb10(opRead10, 0, 50, 1), nil, 512).data; !bytes.Equal(d, nw) {
		t.Fatal("COMPARE AND WRITE did not write")
	}
	// Miscompare: nothing written, MISCOMPARE with the offset.
	wrong := append([]byte(nil), old...)
	r := f.check(f.n, caw, append(wrong, pattern(512, 3)...), 0, KeyMiscompare, 0x1D, 0)
	if binary.BigEndian.Uint32(r.sense[3:]) != 0 {
		t.Fatalf("offset % x", r.sense[3:7])
	}
	if d := f.good(f.n, cdb10(opRead10, 0, 50, 1), nil, 512).data; !bytes.Equal(d, nw) {
		t.Fatal("a miscompare wrote")
	}
	// Descriptor sense once D_SENSE is set: INFORMATION descriptor.
	setControl(f, f.n, 0x04, 0)
	cmp := append([]byte(nil), nw...)
	cmp[300] ^= 1
	r = f.check(f.n, caw, append(cmp, old...), 0, KeyMiscompare, 0x1D, 0)
	if r.sense[0] != 0x72 || r.sense[8] != 0 || binary.BigEndian.Uint64(r.sense[12:]) != 300 {
		t.Fatalf("descriptor sense % x", r.sense)
	}
}

// setControl writes the control mode page with D_SENSE/SWP bits.
func setControl(f *fixture, n *Nexus, b2, b4 byte) {
	f.t.Helper()
	pl := make([]byte, 4+12)
	pl[4], pl[5] = 0x0A, 0x0A
	pl[4+2], pl[4+3], pl[4+4] = 0x20|b2, 0x10, b4
	f.good(n, []byte{opModeSelect6, 0x10, 0, 0, byte(len(pl)), 0}, pl, 0)
}

func TestModeSenseSelect(t *testing.T) {
	f := newFixture(t)
	f.ready(f.n)
	r := f.good(f.n, []byte{opModeSense6, 0, 0x3F, 0, 255, 0}, nil, 255)
	d := r.data
	if int(d[0])+1 != len(d) || d[3] != 8 || binary.BigEndian.Uint32(d[4:]) != testSize/512 || d[2]&0x10 == 0 {
		t.Fatalf("mode sense 6 header/bd % x", d[:12])
	}
	pages := map[byte][]byte{}
	for p := 12; p < len(d); p += 2 + int(d[p+1]) {
		pages[d[p]&0x3F] = d[p : p+2+int(d[p+1])]
	}
	if len(pages) != 3 || pages[0x08][2]&0x04 == 0 || pages[0x0A] == nil || pages[0x1C] == nil {
		t.Fatalf("pages %v", pages)
	}
	// MODE SENSE(10) with LLBAA: long descriptor.
	r = f.good(f.n, []byte{opModeSense10, 0x10, 0x08, 0, 0, 0, 0, 0, 255, 0}, nil, 255)
	if r.data[4]&1 == 0 || binary.BigEndian.Uint16(r.data[6:]) != 16 || r.data[8+16] != 0x08 {
		t.Fatalf("mode sense 10 % x", r.data)
	}
	// Changeable values of the control page: D_SENSE and SWP.
	r = f.good(f.n, []byte{opModeSense6, 0x08, 0x4A, 0, 255, 0}, nil, 255)
	if r.data[4+2] != 0x04 || r.data[4+4] != 0x08 {
		t.Fatalf("changeable control % x", r.data)
	}
	f.check(f.n, []byte{opModeSense6, 0, 0x05, 0, 255, 0}, nil, 255, KeyIllegalRequest, 0x24, 0)
	// SWP via MODE SELECT: writes refused, another nexus gets 2A/01.
	n2 := &Nexus{InitiatorPort: "iqn.b,i,0x2", TargetName: "iqn.t", RelativePort: 1}
	f.ready(n2)
	setControl(f, f.n, 0, 0x08)
	f.check(f.n, cdb10(opWrite10, 0, 0, 1), make([]byte, 512), 0, KeyDataProtect, 0x27, 0)
	f.check(n2, []byte{opTestUnitReady, 0, 0, 0, 0, 0}, nil, 0, KeyUnitAttention, 0x2A, 0x01)
	setControl(f, f.n, 0, 0)
	f.good(f.n, cdb10(opWrite10, 0, 0, 1), make([]byte, 512), 0)
	// A non-changeable bit: INVALID FIELD IN PARAMETER LIST.
	pl := make([]byte, 4+12)
	pl[4], pl[5], pl[4+2], pl[4+3], pl[4+5] = 0x0A, 0x0A, 0x20, 0x10, 0x40
	f.check(f.n, []byte{opModeSelect6, 0x10, 0, 0, byte(len(pl)), 0}, pl, 0, KeyIllegalRequest, 0x26, 0)
	// Writethrough cache: WCE clear.
	dev := exporttest.NewMemDevice(t, "vol", testSize)
	dev.Meta.Cache = backend.CacheWritethrough
	f2 := newFixtureDev(t, dev)
	f2.ready(f2.n)
	if r := f2.good(f2.n, []byte{opModeSense6, 0x08, 0x08, 0, 255, 0}, nil, 255); r.data[4+2]&0x04 != 0 {
		t.Fatal("WCE set on a writethrough volume")
	}
}

func TestReportLUNsAndChange(t *testing.T) {
	f := newFixture(t)
	luns := []LUN{{0, "vol"}, {300, "vol"}}
	f.tg = New(Config{Registry: f.reg, LUNs: func() []LUN { return luns }})
	t.Cleanup(f.tg.Close)
	f.ready(f.n)
	cdb := []byte{opReportLUNs, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0}
	r := f.good(f.n, cdb, nil, 256)
	if binary.BigEndian.Uint32(r.data) != 16 || r.data[8+1] != 0 || r.data[16] != 0x41 || r.data[17] != 0x2C {
		t.Fatalf("report luns % x", r.data)
	}
	cdb[2] = 1 // well known only: none
	if r := f.good(f.n, cdb, nil, 256); binary.BigEndian.Uint32(r.data) != 0 {
		t.Fatal("well-known LUNs reported")
	}
	cdb[2] = 7
	f.check(f.n, cdb, nil, 256, KeyIllegalRequest, 0x24, 0)
	luns = []LUN{{0, "vol"}}
	f.check(f.n, []byte{opTestUnitReady, 0, 0, 0, 0, 0}, nil, 0, KeyUnitAttention, 0x3F, 0x0E)
	f.good(f.n, []byte{opTestUnitReady, 0, 0, 0, 0, 0}, nil, 0)
}

func TestCapacityChangedUA(t *testing.T) {
	f := newFixture(t)
	f.ready(f.n)
	if err := f.dev.Backend.Resize(2 * testSize); err != nil {
		t.Fatal(err)
	}
	f.check(f.n, []byte{opTestUnitReady, 0, 0, 0, 0, 0}, nil, 0, KeyUnitAttention, 0x2A, 0x09)
	b := cdb16(opServiceActionIn, saReadCapacity16, 0, 32)
	r := f.good(f.n, b, nil, 32)
	if binary.BigEndian.Uint64(r.data) != 2*testSize/512-1 || r.data[14]&0xC0 != 0xC0 {
		t.Fatalf("read capacity 16 % x", r.data)
	}
}

func TestReportOpcodesAndTMFs(t *testing.T) {
	f := newFixture(t)
	f.ready(f.n)
	all := []byte{opMaintenanceIn, saReportOpcodes, 0, 0, 0, 0, 0, 0, 0x10, 0, 0, 0}
	r := f.good(f.n, all, nil, 4096)
	if int(binary.BigEndian.Uint32(r.data))+4 != len(r.data) || (len(r.data)-4)%8 != 0 || (len(r.data)-4)/8 != len(cmdList) {
		t.Fatalf("RSOC all: %d bytes", len(r.data))
	}
	one := []byte{opMaintenanceIn, saReportOpcodes, 1, opRead16, 0, 0, 0, 0, 1, 0, 0, 0}
	r = f.good(f.n, one, nil, 256)
	if r.data[1]&7 != 3 || binary.BigEndian.Uint16(r.data[2:]) != 16 || r.data[4] != opRead16 || r.data[5] != 0x1A {
		t.Fatalf("RSOC one % x", r.data)
	}
	one = []byte{opMaintenanceIn, saReportOpcodes, 2, opServiceActionIn, 0, saReadCapacity16, 0, 0, 1, 0, 0, 0}
	if r = f.good(f.n, one, nil, 256); r.data[1]&7 != 3 || r.data[5] != saReadCapacity16 {
		t.Fatalf("RSOC SA % x", r.data)
	}
	one = []byte{opMaintenanceIn, saReportOpcodes, 1, 0xC7, 0, 0, 0, 0, 1, 0, 0, 0}
	if r = f.good(f.n, one, nil, 256); r.data[1]&7 != 1 {
		t.Fatalf("RSOC unsupported % x", r.data)
	}
	r = f.good(f.n, []byte{opMaintenanceIn, saReportTMFs, 0, 0, 0, 0, 0, 0, 0, 4, 0, 0}, nil, 4)
	if r.data[0] != 0xDA {
		t.Fatalf("RSTMF % x", r.data)
	}
}

func TestALUAStates(t *testing.T) {
	f := newFixture(t)
	n2 := &Nexus{InitiatorPort: "iqn.a,i,0x2", TargetName: "iqn.t", RelativePort: 2, PortGroup: 2}
	f.ready(f.n)
	f.ready(n2)
	rtpg := []byte{opMaintenanceIn, 0x20 | saReportTPG, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0}
	r := f.good(f.n, rtpg, nil, 256)
	d := r.data
	if d[4] != 0x10 || int(binary.BigEndian.Uint32(d))+4 != len(d) || len(d) != 8+2*(8+4) {
		t.Fatalf("RTPG % x", d)
	}
	if d[8]&0x0F != 0 || binary.BigEndian.Uint16(d[10:]) != 0 || d[15] != 1 || binary.BigEndian.Uint16(d[18:]) != 1 {
		t.Fatalf("group 0 % x", d[8:20])
	}
	f.tg.SetPortGroupState(2, ALUAStandby)
	f.check(n2, []byte{opTestUnitReady, 0, 0, 0, 0, 0}, nil, 0, KeyUnitAttention, 0x2A, 0x06)
	f.check(n2, cdb10(opRead10, 0, 0, 1), nil, 512, KeyNotReady, 0x04, 0x0B)
	f.check(n2, tur, nil, 0, KeyNotReady, 0x04, 0x0B)
	f.good(n2, cdb10(opReadCapacity10, 0, 0, 0), nil, 8)
	f.good(n2, inq(false, 0, 96), nil, 96)
	r = f.good(n2, rtpg, nil, 256)
	if r.data[8+12]&0x0F != ALUAStandby {
		t.Fatalf("group 2 state % x", r.data)
	}
	f.check(f.n, []byte{opTestUnitReady, 0, 0, 0, 0, 0}, nil, 0, KeyUnitAttention, 0x2A, 0x06)
	f.good(f.n, cdb10(opRead10, 0, 0, 1), nil, 512)
	f.tg.SetPortGroupState(2, ALUAUnavailable)
	f.check(n2, []byte{opTestUnitReady, 0, 0, 0, 0, 0}, nil, 0, KeyUnitAttention, 0x2A, 0x06)
	f.check(n2, []byte{opModeSense6, 0, 0x3F, 0, 255, 0}, nil, 255, KeyNotReady, 0x04, 0x0C)
	f.tg.SetPortGroupState(2, ALUATransitioning)
	if r := f.good(n2, []byte{opRequestSense, 0, 0, 0, 18, 0}, nil, 18); r.data[12] != 0x2A || r.data[13] != 0x06 {
		t.Fatalf("REQUEST SENSE in transitioning % x", r.data)
	}
	f.check(n2, []byte{opTestUnitReady, 0, 0, 0, 0, 0}, nil, 0, KeyNotReady, 0x04, 0x0A)
	f.good(n2, rtpg, nil, 256)
}

func TestRequestSenseAndUAOrder(t *testing.T) {
	f := newFixture(t)
	// REQUEST SENSE reports (and clears) the pending unit attention.
	r := f.good(f.n, []byte{opRequestSense, 0, 0, 0, 18, 0}, nil, 18)
	if r.data[0] != 0x70 || r.data[2] != KeyUnitAttention || r.data[12] != 0x29 {
		t.Fatalf("request sense % x", r.data)
	}
	r = f.good(f.n, []byte{opRequestSense, 1, 0, 0, 252, 0}, nil, 252)
	if r.data[0] != 0x72 || r.data[1] != 0 {
		t.Fatalf("request sense desc % x", r.data)
	}
	// Queued conditions come out oldest first; a reset replaces them.
	f.tg.SetPortGroupState(0, ALUAActiveNonOptimized)
	f.dev.Backend.Resize(2 * testSize)
	f.check(f.n, []byte{opTestUnitReady, 0, 0, 0, 0, 0}, nil, 0, KeyUnitAttention, 0x2A, 0x06)
	f.check(f.n, []byte{opTestUnitReady, 0, 0, 0, 0, 0}, nil, 0, KeyUnitAttention, 0x2A, 0x09)
	f.good(f.n, []byte{opTestUnitReady, 0, 0, 0, 0, 0}, nil, 0)
	n2 := &Nexus{InitiatorPort: "iqn.b,i,0x2", TargetName: "iqn.t", RelativePort: 1}
	f.ready(n2)
	f.tg.SetPortGroupState(0, ALUAActiveOptimized)
	if got := f.tg.TaskManagement(TMFLogicalUnitReset, n2, 0); got != TMFComplete {
		t.Fatalf("LU reset: %d", got)
	}
	f.check(f.n, []byte{opTestUnitReady, 0, 0, 0, 0, 0}, nil, 0, KeyUnitAttention, 0x29, 0x03)
	f.good(f.n, []byte{opTestUnitReady, 0, 0, 0, 0, 0}, nil, 0)
	if got := f.tg.TaskManagement(TMFLogicalUnitReset, n2, 9); got != TMFLUNDoesNotExist {
		t.Fatalf("LU reset of a missing LUN: %d", got)
	}
}

// errDev fails every request with err.
type errDev struct {
	export.Device
	err error
}

func (d *errDev) Submit(r *export.Request) { r.Err = d.err; r.Done(r) }

func TestEngineErrorsToSense(t *testing.T) {
	for _, tc := range []struct {
		err            error
		write          bool
		key, asc, ascq uint8
	}{
		{syscall.EIO, false, KeyMediumError, 0x11, 0},
		{syscall.EIO, true, KeyMediumError, 0x0C, 0},
		{syscall.ENOSPC, true, KeyDataProtect, 0x27, 0x07},
		{syscall.EROFS, true, KeyDataProtect, 0x27, 0},
		{errors.New("boom"), false, KeyMediumError, 0x11, 0},
	} {
		base := exporttest.NewMemDevice(t, "vol", testSize)
		f := newFixtureDev(t, base)
		f.reg.Add(&errDev{Device: base, err: tc.err})
		f.ready(f.n)
		if tc.write {
			f.check(f.n, cdb10(opWrite10, 0, 0, 1), make([]byte, 512), 0, tc.key, tc.asc, tc.ascq)
		} else {
			f.check(f.n, cdb10(opRead10, 0, 0, 1), nil, 512, tc.key, tc.asc, tc.ascq)
		}
	}
}

// TestDataOutSizeMustMatch: COMPARE AND WRITE and WRITE SAME refuse a
// data-out larger or smaller than the CDB implies (libiscsi's
// InvalidDataOutSize tests); WRITE takes the residual instead.
func TestDataOutSizeMustMatch(t *testing.T) {
	f := newFixture(t)
	f.ready(f.n)
	caw := cdb16(opCompareAndWrite, 0, 0, 0)
	caw[13] = 1
	f.check(f.n, caw, make([]byte, 4*512), 0, KeyIllegalRequest, 0x24, 0)
	caw[13] = 3
	f.check(f.n, caw, make([]byte, 4*512), 0, KeyIllegalRequest, 0x24, 0)
	// 256 blocks wrap the one-byte length to 0: the data-out gives it away.
	caw[13] = 0
	f.check(f.n, caw, make([]byte, 2*256*512), 0, KeyIllegalRequest, 0x24, 0)
	f.good(f.n, caw, nil, 0)
	for _, n := range []int{256, 1024} {
		f.check(f.n, cdb10(opWriteSame10, 0x08, 0, 1), make([]byte, n), 0, KeyIllegalRequest, 0x24, 0)
	}
}

// TestReportOpcodesOneEach: every command of the "all" list answers the
// one-command query with its CDB length and a usage map starting with
// its opcode (what libiscsi's OneCommand test walks).
func TestReportOpcodesOneEach(t *testing.T) {
	f := newFixture(t)
	f.ready(f.n)
	all := f.good(f.n, []byte{opMaintenanceIn, saReportOpcodes, 0, 0, 0, 0, 0, 0, 0x10, 0, 0, 0}, nil, 4096).data
	for p := 4; p < len(all); p += 8 {
		op, sa, servactv, cdbLen := all[p], binary.BigEndian.Uint16(all[p+2:]), all[p+5]&1 != 0, binary.BigEndian.Uint16(all[p+6:])
		opts := byte(1)
		if servactv {
			opts = 2
		}
		cdb := []byte{opMaintenanceIn, saReportOpcodes, opts, op, byte(sa >> 8), byte(sa), 0, 0, 1, 0, 0, 0}
		d := f.good(f.n, cdb, nil, 256).data
		if d[1]&7 != 3 || binary.BigEndian.Uint16(d[2:]) != cdbLen || d[4] != op || (servactv && d[5]&0x1F != byte(sa)) {
			t.Errorf("op %#x sa %#x: % x", op, sa, d)
		}
	}
}

// TestResetsAndNexusLoss: a target reset releases RESERVE(6) and
// gives every nexus 29/03, the one that asked included (a multipath
// initiator checks each of its paths); a lost nexus's replacement starts
// with 29/00.
func TestResetsAndNexusLoss(t *testing.T) {
	f := newFixture(t)
	a, b := nexus("iqn.a", 1), nexus("iqn.b", 1)
	f.ready(a)
	f.ready(b)
	f.good(a, []byte{opReserve6, 0, 0, 0, 0, 0}, nil, 0)
	if got := f.tg.TaskManagement(TMFTargetWarmReset, b, 0); got != TMFComplete {
		t.Fatalf("target reset: %d", got)
	}
	f.check(a, tur, nil, 0, KeyUnitAttention, 0x29, 0x03)
	f.check(b, tur, nil, 0, KeyUnitAttention, 0x29, 0x03)
	if r, w := f.access(b); !r || !w {
		t.Fatal("RESERVE(6) survived a target reset")
	}
	for _, fn := range []uint8{TMFAbortTask, TMFAbortTaskSet, TMFClearTaskSet} {
		if got := f.tg.TaskManagement(fn, a, 0); got != TMFComplete {
			t.Fatalf("TMF %d: %d", fn, got)
		}
	}
	if got := f.tg.TaskManagement(TMFClearACA, a, 0); got != TMFNotSupported {
		t.Fatalf("CLEAR ACA: %d", got)
	}
	f.good(a, tur, nil, 0)
	f.tg.NexusLost(a)
	a2 := nexus("iqn.a", 1)
	f.check(a2, tur, nil, 0, KeyUnitAttention, 0x29, 0)
	f.good(a2, tur, nil, 0)
}

// TestORWrite: ORWRITE ORs the data-out into the blocks.
func TestORWrite(t *testing.T) {
	f := newFixture(t)
	f.ready(f.n)
	a, b := bytes.Repeat([]byte{0xA5}, 1024), bytes.Repeat([]byte{0x5A}, 1024)
	f.good(f.n, cdb10(opWrite10, 0, 20, 2), make([]byte, 1024), 0)
	f.good(f.n, cdb16(opORWrite, 0, 20, 2), a, 0)
	if d := f.good(f.n, cdb10(opRead10, 0, 20, 2), nil, 1024).data; !bytes.Equal(d, a) {
		t.Fatal("ORWRITE into zeroes")
	}
	f.good(f.n, cdb16(opORWrite, 0x08, 20, 2), b, 0)
	if d := f.good(f.n, cdb10(opRead10, 0, 20, 2), nil, 1024).data; !bytes.Equal(d, bytes.Repeat([]byte{0xFF}, 1024)) {
		t.Fatal("ORWRITE did not OR")
	}
	f.check(f.n, cdb16(opORWrite, 0, testSize/512-1, 2), a, 0, KeyIllegalRequest, 0x21, 0)
	f.check(f.n, cdb16(opORWrite, 0x20, 0, 1), a[:512], 0, KeyIllegalRequest, 0x24, 0)
}

// TestGetLBAStatusFirstDescriptor: the first descriptor starts at the
// queried LBA (SBC-3), mapped or not, whatever the physical block
// (libiscsi's GetLBAStatus.UnmapSingle walk, 512e: 8 blocks per 4 KiB).
func TestGetLBAStatusFirstDescriptor(t *testing.T) {
	f := newFixture(t)
	f.ready(f.n)
	status := func(at uint64) (uint64, uint32, uint8) {
		b := cdb16(opServiceActionIn, saGetLBAStatus, at, 0)
		binary.BigEndian.PutUint32(b[10:], 24)
		d := f.good(f.n, b, nil, 24).data
		return binary.BigEndian.Uint64(d[8:]), binary.BigEndian.Uint32(d[16:]), d[20]
	}
	for i := uint64(8); i+8 <= 256; i += 8 {
		f.good(f.n, cdb10(opWrite10, 0, 0, 264), pattern(264*512, 1), 0)
		pl := make([]byte, 24)
		binary.BigEndian.PutUint16(pl[0:], 22)
		binary.BigEndian.PutUint16(pl[2:], 16)
		binary.BigEndian.PutUint32(pl[16:], uint32(i))
		f.good(f.n, []byte{opUnmap, 0, 0, 0, 0, 0, 0, 0, 24, 0}, pl, 0)
		if l, n, st := status(0); l != 0 || uint64(n) != i || st != 1 {
			t.Fatalf("i=%d at 0: lba %d n %d status %d", i, l, n, st)
		}
		if l, _, st := status(i + 1); l != i+1 || st != 0 {
			t.Fatalf("i=%d at %d: lba %d status %d", i, i+1, l, st)
		}
		if l, _, st := status(i - 1); l != i-1 || st != 1 {
			t.Fatalf("i=%d at %d: lba %d status %d", i, i-1, l, st)
		}
	}
}

// TestMiscCommandsAndErrors covers the small commands and error paths.
func TestMiscCommandsAndErrors(t *testing.T) {
	f := newFixture(t)
	f.ready(f.n)
	f.good(f.n, []byte{opStartStopUnit, 0x01, 0, 0, 0x01, 0}, nil, 0)
	f.good(f.n, []byte{opPreventAllow, 0, 0, 0, 0x01, 0}, nil, 0)
	// READ CAPACITY(10) with an LBA but no PMI.
	f.check(f.n, []byte{opReadCapacity10, 0, 0, 0, 0, 1, 0, 0, 0, 0}, nil, 8, KeyIllegalRequest, 0x24, 0)
	// MODE SELECT: SP, a block descriptor of another size, a short list,
	// a page beyond the list, an unknown page.
	f.check(f.n, []byte{opModeSelect6, 0x11, 0, 0, 4, 0}, make([]byte, 4), 0, KeyIllegalRequest, 0x24, 0)
	bd := make([]byte, 12)
	bd[3] = 8
	bd[4+6], bd[4+7] = 0x10, 0 // block length 4096 on a 512-byte LU
	f.check(f.n, []byte{opModeSelect6, 0x10, 0, 0, 12, 0}, bd, 0, KeyIllegalRequest, 0x26, 0)
	f.check(f.n, []byte{opModeSelect10, 0x10, 0, 0, 0, 0, 0, 0, 4, 0}, make([]byte, 4), 0, KeyIllegalRequest, 0x1A, 0)
	f.check(f.n, []byte{opModeSelect6, 0x10, 0, 0, 8, 0}, []byte{0, 0, 0, 0, 0x0A, 0x0A, 0, 0}, 0, KeyIllegalRequest, 0x1A, 0)
	f.check(f.n, []byte{opModeSelect6, 0x10, 0, 0, 8, 0}, []byte{0, 0, 0, 0, 0x19, 0x02, 0, 0}, 0, KeyIllegalRequest, 0x26, 0)
	f.good(f.n, []byte{opModeSelect6, 0x10, 0, 0, 0, 0}, nil, 0)
	// Saved values are the defaults; an unknown subpage is refused.
	f.good(f.n, []byte{opModeSense6, 0, 0xC0 | 0x3F, 0, 255, 0}, nil, 255)
	f.check(f.n, []byte{opModeSense6, 0, 0x3F, 0x05, 255, 0}, nil, 255, KeyIllegalRequest, 0x24, 0)
	// RTPG with a reserved parameter data format.
	f.check(f.n, []byte{opMaintenanceIn, 0x40 | saReportTPG, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0}, nil, 256, KeyIllegalRequest, 0x24, 0)
	// A CDB shorter than its command.
	f.check(f.n, []byte{opRead10, 0, 0, 0}, nil, 512, KeyIllegalRequest, 0x24, 0)
	if f.tg.MaxDataOut() < 32<<20 {
		t.Fatalf("MaxDataOut %d", f.tg.MaxDataOut())
	}
}

func TestErrSenseClasses(t *testing.T) {
	for _, tc := range []struct {
		err            error
		key, asc, ascq uint8
	}{
		{syscall.EINVAL, KeyIllegalRequest, 0x21, 0},
		{syscall.ENOMEM, KeyAbortedCommand, 0, 0},
		{syscall.ESHUTDOWN, KeyNotReady, 0x04, 0},
		{syscall.EOPNOTSUPP, KeyHardwareError, 0x44, 0},
		{syscall.EDQUOT, KeyDataProtect, 0x27, 0x07},
	} {
		s := errSense(tc.err, true)
		if s.key != tc.key || s.asc != tc.asc || s.ascq != tc.ascq {
			t.Errorf("%v: %x/%x/%x", tc.err, s.key, s.asc, s.ascq)
		}
	}
}

func TestRegisterMoveErrors(t *testing.T) {
	f := newFixture(t)
	a, b := nexus("iqn.a", 1), nexus("iqn.b", 2)
	f.ready(a)
	f.ready(b)
	f.prOK(a, prRegister, 0, 0, 0xA, 0)
	move := func(n *Nexus, key, saKey uint64, rel uint16, tid []byte) res {
		pl := make([]byte, 24+len(tid))
		binary.BigEndian.PutUint64(pl[0:], key)
		binary.BigEndian.PutUint64(pl[8:], saKey)
		binary.BigEndian.PutUint16(pl[18:], rel)
		binary.BigEndian.PutUint32(pl[20:], uint32(len(tid)))
		copy(pl[24:], tid)
		return f.exec(n, []byte{opPROut, prRegisterMove, prTypeWE, 0, 0, 0, 0, 0, byte(len(pl)), 0}, pl, 0)
	}
	tid := transportID(b.InitiatorPort)
	// Not the holder (no reservation yet): conflict.
	if r := move(a, 0xA, 0xB, 2, tid); r.status != StatusReservationConflict {
		t.Fatalf("move without reservation: %#x", r.status)
	}
	f.prOK(a, prReserve, prTypeWE, 0xA, 0, 0)
	for _, tc := range []struct {
		saKey uint64
		rel   uint16
		tid   []byte
	}{
		{0, 2, tid},                             // service action key 0
		{0xB, 0, tid},                           // relative port 0
		{0xB, 2, []byte{0x01, 0, 0, 4, 'x', 0}}, // not an iSCSI TransportID
		{0xB, 1, transportID(a.InitiatorPort)},  // to itself
	} {
		if r := move(a, 0xA, tc.saKey, tc.rel, tc.tid); r.status != StatusCheckCondition {
			t.Errorf("move %+v: status %#x", tc, r.status)
		}
	}
	if port, _, ok := parseTransportID(transportID("iqn.x")); !ok || port != "iqn.x" {
		t.Fatalf("format 0 TransportID: %q %v", port, ok)
	}
}

// TestVolumeRecreated: a volume deleted under an open logical unit
// (volrt.ErrVolumeGone) fails the command, and the next one opens the
// volume now registered under that name.
func TestVolumeRecreated(t *testing.T) {
	f := newFixture(t)
	f.ready(f.n)
	f.good(f.n, cdb10(opWrite10, 0, 0, 1), pattern(512, 1), 0)
	f.dev.Volume.MarkGone()
	f.check(f.n, cdb10(opRead10, 0, 0, 1), nil, 512, KeyMediumError, 0x11, 0)
	dev2 := exporttest.NewMemDevice(t, "vol", testSize)
	f.reg.Add(dev2)
	f.check(f.n, tur, nil, 0, KeyUnitAttention, 0x29, 0) // a new logical unit
	if d := f.good(f.n, cdb10(opRead10, 0, 0, 1), nil, 512).data; !bytes.Equal(d, make([]byte, 512)) {
		t.Fatal("read the deleted volume's data")
	}
}

// TestWriteProtectFollowsDevice: write protection is the device's current
// one, not the one at open: a replicated volume's logical unit opened
// while its node was secondary (read-only) accepts writes once promoted,
// and refuses them again after a demote.
func TestWriteProtectFollowsDevice(t *testing.T) {
	f := newFixture(t)
	f.ready(f.n)
	blk := pattern(512, 3)
	f.good(f.n, cdb10(opWrite10, 0, 0, 1), blk, 0)
	f.dev.Meta.ReadOnly = true
	f.check(f.n, cdb10(opWrite10, 0, 0, 1), blk, 0, KeyDataProtect, 0x27, 0)
	f.dev.Meta.ReadOnly = false
	f.good(f.n, cdb10(opWrite10, 0, 0, 1), blk, 0)
}

// TestStandbyPortNoWriteProtect: a replicated secondary's logical unit is
// read-only (its device says so) and its port groups standby. MODE SENSE
// on a standby port must not report WP: Linux's sd sets the disk
// read-only from WP at scan time and does not re-read it when the port
// becomes active, and dm-multipath then refuses to build a map over the
// path (EROFS when it loads the table), so the promoted node could never
// take the I/O. Through an active port a read-only device still reports
// WP, and the software write protect (control page SWP) is reported on
// every port.
func TestStandbyPortNoWriteProtect(t *testing.T) {
	f := newFixture(t)
	n2 := &Nexus{InitiatorPort: "iqn.a,i,0x2", TargetName: "iqn.t", RelativePort: 2, PortGroup: 2}
	f.ready(f.n)
	f.ready(n2)
	f.dev.Meta.ReadOnly = true
	f.tg.SetPortGroupState(2, ALUAStandby)
	f.check(n2, []byte{opTestUnitReady, 0, 0, 0, 0, 0}, nil, 0, KeyUnitAttention, 0x2A, 0x06)
	f.check(f.n, []byte{opTestUnitReady, 0, 0, 0, 0, 0}, nil, 0, KeyUnitAttention, 0x2A, 0x06)
	modeSense6 := []byte{opModeSense6, 0, 0x3F, 0, 255, 0}
	modeSense10 := []byte{opModeSense10, 0, 0x3F, 0, 0, 0, 0, 0, 255, 0}
	if r := f.good(n2, modeSense6, nil, 255); r.data[2]&0x80 != 0 {
		t.Fatal("MODE SENSE(6) on a standby port reports WP")
	}
	if r := f.good(n2, modeSense10, nil, 255); r.data[3]&0x80 != 0 {
		t.Fatal("MODE SENSE(10) on a standby port reports WP")
	}
	if r := f.good(f.n, modeSense6, nil, 255); r.data[2]&0x80 == 0 {
		t.Fatal("MODE SENSE on an active port of a read-only device does not report WP")
	}
	// Software write protect (control page SWP) is the logical unit's own.
	f.dev.Meta.ReadOnly = false
	cur := f.good(f.n, []byte{opModeSense6, 0x08, 0x0A, 0, 255, 0}, nil, 255).data // control page, no block descriptor
	ctl := append([]byte{0, 0, 0, 0}, cur[4:4+12]...)
	ctl[4+4] |= 0x08 // SWP
	f.good(f.n, []byte{opModeSelect6, 0x10, 0, 0, byte(len(ctl)), 0}, ctl, 0)
	f.check(n2, modeSense6, nil, 255, KeyUnitAttention, 0x2A, 0x01) // MODE PARAMETERS CHANGED
	if r := f.good(n2, modeSense6, nil, 255); r.data[2]&0x80 == 0 {
		t.Fatal("MODE SENSE on a standby port does not report the software write protect")
	}
}
