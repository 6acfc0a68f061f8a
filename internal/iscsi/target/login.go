package target

import (
	"errors"
	"strconv"
	"strings"

	"github.com/vmsan/vmsan/internal/iscsi/chap"
	"github.com/vmsan/vmsan/internal/iscsi/pdu"
	"github.com/vmsan/vmsan/internal/iscsi/text"
	"github.com/vmsan/vmsan/internal/scsi"
)

// loginState is the login phase of one connection (RFC 7143 6).
type loginState struct {
	c        *conn
	stage    pdu.Stage
	first    *pdu.LoginRequest
	params   text.Params
	acc      text.Accumulator
	statSN   uint32
	declared bool // our MaxRecvDataSegmentLength was sent

	initiator  string
	targetName string // as the initiator asked, for logs
	discovery  bool
	target     Target
	auth       *CHAP // required credentials, nil when no authentication
	authDone   bool
	chapStep   int // 0 nothing, 1 AuthMethod=CHAP agreed, 2 challenge sent, 3 done
	challenge  chap.Challenge
}

// loginError is a login failure with its status.
type loginError struct {
	status pdu.LoginStatus
	msg    string
}

func (e *loginError) Error() string { return e.status.String() + ": " + e.msg }

func fail(st pdu.LoginStatus, msg string) error { return &loginError{st, msg} }

// ours are the target's values for negotiated keys (List keys: the values
// it supports).
func (c *conn) ours() map[string]string {
	cfg := &c.s.cfg
	return map[string]string{
		"HeaderDigest":        "None,CRC32C",
		"DataDigest":          "None,CRC32C",
		"MaxConnections":      "1",
		"InitialR2T":          "No",
		"ImmediateData":       "Yes",
		"MaxBurstLength":      strconv.Itoa(cfg.MaxBurstLength),
		"FirstBurstLength":    strconv.Itoa(cfg.FirstBurstLength),
		"MaxOutstandingR2T":   strconv.Itoa(cfg.MaxOutstandingR2T),
		"ErrorRecoveryLevel":  "0",
		"DefaultTime2Wait":    "2",
		"DefaultTime2Retain":  "0",
		"DataPDUInOrder":      "Yes",
		"DataSequenceInOrder": "Yes",
		"TaskReporting":       "RFC3720",
		"IFMarker":            "No",
		"OFMarker":            "No",
	}
}

// login runs the login phase; it returns the new session, or nil after
// answering a failure (or on a broken connection).
func (c *conn) login() *session {
	ls := &loginState{c: c, params: text.Defaults(), statSN: 1}
	for {
		f, err := c.rd.Read()
		if err != nil {
			// Framing errors during login cannot be answered reliably.
			return nil
		}
		c.lastRecv.Store(nowNano())
		req, ok := f.Header.(*pdu.LoginRequest)
		if !ok {
			c.s.loginFailures.Add(1)
			c.s.countLoginFailure("protocol")
			return nil
		}
		answers, transit, err := ls.step(req, f.Data)
		if err != nil {
			var le *loginError
			if !errors.As(err, &le) {
				le = &loginError{pdu.LoginTargetError, err.Error()}
			}
			c.s.loginFailures.Add(1)
			c.s.countLoginStatus(le.status)
			c.s.cfg.Logger.Info("iscsi: login refused", "remote", c.log(), "portal", c.nc.LocalAddr().String(), "initiator", ls.initiator,
				"target", ls.targetName, "status", le.status.String(), "reason", LoginFailureReason(le.status), "why", le.msg)
			rsp := &pdu.LoginResponse{ISID: req.ISID, ITT: req.ITT, CSG: ls.stage, Status: le.status,
				StatusSNs: pdu.StatusSNs{StatSN: ls.statSN, ExpCmdSN: req.CmdSN, MaxCmdSN: req.CmdSN}}
			c.writePDU(rsp, nil, false)
			c.flush()
			return nil
		}
		rsp := &pdu.LoginResponse{ISID: req.ISID, ITT: req.ITT, CSG: req.CSG, TSIH: req.TSIH,
			StatusSNs: pdu.StatusSNs{StatSN: ls.statSN, ExpCmdSN: req.CmdSN, MaxCmdSN: req.CmdSN + uint32(c.s.cfg.QueueDepth) - 1}}
		ls.statSN++
		var ss *session
		if transit {
			rsp.Transit, rsp.NSG = true, req.NSG
			if req.NSG == pdu.StageFullFeaturePhase {
				ss = ls.newSession(req)
				tsih, err := c.s.register(ss, req.TSIH)
				if err != nil {
					// RFC 7143 11.13.5: 0x0302 "out of resources" when
					// the target has no room for another session (the
					// initiator may retry later), 0x0301 otherwise.
					st := pdu.LoginServiceUnavailable
					if errors.Is(err, errTooManySessions) {
						st = pdu.LoginOutOfResources
						c.s.logRefusal(c, err)
					}
					c.s.loginFailures.Add(1)
					c.s.countLoginStatus(st)
					rsp.Transit, rsp.NSG, rsp.Status = false, 0, st
					c.writePDU(rsp, nil, false)
					c.flush()
					return nil
				}
				rsp.TSIH = tsih
			}
		}
		data, err := text.Append(nil, answers...)
		if err != nil || len(data) > pdu.DefaultMaxRecvDataSegmentLength {
			// Our own answers are short; this cannot happen with the
			// keys we send, but never send what the peer cannot take.
			data = nil
		}
		if err := c.writePDU(rsp, data, false); err != nil {
			if ss != nil {
				c.s.unregister(ss)
			}
			return nil
		}
		if err := c.flush(); err != nil {
			if ss != nil {
				c.s.unregister(ss)
			}
			return nil
		}
		if ss != nil {
			c.dig = c.rd.Digests
			c.statSN = ls.statSN
			c.s.logins.Add(1)
			ss.start()
			ss.logLogin()
			return ss
		}
		if transit {
			ls.stage = req.NSG
		}
	}
}

