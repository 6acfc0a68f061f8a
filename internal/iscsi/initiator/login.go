package initiator

import (
	"bufio"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"time"

	"github.com/vmsan/vmsan/internal/iscsi/chap"
	"github.com/vmsan/vmsan/internal/iscsi/pdu"
	"github.com/vmsan/vmsan/internal/iscsi/text"
)

// DefaultInitiatorName is the InitiatorName sent when Config leaves it
// empty.
const DefaultInitiatorName = "iqn.2026-11.org.vmsan:initiator"

// Config says how to log in.
type Config struct {
	// InitiatorName; DefaultInitiatorName when empty.
	InitiatorName string
	// TargetName is the IQN to log in to (Dial); ignored by Discover.
	TargetName string
	// User and Secret enable CHAP: the target checks that this initiator
	// knows Secret (CHAP_N = User). Empty User means AuthMethod=None.
	User, Secret string
	// TargetUser and TargetSecret enable mutual CHAP: the initiator then
	// checks that the target knows TargetSecret under the name TargetUser.
	TargetUser, TargetSecret string
	// HeaderDigest and DataDigest are the lists to offer ("CRC32C",
	// "CRC32C,None", "None,CRC32C"); empty means "None".
	HeaderDigest, DataDigest string
	// MaxRecvDataSegmentLength this side declares: the largest Data-In
	// PDU the target may send. 0 means 262144.
	MaxRecvDataSegmentLength int
	// MaxBurstLength and FirstBurstLength to offer; 0 means 16776192 and
	// 262144 (the target's answer is the minimum).
	MaxBurstLength, FirstBurstLength int
	// NoImmediateData offers ImmediateData=No; InitialR2T offers
	// InitialR2T=Yes. The zero values ask for the fastest write path
	// (immediate data and unsolicited Data-Out up to FirstBurstLength).
	NoImmediateData bool
	InitialR2T      bool
	// DialTimeout bounds connecting and the whole login; 0 means 15 s.
	DialTimeout time.Duration
	// NOPInterval, when > 0, pings the target with a NOP-Out after that
	// much silence; no answer within another NOPInterval fails the session
	// (every outstanding command returns ErrSessionFailed).
	NOPInterval time.Duration
}

// LoginError is a login the target refused (Status-Class not 0) or that
// broke the protocol.
type LoginError struct {
	Status pdu.LoginStatus // 0 when the failure is not the target's status
	Msg    string
}

func (e *LoginError) Error() string {
	if e.Status != 0 {
		return "iscsi login: target answered " + e.Status.String() + e.Msg
	}
	return "iscsi login: " + e.Msg
}

// ErrAuth is wrapped by login failures caused by authentication (the
// target's status 0x0201, or a mutual CHAP answer that does not check).
var ErrAuth = errors.New("iscsi login: authentication failed")

func (e *LoginError) Unwrap() error {
	if e.Status == pdu.LoginAuthenticationFailure || e.Status == pdu.LoginAuthorizationFailure {
		return ErrAuth
	}
	return nil
}

// loginResult is what a successful login leaves for the session.
type loginResult struct {
	params   text.Params
	tsih     uint16
	cmdSN    uint32 // the first CmdSN of the full feature phase
	expStat  uint32 // ExpStatSN to send next
	expCmdSN uint32
	maxCmdSN uint32
	alias    string
}

// maxLoginSteps bounds the number of Login Request/Response exchanges, so
// a target that never transits cannot keep the initiator busy forever.
const maxLoginSteps = 32

type loginConn struct {
	nc      net.Conn
	r       pdu.Reader
	isid    pdu.ISID
	itt     uint32
	cmdSN   uint32
	expStat uint32
	tsih    uint16
	sns     pdu.StatusSNs
}

