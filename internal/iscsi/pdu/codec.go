package pdu

import "encoding/binary"

// PDU is the Basic Header Segment of one PDU as a typed struct. Every
// opcode has its own type (*NOPOut, *SCSICommand, ... *Reject); Decode
// picks it from byte 0.
//
// Encode writes exactly BHSLen bytes into b (reserved fields zero, as the
// RFC requires of senders); Decode reads BHSLen bytes and ignores reserved
// fields (as it requires of receivers). Neither allocates.
type PDU interface {
	Opcode() Opcode
	// Lengths returns the framing fields shared by every BHS, so framing
	// code (AppendPDU, Reader) can set and read them without a type switch.
	Framing() *Lengths
	Encode(b []byte) error
	Decode(b []byte) error
}

// Lengths are the two framing fields every BHS carries.
type Lengths struct {
	// TotalAHSLength is the AHS area length in 4-byte words (padding
	// included); 0 when the PDU has no AHS.
	TotalAHSLength uint8
	// DataSegmentLength is the data segment length in bytes, padding
	// excluded; 24 bits on the wire.
	DataSegmentLength uint32
}

// Framing implements PDU for every type that embeds Lengths.
func (l *Lengths) Framing() *Lengths { return l }

var be = binary.BigEndian

// begin validates b and the lengths and writes bytes 0..7 of the BHS.
func begin(b []byte, op Opcode, imm bool, flags byte, l *Lengths) error {
	if len(b) < BHSLen {
		return short(op.String()+" BHS", len(b), BHSLen)
	}
	if l.DataSegmentLength > MaxDataSegmentLength {
		return tooLong(op, "DataSegmentLength", int(l.DataSegmentLength), MaxDataSegmentLength)
	}
	clear(b[:BHSLen])
	b[0] = byte(op)
	if imm {
		b[0] |= immediateBit
	}
	b[1] = flags
	b[4] = l.TotalAHSLength
	b[5] = byte(l.DataSegmentLength >> 16)
	b[6] = byte(l.DataSegmentLength >> 8)
	b[7] = byte(l.DataSegmentLength)
	return nil
}

// parse checks b holds a BHS of opcode op and reads the framing fields;
// it returns the I bit.
func parse(b []byte, op Opcode, l *Lengths) (bool, error) {
	if len(b) < BHSLen {
		return false, short(op.String()+" BHS", len(b), BHSLen)
	}
	if Opcode(b[0]&opcodeMask) != op {
		return false, invalid(op, "Opcode", "BHS has opcode 0x%02x", b[0]&opcodeMask)
	}
	l.TotalAHSLength = b[4]
	l.DataSegmentLength = uint32(b[5])<<16 | uint32(b[6])<<8 | uint32(b[7])
	return b[0]&immediateBit != 0, nil
}

// PeekLengths returns the opcode and framing fields of a BHS without
// decoding the rest: what a reader needs to size the AHS and data segment.
func PeekLengths(b []byte) (Opcode, Lengths, error) {
	if len(b) < BHSLen {
		return 0, Lengths{}, short("BHS", len(b), BHSLen)
	}
	return Opcode(b[0] & opcodeMask), Lengths{
		TotalAHSLength:    b[4],
		DataSegmentLength: uint32(b[5])<<16 | uint32(b[6])<<8 | uint32(b[7]),
	}, nil
}

// New returns a zero PDU of the given opcode, or nil for an unknown one.
func New(op Opcode) PDU {
	switch op {
	case OpNOPOut:
		return new(NOPOut)
	case OpSCSICommand:
		return new(SCSICommand)
	case OpTaskMgmtReq:
		return new(TaskMgmtRequest)
	case OpLoginReq:
		return new(LoginRequest)
	case OpTextReq:
		return new(TextRequest)
	case OpSCSIDataOut:
		return new(DataOut)
	case OpLogoutReq:
		return new(LogoutRequest)
	case OpSNACKReq:
		return new(SNACKRequest)
	case OpNOPIn:
		return new(NOPIn)
	case OpSCSIResponse:
		return new(SCSIResponse)
	case OpTaskMgmtResp:
		return new(TaskMgmtResponse)
	case OpLoginResp:
		return new(LoginResponse)
	case OpTextResp:
		return new(TextResponse)
	case OpSCSIDataIn:
		return new(DataIn)
	case OpLogoutResp:
		return new(LogoutResponse)
	case OpR2T:
		return new(R2T)
	case OpAsyncMessage:
		return new(AsyncMessage)
	case OpReject:
		return new(Reject)
	}
	return nil
}