// step handles one Login Request; it returns the keys to answer and
// whether the stage transition the initiator asked for is granted.
func (ls *loginState) step(req *pdu.LoginRequest, data []byte) ([]text.Pair, bool, error) {
	c := ls.c
	if ls.first == nil {
		r := *req
		ls.first = &r
		// Version: the RFC 7143 version is 0x00 (RFC 7143 11.12.4).
		if req.VersionMin > pdu.VersionRFC7143 {
			return nil, false, fail(pdu.LoginUnsupportedVersion, "initiator's VersionMin is above 0")
		}
		ls.stage = req.CSG
	} else if req.ISID != ls.first.ISID || req.TSIH != ls.first.TSIH || req.CID != ls.first.CID {
		return nil, false, fail(pdu.LoginInitiatorError, "ISID/TSIH/CID changed during login")
	}
	if req.CSG != ls.stage {
		return nil, false, fail(pdu.LoginInitiatorError, "unexpected CSG")
	}
	if req.CSG == pdu.StageFullFeaturePhase {
		return nil, false, fail(pdu.LoginInitiatorError, "CSG is full feature phase")
	}
	if req.Transit && req.NSG <= req.CSG {
		return nil, false, fail(pdu.LoginInitiatorError, "transit to an earlier stage")
	}
	done, err := ls.acc.Add(data, req.Continue)
	if err != nil {
		return nil, false, fail(pdu.LoginInitiatorError, err.Error())
	}
	if !done {
		// RFC 7143 6.6: answer an empty response and wait for the rest.
		return nil, false, nil
	}
	pairs, err := text.Parse(ls.acc.Take())
	if err != nil {
		return nil, false, fail(pdu.LoginInitiatorError, err.Error())
	}
	offers := make(map[string]string, len(pairs))
	for _, p := range pairs {
		offers[p.Key] = p.Value
	}
	var answers []text.Pair
	if ls.initiator == "" {
		if err := ls.identify(req, offers); err != nil {
			return nil, false, err
		}
		if !ls.discovery {
			answers = append(answers, text.Pair{Key: "TargetPortalGroupTag", Value: tpgtString(c.tpgt)})
			if ls.target.Alias != "" {
				answers = append(answers, text.Pair{Key: "TargetAlias", Value: ls.target.Alias})
			}
		}
		if ls.auth == nil {
			ls.authDone = true
		}
	}
	var ops []text.Pair
	for _, p := range pairs {
		switch {
		case p.Key == "AuthMethod" || strings.HasPrefix(p.Key, "CHAP_"):
			if req.CSG != pdu.StageSecurityNegotiation {
				return nil, false, fail(pdu.LoginInitiatorError, p.Key+" outside the security stage")
			}
		case p.Key == "InitiatorName" || p.Key == "TargetName" || p.Key == "SessionType" || p.Key == "InitiatorAlias":
			// handled by identify
		default:
			ops = append(ops, p)
		}
	}
	if req.CSG == pdu.StageSecurityNegotiation {
		a, err := ls.security(offers)
		if err != nil {
			return nil, false, err
		}
		answers = append(answers, a...)
	} else if !ls.authDone {
		return nil, false, fail(pdu.LoginAuthenticationFailure, "authentication required")
	}
	answers = append(answers, text.Negotiate(&ls.params, ops, c.ours(), ls.discovery)...)
	transit := req.Transit
	if transit && !ls.authDone {
		if ls.chapStep == 0 {
			return nil, false, fail(pdu.LoginAuthenticationFailure, "authentication required")
		}
		transit = false // finish the CHAP exchange first
	}
	if transit && (req.NSG == pdu.StageFullFeaturePhase || req.CSG == pdu.StageLoginOperationalNegotiation) && !ls.declared {
		ls.declared = true
		answers = append(answers, text.Pair{Key: "MaxRecvDataSegmentLength", Value: strconv.Itoa(c.s.cfg.MaxRecvDataSegmentLength)})
	}
	if transit && req.NSG == pdu.StageFullFeaturePhase {
		if err := ls.params.Check(); err != nil {
			return nil, false, fail(pdu.LoginInitiatorError, err.Error())
		}
	}
	return answers, transit, nil
}