// exchange sends one login text (split over several PDUs with C when it
// exceeds 8192 bytes, the target's receive limit during login) and returns
// the target's complete answer (gathering continued responses).
func (lc *loginConn) exchange(data []byte, transit bool, csg, nsg pdu.Stage) (*pdu.LoginResponse, []byte, error) {
	chunks := text.Split(data, pdu.DefaultMaxRecvDataSegmentLength)
	var acc text.Accumulator
	for i, ch := range chunks {
		last := i == len(chunks)-1
		req := &pdu.LoginRequest{Transit: transit && last, Continue: !last, CSG: csg, NSG: nsg,
			ISID: lc.isid, TSIH: lc.tsih, ITT: lc.itt, CmdSN: lc.cmdSN, ExpStatSN: lc.expStat}
		if !req.Transit {
			req.NSG = 0
		}
		for {
			b, err := pdu.AppendPDU(nil, req, nil, ch, pdu.Digests{})
			if err != nil {
				return nil, nil, err
			}
			if _, err := lc.nc.Write(b); err != nil {
				return nil, nil, err
			}
			f, err := lc.r.Read()
			if err != nil {
				return nil, nil, fmt.Errorf("iscsi login: reading the response: %w", err)
			}
			resp, ok := f.Header.(*pdu.LoginResponse)
			if !ok {
				return nil, nil, &LoginError{Msg: fmt.Sprintf("expected a Login Response, got %s", f.Header.Opcode())}
			}
			if resp.ITT != lc.itt {
				return nil, nil, &LoginError{Msg: fmt.Sprintf("Login Response for ITT %#x, sent %#x", resp.ITT, lc.itt)}
			}
			if resp.Status != pdu.LoginSuccess {
				return resp, nil, &LoginError{Status: resp.Status}
			}
			if resp.VersionActive != pdu.VersionRFC7143 {
				return nil, nil, &LoginError{Msg: fmt.Sprintf("target chose version %#x", resp.VersionActive)}
			}
			// The first response's StatSN starts the sequence (RFC 7143
			// 11.13.4); afterwards it must follow ExpStatSN.
			lc.expStat = resp.StatSN + 1
			lc.sns = resp.StatusSNs
			lc.tsih = resp.TSIH
			if !last {
				// The target acknowledges a continued PDU with an empty
				// response (RFC 7143 6.6) before we send the rest.
				break
			}
			done, err := acc.Add(f.Data, resp.Continue)
			if err != nil {
				return nil, nil, &LoginError{Msg: err.Error()}
			}
			if done {
				return resp, acc.Take(), nil
			}
			// The target continues its text: ask for more with an empty
			// request, T=0 (RFC 7143 6.6).
			req = &pdu.LoginRequest{CSG: csg, ISID: lc.isid, TSIH: lc.tsih, ITT: lc.itt, CmdSN: lc.cmdSN, ExpStatSN: lc.expStat}
			ch = nil
		}
	}
	return nil, nil, &LoginError{Msg: "internal: no chunk sent"}
}

func pairsMap(ps []text.Pair) map[string]string {
	m := make(map[string]string, len(ps))
	for _, p := range ps {
		m[p.Key] = p.Value
	}
	return m
}

