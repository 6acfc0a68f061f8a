package target

import (
	"bytes"
	"encoding/hex"
	"sort"

	"github.com/vmsan/vmsan/internal/iscsi/pdu"
)

// SessionInfo describes one logged-in session (vmsan iscsi show). JSON
// names are snake_case like the rest of the control API.
type SessionInfo struct {
	Initiator string `json:"initiator"`
	ISID      string `json:"isid"` // 12 hex digits
	TSIH      uint16 `json:"tsih"`
	// Target is the target name ("" for a discovery session).
	Target    string `json:"target,omitempty"`
	Discovery bool   `json:"discovery,omitempty"`
	// Portal is the address the initiator connected to, Remote its own.
	Portal      string `json:"portal"`
	Remote      string `json:"remote"`
	PortalGroup uint16 `json:"portal_group"`
	Connections int    `json:"connections"`
	// Auth is the method the login used: "CHAP" or "None"; CHAPUser the
	// name the initiator proved.
	Auth         string `json:"auth"`
	CHAPUser     string `json:"chap_user,omitempty"`
	HeaderDigest string `json:"header_digest"` // "CRC32C" or "None"
	DataDigest   string `json:"data_digest"`
	// The negotiated limits: the initiator's and the target's
	// MaxRecvDataSegmentLength (each the bound on what the other sends).
	InitiatorMaxRecvDataSegmentLength uint64 `json:"initiator_max_recv_data_segment_length"`
	TargetMaxRecvDataSegmentLength    uint64 `json:"target_max_recv_data_segment_length"`
	MaxBurstLength                    uint64 `json:"max_burst_length"`
	FirstBurstLength                  uint64 `json:"first_burst_length"`
	ImmediateData                     bool   `json:"immediate_data"`
	InitialR2T                        bool   `json:"initial_r2t"`
	MaxOutstandingR2T                 uint64 `json:"max_outstanding_r2t"`
	// CommandsInFlight are the session's SCSI commands received and not
	// yet answered (waiting for data, executing or being sent).
	CommandsInFlight int `json:"commands_in_flight"`
}

func digestName(on bool) string {
	if on {
		return "CRC32C"
	}
	return "None"
}

// Sessions lists the logged-in sessions (full feature phase), by target
// then initiator then ISID.
func (s *Server) Sessions() []SessionInfo {
	s.mu.Lock()
	list := make([]*session, 0, len(s.byTSIH))
	for _, ss := range s.byTSIH {
		list = append(list, ss)
	}
	s.mu.Unlock()
	out := make([]SessionInfo, 0, len(list))
	for _, ss := range list {
		out = append(out, ss.info())
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.Target != b.Target {
			return a.Target < b.Target
		}
		if a.Initiator != b.Initiator {
			return a.Initiator < b.Initiator
		}
		return a.ISID < b.ISID
	})
	return out
}

func (ss *session) info() SessionInfo {
	p := ss.params
	si := SessionInfo{
		Initiator: ss.nexus.InitiatorName, ISID: hex.EncodeToString(ss.isid[:]), TSIH: ss.tsih,
		Target: ss.nexus.TargetName, Discovery: ss.discovery,
		Portal: ss.c.nc.LocalAddr().String(), Remote: ss.c.nc.RemoteAddr().String(),
		PortalGroup: ss.c.tpgt, Connections: 1, Auth: "None",
		HeaderDigest: digestName(p.HeaderDigest), DataDigest: digestName(p.DataDigest),
		InitiatorMaxRecvDataSegmentLength: p.PeerMaxRecvDataSegmentLength,
		TargetMaxRecvDataSegmentLength:    uint64(ss.s.cfg.MaxRecvDataSegmentLength),
		MaxBurstLength:                    p.MaxBurstLength, FirstBurstLength: p.FirstBurstLength,
		ImmediateData: p.ImmediateData, InitialR2T: p.InitialR2T, MaxOutstandingR2T: p.MaxOutstandingR2T,
	}
	if ss.auth != nil {
		si.Auth, si.CHAPUser = "CHAP", ss.auth.User
	}
	ss.mu.Lock()
	si.CommandsInFlight = len(ss.tasks)
	ss.mu.Unlock()
	return si
}

