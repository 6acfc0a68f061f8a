package text

import "strconv"

// Kind is how a key's value is decided (RFC 7143 6.2, 6.3).
type Kind uint8

const (
	// Declarative: each side states its own value; no answer needed.
	Declarative Kind = iota
	// List: the responder picks the first value of the offerer's list it
	// supports.
	List
	// And: Boolean, result is offer AND responder's value.
	And
	// Or: Boolean, result is offer OR responder's value.
	Or
	// Min: numerical, result is the smaller of the two values.
	Min
	// Max: numerical, result is the larger of the two values.
	Max
)

func (k Kind) String() string {
	return [...]string{"declarative", "list", "Boolean AND", "Boolean OR", "numerical min", "numerical max"}[k]
}

// Use says where a key may appear (RFC 7143 13: "Use").
type Use uint8

const (
	UseLeadingOnly Use = 1 << iota // LO: only on a session's leading connection
	UseInitialize                  // IO: only in the login phase
	UseFullFeature                 // FFPO: only in full feature phase
	UseAll                         // ALL: login and full feature phase
	UseDiscovery                   // relevant in a discovery session
)

// Key describes one operational or security key.
type Key struct {
	Name    string
	Kind    Kind
	Default string // "" when the key has none
	// Numerical keys: inclusive range.
	Lo, Hi uint64
	// List keys: the values the RFC defines for it (others are answered
	// with the first supported value or Reject).
	Values []string
	// MaxLen overrides MaxValueLen for the key's value.
	MaxLen int
	Use    Use
	// Session-wide (SW) rather than connection-only (CO).
	SessionWide bool
	Numeric     bool // Declarative keys whose value is a number
}

// Keys is the table of RFC 7143 chapter 13 keys plus the security keys of
// chapter 12 that the text layer must know the size of.
var Keys = map[string]*Key{}

func add(k Key) { Keys[k.Name] = &k }

