package pdu

import (
	"bytes"
	"errors"
	"io"
	"reflect"
	"testing"
)

// every returns one populated PDU of each opcode.
func every() []PDU {
	sns := StatusSNs{StatSN: 7, ExpCmdSN: 8, MaxCmdSN: 40}
	return []PDU{
		&NOPOut{Immediate: true, LUN: 1 << 48, ITT: 1, TTT: ReservedTag, CmdSN: 2, ExpStatSN: 3},
		&SCSICommand{Final: true, Read: true, Attr: AttrOrdered, LUN: 2 << 48, ITT: 9, ExpectedDataTransferLength: 4096,
			CmdSN: 10, ExpStatSN: 11, CDB: [16]byte{0x28, 0, 0, 0, 0, 8, 0, 0, 8, 0}},
		&TaskMgmtRequest{Immediate: true, Function: TMFAbortTask, ITT: 4, ReferencedTaskTag: 9, CmdSN: 5, ExpStatSN: 6, RefCmdSN: 10, ExpDataSN: 1},
		&LoginRequest{Transit: true, CSG: StageLoginOperationalNegotiation, NSG: StageFullFeaturePhase,
			ISID: ISID{0x80, 1, 2, 3, 4, 5}, ITT: 0x11, CID: 1, CmdSN: 99, ExpStatSN: 1},
		&TextRequest{Final: true, ITT: 3, TTT: ReservedTag, CmdSN: 4, ExpStatSN: 5},
		&DataOut{Final: true, LUN: 1, ITT: 9, TTT: 0x77, ExpStatSN: 3, DataSN: 2, BufferOffset: 8192},
		&LogoutRequest{Immediate: true, Reason: LogoutCloseConnection, ITT: 12, CID: 3, CmdSN: 13, ExpStatSN: 14},
		&SNACKRequest{Type: SNACKStatus, ITT: 1, TTT: 2, ExpStatSN: 3, BegRun: 4, RunLength: 5},
		&NOPIn{StatusSNs: sns, ITT: ReservedTag, TTT: 0x55},
		&SCSIResponse{StatusSNs: sns, Underflow: true, Status: StatusCheckCondition, ITT: 9, ExpDataSN: 2, ResidualCount: 512},
		&TaskMgmtResponse{StatusSNs: sns, Response: TMFTaskDoesNotExist, ITT: 4},
		&LoginResponse{StatusSNs: sns, Transit: true, CSG: StageSecurityNegotiation, NSG: StageLoginOperationalNegotiation,
			ISID: ISID{0x80, 1, 2, 3, 4, 5}, TSIH: 0x1234, ITT: 0x11, Status: LoginAuthenticationFailure},
		&TextResponse{StatusSNs: sns, Continue: true, ITT: 3, TTT: 0x99},
		&DataIn{StatusSNs: sns, Final: true, HasStatus: true, Status: StatusGood, Overflow: true, ITT: 9, TTT: ReservedTag,
			DataSN: 3, BufferOffset: 4096, ResidualCount: 100},
		&LogoutResponse{StatusSNs: sns, Response: LogoutCIDNotFound, ITT: 12, Time2Wait: 2, Time2Retain: 20},
		&R2T{StatusSNs: sns, LUN: 1, ITT: 9, TTT: 0x42, R2TSN: 1, BufferOffset: 65536, DesiredDataTransferLength: 262144},
		&AsyncMessage{StatusSNs: sns, LUN: 1, AsyncEvent: AsyncSCSIEvent, Parameter1: 1, Parameter2: 2, Parameter3: 3},
		&Reject{StatusSNs: sns, Reason: RejectDataDigestError, DataSNR2TSN: 0},
	}
}

