package scsi

import (
	"encoding/binary"
	"syscall"

	"github.com/vmsan/vmsan/internal/volrt"
)

// SCSI status codes (SAM-5).
const (
	StatusGood                = 0x00
	StatusCheckCondition      = 0x02
	StatusConditionMet        = 0x04
	StatusBusy                = 0x08
	StatusReservationConflict = 0x18
	StatusTaskSetFull         = 0x28
	StatusTaskAborted         = 0x40
)

// Sense keys (SPC-4).
const (
	KeyNoSense        = 0x0
	KeyRecoveredError = 0x1
	KeyNotReady       = 0x2
	KeyMediumError    = 0x3
	KeyHardwareError  = 0x4
	KeyIllegalRequest = 0x5
	KeyUnitAttention  = 0x6
	KeyDataProtect    = 0x7
	KeyAbortedCommand = 0xB
	KeyMiscompare     = 0xE
)

// senseInfo is one sense condition before it is encoded in fixed or
// descriptor format.
type senseInfo struct {
	key, asc, ascq uint8
	// info is the INFORMATION field (valid when hasInfo).
	info    uint64
	hasInfo bool
	// Sense-key-specific field pointer (ILLEGAL REQUEST): byte offset in
	// the CDB (cd) or parameter list (!cd), and bit (bitValid).
	sks      bool
	cd       bool
	field    uint16
	bit      uint8
	bitValid bool
}

// ASC/ASCQ pairs used in more than one place (SPC-4 annex D).
var (
	senseInvalidOpcode    = senseInfo{key: KeyIllegalRequest, asc: 0x20}
	senseLBAOutOfRange    = senseInfo{key: KeyIllegalRequest, asc: 0x21}
	senseLUNotSupported   = senseInfo{key: KeyIllegalRequest, asc: 0x25}
	senseParamLenError    = senseInfo{key: KeyIllegalRequest, asc: 0x1A}
	senseWriteProtected   = senseInfo{key: KeyDataProtect, asc: 0x27}
	senseSoftwareWP       = senseInfo{key: KeyDataProtect, asc: 0x27} // SPC-4 control page SWP: WRITE PROTECTED
	senseSpaceAllocFailed = senseInfo{key: KeyDataProtect, asc: 0x27, ascq: 0x07}
	senseReadError        = senseInfo{key: KeyMediumError, asc: 0x11}
	senseWriteError       = senseInfo{key: KeyMediumError, asc: 0x0C}
	senseInternalFailure  = senseInfo{key: KeyHardwareError, asc: 0x44}
	senseAborted          = senseInfo{key: KeyAbortedCommand}
	senseInvalidRelease   = senseInfo{key: KeyIllegalRequest, asc: 0x26, ascq: 0x04}
	senseMiscompare       = senseInfo{key: KeyMiscompare, asc: 0x1D}
	senseTransitioning    = senseInfo{key: KeyNotReady, asc: 0x04, ascq: 0x0A}
	senseStandby          = senseInfo{key: KeyNotReady, asc: 0x04, ascq: 0x0B}
	senseUnavailable      = senseInfo{key: KeyNotReady, asc: 0x04, ascq: 0x0C}
)

// invalidCDB is INVALID FIELD IN CDB (24/00) pointing at byte field, bit
// (bit < 0: no bit pointer).
func invalidCDB(field int, bit int) senseInfo {
	s := senseInfo{key: KeyIllegalRequest, asc: 0x24, sks: true, cd: true, field: uint16(field)}
	if bit >= 0 {
		s.bit, s.bitValid = uint8(bit), true
	}
	return s
}

// invalidParam is INVALID FIELD IN PARAMETER LIST (26/00) pointing at a
// byte of the parameter data (bit < 0: no bit pointer).
func invalidParam(field int, bit int) senseInfo {
	s := senseInfo{key: KeyIllegalRequest, asc: 0x26, sks: true, field: uint16(field)}
	if bit >= 0 {
		s.bit, s.bitValid = uint8(bit), true
	}
	return s
}

// maxSense is the largest sense this package produces: descriptor header
// (8) + information descriptor (12) + sense-key-specific descriptor (8).
const maxSense = 32

// encode appends s to b[:0] as fixed (0x70) or descriptor (0x72) sense.
func (s senseInfo) encode(b []byte, desc bool) []byte {
	b = b[:0]
	if desc {
		b = append(b, 0x72, s.key&0x0F, s.asc, s.ascq, 0, 0, 0, 0)
		if s.hasInfo {
			b = append(b, 0x00, 0x0A, 0x80, 0)
			b = binary.BigEndian.AppendUint64(b, s.info)
		}
		if s.sks {
			b = append(b, 0x02, 0x06, 0, 0)
			b = s.appendSKS(b)
			b = append(b, 0)
		}
		b[7] = byte(len(b) - 8)
		return b
	}
	b = append(b, 0x70, 0, s.key&0x0F, 0, 0, 0, 0, 10, 0, 0, 0, 0, s.asc, s.ascq, 0)
	if s.hasInfo {
		// Fixed format holds 32 bits; VALID says the field is meaningful,
		// so a larger value is left invalid (descriptor format holds it).
		if s.info <= 0xFFFFFFFF {
			b[0] |= 0x80
			binary.BigEndian.PutUint32(b[3:7], uint32(s.info))
		}
	}
	if s.sks {
		b = s.appendSKS(b)
	} else {
		b = append(b, 0, 0, 0)
	}
	return b
}

func (s senseInfo) appendSKS(b []byte) []byte {
	v := byte(0x80) // SKSV
	if s.cd {
		v |= 0x40
	}
	if s.bitValid {
		v |= 0x08 | s.bit&7
	}
	return append(b, v, byte(s.field>>8), byte(s.field))
}

// errSense maps an engine error (via volrt.Errno) onto sense data: write
// says whether the failed request wrote (WRITE ERROR vs UNRECOVERED READ
// ERROR for EIO).
func errSense(err error, write bool) senseInfo {
	switch volrt.Errno(err) {
	case syscall.ENOSPC:
		return senseSpaceAllocFailed
	case syscall.EPERM:
		return senseWriteProtected
	case syscall.EINVAL:
		return senseLBAOutOfRange
	case syscall.ENOMEM:
		// The initiator retries an ABORTED COMMAND.
		return senseAborted
	case syscall.ESHUTDOWN:
		return senseInfo{key: KeyNotReady, asc: 0x04, ascq: 0x00}
	case syscall.EOPNOTSUPP:
		return senseInternalFailure
	}
	if write {
		return senseWriteError
	}
	return senseReadError
}
