package pdu

import "strconv"

// BHSLen is the size of the Basic Header Segment that starts every PDU.
const BHSLen = 48

// DigestLen is the size of a CRC32C header or data digest.
const DigestLen = 4

// MaxDataSegmentLength is the largest value the 24-bit DataSegmentLength
// field can carry (and the RFC's upper bound for MaxRecvDataSegmentLength).
const MaxDataSegmentLength = 1<<24 - 1

// MaxTotalAHSLength is the largest AHS area the 8-bit TotalAHSLength field
// (counted in 4-byte words) can describe.
const MaxTotalAHSLength = 255 * 4

// ReservedTag is the Initiator Task Tag value 0xffffffff that the RFC
// reserves (unsolicited NOP-In, Async Message, Reject) and the Target
// Transfer Tag value meaning "no transfer tag".
const ReservedTag = 0xffffffff

// Opcode is the 6-bit PDU opcode in byte 0 of the BHS (RFC 7143 11.1.1).
type Opcode uint8

// Initiator opcodes.
const (
	OpNOPOut       Opcode = 0x00
	OpSCSICommand  Opcode = 0x01
	OpTaskMgmtReq  Opcode = 0x02
	OpLoginReq     Opcode = 0x03
	OpTextReq      Opcode = 0x04
	OpSCSIDataOut  Opcode = 0x05
	OpLogoutReq    Opcode = 0x06
	OpSNACKReq     Opcode = 0x10
	OpNOPIn        Opcode = 0x20
	OpSCSIResponse Opcode = 0x21
	OpTaskMgmtResp Opcode = 0x22
	OpLoginResp    Opcode = 0x23
	OpTextResp     Opcode = 0x24
	OpSCSIDataIn   Opcode = 0x25
	OpLogoutResp   Opcode = 0x26
	OpR2T          Opcode = 0x31
	OpAsyncMessage Opcode = 0x32
	OpReject       Opcode = 0x3f
	opcodeMask     byte   = 0x3f
	immediateBit   byte   = 0x40
	finalBit       byte   = 0x80
	continueBit    byte   = 0x40
)

// FromInitiator reports whether op is an initiator opcode (bit 5 clear).
func (op Opcode) FromInitiator() bool { return op&0x20 == 0 }

// String returns the RFC 7143 PDU name, e.g. "Login Request".
func (op Opcode) String() string {
	switch op {
	case OpNOPOut:
		return "NOP-Out"
	case OpSCSICommand:
		return "SCSI Command"
	case OpTaskMgmtReq:
		return "SCSI Task Management Function Request"
	case OpLoginReq:
		return "Login Request"
	case OpTextReq:
		return "Text Request"
	case OpSCSIDataOut:
		return "SCSI Data-Out"
	case OpLogoutReq:
		return "Logout Request"
	case OpSNACKReq:
		return "SNACK Request"
	case OpNOPIn:
		return "NOP-In"
	case OpSCSIResponse:
		return "SCSI Response"
	case OpTaskMgmtResp:
		return "SCSI Task Management Function Response"
	case OpLoginResp:
		return "Login Response"
	case OpTextResp:
		return "Text Response"
	case OpSCSIDataIn:
		return "SCSI Data-In"
	case OpLogoutResp:
		return "Logout Response"
	case OpR2T:
		return "Ready To Transfer (R2T)"
	case OpAsyncMessage:
		return "Asynchronous Message"
	case OpReject:
		return "Reject"
	}
	return "opcode 0x" + strconv.FormatUint(uint64(op), 16)
}

// Stage is a login stage (CSG/NSG, RFC 7143 11.12.3).
type Stage uint8

const (
	StageSecurityNegotiation         Stage = 0
	StageLoginOperationalNegotiation Stage = 1
	StageFullFeaturePhase            Stage = 3
)

func (s Stage) String() string {
	switch s {
	case StageSecurityNegotiation:
		return "SecurityNegotiation"
	case StageLoginOperationalNegotiation:
		return "LoginOperationalNegotiation"
	case StageFullFeaturePhase:
		return "FullFeaturePhase"
	}
	return "stage " + strconv.Itoa(int(s)) + " (reserved)"
}

// LoginStatus is Status-Class<<8 | Status-Detail of a Login Response
// (RFC 7143 11.13.5).
type LoginStatus uint16