// Decode decodes the BHS at the start of b into the typed struct for its
// opcode. Unknown opcodes (vendor-specific included) give a *FieldError
// wrapping ErrUnknownOpcode with reason RejectCommandNotSupported.
func Decode(b []byte) (PDU, error) {
	if len(b) < BHSLen {
		return nil, short("BHS", len(b), BHSLen)
	}
	op := Opcode(b[0] & opcodeMask)
	p := New(op)
	if p == nil {
		return nil, &FieldError{Op: op, Field: "Opcode", Reason: RejectCommandNotSupported,
			Msg: "not an RFC 7143 opcode", Err: ErrUnknownOpcode}
	}
	if err := p.Decode(b); err != nil {
		return nil, err
	}
	return p, nil
}

// NOPOut (opcode 0x00, RFC 7143 11.18): initiator ping or ping reply.
type NOPOut struct {
	Lengths
	Immediate bool
	LUN       uint64
	ITT       uint32 // ReservedTag when answering a NOP-In
	TTT       uint32 // copied from the NOP-In being answered, else ReservedTag
	CmdSN     uint32
	ExpStatSN uint32
}

func (*NOPOut) Opcode() Opcode { return OpNOPOut }

func (p *NOPOut) Encode(b []byte) error {
	if err := begin(b, OpNOPOut, p.Immediate, finalBit, &p.Lengths); err != nil {
		return err
	}
	be.PutUint64(b[8:], p.LUN)
	be.PutUint32(b[16:], p.ITT)
	be.PutUint32(b[20:], p.TTT)
	be.PutUint32(b[24:], p.CmdSN)
	be.PutUint32(b[28:], p.ExpStatSN)
	return nil
}

func (p *NOPOut) Decode(b []byte) error {
	imm, err := parse(b, OpNOPOut, &p.Lengths)
	if err != nil {
		return err
	}
	p.Immediate = imm
	p.LUN = be.Uint64(b[8:])
	p.ITT = be.Uint32(b[16:])
	p.TTT = be.Uint32(b[20:])
	p.CmdSN = be.Uint32(b[24:])
	p.ExpStatSN = be.Uint32(b[28:])
	return nil
}

// SCSICommand (opcode 0x01, RFC 7143 11.3).
type SCSICommand struct {
	Lengths
	Immediate bool
	Final     bool // F: no unsolicited Data-Out follows
	Read      bool // R
	Write     bool // W
	Attr      TaskAttr
	LUN       uint64
	ITT       uint32
	// ExpectedDataTransferLength is the write length for writes, the read
	// length for reads (the AHS carries the read length of bidirectional
	// commands).
	ExpectedDataTransferLength uint32
	CmdSN                      uint32
	ExpStatSN                  uint32
	CDB                        [16]byte // longer CDBs continue in an Extended CDB AHS
}

func (*SCSICommand) Opcode() Opcode { return OpSCSICommand }

func (p *SCSICommand) Encode(b []byte) error {
	if p.Attr > 7 {
		return invalid(OpSCSICommand, "ATTR", "%d does not fit 3 bits", p.Attr)
	}
	f := byte(p.Attr)
	if p.Final {
		f |= 0x80
	}
	if p.Read {
		f |= 0x40
	}
	if p.Write {
		f |= 0x20
	}
	if err := begin(b, OpSCSICommand, p.Immediate, f, &p.Lengths); err != nil {
		return err
	}
	be.PutUint64(b[8:], p.LUN)
	be.PutUint32(b[16:], p.ITT)
	be.PutUint32(b[20:], p.ExpectedDataTransferLength)
	be.PutUint32(b[24:], p.CmdSN)
	be.PutUint32(b[28:], p.ExpStatSN)
	copy(b[32:48], p.CDB[:])
	return nil
}

func (p *SCSICommand) Decode(b []byte) error {
	imm, err := parse(b, OpSCSICommand, &p.Lengths)
	if err != nil {
		return err
	}
	p.Immediate = imm
	p.Final = b[1]&0x80 != 0
	p.Read = b[1]&0x40 != 0
	p.Write = b[1]&0x20 != 0
	p.Attr = TaskAttr(b[1] & 0x07)
	p.LUN = be.Uint64(b[8:])
	p.ITT = be.Uint32(b[16:])
	p.ExpectedDataTransferLength = be.Uint32(b[20:])
	p.CmdSN = be.Uint32(b[24:])
	p.ExpStatSN = be.Uint32(b[28:])
	copy(p.CDB[:], b[32:48])
	return nil
}

// TaskMgmtRequest (opcode 0x02, RFC 7143 11.5).
type TaskMgmtRequest struct {
	Lengths
	Immediate         bool
	Function          TMFunction
	LUN               uint64
	ITT               uint32
	ReferencedTaskTag uint32 // ABORT TASK: the ITT of the task to abort
	CmdSN             uint32
	ExpStatSN         uint32
	RefCmdSN          uint32
	ExpDataSN         uint32
}

func (*TaskMgmtRequest) Opcode() Opcode { return OpTaskMgmtReq }

