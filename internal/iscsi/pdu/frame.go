package pdu

import (
	"fmt"
	"hash/crc32"
	"io"
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// CRC32C returns the iSCSI digest of b (RFC 7143 13.1: CRC32C, the
// Castagnoli polynomial, as hash/crc32 computes it).
func CRC32C(b []byte) uint32 { return crc32.Checksum(b, castagnoli) }

// The digest goes on the wire least significant byte first (RFC 7143
// Appendix B.4's examples: 32 zero bytes give aa 36 91 8a); libiscsi
// and the Linux initiator agree, and the captured vectors check it.
func putDigest(b []byte, v uint32) {
	b[0], b[1], b[2], b[3] = byte(v), byte(v>>8), byte(v>>16), byte(v>>24)
}

func getDigest(b []byte) uint32 {
	return uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24
}

// Pad returns the number of zero bytes that pad n to a 4-byte boundary.
func Pad(n int) int { return -n & 3 }

// Digests says which CRC32C digests the connection negotiated
// (HeaderDigest / DataDigest = CRC32C). They apply only after login.
type Digests struct {
	Header bool
	Data   bool
}

// AppendPDU appends one complete PDU to dst: the BHS of h (whose
// TotalAHSLength and DataSegmentLength it sets from ahs and data), the AHS
// area, the header digest, the data segment padded to 4 bytes and the data
// digest, as d asks.
//
// REQUIRES: len(ahs) is a multiple of 4 (AppendAHS produces such areas).
func AppendPDU(dst []byte, h PDU, ahs, data []byte, d Digests) ([]byte, error) {
	if len(ahs)%4 != 0 || len(ahs) > MaxTotalAHSLength {
		return dst, &FieldError{Op: h.Opcode(), Field: "TotalAHSLength", Reason: RejectProtocolError,
			Msg: fmt.Sprintf("AHS area of %d bytes is not a multiple of 4 up to %d", len(ahs), MaxTotalAHSLength), Err: ErrTooLong}
	}
	if len(data) > MaxDataSegmentLength {
		return dst, tooLong(h.Opcode(), "DataSegmentLength", len(data), MaxDataSegmentLength)
	}
	l := h.Framing()
	l.TotalAHSLength = uint8(len(ahs) / 4)
	l.DataSegmentLength = uint32(len(data))
	start := len(dst)
	dst = append(dst, make([]byte, BHSLen)...)
	if err := h.Encode(dst[start:]); err != nil {
		return dst[:start], err
	}
	dst = append(dst, ahs...)
	if d.Header {
		var dg [DigestLen]byte
		putDigest(dg[:], CRC32C(dst[start:]))
		dst = append(dst, dg[:]...)
	}
	if len(data) > 0 {
		ds := len(dst)
		dst = append(dst, data...)
		dst = append(dst, make([]byte, Pad(len(data)))...)
		if d.Data {
			var dg [DigestLen]byte
			putDigest(dg[:], CRC32C(dst[ds:]))
			dst = append(dst, dg[:]...)
		}
	}
	return dst, nil
}

// Frame is one PDU as read from the wire.
type Frame struct {
	Header PDU
	BHS    [BHSLen]byte // the raw BHS (a Reject quotes it)
	AHS    []byte       // the AHS area, padding included (ParseAHS splits it)
	Data   []byte       // the data segment without padding or digest
}

// Reader reads PDUs from a byte stream, checking every declared length
// against its limits before allocating anything for it.
//
// Simplest use (a target during login, where MaxRecvDataSegmentLength is
// still the default 8192):
//
//	r := pdu.Reader{R: bufio.NewReader(conn), MaxData: 8192}
//	f, err := r.Read()
//
// A Reader is not safe for concurrent use; one goroutine per connection
// reads.
type Reader struct {
	R io.Reader
	// MaxData bounds DataSegmentLength: the MaxRecvDataSegmentLength this
	// side declared. 0 means the RFC's default, 8192. A larger declared
	// length fails with ErrTooLong before anything is allocated.
	MaxData int
	// MaxAHS bounds the AHS area in bytes; 0 means the field's own limit
	// (1020 bytes), which is small enough to allocate.
	MaxAHS int
	// Digests to expect after the header and the data segment.
	Digests Digests
	// DataBuffer (optional) chooses where the data segment of a decoded
	// PDU is read: it returns a slice of length n (then Frame.Data is
	// that slice), or nil for a fresh allocation. A target reads write
	// data straight into the command's buffer this way, with no copy and
	// no allocation per PDU. It runs on the reading goroutine, after the
	// lengths were checked against MaxData, and is not called for a PDU
	// that failed to decode.
	DataBuffer func(h PDU, n int) []byte

	hdr  [BHSLen + MaxTotalAHSLength + DigestLen]byte
	tail [3 + DigestLen]byte // padding and data digest
}

// DefaultMaxRecvDataSegmentLength is the RFC's default
// MaxRecvDataSegmentLength, and the bound a Reader uses when MaxData is 0.
const DefaultMaxRecvDataSegmentLength = 8192

// Read reads one PDU. Errors: io.EOF on a clean end before a BHS,
// io.ErrUnexpectedEOF mid-PDU, ErrTooLong for lengths over the limits,
// *DigestError for a mismatching digest (for a data digest the whole PDU
// has been consumed and Frame.Header is valid, so the target can send its
// Reject and continue), ErrUnknownOpcode / ErrInvalid from Decode (the PDU
// has been consumed; Frame.BHS is set).
func (r *Reader) Read() (Frame, error) {
	var f Frame
	if _, err := io.ReadFull(r.R, r.hdr[:BHSLen]); err != nil {
		return f, err
	}
	copy(f.BHS[:], r.hdr[:BHSLen])
	op, l, _ := PeekLengths(f.BHS[:])
	maxAHS := r.MaxAHS
	if maxAHS <= 0 || maxAHS > MaxTotalAHSLength {
		maxAHS = MaxTotalAHSLength
	}
	ahsLen := int(l.TotalAHSLength) * 4
	if ahsLen > maxAHS {
		return f, tooLong(op, "TotalAHSLength", ahsLen, maxAHS)
	}
	maxData := r.MaxData
	if maxData <= 0 {
		maxData = DefaultMaxRecvDataSegmentLength
	}
	// INVARIANT: nothing below allocates more than maxData+7 bytes, and
	// only after this check.
	if int(l.DataSegmentLength) > maxData {
		return f, tooLong(op, "DataSegmentLength", int(l.DataSegmentLength), maxData)
	}
	n := BHSLen + ahsLen
	if r.Digests.Header {
		n += DigestLen
	}
	if _, err := io.ReadFull(r.R, r.hdr[BHSLen:n]); err != nil {
		return f, unexpected(err)
	}
	if ahsLen > 0 {
		f.AHS = append([]byte(nil), r.hdr[BHSLen:BHSLen+ahsLen]...)
	}
	if r.Digests.Header {
		got, want := getDigest(r.hdr[n-DigestLen:n]), CRC32C(r.hdr[:n-DigestLen])
		if got != want {
			return f, &DigestError{Header: true, Got: got, Want: want}
		}
	}
	// Decoded before the data segment is read, so that DataBuffer sees
	// the header; a PDU that fails to decode is still consumed whole.
	// From r.hdr, not f.BHS: Decode's interface call would move f to
	// the heap (no PDU keeps a slice of the bytes it decodes).
	h, herr := Decode(r.hdr[:BHSLen])
	dl := int(l.DataSegmentLength)
	var derr error
	if dl > 0 {
		var buf []byte
		if herr == nil && r.DataBuffer != nil {
			if b := r.DataBuffer(h, dl); len(b) == dl {
				buf = b
			}
		}
		if buf == nil {
			buf = make([]byte, dl)
		}
		tail := r.tail[:Pad(dl)]
		if r.Digests.Data {
			tail = r.tail[:Pad(dl)+DigestLen]
		}
		if _, err := io.ReadFull(r.R, buf); err != nil {
			return f, unexpected(err)
		}
		if len(tail) > 0 {
			if _, err := io.ReadFull(r.R, tail); err != nil {
				return f, unexpected(err)
			}
		}
		if r.Digests.Data {
			p := Pad(dl)
			want := crc32.Update(crc32.Update(0, castagnoli, buf), castagnoli, tail[:p])
			if got := getDigest(tail[p:]); got != want {
				derr = &DigestError{Got: got, Want: want}
			}
		}
		f.Data = buf[:dl:dl]
	}
	if herr != nil {
		return f, herr
	}
	f.Header = h
	return f, derr
}

func unexpected(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// AHS is one Additional Header Segment.
type AHS struct {
	Type AHSType
	// Specific is the AHS-specific bytes: for AHSExtendedCDB a reserved
	// byte followed by CDB bytes 16.., for AHSBidiReadLength a reserved
	// byte followed by the 4-byte length.
	Specific []byte
}

// ParseAHS splits an AHS area (Frame.AHS) into its segments. The returned
// slices alias area.
func ParseAHS(area []byte) ([]AHS, error) {
	var out []AHS
	for len(area) > 0 {
		if len(area) < 4 {
			return nil, short("AHS", len(area), 4)
		}
		n := int(be.Uint16(area))
		if 3+n > len(area) {
			return nil, &FieldError{Op: OpSCSICommand, Field: "AHSLength", Reason: RejectProtocolError,
				Msg: fmt.Sprintf("%d bytes overrun the %d-byte AHS area", n, len(area)-3), Err: ErrTooLong}
		}
		if n == 0 {
			return nil, &FieldError{Op: OpSCSICommand, Field: "AHSLength", Reason: RejectProtocolError,
				Msg: "zero-length AHS", Err: ErrInvalid}
		}
		out = append(out, AHS{Type: AHSType(area[2]), Specific: area[3 : 3+n]})
		area = area[min(len(area), 3+n+Pad(3+n)):]
	}
	return out, nil
}

// AppendAHS appends one AHS, padded to 4 bytes.
func AppendAHS(dst []byte, a AHS) ([]byte, error) {
	if len(a.Specific) == 0 || len(a.Specific) > MaxTotalAHSLength-3 {
		return dst, &FieldError{Op: OpSCSICommand, Field: "AHSLength", Reason: RejectProtocolError,
			Msg: fmt.Sprintf("%d bytes", len(a.Specific)), Err: ErrTooLong}
	}
	dst = be.AppendUint16(dst, uint16(len(a.Specific)))
	dst = append(dst, byte(a.Type))
	dst = append(dst, a.Specific...)
	return append(dst, make([]byte, Pad(3+len(a.Specific)))...), nil
}

// ExtendedCDB returns the AHS carrying CDB bytes 16.. of a CDB longer
// than 16 bytes (RFC 7143 11.3.5: AHSLength = CDB length - 15).
func ExtendedCDB(cdb []byte) AHS {
	if len(cdb) <= 16 {
		return AHS{Type: AHSExtendedCDB}
	}
	return AHS{Type: AHSExtendedCDB, Specific: append([]byte{0}, cdb[16:]...)}
}

// BidiReadLength returns the AHS carrying the Bidirectional Read Expected
// Data Transfer Length (RFC 7143 11.3.6).
func BidiReadLength(n uint32) AHS {
	return AHS{Type: AHSBidiReadLength, Specific: be.AppendUint32([]byte{0}, n)}
}

// FullCDB returns the command's CDB: the 16 BHS bytes followed by the
// Extended CDB AHS bytes if ahs carries one.
func FullCDB(cmd *SCSICommand, ahs []AHS) []byte {
	cdb := append([]byte(nil), cmd.CDB[:]...)
	for _, a := range ahs {
		if a.Type == AHSExtendedCDB && len(a.Specific) > 1 {
			cdb = append(cdb, a.Specific[1:]...)
		}
	}
	return cdb
}

// BidiRead returns the Bidirectional Read Expected Data Transfer Length
// from ahs, if present.
func BidiRead(ahs []AHS) (uint32, bool) {
	for _, a := range ahs {
		if a.Type == AHSBidiReadLength && len(a.Specific) == 5 {
			return be.Uint32(a.Specific[1:]), true
		}
	}
	return 0, false
}

// SenseData returns a SCSI Response data segment carrying sense: the
// 2-byte SenseLength then the sense bytes (RFC 7143 11.4.7).
func SenseData(sense []byte) []byte {
	return append(be.AppendUint16(nil, uint16(len(sense))), sense...)
}

// ParseSenseData returns the sense bytes of a SCSI Response data segment.
func ParseSenseData(data []byte) ([]byte, error) {
	if len(data) == 0 {
		return nil, nil
	}
	if len(data) < 2 {
		return nil, short("SenseLength", len(data), 2)
	}
	n := int(be.Uint16(data))
	if 2+n > len(data) {
		return nil, &FieldError{Op: OpSCSIResponse, Field: "SenseLength", Reason: RejectProtocolError,
			Msg: fmt.Sprintf("%d bytes overrun the %d-byte data segment", n, len(data)-2), Err: ErrTooLong}
	}
	return data[2 : 2+n], nil
}

// NewReject returns a Reject PDU and its data segment for a PDU the target
// refuses: the data segment is the complete BHS of the rejected PDU (RFC
// 7143 11.17). Send both with AppendPDU.
func NewReject(reason RejectReason, rejected [BHSLen]byte, sns StatusSNs) (*Reject, []byte) {
	data := rejected
	return &Reject{Reason: reason, StatusSNs: sns}, data[:]
}