// Login status classes and details.
const (
	LoginSuccess                 LoginStatus = 0x0000
	LoginTargetMovedTemporarily  LoginStatus = 0x0101
	LoginTargetMovedPermanently  LoginStatus = 0x0102
	LoginInitiatorError          LoginStatus = 0x0200
	LoginAuthenticationFailure   LoginStatus = 0x0201
	LoginAuthorizationFailure    LoginStatus = 0x0202
	LoginNotFound                LoginStatus = 0x0203
	LoginTargetRemoved           LoginStatus = 0x0204
	LoginUnsupportedVersion      LoginStatus = 0x0205
	LoginTooManyConnections      LoginStatus = 0x0206
	LoginMissingParameter        LoginStatus = 0x0207
	LoginCantIncludeInSession    LoginStatus = 0x0208
	LoginSessionTypeNotSupported LoginStatus = 0x0209
	LoginSessionDoesNotExist     LoginStatus = 0x020a
	LoginInvalidDuringLogin      LoginStatus = 0x020b
	LoginTargetError             LoginStatus = 0x0300
	LoginServiceUnavailable      LoginStatus = 0x0301
	LoginOutOfResources          LoginStatus = 0x0302
)

// Status classes (the high byte of LoginStatus).
const (
	StatusClassSuccess        = 0
	StatusClassRedirection    = 1
	StatusClassInitiatorError = 2
	StatusClassTargetError    = 3
)

// Class returns the Status-Class byte.
func (s LoginStatus) Class() uint8 { return uint8(s >> 8) }

// Detail returns the Status-Detail byte.
func (s LoginStatus) Detail() uint8 { return uint8(s) }

func (s LoginStatus) String() string {
	var n string
	switch s {
	case LoginSuccess:
		n = "Success"
	case LoginTargetMovedTemporarily:
		n = "Target moved temporarily"
	case LoginTargetMovedPermanently:
		n = "Target moved permanently"
	case LoginInitiatorError:
		n = "Initiator error"
	case LoginAuthenticationFailure:
		n = "Authentication failure"
	case LoginAuthorizationFailure:
		n = "Authorization failure"
	case LoginNotFound:
		n = "Not found"
	case LoginTargetRemoved:
		n = "Target removed"
	case LoginUnsupportedVersion:
		n = "Unsupported version"
	case LoginTooManyConnections:
		n = "Too many connections"
	case LoginMissingParameter:
		n = "Missing parameter"
	case LoginCantIncludeInSession:
		n = "Can't include in session"
	case LoginSessionTypeNotSupported:
		n = "Session type not supported"
	case LoginSessionDoesNotExist:
		n = "Session does not exist"
	case LoginInvalidDuringLogin:
		n = "Invalid request during login"
	case LoginTargetError:
		n = "Target error"
	case LoginServiceUnavailable:
		n = "Service unavailable"
	case LoginOutOfResources:
		n = "Out of resources"
	default:
		n = "reserved"
	}
	return n + " (0x" + hex4(uint16(s)) + ")"
}

func hex4(v uint16) string {
	const d = "0123456789abcdef"
	return string([]byte{d[v>>12&15], d[v>>8&15], d[v>>4&15], d[v&15]})
}

// RejectReason is the Reason byte of a Reject PDU (RFC 7143 11.17.1).
type RejectReason uint8

const (
	RejectDataDigestError     RejectReason = 0x02
	RejectSNACKReject         RejectReason = 0x03
	RejectProtocolError       RejectReason = 0x04
	RejectCommandNotSupported RejectReason = 0x05
	RejectImmediateCommand    RejectReason = 0x06
	RejectTaskInProgress      RejectReason = 0x07
	RejectInvalidDataACK      RejectReason = 0x08
	RejectInvalidPDUField     RejectReason = 0x09
	RejectLongOp              RejectReason = 0x0a
	RejectWaitingForLogout    RejectReason = 0x0c
)

func (r RejectReason) String() string {
	switch r {
	case RejectDataDigestError:
		return "Data (payload) digest error"
	case RejectSNACKReject:
		return "SNACK Reject"
	case RejectProtocolError:
		return "Protocol Error"
	case RejectCommandNotSupported:
		return "Command not supported"
	case RejectImmediateCommand:
		return "Immediate command reject - too many immediate commands"
	case RejectTaskInProgress:
		return "Task in progress"
	case RejectInvalidDataACK:
		return "Invalid data ack"
	case RejectInvalidPDUField:
		return "Invalid PDU field"
	case RejectLongOp:
		return "Long op reject - Can't generate Target Transfer Tag - out of resources"
	case RejectWaitingForLogout:
		return "Waiting for Logout"
	}
	return "reject reason 0x" + strconv.FormatUint(uint64(r), 16)
}