func (p *TaskMgmtRequest) Encode(b []byte) error {
	if p.Function > 0x7f {
		return invalid(OpTaskMgmtReq, "Function", "%d does not fit 7 bits", p.Function)
	}
	if err := begin(b, OpTaskMgmtReq, p.Immediate, finalBit|byte(p.Function), &p.Lengths); err != nil {
		return err
	}
	be.PutUint64(b[8:], p.LUN)
	be.PutUint32(b[16:], p.ITT)
	be.PutUint32(b[20:], p.ReferencedTaskTag)
	be.PutUint32(b[24:], p.CmdSN)
	be.PutUint32(b[28:], p.ExpStatSN)
	be.PutUint32(b[32:], p.RefCmdSN)
	be.PutUint32(b[36:], p.ExpDataSN)
	return nil
}

func (p *TaskMgmtRequest) Decode(b []byte) error {
	imm, err := parse(b, OpTaskMgmtReq, &p.Lengths)
	if err != nil {
		return err
	}
	p.Immediate = imm
	p.Function = TMFunction(b[1] & 0x7f)
	p.LUN = be.Uint64(b[8:])
	p.ITT = be.Uint32(b[16:])
	p.ReferencedTaskTag = be.Uint32(b[20:])
	p.CmdSN = be.Uint32(b[24:])
	p.ExpStatSN = be.Uint32(b[28:])
	p.RefCmdSN = be.Uint32(b[32:])
	p.ExpDataSN = be.Uint32(b[36:])
	return nil
}

// loginFlags packs T, C, CSG and NSG (byte 1 of Login Request/Response).
func loginFlags(op Opcode, transit, cont bool, csg, nsg Stage) (byte, error) {
	// NSG is reserved unless T is set (RFC 7143 11.12.3), so only a
	// transiting PDU may not name the reserved stage 2.
	if csg > 3 || csg == 2 || nsg > 3 || transit && nsg == 2 {
		return 0, invalid(op, "CSG/NSG", "reserved stage (CSG %d, NSG %d)", csg, nsg)
	}
	if transit && cont {
		// RFC 7143 11.12.2: T and C must not both be 1.
		return 0, invalid(op, "T/C", "Transit and Continue both set")
	}
	f := byte(csg)<<2 | byte(nsg)
	if transit {
		f |= 0x80
	}
	if cont {
		f |= 0x40
	}
	return f, nil
}

func parseLoginFlags(op Opcode, f byte) (transit, cont bool, csg, nsg Stage, err error) {
	transit, cont = f&0x80 != 0, f&0x40 != 0
	csg, nsg = Stage(f>>2&3), Stage(f&3)
	if csg == 2 || (transit && nsg == 2) {
		err = invalid(op, "CSG/NSG", "reserved stage (CSG %d, NSG %d)", csg, nsg)
	} else if transit && cont {
		err = invalid(op, "T/C", "Transit and Continue both set")
	}
	return
}

// ISID is the 6-byte initiator part of the session ID (RFC 7143 11.12.5).
type ISID [6]byte

// LoginRequest (opcode 0x03, RFC 7143 11.12). The I bit is always 1.
type LoginRequest struct {
	Lengths
	Transit    bool  // T
	Continue   bool  // C: the text continues in the next PDU
	CSG, NSG   Stage // NSG is meaningful only with Transit
	VersionMax uint8
	VersionMin uint8
	ISID       ISID
	TSIH       uint16 // 0 for a new session
	ITT        uint32
	CID        uint16
	CmdSN      uint32
	ExpStatSN  uint32
}

func (*LoginRequest) Opcode() Opcode { return OpLoginReq }

func (p *LoginRequest) Encode(b []byte) error {
	f, err := loginFlags(OpLoginReq, p.Transit, p.Continue, p.CSG, p.NSG)
	if err != nil {
		return err
	}
	if err := begin(b, OpLoginReq, true, f, &p.Lengths); err != nil {
		return err
	}
	b[2], b[3] = p.VersionMax, p.VersionMin
	copy(b[8:14], p.ISID[:])
	be.PutUint16(b[14:], p.TSIH)
	be.PutUint32(b[16:], p.ITT)
	be.PutUint16(b[20:], p.CID)
	be.PutUint32(b[24:], p.CmdSN)
	be.PutUint32(b[28:], p.ExpStatSN)
	return nil
}

func (p *LoginRequest) Decode(b []byte) error {
	if _, err := parse(b, OpLoginReq, &p.Lengths); err != nil {
		return err
	}
	var err error
	if p.Transit, p.Continue, p.CSG, p.NSG, err = parseLoginFlags(OpLoginReq, b[1]); err != nil {
		return err
	}
	p.VersionMax, p.VersionMin = b[2], b[3]
	copy(p.ISID[:], b[8:14])
	p.TSIH = be.Uint16(b[14:])
	p.ITT = be.Uint32(b[16:])
	p.CID = be.Uint16(b[20:])
	p.CmdSN = be.Uint32(b[24:])
	p.ExpStatSN = be.Uint32(b[28:])
	return nil
}