func init() {
	const lenName = 223 // RFC 7143 4.2.7.1: iSCSI names are at most 223 bytes
	add(Key{Name: "HeaderDigest", Kind: List, Default: "None", Values: []string{"None", "CRC32C"}, Use: UseInitialize | UseDiscovery})
	add(Key{Name: "DataDigest", Kind: List, Default: "None", Values: []string{"None", "CRC32C"}, Use: UseInitialize | UseDiscovery})
	add(Key{Name: "MaxConnections", Kind: Min, Default: "1", Lo: 1, Hi: 65535, Use: UseLeadingOnly, SessionWide: true})
	add(Key{Name: "SendTargets", Kind: Declarative, Use: UseFullFeature | UseDiscovery, MaxLen: lenName})
	add(Key{Name: "TargetName", Kind: Declarative, Use: UseInitialize | UseAll | UseDiscovery, SessionWide: true, MaxLen: lenName})
	add(Key{Name: "InitiatorName", Kind: Declarative, Use: UseInitialize | UseDiscovery, SessionWide: true, MaxLen: lenName})
	add(Key{Name: "TargetAlias", Kind: Declarative, Use: UseAll | UseDiscovery, SessionWide: true})
	add(Key{Name: "InitiatorAlias", Kind: Declarative, Use: UseAll | UseDiscovery, SessionWide: true})
	add(Key{Name: "TargetAddress", Kind: Declarative, Use: UseAll | UseDiscovery})
	add(Key{Name: "TargetPortalGroupTag", Kind: Declarative, Lo: 0, Hi: 65535, Numeric: true, Use: UseInitialize | UseDiscovery})
	add(Key{Name: "InitialR2T", Kind: Or, Default: "Yes", Use: UseLeadingOnly, SessionWide: true})
	add(Key{Name: "ImmediateData", Kind: And, Default: "Yes", Use: UseLeadingOnly, SessionWide: true})
	add(Key{Name: "MaxRecvDataSegmentLength", Kind: Declarative, Default: "8192", Lo: 512, Hi: 1<<24 - 1, Numeric: true, Use: UseAll | UseDiscovery})
	add(Key{Name: "MaxBurstLength", Kind: Min, Default: "262144", Lo: 512, Hi: 1<<24 - 1, Use: UseLeadingOnly, SessionWide: true})
	add(Key{Name: "FirstBurstLength", Kind: Min, Default: "65536", Lo: 512, Hi: 1<<24 - 1, Use: UseLeadingOnly, SessionWide: true})
	add(Key{Name: "DefaultTime2Wait", Kind: Max, Default: "2", Lo: 0, Hi: 3600, Use: UseLeadingOnly | UseDiscovery, SessionWide: true})
	add(Key{Name: "DefaultTime2Retain", Kind: Min, Default: "20", Lo: 0, Hi: 3600, Use: UseLeadingOnly | UseDiscovery, SessionWide: true})
	add(Key{Name: "MaxOutstandingR2T", Kind: Min, Default: "1", Lo: 1, Hi: 65535, Use: UseLeadingOnly, SessionWide: true})
	add(Key{Name: "DataPDUInOrder", Kind: Or, Default: "Yes", Use: UseLeadingOnly, SessionWide: true})
	add(Key{Name: "DataSequenceInOrder", Kind: Or, Default: "Yes", Use: UseLeadingOnly, SessionWide: true})
	add(Key{Name: "ErrorRecoveryLevel", Kind: Min, Default: "0", Lo: 0, Hi: 2, Use: UseLeadingOnly | UseDiscovery, SessionWide: true})
	add(Key{Name: "SessionType", Kind: Declarative, Default: "Normal", Values: []string{"Discovery", "Normal"}, Use: UseLeadingOnly | UseDiscovery, SessionWide: true})
	add(Key{Name: "TaskReporting", Kind: List, Default: "RFC3720", Values: []string{"RFC3720", "ResponseFence", "FastAbort"}, Use: UseLeadingOnly, SessionWide: true})
	// RFC 7144: default 1 (RFC 7143 itself), the session runs at the lower
	// of the two levels; irrelevant in discovery sessions.
	add(Key{Name: "iSCSIProtocolLevel", Kind: Min, Default: "1", Lo: 0, Hi: 31, Use: UseLeadingOnly, SessionWide: true})
	// Markers were removed by RFC 7143 (13.25); RFC 3720 initiators may
	// still offer them and are answered with No (AND) or Irrelevant.
	add(Key{Name: "IFMarker", Kind: And, Default: "No", Use: UseInitialize})
	add(Key{Name: "OFMarker", Kind: And, Default: "No", Use: UseInitialize})
	add(Key{Name: "OFMarkInt", Kind: Declarative, Use: UseInitialize})
	add(Key{Name: "IFMarkInt", Kind: Declarative, Use: UseInitialize})
	// Security keys (chapter 12).
	add(Key{Name: "AuthMethod", Kind: List, Default: "None", Values: []string{"None", "CHAP", "KRB5", "SRP", "SPKM1", "SPKM2"}, Use: UseInitialize | UseDiscovery})
	add(Key{Name: "CHAP_A", Kind: List, Use: UseInitialize | UseDiscovery})
	add(Key{Name: "CHAP_I", Kind: Declarative, Use: UseInitialize | UseDiscovery})
	add(Key{Name: "CHAP_C", Kind: Declarative, MaxLen: MaxBinaryValueLen, Use: UseInitialize | UseDiscovery})
	add(Key{Name: "CHAP_N", Kind: Declarative, Use: UseInitialize | UseDiscovery})
	add(Key{Name: "CHAP_R", Kind: Declarative, MaxLen: MaxBinaryValueLen, Use: UseInitialize | UseDiscovery})
}

// ParseNumber parses a numerical value: decimal or 0x hex (RFC 7143 5.1
// decimal-constant / hex-constant), at most 2^64-1.
func ParseNumber(s string) (uint64, bool) {
	if len(s) > 2 && (s[:2] == "0x" || s[:2] == "0X") {
		v, err := strconv.ParseUint(s[2:], 16, 64)
		return v, err == nil
	}
	if s == "" || s[0] == '+' || s[0] == '-' {
		return 0, false
	}
	v, err := strconv.ParseUint(s, 10, 64)
	return v, err == nil
}

// ParseBool parses a Boolean value ("Yes" / "No", exactly).
func ParseBool(s string) (bool, bool) {
	switch s {
	case "Yes":
		return true, true
	case "No":
		return false, true
	}
	return false, false
}

// FormatBool returns "Yes" or "No".
func FormatBool(b bool) string {
	if b {
		return "Yes"
	}
	return "No"
}