func TestRoundTripEveryOpcode(t *testing.T) {
	seen := map[Opcode]bool{}
	for _, p := range every() {
		var b [BHSLen]byte
		if err := p.Encode(b[:]); err != nil {
			t.Fatalf("%s: %v", p.Opcode(), err)
		}
		if Opcode(b[0]&0x3f) != p.Opcode() {
			t.Fatalf("%s: byte 0 %#x", p.Opcode(), b[0])
		}
		q, err := Decode(b[:])
		if err != nil {
			t.Fatalf("%s: %v", p.Opcode(), err)
		}
		if !reflect.DeepEqual(p, q) {
			t.Errorf("%s: round trip\n got %+v\nwant %+v", p.Opcode(), q, p)
		}
		if p.Opcode().FromInitiator() != (p.Opcode() < 0x20) {
			t.Errorf("%s: FromInitiator wrong", p.Opcode())
		}
		seen[p.Opcode()] = true
	}
	if len(seen) != 18 {
		t.Errorf("covered %d opcodes, want 18", len(seen))
	}
}

// Spot-check field offsets against RFC 7143's BHS layouts, independent of
// the decoder.
func TestFieldOffsets(t *testing.T) {
	var b [BHSLen]byte
	lr := &LoginResponse{Transit: true, CSG: 1, NSG: 3, VersionActive: 0, TSIH: 0xabcd, ITT: 0x01020304,
		StatusSNs: StatusSNs{StatSN: 0x11, ExpCmdSN: 0x22, MaxCmdSN: 0x33}, Status: LoginNotFound}
	lr.DataSegmentLength = 0x010203
	if err := lr.Encode(b[:]); err != nil {
		t.Fatal(err)
	}
	want := map[int]byte{0: 0x23, 1: 0x87, 5: 0x01, 6: 0x02, 7: 0x03, 14: 0xab, 15: 0xcd, 16: 1, 19: 4, 27: 0x11, 31: 0x22, 35: 0x33, 36: 2, 37: 3}
	for i, v := range want {
		if b[i] != v {
			t.Errorf("Login Response byte %d = %#x, want %#x", i, b[i], v)
		}
	}
	r2t := &R2T{DesiredDataTransferLength: 0xdeadbeef, R2TSN: 5}
	r2t.Encode(b[:])
	if b[0] != 0x31 || b[1] != 0x80 || b[39] != 5 || b[44] != 0xde || b[47] != 0xef {
		t.Errorf("R2T layout %x", b)
	}
	cmd := &SCSICommand{Immediate: true, Write: true, Attr: AttrSimple, ExpectedDataTransferLength: 512}
	cmd.CDB[0] = 0x2a
	cmd.Encode(b[:])
	if b[0] != 0x41 || b[1] != 0x21 || b[23] != 0x00 || b[22] != 0x02 || b[32] != 0x2a {
		t.Errorf("SCSI Command layout %x", b)
	}
}

func TestDecodeErrors(t *testing.T) {
	var b [BHSLen]byte
	if _, err := Decode(b[:47]); !errors.Is(err, ErrShort) {
		t.Errorf("short: %v", err)
	}
	b[0] = 0x1c // vendor-specific initiator opcode
	_, err := Decode(b[:])
	var fe *FieldError
	if !errors.Is(err, ErrUnknownOpcode) || !errors.As(err, &fe) || fe.Reason != RejectCommandNotSupported {
		t.Errorf("vendor opcode: %v", err)
	}
	b[0], b[1] = 0x03, 0xc0|0x08 // Login with T and C both set
	if _, err := Decode(b[:]); !errors.Is(err, ErrInvalid) {
		t.Errorf("T+C: %v", err)
	}
	b[1] = 0x80 | 0x08 | 0x02 // CSG 2 (reserved)
	if _, err := Decode(b[:]); !errors.Is(err, ErrInvalid) {
		t.Errorf("CSG 2: %v", err)
	}
	b[0], b[1] = 0x25, 0x01 // Data-In with S but not F
	if _, err := Decode(b[:]); !errors.Is(err, ErrInvalid) {
		t.Errorf("S without F: %v", err)
	}
	if err := (&NOPOut{Lengths: Lengths{DataSegmentLength: 1 << 24}}).Encode(b[:]); !errors.Is(err, ErrTooLong) {
		t.Errorf("encode 2^24 data: %v", err)
	}
}