// identify checks the first PDU's InitiatorName, SessionType and
// TargetName (status 0207 missing, 0209 session type, 0203 not found,
// 0202 ACL, 020a unknown TSIH).
func (ls *loginState) identify(req *pdu.LoginRequest, offers map[string]string) error {
	c := ls.c
	name := offers["InitiatorName"]
	if name == "" {
		return fail(pdu.LoginMissingParameter, "no InitiatorName")
	}
	ls.initiator = name
	switch offers["SessionType"] {
	case "", "Normal":
	case "Discovery":
		ls.discovery = true
	default:
		return fail(pdu.LoginSessionTypeNotSupported, "SessionType "+offers["SessionType"])
	}
	if ls.discovery {
		ls.auth = c.s.discoveryAuth()
		return nil
	}
	tn, ok := offers["TargetName"]
	if !ok || tn == "" {
		return fail(pdu.LoginMissingParameter, "no TargetName")
	}
	ls.targetName = tn
	t, ok := c.s.lookup(tn)
	if !ok {
		return fail(pdu.LoginNotFound, "no target "+tn)
	}
	if why := t.refuses(name); why != "" {
		return fail(pdu.LoginAuthorizationFailure, why)
	}
	if req.TSIH != 0 {
		if old := c.s.findTSIH(req.TSIH); old == nil || old.nexus.InitiatorName != name || old.isid != req.ISID {
			return fail(pdu.LoginSessionDoesNotExist, "unknown TSIH")
		}
	}
	ls.target = t
	ls.auth = t.Auth
	return nil
}

// security handles AuthMethod and the CHAP exchange.
func (ls *loginState) security(offers map[string]string) ([]text.Pair, error) {
	var out []text.Pair
	if am, ok := offers["AuthMethod"]; ok {
		methods := strings.Split(am, ",")
		has := func(m string) bool {
			for _, x := range methods {
				if x == m {
					return true
				}
			}
			return false
		}
		switch {
		case ls.auth != nil && has("CHAP"):
			out = append(out, text.Pair{Key: "AuthMethod", Value: "CHAP"})
			ls.chapStep = 1
		case ls.auth == nil && has("None"):
			out = append(out, text.Pair{Key: "AuthMethod", Value: "None"})
			ls.authDone = true
		default:
			return nil, fail(pdu.LoginAuthenticationFailure, "no acceptable AuthMethod in "+am)
		}
	}
	if a, ok := offers["CHAP_A"]; ok {
		if ls.chapStep != 1 {
			return nil, fail(pdu.LoginAuthenticationFailure, "CHAP_A out of sequence")
		}
		ch, pairs, err := chap.Begin(a, ls.c.s.cfg.Rand)
		if err != nil {
			return nil, fail(pdu.LoginAuthenticationFailure, err.Error())
		}
		ls.challenge, ls.chapStep = ch, 2
		out = append(out, pairs...)
	}
	if _, ok := offers["CHAP_R"]; ok || ls.chapStep == 2 && offers["CHAP_N"] != "" {
		if ls.chapStep != 2 {
			return nil, fail(pdu.LoginAuthenticationFailure, "CHAP_R out of sequence")
		}
		auth := ls.auth
		sec := chap.Secrets{
			Lookup: func(n string) ([]byte, bool) {
				if n != auth.User {
					return nil, false
				}
				return auth.Secret, true
			},
			TargetName:   auth.MutualUser,
			TargetSecret: auth.MutualSecret,
		}
		pairs, err := chap.Verify(ls.challenge, offers, sec, &ls.c.s.chapCache)
		if err != nil {
			return nil, fail(pdu.LoginAuthenticationFailure, err.Error())
		}
		ls.chapStep, ls.authDone = 3, true
		out = append(out, pairs...)
	}
	return out, nil
}

// newSession builds the session the login negotiated.
func (ls *loginState) newSession(req *pdu.LoginRequest) *session {
	c := ls.c
	p := ls.params
	// Digests start after the final Login Response (RFC 7143 13.1):
	// login() sets c.dig once that response is written.
	c.rd.Digests = pdu.Digests{Header: p.HeaderDigest, Data: p.DataDigest}
	c.rd.MaxData = c.s.cfg.MaxRecvDataSegmentLength
	c.peerMax = int(min(max(p.PeerMaxRecvDataSegmentLength, 512), pdu.MaxDataSegmentLength))
	c.burstMax = int(min(max(p.MaxBurstLength, 512), pdu.MaxDataSegmentLength))
	ss := newSession(c, ls.first.ISID, ls.discovery, ls.target, p, req.CmdSN)
	ss.cid = ls.first.CID
	ss.auth = ls.auth
	ss.nexus = &scsi.Nexus{InitiatorName: ls.initiator, InitiatorPort: initiatorPort(ls.initiator, ls.first.ISID),
		TargetName: ls.target.Name, RelativePort: c.rel, PortGroup: c.tpgt}
	if ls.discovery {
		ss.nexus.TargetName = ""
	}
	return ss
}