// TextRequest (opcode 0x04, RFC 7143 11.10).
type TextRequest struct {
	Lengths
	Immediate bool
	Final     bool // F
	Continue  bool // C
	LUN       uint64
	ITT       uint32
	TTT       uint32 // ReservedTag on a new exchange
	CmdSN     uint32
	ExpStatSN uint32
}

func (*TextRequest) Opcode() Opcode { return OpTextReq }

func textFlags(op Opcode, final, cont bool) (byte, error) {
	if final && cont {
		return 0, invalid(op, "F/C", "Final and Continue both set")
	}
	var f byte
	if final {
		f |= finalBit
	}
	if cont {
		f |= continueBit
	}
	return f, nil
}

func (p *TextRequest) Encode(b []byte) error {
	f, err := textFlags(OpTextReq, p.Final, p.Continue)
	if err != nil {
		return err
	}
	if err := begin(b, OpTextReq, p.Immediate, f, &p.Lengths); err != nil {
		return err
	}
	be.PutUint64(b[8:], p.LUN)
	be.PutUint32(b[16:], p.ITT)
	be.PutUint32(b[20:], p.TTT)
	be.PutUint32(b[24:], p.CmdSN)
	be.PutUint32(b[28:], p.ExpStatSN)
	return nil
}

func (p *TextRequest) Decode(b []byte) error {
	imm, err := parse(b, OpTextReq, &p.Lengths)
	if err != nil {
		return err
	}
	p.Immediate = imm
	p.Final, p.Continue = b[1]&finalBit != 0, b[1]&continueBit != 0
	if p.Final && p.Continue {
		return invalid(OpTextReq, "F/C", "Final and Continue both set")
	}
	p.LUN = be.Uint64(b[8:])
	p.ITT = be.Uint32(b[16:])
	p.TTT = be.Uint32(b[20:])
	p.CmdSN = be.Uint32(b[24:])
	p.ExpStatSN = be.Uint32(b[28:])
	return nil
}

// DataOut (opcode 0x05, RFC 7143 11.7): SCSI Data-Out.
type DataOut struct {
	Lengths
	Final        bool
	LUN          uint64
	ITT          uint32
	TTT          uint32 // from the R2T, ReservedTag for unsolicited data
	ExpStatSN    uint32
	DataSN       uint32
	BufferOffset uint32
}

func (*DataOut) Opcode() Opcode { return OpSCSIDataOut }

func (p *DataOut) Encode(b []byte) error {
	var f byte
	if p.Final {
		f = finalBit
	}
	if err := begin(b, OpSCSIDataOut, false, f, &p.Lengths); err != nil {
		return err
	}
	be.PutUint64(b[8:], p.LUN)
	be.PutUint32(b[16:], p.ITT)
	be.PutUint32(b[20:], p.TTT)
	be.PutUint32(b[28:], p.ExpStatSN)
	be.PutUint32(b[36:], p.DataSN)
	be.PutUint32(b[40:], p.BufferOffset)
	return nil
}

func (p *DataOut) Decode(b []byte) error {
	if _, err := parse(b, OpSCSIDataOut, &p.Lengths); err != nil {
		return err
	}
	p.Final = b[1]&finalBit != 0
	p.LUN = be.Uint64(b[8:])
	p.ITT = be.Uint32(b[16:])
	p.TTT = be.Uint32(b[20:])
	p.ExpStatSN = be.Uint32(b[28:])
	p.DataSN = be.Uint32(b[36:])
	p.BufferOffset = be.Uint32(b[40:])
	return nil
}

// LogoutRequest (opcode 0x06, RFC 7143 11.14).
type LogoutRequest struct {
	Lengths
	Immediate bool
	Reason    LogoutReason
	ITT       uint32
	CID       uint16
	CmdSN     uint32
	ExpStatSN uint32
}

func (*LogoutRequest) Opcode() Opcode { return OpLogoutReq }

func (p *LogoutRequest) Encode(b []byte) error {
	if p.Reason > 0x7f {
		return invalid(OpLogoutReq, "Reason Code", "%d does not fit 7 bits", p.Reason)
	}
	if err := begin(b, OpLogoutReq, p.Immediate, finalBit|byte(p.Reason), &p.Lengths); err != nil {
		return err
	}
	be.PutUint32(b[16:], p.ITT)
	be.PutUint16(b[20:], p.CID)
	be.PutUint32(b[24:], p.CmdSN)
	be.PutUint32(b[28:], p.ExpStatSN)
	return nil
}