// RFC 7143 Appendix B.4 CRC32C examples, and the wire byte order.
func TestCRC32C(t *testing.T) {
	inc := make([]byte, 32)
	dec := make([]byte, 32)
	for i := range inc {
		inc[i], dec[i] = byte(i), byte(31-i)
	}
	ones := bytes.Repeat([]byte{0xff}, 32)
	for _, c := range []struct {
		in   []byte
		wire [4]byte
	}{
		{make([]byte, 32), [4]byte{0xaa, 0x36, 0x91, 0x8a}},
		{ones, [4]byte{0x43, 0xab, 0xa8, 0x62}},
		{inc, [4]byte{0x4e, 0x79, 0xdd, 0x46}},
		{dec, [4]byte{0x5c, 0xdb, 0x3f, 0x11}},
	} {
		var w [4]byte
		putDigest(w[:], CRC32C(c.in))
		if w != c.wire {
			t.Errorf("CRC32C(%x) on the wire %x, want %x", c.in[:4], w, c.wire)
		}
	}
}

func TestReaderDigestsAndPadding(t *testing.T) {
	d := Digests{Header: true, Data: true}
	ahs, _ := AppendAHS(nil, ExtendedCDB(make([]byte, 32)))
	ahs, _ = AppendAHS(ahs, BidiReadLength(4096))
	data := []byte("hello") // 5 bytes: 3 bytes of padding
	cmd := &SCSICommand{Final: true, Write: true, Read: true, ITT: 1, ExpectedDataTransferLength: 5}
	cmd.CDB[0] = 0x7f
	b, err := AppendPDU(nil, cmd, ahs, data, d)
	if err != nil {
		t.Fatal(err)
	}
	if want := BHSLen + len(ahs) + 4 + 8 + 4; len(b) != want {
		t.Fatalf("PDU %d bytes, want %d", len(b), want)
	}
	r := Reader{R: bytes.NewReader(b), Digests: d}
	f, err := r.Read()
	if err != nil {
		t.Fatal(err)
	}
	if string(f.Data) != "hello" {
		t.Errorf("data %q", f.Data)
	}
	segs, err := ParseAHS(f.AHS)
	if err != nil || len(segs) != 2 {
		t.Fatalf("AHS %v %v", segs, err)
	}
	if cdb := FullCDB(f.Header.(*SCSICommand), segs); len(cdb) != 32 || cdb[0] != 0x7f {
		t.Errorf("full CDB %x", cdb)
	}
	if n, ok := BidiRead(segs); !ok || n != 4096 {
		t.Errorf("bidi %d %v", n, ok)
	}
	// Corrupt the data: a *DigestError with the Reject reason, header intact.
	bad := append([]byte(nil), b...)
	bad[len(bad)-10] ^= 1
	r = Reader{R: bytes.NewReader(bad), Digests: d}
	f, err = r.Read()
	var de *DigestError
	if !errors.As(err, &de) || de.Header || de.RejectReason() != RejectDataDigestError || f.Header == nil {
		t.Errorf("data digest: %v (header %v)", err, f.Header)
	}
	// Corrupt the header.
	bad = append([]byte(nil), b...)
	bad[20] ^= 1
	r = Reader{R: bytes.NewReader(bad), Digests: d}
	if _, err = r.Read(); !errors.As(err, &de) || !de.Header {
		t.Errorf("header digest: %v", err)
	}
	// Truncated mid-PDU.
	r = Reader{R: bytes.NewReader(b[:len(b)-1]), Digests: d}
	if _, err = r.Read(); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("truncated: %v", err)
	}
	r = Reader{R: bytes.NewReader(nil)}
	if _, err = r.Read(); err != io.EOF {
		t.Errorf("empty: %v", err)
	}
}

// A declared data segment over the limit fails before anything is read or
// allocated for it: the reader has only the 48 BHS bytes, so reaching for
// the data would give ErrUnexpectedEOF instead of ErrTooLong.
func TestReaderLimitBeforeAllocation(t *testing.T) {
	var b [BHSLen]byte
	h := &DataOut{Lengths: Lengths{DataSegmentLength: MaxDataSegmentLength}}
	if err := h.Encode(b[:]); err != nil {
		t.Fatal(err)
	}
	allocs := testing.AllocsPerRun(20, func() {
		r := Reader{R: bytes.NewReader(b[:]), MaxData: 8192}
		if _, err := r.Read(); !errors.Is(err, ErrTooLong) {
			t.Fatalf("got %v", err)
		}
	})
	if allocs > 8 { // the Reader, the bytes.Reader and the error value
		t.Errorf("%v allocations for a refused 16 MiB segment", allocs)
	}
	b[4] = 255 // 1020 bytes of AHS over a 64-byte limit
	b[5], b[6], b[7] = 0, 0, 0
	r := Reader{R: bytes.NewReader(b[:]), MaxAHS: 64}
	if _, err := r.Read(); !errors.Is(err, ErrTooLong) {
		t.Errorf("AHS limit: %v", err)
	}
}

