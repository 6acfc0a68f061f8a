// Package pdu is the iSCSI PDU codec (RFC 7143 chapter 11): spec constants
// with their RFC names, one typed struct per opcode with Encode/Decode over
// the 48-byte Basic Header Segment, AHS helpers, CRC32C digests, serial
// number arithmetic for CmdSN/StatSN, and a Reader that frames PDUs from a
// byte stream with lengths checked before allocation.
//
// Simplest use, a target reading a PDU and answering a NOP-Out:
//
//	r := pdu.Reader{R: bufio.NewReader(conn), MaxData: 8192}
//	f, err := r.Read() // errors.Is(err, pdu.ErrTooLong) for oversized segments
//	if nop, ok := f.Header.(*pdu.NOPOut); ok {
//		out, _ = pdu.AppendPDU(out[:0], &pdu.NOPIn{ITT: nop.ITT, TTT: pdu.ReservedTag,
//			StatusSNs: sns}, nil, f.Data, pdu.Digests{})
//	}
//
// Decode/Encode never allocate and never do I/O; only Reader touches an
// io.Reader. Errors wrap ErrShort, ErrTooLong, ErrUnknownOpcode, ErrInvalid
// or ErrDigest; *FieldError and *DigestError carry the Reject reason the
// RFC prescribes, so the session layer can answer without re-deriving it.
// Text key=value data segments are package text's job, CHAP is package
// chap's.
//
// Concurrency: the package has no mutable state; a Reader belongs to one
// goroutine.
package pdu