func (p *LogoutRequest) Decode(b []byte) error {
	imm, err := parse(b, OpLogoutReq, &p.Lengths)
	if err != nil {
		return err
	}
	p.Immediate = imm
	p.Reason = LogoutReason(b[1] & 0x7f)
	p.ITT = be.Uint32(b[16:])
	p.CID = be.Uint16(b[20:])
	p.CmdSN = be.Uint32(b[24:])
	p.ExpStatSN = be.Uint32(b[28:])
	return nil
}

// SNACKRequest (opcode 0x10, RFC 7143 11.16).
type SNACKRequest struct {
	Lengths
	Type      SNACKType
	LUN       uint64
	ITT       uint32
	TTT       uint32
	ExpStatSN uint32
	BegRun    uint32
	RunLength uint32
}

func (*SNACKRequest) Opcode() Opcode { return OpSNACKReq }

func (p *SNACKRequest) Encode(b []byte) error {
	if p.Type > 0x0f {
		return invalid(OpSNACKReq, "Type", "%d does not fit 4 bits", p.Type)
	}
	if err := begin(b, OpSNACKReq, false, finalBit|byte(p.Type), &p.Lengths); err != nil {
		return err
	}
	be.PutUint64(b[8:], p.LUN)
	be.PutUint32(b[16:], p.ITT)
	be.PutUint32(b[20:], p.TTT)
	be.PutUint32(b[28:], p.ExpStatSN)
	be.PutUint32(b[40:], p.BegRun)
	be.PutUint32(b[44:], p.RunLength)
	return nil
}

func (p *SNACKRequest) Decode(b []byte) error {
	if _, err := parse(b, OpSNACKReq, &p.Lengths); err != nil {
		return err
	}
	p.Type = SNACKType(b[1] & 0x0f)
	p.LUN = be.Uint64(b[8:])
	p.ITT = be.Uint32(b[16:])
	p.TTT = be.Uint32(b[20:])
	p.ExpStatSN = be.Uint32(b[28:])
	p.BegRun = be.Uint32(b[40:])
	p.RunLength = be.Uint32(b[44:])
	return nil
}

// StatusSNs are the sequence numbers every target PDU with a status carries.
type StatusSNs struct {
	StatSN   uint32
	ExpCmdSN uint32
	MaxCmdSN uint32
}

func (s *StatusSNs) put(b []byte) {
	be.PutUint32(b[24:], s.StatSN)
	be.PutUint32(b[28:], s.ExpCmdSN)
	be.PutUint32(b[32:], s.MaxCmdSN)
}

func (s *StatusSNs) get(b []byte) {
	s.StatSN = be.Uint32(b[24:])
	s.ExpCmdSN = be.Uint32(b[28:])
	s.MaxCmdSN = be.Uint32(b[32:])
}

// NOPIn (opcode 0x20, RFC 7143 11.19).
type NOPIn struct {
	Lengths
	StatusSNs
	LUN uint64
	ITT uint32 // ReservedTag for a target-initiated ping
	TTT uint32 // ReservedTag when no reply is wanted
}

func (*NOPIn) Opcode() Opcode { return OpNOPIn }

func (p *NOPIn) Encode(b []byte) error {
	if err := begin(b, OpNOPIn, false, finalBit, &p.Lengths); err != nil {
		return err
	}
	be.PutUint64(b[8:], p.LUN)
	be.PutUint32(b[16:], p.ITT)
	be.PutUint32(b[20:], p.TTT)
	p.StatusSNs.put(b)
	return nil
}

func (p *NOPIn) Decode(b []byte) error {
	if _, err := parse(b, OpNOPIn, &p.Lengths); err != nil {
		return err
	}
	p.LUN = be.Uint64(b[8:])
	p.ITT = be.Uint32(b[16:])
	p.TTT = be.Uint32(b[20:])
	p.StatusSNs.get(b)
	return nil
}

// SCSIResponse (opcode 0x21, RFC 7143 11.4). The data segment carries the
// sense data prefixed by its 2-byte length (SenseData helps).
type SCSIResponse struct {
	Lengths
	StatusSNs
	BidiReadOverflow      bool // o
	BidiReadUnderflow     bool // u
	Overflow              bool // O
	Underflow             bool // U
	Response              ServiceResponse
	Status                SCSIStatus
	ITT                   uint32
	SNACKTag              uint32
	ExpDataSN             uint32
	BidiReadResidualCount uint32
	ResidualCount         uint32
}

func (*SCSIResponse) Opcode() Opcode { return OpSCSIResponse }