// TMFunction is the Function field of a Task Management Function Request
// (RFC 7143 11.5.1).
type TMFunction uint8

const (
	TMFAbortTask        TMFunction = 1
	TMFAbortTaskSet     TMFunction = 2
	TMFClearACA         TMFunction = 3
	TMFClearTaskSet     TMFunction = 4
	TMFLogicalUnitReset TMFunction = 5
	TMFTargetWarmReset  TMFunction = 6
	TMFTargetColdReset  TMFunction = 7
	TMFTaskReassign     TMFunction = 8
)

func (f TMFunction) String() string {
	switch f {
	case TMFAbortTask:
		return "ABORT TASK"
	case TMFAbortTaskSet:
		return "ABORT TASK SET"
	case TMFClearACA:
		return "CLEAR ACA"
	case TMFClearTaskSet:
		return "CLEAR TASK SET"
	case TMFLogicalUnitReset:
		return "LOGICAL UNIT RESET"
	case TMFTargetWarmReset:
		return "TARGET WARM RESET"
	case TMFTargetColdReset:
		return "TARGET COLD RESET"
	case TMFTaskReassign:
		return "TASK REASSIGN"
	}
	return "task management function " + strconv.Itoa(int(f))
}

// TMFResponse is the Response field of a Task Management Function Response
// (RFC 7143 11.6.1).
type TMFResponse uint8

const (
	TMFFunctionComplete            TMFResponse = 0
	TMFTaskDoesNotExist            TMFResponse = 1
	TMFLUNDoesNotExist             TMFResponse = 2
	TMFTaskStillAllegiant          TMFResponse = 3
	TMFReassignmentNotSupported    TMFResponse = 4
	TMFFunctionNotSupported        TMFResponse = 5
	TMFFunctionAuthorizationFailed TMFResponse = 6
	TMFFunctionRejected            TMFResponse = 255
)

func (r TMFResponse) String() string {
	switch r {
	case TMFFunctionComplete:
		return "Function complete"
	case TMFTaskDoesNotExist:
		return "Task does not exist"
	case TMFLUNDoesNotExist:
		return "LUN does not exist"
	case TMFTaskStillAllegiant:
		return "Task still allegiant"
	case TMFReassignmentNotSupported:
		return "Task allegiance reassignment not supported"
	case TMFFunctionNotSupported:
		return "Task management function not supported"
	case TMFFunctionAuthorizationFailed:
		return "Function authorization failed"
	case TMFFunctionRejected:
		return "Function rejected"
	}
	return "task management response " + strconv.Itoa(int(r))
}

// AsyncEvent is the AsyncEvent field of an Asynchronous Message
// (RFC 7143 11.9.1).
type AsyncEvent uint8

const (
	AsyncSCSIEvent          AsyncEvent = 0
	AsyncLogoutRequest      AsyncEvent = 1
	AsyncConnectionDrop     AsyncEvent = 2
	AsyncSessionDrop        AsyncEvent = 3
	AsyncNegotiationRequest AsyncEvent = 4
	AsyncTaskTermination    AsyncEvent = 5
	AsyncVendorSpecific     AsyncEvent = 255
)

func (e AsyncEvent) String() string {
	switch e {
	case AsyncSCSIEvent:
		return "SCSI Asynchronous Event"
	case AsyncLogoutRequest:
		return "Logout Request"
	case AsyncConnectionDrop:
		return "Connection Drop"
	case AsyncSessionDrop:
		return "Session Drop"
	case AsyncNegotiationRequest:
		return "Negotiation Request"
	case AsyncTaskTermination:
		return "Task Termination"
	case AsyncVendorSpecific:
		return "Vendor-specific"
	}
	return "async event " + strconv.Itoa(int(e))
}

// LogoutReason is the Reason Code of a Logout Request (RFC 7143 11.14.1).
type LogoutReason uint8

const (
	LogoutCloseSession      LogoutReason = 0
	LogoutCloseConnection   LogoutReason = 1
	LogoutRemoveForRecovery LogoutReason = 2
)

func (r LogoutReason) String() string {
	switch r {
	case LogoutCloseSession:
		return "close the session"
	case LogoutCloseConnection:
		return "close the connection"
	case LogoutRemoveForRecovery:
		return "remove the connection for recovery"
	}
	return "logout reason " + strconv.Itoa(int(r))
}

// LogoutResponseCode is the Response field of a Logout Response (RFC 7143 11.15.1).
type LogoutResponseCode uint8

