package pdu

import (
	"errors"
	"fmt"
)

// Codec errors. Functions wrap these with detail; match with errors.Is.
var (
	// ErrShort means a buffer is shorter than the structure it should hold.
	ErrShort = errors.New("iscsi: short buffer")
	// ErrTooLong means a declared length (TotalAHSLength,
	// DataSegmentLength, AHSLength) exceeds the caller's or the RFC's
	// bound; nothing was allocated for it.
	ErrTooLong = errors.New("iscsi: length exceeds limit")
	// ErrUnknownOpcode means byte 0 names no PDU RFC 7143 defines
	// (vendor-specific opcodes included). Whether a known opcode may come
	// from the peer's side is Opcode.FromInitiator's question.
	ErrUnknownOpcode = errors.New("iscsi: unknown opcode")
	// ErrInvalid means a PDU is well-framed but a field breaks a rule of
	// RFC 7143 (reserved stage, F bit missing where it is mandatory...).
	ErrInvalid = errors.New("iscsi: invalid PDU field")
	// ErrDigest means a CRC32C header or data digest did not match; the
	// error is a *DigestError.
	ErrDigest = errors.New("iscsi: digest mismatch")
)

// DigestError reports a CRC32C mismatch. RFC 7143 7.8 prescribes the
// answers: a header digest error means the PDU cannot be trusted at all (at
// ErrorRecoveryLevel 0 the connection is dropped); a data digest error on a
// PDU the target received is answered with a Reject whose reason is
// RejectDataDigestError and the PDU's data is discarded.
type DigestError struct {
	Header    bool   // true: HeaderDigest, false: DataDigest
	Got, Want uint32 // received and computed CRC32C
}

func (e *DigestError) Error() string {
	k := "DataDigest"
	if e.Header {
		k = "HeaderDigest"
	}
	return fmt.Sprintf("iscsi: %s mismatch: received 0x%08x, computed 0x%08x", k, e.Got, e.Want)
}

// Unwrap makes errors.Is(err, ErrDigest) true.
func (e *DigestError) Unwrap() error { return ErrDigest }

// RejectReason returns the Reject reason the target sends for this error
// (only meaningful for data digests; a header digest error has no Reject).
func (e *DigestError) RejectReason() RejectReason { return RejectDataDigestError }

// FieldError names the PDU and field that broke a rule, and the Reject
// reason RFC 7143 gives for it, so a target can answer without re-deriving
// it.
type FieldError struct {
	Op     Opcode
	Field  string
	Reason RejectReason
	Msg    string
	Err    error // ErrInvalid, ErrTooLong or ErrUnknownOpcode
}

func (e *FieldError) Error() string {
	return fmt.Sprintf("iscsi: %s: %s: %s", e.Op, e.Field, e.Msg)
}

func (e *FieldError) Unwrap() error { return e.Err }

func invalid(op Opcode, field, format string, a ...any) error {
	return &FieldError{Op: op, Field: field, Reason: RejectInvalidPDUField, Msg: fmt.Sprintf(format, a...), Err: ErrInvalid}
}

func tooLong(op Opcode, field string, got, limit int) error {
	return &FieldError{Op: op, Field: field, Reason: RejectProtocolError,
		Msg: fmt.Sprintf("%d bytes exceeds limit %d", got, limit), Err: ErrTooLong}
}

func short(what string, got, want int) error {
	return fmt.Errorf("%w: %s needs %d bytes, have %d", ErrShort, what, want, got)
}