func TestParseAHSErrors(t *testing.T) {
	for _, area := range [][]byte{
		{0, 9, 1, 0},          // AHSLength overruns
		{0, 0, 1, 0},          // zero length
		{0, 1},                // short
		{0, 5, 2, 0, 0, 0, 0}, // overruns by one
	} {
		if _, err := ParseAHS(area); err == nil {
			t.Errorf("ParseAHS(%x) accepted", area)
		}
	}
}

func TestSenseData(t *testing.T) {
	s := []byte{0x70, 0, 5}
	got, err := ParseSenseData(SenseData(s))
	if err != nil || !bytes.Equal(got, s) {
		t.Errorf("%x %v", got, err)
	}
	if _, err := ParseSenseData([]byte{0, 9, 1}); !errors.Is(err, ErrTooLong) {
		t.Errorf("overrun: %v", err)
	}
}

func TestSerialArithmetic(t *testing.T) {
	cases := []struct {
		a, b uint32
		less bool
	}{
		{1, 2, true}, {2, 1, false}, {0xffffffff, 0, true}, {0, 0xffffffff, false},
		{0xfffffff0, 0x10, true}, {5, 5, false}, {0, 1 << 31, false}, {1 << 31, 0, false},
		{0, 1<<31 - 1, true},
	}
	for _, c := range cases {
		if SNLess(c.a, c.b) != c.less {
			t.Errorf("SNLess(%#x, %#x) = %v", c.a, c.b, !c.less)
		}
	}
	if !SNInWindow(0xfffffffe, 0xfffffff0, 5) || SNInWindow(6, 0xfffffff0, 5) || SNInWindow(10, 10, 9) {
		t.Error("window across the wrap")
	}
	if !SNLessEq(3, 3) || !SNGreater(0, 0xffffffff) || SNDistance(0xffffffff, 1) != 2 {
		t.Error("LessEq/Greater/Distance")
	}
}

func TestStrings(t *testing.T) {
	for _, c := range []struct{ got, want string }{
		{OpLoginReq.String(), "Login Request"},
		{OpReject.String(), "Reject"},
		{LoginAuthenticationFailure.String(), "Authentication failure (0x0201)"},
		{StatusReservationConflict.String(), "RESERVATION CONFLICT"},
		{StatusTaskSetFull.String(), "TASK SET FULL"},
		{TMFLogicalUnitReset.String(), "LOGICAL UNIT RESET"},
		{RejectProtocolError.String(), "Protocol Error"},
		{AsyncSCSIEvent.String(), "SCSI Asynchronous Event"},
		{StageFullFeaturePhase.String(), "FullFeaturePhase"},
		{Opcode(0x1c).String(), "opcode 0x1c"},
	} {
		if c.got != c.want {
			t.Errorf("%q, want %q", c.got, c.want)
		}
	}
}

func TestNewReject(t *testing.T) {
	var bhs [BHSLen]byte
	(&NOPOut{ITT: 5, CmdSN: 9}).Encode(bhs[:])
	h, data := NewReject(RejectProtocolError, bhs, StatusSNs{StatSN: 1})
	b, err := AppendPDU(nil, h, nil, data, Digests{})
	if err != nil {
		t.Fatal(err)
	}
	if len(b) != 2*BHSLen || b[0] != 0x3f || b[2] != 0x04 || !bytes.Equal(b[16:20], []byte{0xff, 0xff, 0xff, 0xff}) || !bytes.Equal(b[BHSLen:], bhs[:]) {
		t.Errorf("reject %x", b)
	}
}