// login runs the login phase on nc up to the full feature phase.
func login(nc net.Conn, br *bufio.Reader, cfg *Config, discovery bool) (*loginResult, error) {
	var isid pdu.ISID
	var rnd [5]byte
	if _, err := io.ReadFull(rand.Reader, rnd[:]); err != nil {
		return nil, err
	}
	// ISID type 10b "Random" (RFC 7143 11.12.5): B and C random, D the
	// qualifier.
	isid[0] = 0x80
	copy(isid[2:], rnd[:4])
	lc := &loginConn{nc: nc, r: pdu.Reader{R: br}, isid: isid, itt: 0, cmdSN: uint32(rnd[4])<<8 | 1}

	name := cfg.InitiatorName
	if name == "" {
		name = DefaultInitiatorName
	}
	lead := []text.Pair{{Key: "InitiatorName", Value: name}}
	if discovery {
		lead = append(lead, text.Pair{Key: "SessionType", Value: "Discovery"})
	} else {
		if cfg.TargetName == "" {
			return nil, &LoginError{Msg: "no TargetName"}
		}
		lead = append(lead, text.Pair{Key: "SessionType", Value: "Normal"}, text.Pair{Key: "TargetName", Value: cfg.TargetName})
	}
	res := &loginResult{}

	// Security negotiation stage.
	useCHAP := cfg.User != ""
	mutual := cfg.TargetUser != "" || cfg.TargetSecret != ""
	if mutual && !useCHAP {
		return nil, &LoginError{Msg: "mutual CHAP needs User and Secret as well"}
	}
	if mutual {
		if err := chap.CheckSecrets([]byte(cfg.Secret), []byte(cfg.TargetSecret)); err != nil {
			return nil, &LoginError{Msg: err.Error()}
		}
	}
	auth := "None"
	if useCHAP {
		auth = "CHAP"
	}
	data, _ := text.Append(nil, append(lead, text.Pair{Key: "AuthMethod", Value: auth})...)
	resp, ans, err := lc.exchange(data, !useCHAP, pdu.StageSecurityNegotiation, pdu.StageLoginOperationalNegotiation)
	if err != nil {
		return nil, err
	}
	pairs, err := text.Parse(ans)
	if err != nil {
		return nil, &LoginError{Msg: "security answer: " + err.Error()}
	}
	m := pairsMap(pairs)
	res.alias = m["TargetAlias"]
	if a, ok := m["AuthMethod"]; ok && a != auth {
		return nil, &LoginError{Msg: fmt.Sprintf("offered AuthMethod=%s, target answered %s", auth, a)}
	}
	if useCHAP && m["AuthMethod"] == "CHAP" {
		data, _ = text.Append(nil, text.Pair{Key: "CHAP_A", Value: strconv.Itoa(chap.AlgorithmMD5)})
		if _, ans, err = lc.exchange(data, false, pdu.StageSecurityNegotiation, 0); err != nil {
			return nil, err
		}
		if pairs, err = text.Parse(ans); err != nil {
			return nil, &LoginError{Msg: "CHAP challenge: " + err.Error()}
		}
		var mc *chap.Challenge
		if mutual {
			c, err := chap.NewChallenge(rand.Reader)
			if err != nil {
				return nil, err
			}
			mc = &c
		}
		out, err := chap.Answer(pairsMap(pairs), cfg.User, []byte(cfg.Secret), mc)
		if err != nil {
			return nil, &LoginError{Msg: err.Error()}
		}
		data, _ = text.Append(nil, out...)
		if resp, ans, err = lc.exchange(data, true, pdu.StageSecurityNegotiation, pdu.StageLoginOperationalNegotiation); err != nil {
			return nil, err
		}
		if pairs, err = text.Parse(ans); err != nil {
			return nil, &LoginError{Msg: "CHAP answer: " + err.Error()}
		}
		if mutual {
			if err := chap.CheckTarget(*mc, pairsMap(pairs), cfg.TargetUser, []byte(cfg.TargetSecret)); err != nil {
				return nil, fmt.Errorf("%w: %v", ErrAuth, err)
			}
		}
	} else if mutual {
		return nil, fmt.Errorf("%w: target did not authenticate itself (mutual CHAP asked for)", ErrAuth)
	}
	// A target may ask for more security steps (T=0); send empty requests
	// with T=1 until it transits.
	for i := 0; !resp.Transit; i++ {
		if i == maxLoginSteps {
			return nil, &LoginError{Msg: "target never left the security stage"}
		}
		if resp, _, err = lc.exchange(nil, true, pdu.StageSecurityNegotiation, pdu.StageLoginOperationalNegotiation); err != nil {
			return nil, err
		}
	}

	p := text.Defaults()
	if resp.NSG == pdu.StageFullFeaturePhase {
		// The target skipped operational negotiation: defaults apply.
		return finishLogin(res, lc, p)
	}

	// Operational negotiation stage.
	mrdsl := cfg.MaxRecvDataSegmentLength
	if mrdsl == 0 {
		mrdsl = 262144
	}
	mbl, fbl := cfg.MaxBurstLength, cfg.FirstBurstLength
	if mbl == 0 {
		mbl = 16776192
	}
	if fbl == 0 {
		fbl = 262144
	}
	fbl = min(fbl, mbl)
	hd, dd := cfg.HeaderDigest, cfg.DataDigest
	if hd == "" {
		hd = "None"
	}
	if dd == "" {
		dd = "None"
	}
	offers := []text.Pair{
		{Key: "HeaderDigest", Value: hd},
		{Key: "DataDigest", Value: dd},
		{Key: "DefaultTime2Wait", Value: "0"},
		{Key: "DefaultTime2Retain", Value: "0"},
		{Key: "ErrorRecoveryLevel", Value: "0"},
		{Key: "MaxRecvDataSegmentLength", Value: strconv.Itoa(mrdsl)},
	}
	if !discovery {
		offers = append(offers,
			text.Pair{Key: "MaxConnections", Value: "1"},
			text.Pair{Key: "InitialR2T", Value: text.FormatBool(cfg.InitialR2T)},
			text.Pair{Key: "ImmediateData", Value: text.FormatBool(!cfg.NoImmediateData)},
			text.Pair{Key: "MaxBurstLength", Value: strconv.Itoa(mbl)},
			text.Pair{Key: "FirstBurstLength", Value: strconv.Itoa(fbl)},
			text.Pair{Key: "MaxOutstandingR2T", Value: "1"},
			text.Pair{Key: "DataPDUInOrder", Value: "Yes"},
			text.Pair{Key: "DataSequenceInOrder", Value: "Yes"},
		)
	}
	p.MaxRecvDataSegmentLength = uint64(mrdsl)
	offered := pairsMap(offers)
	send := offers
	for step := 0; ; step++ {
		if step == maxLoginSteps {
			return nil, &LoginError{Msg: "operational negotiation did not converge"}
		}
		data, err := text.Append(nil, send...)
		if err != nil {
			return nil, &LoginError{Msg: err.Error()}
		}
		if resp, ans, err = lc.exchange(data, true, pdu.StageLoginOperationalNegotiation, pdu.StageFullFeaturePhase); err != nil {
			return nil, err
		}
		if pairs, err = text.Parse(ans); err != nil {
			return nil, &LoginError{Msg: "operational answer: " + err.Error()}
		}
		send = nil
		for _, a := range pairs {
			if ov, ok := offered[a.Key]; ok {
				delete(offered, a.Key)
				if a.Key == "MaxRecvDataSegmentLength" {
					// Declarative both ways: the target's own value bounds
					// what we send it.
					n, ok := text.ParseNumber(a.Value)
					if !ok || n < 512 || n > pdu.MaxDataSegmentLength {
						return nil, &LoginError{Msg: fmt.Sprintf("target declared MaxRecvDataSegmentLength=%q", a.Value)}
					}
					p.PeerMaxRecvDataSegmentLength = n
					continue
				}
				v, err := text.Settle(a.Key, ov, a.Value)
				if err != nil {
					return nil, &LoginError{Msg: err.Error()}
				}
				if v != "" {
					if err := p.Set(a.Key, v); err != nil {
						return nil, &LoginError{Msg: err.Error()}
					}
				}
				continue
			}
			// The target's own offer or declaration.
			switch a.Key {
			case "MaxRecvDataSegmentLength":
				n, ok := text.ParseNumber(a.Value)
				if !ok || n < 512 || n > pdu.MaxDataSegmentLength {
					return nil, &LoginError{Msg: fmt.Sprintf("target declared MaxRecvDataSegmentLength=%q", a.Value)}
				}
				p.PeerMaxRecvDataSegmentLength = n
				continue
			case "TargetAlias":
				res.alias = a.Value
				continue
			}
			k := text.Keys[a.Key]
			ours := ""
			if k != nil {
				ours = k.Default
			}
			r := text.Respond(a, ours, discovery)
			if r.Outcome == text.Agreed {
				_ = p.Set(a.Key, r.Result)
			}
			if r.Outcome != text.Declared {
				send = append(send, text.Pair{Key: a.Key, Value: r.Value})
			}
		}
		if resp.Transit && resp.NSG == pdu.StageFullFeaturePhase {
			if len(send) > 0 {
				return nil, &LoginError{Msg: "target transited with offers left unanswered"}
			}
			break
		}
	}
	if err := p.Check(); err != nil {
		return nil, &LoginError{Msg: err.Error()}
	}
	if discovery {
		p.SessionType = "Discovery"
	}
	return finishLogin(res, lc, p)
}

func finishLogin(res *loginResult, lc *loginConn, p text.Params) (*loginResult, error) {
	if lc.tsih == 0 {
		return nil, &LoginError{Msg: "target sent TSIH 0 in the final Login Response"}
	}
	res.params = p
	res.tsih = lc.tsih
	res.cmdSN = lc.cmdSN
	res.expStat = lc.expStat
	res.expCmdSN = lc.sns.ExpCmdSN
	res.maxCmdSN = lc.sns.MaxCmdSN
	return res, nil
}