func (p *SCSIResponse) Encode(b []byte) error {
	if p.Overflow && p.Underflow || p.BidiReadOverflow && p.BidiReadUnderflow {
		// RFC 7143 11.4.5.1: O and U (o and u) are mutually exclusive.
		return invalid(OpSCSIResponse, "O/U", "overflow and underflow both set")
	}
	f := finalBit
	if p.BidiReadOverflow {
		f |= 0x10
	}
	if p.BidiReadUnderflow {
		f |= 0x08
	}
	if p.Overflow {
		f |= 0x04
	}
	if p.Underflow {
		f |= 0x02
	}
	if err := begin(b, OpSCSIResponse, false, f, &p.Lengths); err != nil {
		return err
	}
	b[2], b[3] = byte(p.Response), byte(p.Status)
	be.PutUint32(b[16:], p.ITT)
	be.PutUint32(b[20:], p.SNACKTag)
	p.StatusSNs.put(b)
	be.PutUint32(b[36:], p.ExpDataSN)
	be.PutUint32(b[40:], p.BidiReadResidualCount)
	be.PutUint32(b[44:], p.ResidualCount)
	return nil
}

func (p *SCSIResponse) Decode(b []byte) error {
	if _, err := parse(b, OpSCSIResponse, &p.Lengths); err != nil {
		return err
	}
	p.BidiReadOverflow = b[1]&0x10 != 0
	p.BidiReadUnderflow = b[1]&0x08 != 0
	p.Overflow = b[1]&0x04 != 0
	p.Underflow = b[1]&0x02 != 0
	if p.Overflow && p.Underflow || p.BidiReadOverflow && p.BidiReadUnderflow {
		return invalid(OpSCSIResponse, "O/U", "overflow and underflow both set")
	}
	p.Response, p.Status = ServiceResponse(b[2]), SCSIStatus(b[3])
	p.ITT = be.Uint32(b[16:])
	p.SNACKTag = be.Uint32(b[20:])
	p.StatusSNs.get(b)
	p.ExpDataSN = be.Uint32(b[36:])
	p.BidiReadResidualCount = be.Uint32(b[40:])
	p.ResidualCount = be.Uint32(b[44:])
	return nil
}

// TaskMgmtResponse (opcode 0x22, RFC 7143 11.6).
type TaskMgmtResponse struct {
	Lengths
	StatusSNs
	Response TMFResponse
	ITT      uint32
}

func (*TaskMgmtResponse) Opcode() Opcode { return OpTaskMgmtResp }

func (p *TaskMgmtResponse) Encode(b []byte) error {
	if err := begin(b, OpTaskMgmtResp, false, finalBit, &p.Lengths); err != nil {
		return err
	}
	b[2] = byte(p.Response)
	be.PutUint32(b[16:], p.ITT)
	p.StatusSNs.put(b)
	return nil
}

func (p *TaskMgmtResponse) Decode(b []byte) error {
	if _, err := parse(b, OpTaskMgmtResp, &p.Lengths); err != nil {
		return err
	}
	p.Response = TMFResponse(b[2])
	p.ITT = be.Uint32(b[16:])
	p.StatusSNs.get(b)
	return nil
}

// LoginResponse (opcode 0x23, RFC 7143 11.13).
type LoginResponse struct {
	Lengths
	StatusSNs
	Transit       bool
	Continue      bool
	CSG, NSG      Stage
	VersionMax    uint8
	VersionActive uint8
	ISID          ISID
	TSIH          uint16
	ITT           uint32
	Status        LoginStatus
}

func (*LoginResponse) Opcode() Opcode { return OpLoginResp }

func (p *LoginResponse) Encode(b []byte) error {
	f, err := loginFlags(OpLoginResp, p.Transit, p.Continue, p.CSG, p.NSG)
	if err != nil {
		return err
	}
	if err := begin(b, OpLoginResp, false, f, &p.Lengths); err != nil {
		return err
	}
	b[2], b[3] = p.VersionMax, p.VersionActive
	copy(b[8:14], p.ISID[:])
	be.PutUint16(b[14:], p.TSIH)
	be.PutUint32(b[16:], p.ITT)
	p.StatusSNs.put(b)
	b[36], b[37] = p.Status.Class(), p.Status.Detail()
	return nil
}

func (p *LoginResponse) Decode(b []byte) error {
	if _, err := parse(b, OpLoginResp, &p.Lengths); err != nil {
		return err
	}
	var err error
	if p.Transit, p.Continue, p.CSG, p.NSG, err = parseLoginFlags(OpLoginResp, b[1]); err != nil {
		return err
	}
	p.VersionMax, p.VersionActive = b[2], b[3]
	copy(p.ISID[:], b[8:14])
	p.TSIH = be.Uint16(b[14:])
	p.ITT = be.Uint32(b[16:])
	p.StatusSNs.get(b)
	p.Status = LoginStatus(b[36])<<8 | LoginStatus(b[37])
	return nil
}

// TextResponse (opcode 0x24, RFC 7143 11.11).
type TextResponse struct {
	Lengths
	StatusSNs
	Final    bool
	Continue bool
	LUN      uint64
	ITT      uint32
	TTT      uint32 // ReservedTag when the exchange is complete
}