const (
	LogoutClosedSuccessfully   LogoutResponseCode = 0
	LogoutCIDNotFound          LogoutResponseCode = 1
	LogoutRecoveryNotSupported LogoutResponseCode = 2
	LogoutCleanupFailed        LogoutResponseCode = 3
)

func (r LogoutResponseCode) String() string {
	switch r {
	case LogoutClosedSuccessfully:
		return "connection or session closed successfully"
	case LogoutCIDNotFound:
		return "CID not found"
	case LogoutRecoveryNotSupported:
		return "connection recovery is not supported"
	case LogoutCleanupFailed:
		return "cleanup failed for various reasons"
	}
	return "logout response " + strconv.Itoa(int(r))
}

// SNACKType is the Type field of a SNACK Request (RFC 7143 11.16.1).
type SNACKType uint8

const (
	SNACKDataR2T SNACKType = 0
	SNACKStatus  SNACKType = 1
	SNACKDataACK SNACKType = 2
	SNACKRData   SNACKType = 3
)

func (t SNACKType) String() string {
	switch t {
	case SNACKDataR2T:
		return "Data/R2T SNACK"
	case SNACKStatus:
		return "Status SNACK"
	case SNACKDataACK:
		return "DataACK"
	case SNACKRData:
		return "R-Data SNACK"
	}
	return "SNACK type " + strconv.Itoa(int(t))
}

// TaskAttr is the ATTR field of a SCSI Command (RFC 7143 11.3.1.3).
type TaskAttr uint8

const (
	AttrUntagged    TaskAttr = 0
	AttrSimple      TaskAttr = 1
	AttrOrdered     TaskAttr = 2
	AttrHeadOfQueue TaskAttr = 3
	AttrACA         TaskAttr = 4
)

func (a TaskAttr) String() string {
	switch a {
	case AttrUntagged:
		return "Untagged"
	case AttrSimple:
		return "Simple"
	case AttrOrdered:
		return "Ordered"
	case AttrHeadOfQueue:
		return "Head of Queue"
	case AttrACA:
		return "ACA"
	}
	return "task attribute " + strconv.Itoa(int(a))
}

// ServiceResponse is the Response field of a SCSI Response (RFC 7143 11.4.3).
type ServiceResponse uint8

const (
	CommandCompletedAtTarget ServiceResponse = 0x00
	TargetFailure            ServiceResponse = 0x01
)

func (r ServiceResponse) String() string {
	switch r {
	case CommandCompletedAtTarget:
		return "Command Completed at Target"
	case TargetFailure:
		return "Target Failure"
	}
	return "response 0x" + strconv.FormatUint(uint64(r), 16)
}

// SCSIStatus is a SAM status code (RFC 7143 11.4.2, SAM-5).
type SCSIStatus uint8

const (
	StatusGood                SCSIStatus = 0x00
	StatusCheckCondition      SCSIStatus = 0x02
	StatusConditionMet        SCSIStatus = 0x04
	StatusBusy                SCSIStatus = 0x08
	StatusReservationConflict SCSIStatus = 0x18
	StatusTaskSetFull         SCSIStatus = 0x28
	StatusACAActive           SCSIStatus = 0x30
	StatusTaskAborted         SCSIStatus = 0x40
)

func (s SCSIStatus) String() string {
	switch s {
	case StatusGood:
		return "GOOD"
	case StatusCheckCondition:
		return "CHECK CONDITION"
	case StatusConditionMet:
		return "CONDITION MET"
	case StatusBusy:
		return "BUSY"
	case StatusReservationConflict:
		return "RESERVATION CONFLICT"
	case StatusTaskSetFull:
		return "TASK SET FULL"
	case StatusACAActive:
		return "ACA ACTIVE"
	case StatusTaskAborted:
		return "TASK ABORTED"
	}
	return "status 0x" + strconv.FormatUint(uint64(s), 16)
}

// AHSType is the AHSType byte of an Additional Header Segment (RFC 7143 11.2.2).
type AHSType uint8

const (
	AHSExtendedCDB    AHSType = 1
	AHSBidiReadLength AHSType = 2
)

func (t AHSType) String() string {
	switch t {
	case AHSExtendedCDB:
		return "Extended CDB"
	case AHSBidiReadLength:
		return "Bidirectional Read Expected Data Transfer Length"
	}
	return "AHS type " + strconv.Itoa(int(t))
}

// Protocol versions (Version-max/Version-min/Version-active); RFC 7143 and
// RFC 3720 both use 0x00.
const VersionRFC7143 = 0x00