// SetDiscoveryAuth replaces the CHAP credentials discovery sessions need
// (nil: none); logins from now on use them.
func (s *Server) SetDiscoveryAuth(a *CHAP) { s.discAuth.Store(a) }

func (s *Server) discoveryAuth() *CHAP { return s.discAuth.Load() }

// sameCHAP says two credential sets are the same (nil: no CHAP).
func sameCHAP(a, b *CHAP) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.User == b.User && bytes.Equal(a.Secret, b.Secret) &&
		a.MutualUser == b.MutualUser && bytes.Equal(a.MutualSecret, b.MutualSecret)
}

// Revoked is a session DropRevoked closed.
type Revoked struct {
	Session SessionInfo
	Why     string
}

// DropRevoked closes the sessions whose initiator would not be let in
// now: its target is gone, the target's ACL no longer lists it (or the
// target has no access control left and allow-any is off), or the CHAP
// credentials it logged in with changed. Call it after changing what
// Config.Targets returns or SetDiscoveryAuth; it returns what it closed.
// A closed session's initiator may log in again under the new rules.
func (s *Server) DropRevoked() []Revoked {
	s.mu.Lock()
	list := make([]*session, 0, len(s.byTSIH))
	for _, ss := range s.byTSIH {
		list = append(list, ss)
	}
	s.mu.Unlock()
	var out []Revoked
	for _, ss := range list {
		why := s.revoked(ss)
		if why == "" {
			continue
		}
		out = append(out, Revoked{Session: ss.info(), Why: why})
		s.cfg.Logger.Warn("iscsi: closing a session whose initiator lost access", "initiator", ss.nexus.InitiatorName,
			"target", ss.nexus.TargetName, "portal", ss.c.nc.LocalAddr().String(), "remote", ss.c.log(), "tsih", ss.tsih, "why", why)
		ss.c.abort()
	}
	return out
}

// revoked says why ss's initiator would be refused now, or "".
func (s *Server) revoked(ss *session) string {
	if ss.discovery {
		if !sameCHAP(ss.auth, s.discoveryAuth()) {
			return "discovery CHAP credentials changed"
		}
		return ""
	}
	t, ok := s.lookup(ss.nexus.TargetName)
	if !ok {
		return "target no longer exists"
	}
	if why := t.refuses(ss.nexus.InitiatorName); why != "" {
		return why
	}
	if !sameCHAP(ss.auth, t.Auth) {
		return "CHAP credentials changed"
	}
	return ""
}

// LoginFailureReason names a login status for counting (metrics label):
// authentication, authorization, not_found, missing_parameter,
// unsupported_version, session_type, session_not_found, initiator_error,
// out_of_resources, service_unavailable, target_error; "protocol" is a
// connection that sent something other than a Login Request.
func LoginFailureReason(st pdu.LoginStatus) string {
	switch st {
	case pdu.LoginAuthenticationFailure:
		return "authentication"
	case pdu.LoginAuthorizationFailure:
		return "authorization"
	case pdu.LoginNotFound, pdu.LoginTargetRemoved:
		return "not_found"
	case pdu.LoginMissingParameter:
		return "missing_parameter"
	case pdu.LoginUnsupportedVersion:
		return "unsupported_version"
	case pdu.LoginSessionTypeNotSupported:
		return "session_type"
	case pdu.LoginSessionDoesNotExist:
		return "session_not_found"
	case pdu.LoginOutOfResources:
		return "out_of_resources"
	case pdu.LoginServiceUnavailable:
		return "service_unavailable"
	}
	if st>>8 == 3 {
		return "target_error"
	}
	return "initiator_error"
}

// LoginFailureReasons are every reason LoginFailureReason returns, so a
// counter exists (at 0) for each from the first scrape.
var LoginFailureReasons = []string{"authentication", "authorization", "not_found", "missing_parameter",
	"unsupported_version", "session_type", "session_not_found", "initiator_error",
	"out_of_resources", "service_unavailable", "target_error", "protocol"}

func (s *Server) countLoginFailure(reason string) {
	s.statusMu.Lock()
	s.loginReasons[reason]++
	s.statusMu.Unlock()
}