func (*TextResponse) Opcode() Opcode { return OpTextResp }

func (p *TextResponse) Encode(b []byte) error {
	f, err := textFlags(OpTextResp, p.Final, p.Continue)
	if err != nil {
		return err
	}
	if err := begin(b, OpTextResp, false, f, &p.Lengths); err != nil {
		return err
	}
	be.PutUint64(b[8:], p.LUN)
	be.PutUint32(b[16:], p.ITT)
	be.PutUint32(b[20:], p.TTT)
	p.StatusSNs.put(b)
	return nil
}

func (p *TextResponse) Decode(b []byte) error {
	if _, err := parse(b, OpTextResp, &p.Lengths); err != nil {
		return err
	}
	p.Final, p.Continue = b[1]&finalBit != 0, b[1]&continueBit != 0
	if p.Final && p.Continue {
		return invalid(OpTextResp, "F/C", "Final and Continue both set")
	}
	p.LUN = be.Uint64(b[8:])
	p.ITT = be.Uint32(b[16:])
	p.TTT = be.Uint32(b[20:])
	p.StatusSNs.get(b)
	return nil
}

// DataIn (opcode 0x25, RFC 7143 11.7): SCSI Data-In, optionally carrying
// the command's status (S bit, "status piggyback").
type DataIn struct {
	Lengths
	StatusSNs     // StatSN is meaningful only with HasStatus
	Final         bool
	Acknowledge   bool // A
	Overflow      bool // O
	Underflow     bool // U
	HasStatus     bool // S
	Status        SCSIStatus
	LUN           uint64
	ITT           uint32
	TTT           uint32
	DataSN        uint32
	BufferOffset  uint32
	ResidualCount uint32
}

func (*DataIn) Opcode() Opcode { return OpSCSIDataIn }

func (p *DataIn) Encode(b []byte) error {
	if p.HasStatus && !p.Final {
		// RFC 7143 11.7.4: S may be set only with F.
		return invalid(OpSCSIDataIn, "S", "status without the F bit")
	}
	if p.Overflow && p.Underflow {
		return invalid(OpSCSIDataIn, "O/U", "overflow and underflow both set")
	}
	var f byte
	if p.Final {
		f |= finalBit
	}
	if p.Acknowledge {
		f |= 0x40
	}
	if p.Overflow {
		f |= 0x04
	}
	if p.Underflow {
		f |= 0x02
	}
	if p.HasStatus {
		f |= 0x01
	}
	if err := begin(b, OpSCSIDataIn, false, f, &p.Lengths); err != nil {
		return err
	}
	if p.HasStatus {
		b[3] = byte(p.Status)
	}
	be.PutUint64(b[8:], p.LUN)
	be.PutUint32(b[16:], p.ITT)
	be.PutUint32(b[20:], p.TTT)
	p.StatusSNs.put(b)
	be.PutUint32(b[36:], p.DataSN)
	be.PutUint32(b[40:], p.BufferOffset)
	be.PutUint32(b[44:], p.ResidualCount)
	return nil
}

func (p *DataIn) Decode(b []byte) error {
	if _, err := parse(b, OpSCSIDataIn, &p.Lengths); err != nil {
		return err
	}
	f := b[1]
	p.Final, p.Acknowledge = f&finalBit != 0, f&0x40 != 0
	p.Overflow, p.Underflow, p.HasStatus = f&0x04 != 0, f&0x02 != 0, f&0x01 != 0
	if p.HasStatus && !p.Final {
		return invalid(OpSCSIDataIn, "S", "status without the F bit")
	}
	if p.Overflow && p.Underflow {
		return invalid(OpSCSIDataIn, "O/U", "overflow and underflow both set")
	}
	p.Status = 0
	if p.HasStatus {
		p.Status = SCSIStatus(b[3])
	}
	p.LUN = be.Uint64(b[8:])
	p.ITT = be.Uint32(b[16:])
	p.TTT = be.Uint32(b[20:])
	p.StatusSNs.get(b)
	p.DataSN = be.Uint32(b[36:])
	p.BufferOffset = be.Uint32(b[40:])
	p.ResidualCount = be.Uint32(b[44:])
	return nil
}

// LogoutResponse (opcode 0x26, RFC 7143 11.15).
type LogoutResponse struct {
	Lengths
	StatusSNs
	Response    LogoutResponseCode
	ITT         uint32
	Time2Wait   uint16
	Time2Retain uint16
}

func (*LogoutResponse) Opcode() Opcode { return OpLogoutResp }

func (p *LogoutResponse) Encode(b []byte) error {
	if err := begin(b, OpLogoutResp, false, finalBit, &p.Lengths); err != nil {
		return err
	}
	b[2] = byte(p.Response)
	be.PutUint32(b[16:], p.ITT)
	p.StatusSNs.put(b)
	be.PutUint16(b[40:], p.Time2Wait)
	be.PutUint16(b[42:], p.Time2Retain)
	return nil
}

