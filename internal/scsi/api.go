// Package scsi emulates SCSI block logical units (SPC-4 and SBC-3 as Linux
// sd, libiscsi's test suite, QEMU, VMware and Windows use them) over the
// volume runtime's devices. It knows nothing of iSCSI: a transport (the
// iSCSI target in internal/iscsi/target) decodes its PDUs into a Task,
// collects the data-out, calls Execute and sends the Result back.
//
// Simplest use (a transport, per command):
//
//	lu := scsi.New(scsi.Config{Registry: reg, LUNs: lunMap})
//	lu.Execute(&scsi.Task{Nexus: n, LUN: 0, CDB: cdb, ExpectedIn: edtl},
//		func(r *scsi.Result) { send(r.Status, r.Sense, r.DataIn); r.Release() })
//
// What lives here: target.go (Config, Target, Execute's checks in SPC-4
// order: opcode and CDB usage mask, logical unit, unit attention, ALUA
// state, reservation conflict; pooled commands and residuals), lu.go (a
// logical unit: device, identity, unit attentions per I_T nexus), cmds.go
// (the command table: usage masks and classes), rw.go (the data path:
// READ/WRITE/VERIFY/WRITE SAME/UNMAP/COMPARE AND WRITE/ORWRITE/GET LBA
// STATUS, each one export.Request), inquiry.go (INQUIRY, VPD, REPORT LUNS,
// REQUEST SENSE, RTPG, RSOC, RSTMF), mode.go, pr.go (persistent
// reservations, RESERVE/RELEASE, APTPL state), sense.go. docs/iscsi.md
// ("SCSI command set") lists what is implemented.
//
// Concurrency: a Target is safe for concurrent use by every session of
// every transport; done may run on the caller's goroutine before Execute
// returns or on an engine goroutine, exactly once.
package scsi

// This file is the contract between the SCSI emulation and its transports;
// change it only in step with internal/iscsi/target.

// Nexus is an I_T nexus: one initiator port talking to one target port.
// Reservations, unit attentions and ALUA states are kept per nexus or per
// target port. A transport allocates one per session and passes the same
// pointer with every task of that session.
type Nexus struct {
	// InitiatorName is the initiator's name (an iSCSI IQN/EUI/NAA name).
	InitiatorName string
	// InitiatorPort is the SPC-4 initiator port name: for iSCSI
	// "NAME,i,0xISID" (12 hex digits), unique per session.
	InitiatorPort string
	// TargetName is the target's name (the iSCSI TargetName).
	TargetName string
	// RelativePort is the relative target port identifier (1..65535) of
	// the portal the session came in on (VPD 83 designator type 4).
	RelativePort uint16
	// PortGroup is the target port group of that portal (VPD 83 type 5,
	// REPORT TARGET PORT GROUPS).
	PortGroup uint16
}

// Task attributes (SAM-5), as the transport received them.
const (
	AttrSimple  = 0
	AttrOrdered = 1
	AttrHead    = 2
	AttrACA     = 3
)

// Task is one SCSI command as the transport received it.
type Task struct {
	Nexus *Nexus
	// LUN is the logical unit number, decoded from SAM's 8-byte LUN
	// (flat or peripheral addressing, numbers < 16384).
	LUN uint64
	// CDB is the command descriptor block (16 bytes from the BHS, more
	// from an Extended CDB AHS); trailing zero padding is allowed.
	CDB []byte
	// Tag identifies the task for ABORT TASK (iSCSI: the ITT).
	Tag uint32
	// Attr is the task attribute (AttrSimple...).
	Attr uint8
	// DataOut is every data-out byte the initiator sent for the command
	// (immediate, unsolicited and solicited), at most the expected data
	// transfer length. The Target may keep it until done is called.
	DataOut []byte
	// ExpectedOut and ExpectedIn are the initiator's expected data
	// transfer lengths (iSCSI EDTL and the bidirectional read EDTL); the
	// Target computes residuals against them.
	ExpectedOut uint32
	ExpectedIn  uint32
	// More (optional) says the transport already holds another complete
	// command of this session that it will Execute right after this one:
	// the engine's write-gathering hint (export.Request.More), as the
	// NBD server gives it. False is always correct.
	More bool
}

// Result is a completed task: what the transport sends back.
type Result struct {
	// Status is the SCSI status (GOOD 0x00, CHECK CONDITION 0x02,
	// CONDITION MET 0x04, BUSY 0x08, RESERVATION CONFLICT 0x18,
	// TASK SET FULL 0x28, ACA ACTIVE 0x30, TASK ABORTED 0x40).
	Status uint8
	// Sense is the sense data (fixed 0x70 or descriptor 0x72) when
	// Status is CHECK CONDITION; nil otherwise.
	Sense []byte
	// DataIn is the data-in to send, already cut to ExpectedIn.
	DataIn []byte
	// Residual is the SCSI residual count against the expected transfer
	// length in the command's direction; Overflow/Underflow say which
	// (iSCSI's O and U bits). Both false means Residual is 0.
	Residual  uint32
	Overflow  bool
	Underflow bool

	release func()
}

// SetRelease registers the function Release calls (package-internal use
// by the Target, and by transports' test fakes).
func (r *Result) SetRelease(f func()) { r.release = f }

// Release returns DataIn's buffer to its pool. The transport calls it once
// the data-in has been written; DataIn must not be used afterwards.
// Safe to call on a Result without a pool, and more than once.
func (r *Result) Release() {
	if f := r.release; f != nil {
		r.release = nil
		f()
	}
}

// Task management functions (SAM-5 names; iSCSI function codes).
const (
	TMFAbortTask        = 1
	TMFAbortTaskSet     = 2
	TMFClearACA         = 3
	TMFClearTaskSet     = 4
	TMFLogicalUnitReset = 5
	TMFTargetWarmReset  = 6
	TMFTargetColdReset  = 7
)

// Task management responses (iSCSI Task Management Response codes).
const (
	TMFComplete             = 0
	TMFTaskDoesNotExist     = 1
	TMFLUNDoesNotExist      = 2
	TMFTaskStillAllegiant   = 3
	TMFReassignNotSupported = 4
	TMFNotSupported         = 5
	TMFAuthorizationFailed  = 6
	TMFRejected             = 255
)

// Task management and session end, as a transport drives them: the SCSI
// layer decides what a reset means (unit attentions, reservation release),
// the transport owns the task lists. Target.TaskManagement(fn, n, lun) is
// called by the transport after it has aborted (and waited for) the
// affected tasks; it returns a TMF* response. Target.NexusLost(n) is
// called when a session ends (reservations of registrants without APTPL
// survive, per SPC-4; RESERVE(6) reservations are released).
//
// The rest of the Target's surface is in target.go: Config (its fields are
// documented there only, so this contract cannot drift from them), New,
// Execute, MaxDataOut, SetPortGroupState/PortGroupState, WaitAdmitted,
// ReleaseVolume, Close.