func (p *LogoutResponse) Decode(b []byte) error {
	if _, err := parse(b, OpLogoutResp, &p.Lengths); err != nil {
		return err
	}
	p.Response = LogoutResponseCode(b[2])
	p.ITT = be.Uint32(b[16:])
	p.StatusSNs.get(b)
	p.Time2Wait = be.Uint16(b[40:])
	p.Time2Retain = be.Uint16(b[42:])
	return nil
}

// R2T (opcode 0x31, RFC 7143 11.8): Ready To Transfer.
type R2T struct {
	Lengths
	StatusSNs                 // StatSN here is the next StatSN, not advanced
	LUN                       uint64
	ITT                       uint32
	TTT                       uint32
	R2TSN                     uint32
	BufferOffset              uint32
	DesiredDataTransferLength uint32
}

func (*R2T) Opcode() Opcode { return OpR2T }

func (p *R2T) Encode(b []byte) error {
	if err := begin(b, OpR2T, false, finalBit, &p.Lengths); err != nil {
		return err
	}
	be.PutUint64(b[8:], p.LUN)
	be.PutUint32(b[16:], p.ITT)
	be.PutUint32(b[20:], p.TTT)
	p.StatusSNs.put(b)
	be.PutUint32(b[36:], p.R2TSN)
	be.PutUint32(b[40:], p.BufferOffset)
	be.PutUint32(b[44:], p.DesiredDataTransferLength)
	return nil
}

func (p *R2T) Decode(b []byte) error {
	if _, err := parse(b, OpR2T, &p.Lengths); err != nil {
		return err
	}
	p.LUN = be.Uint64(b[8:])
	p.ITT = be.Uint32(b[16:])
	p.TTT = be.Uint32(b[20:])
	p.StatusSNs.get(b)
	p.R2TSN = be.Uint32(b[36:])
	p.BufferOffset = be.Uint32(b[40:])
	p.DesiredDataTransferLength = be.Uint32(b[44:])
	return nil
}

// AsyncMessage (opcode 0x32, RFC 7143 11.9). Its ITT is always ReservedTag;
// for AsyncSCSIEvent the data segment carries sense data (as in a SCSI
// Response) reporting e.g. CAPACITY DATA HAS CHANGED.
type AsyncMessage struct {
	Lengths
	StatusSNs
	LUN        uint64
	AsyncEvent AsyncEvent
	AsyncVCode uint8
	Parameter1 uint16
	Parameter2 uint16
	Parameter3 uint16
}

func (*AsyncMessage) Opcode() Opcode { return OpAsyncMessage }

func (p *AsyncMessage) Encode(b []byte) error {
	if err := begin(b, OpAsyncMessage, false, finalBit, &p.Lengths); err != nil {
		return err
	}
	be.PutUint64(b[8:], p.LUN)
	be.PutUint32(b[16:], ReservedTag)
	p.StatusSNs.put(b)
	b[36], b[37] = byte(p.AsyncEvent), p.AsyncVCode
	be.PutUint16(b[38:], p.Parameter1)
	be.PutUint16(b[40:], p.Parameter2)
	be.PutUint16(b[42:], p.Parameter3)
	return nil
}

func (p *AsyncMessage) Decode(b []byte) error {
	if _, err := parse(b, OpAsyncMessage, &p.Lengths); err != nil {
		return err
	}
	p.LUN = be.Uint64(b[8:])
	p.StatusSNs.get(b)
	p.AsyncEvent, p.AsyncVCode = AsyncEvent(b[36]), b[37]
	p.Parameter1 = be.Uint16(b[38:])
	p.Parameter2 = be.Uint16(b[40:])
	p.Parameter3 = be.Uint16(b[42:])
	return nil
}

// Reject (opcode 0x3f, RFC 7143 11.17). The data segment is the complete
// BHS of the rejected PDU.
type Reject struct {
	Lengths
	StatusSNs
	Reason      RejectReason
	DataSNR2TSN uint32 // for RejectSNACKReject only
}

func (*Reject) Opcode() Opcode { return OpReject }

func (p *Reject) Encode(b []byte) error {
	if err := begin(b, OpReject, false, finalBit, &p.Lengths); err != nil {
		return err
	}
	b[2] = byte(p.Reason)
	be.PutUint32(b[16:], ReservedTag)
	p.StatusSNs.put(b)
	be.PutUint32(b[36:], p.DataSNR2TSN)
	return nil
}

func (p *Reject) Decode(b []byte) error {
	if _, err := parse(b, OpReject, &p.Lengths); err != nil {
		return err
	}
	p.Reason = RejectReason(b[2])
	p.StatusSNs.get(b)
	p.DataSNR2TSN = be.Uint32(b[36:])
	return nil
}
