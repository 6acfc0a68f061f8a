package pdu

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"math/rand"
	"net"
	"sync"
	"testing"

	"github.com/vmsan/vmsan/internal/iscsi/chap"
	"github.com/vmsan/vmsan/internal/iscsi/text"
)

// fakeTarget is a scripted, single-connection-at-a-time iSCSI target that
// exists only to drive real initiators (libiscsi's tools) through login,
// discovery, CHAP, one SCSI command and logout, so that the PDUs they send
// can be recorded as golden vectors. It is built from this repository's
// codecs, so a capture also checks that a real initiator accepts what they
// encode. It is test code: the production target lives elsewhere.
type fakeTarget struct {
	iqn     string
	addr    string
	user    string // CHAP_N the initiator must send ("" = AuthMethod None)
	secret  []byte
	tuser   string // mutual CHAP target name/secret
	tsecret []byte
	rnd     io.Reader
	digests string // HeaderDigest values supported ("" = None)

	mu    sync.Mutex
	lines []string // "C hex" / "S hex", one PDU each, in order
	errs  []error
}

func (ft *fakeTarget) record(dir string, b []byte) {
	ft.mu.Lock()
	ft.lines = append(ft.lines, dir+" "+hex.EncodeToString(b))
	ft.mu.Unlock()
}

func (ft *fakeTarget) fail(err error) {
	ft.mu.Lock()
	ft.errs = append(ft.errs, err)
	ft.mu.Unlock()
}

// serve accepts connections until l closes.
func (ft *fakeTarget) serve(l net.Listener) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		ft.conn(c)
		c.Close()
	}
}

// recorder keeps the raw bytes read since the last take.
type recorder struct {
	r   io.Reader
	buf bytes.Buffer
}

func (r *recorder) Read(p []byte) (int, error) {
	n, err := r.r.Read(p)
	r.buf.Write(p[:n])
	return n, err
}

func (r *recorder) take() []byte {
	b := append([]byte(nil), r.buf.Bytes()...)
	r.buf.Reset()
	return b
}

type connState struct {
	statSN, expCmdSN uint32
	dig              Digests
	params           text.Params
	discovery        bool
	authDone         bool
	ch               chap.Challenge
	acc              text.Accumulator
	offers           map[string]string
	sentTPGT         bool
}

func (ft *fakeTarget) conn(c net.Conn) {
	rec := &recorder{r: c}
	rd := Reader{R: rec, MaxData: 1 << 20}
	st := &connState{params: text.Defaults(), offers: map[string]string{}}
	send := func(h PDU, data []byte) bool {
		b, err := AppendPDU(nil, h, nil, data, st.dig)
		if err != nil {
			ft.fail(err)
			return false
		}
		ft.record("S", b)
		_, err = c.Write(b)
		return err == nil
	}
	for {
		f, err := rd.Read()
		raw := rec.take()
		if len(raw) > 0 {
			ft.record("C", raw)
		}
		if err != nil {
			if err != io.EOF {
				ft.fail(fmt.Errorf("read: %w", err))
			}
			return
		}
		sns := func() StatusSNs {
			s := StatusSNs{StatSN: st.statSN, ExpCmdSN: st.expCmdSN, MaxCmdSN: st.expCmdSN + 31}
			st.statSN++
			return s
		}
		switch h := f.Header.(type) {
		case *LoginRequest:
			st.expCmdSN = h.CmdSN
			done, err := st.acc.Add(f.Data, h.Continue)
			if err != nil {
				ft.fail(err)
				return
			}
			resp := &LoginResponse{ISID: h.ISID, ITT: h.ITT, CSG: h.CSG, StatusSNs: sns()}
			if !done {
				resp.Continue = false
				if !send(resp, nil) {
					return
				}
				continue
			}
			pairs, err := text.Parse(st.acc.Take())
			if err != nil {
				ft.fail(err)
				return
			}
			var out []text.Pair
			status := LoginSuccess
			for _, p := range pairs {
				st.offers[p.Key] = p.Value
			}
			if st.offers["SessionType"] == "Discovery" {
				st.discovery = true
			}
			if h.CSG == StageSecurityNegotiation {
				out, status = ft.security(st, pairs)
			} else {
				st.authDone = st.authDone || ft.user == ""
				dg := ft.digests
				if dg == "" {
					dg = "None"
				}
				ours := map[string]string{"HeaderDigest": dg, "DataDigest": "CRC32C,None",
					"InitialR2T": "No", "ImmediateData": "Yes", "MaxBurstLength": "1048576",
					"FirstBurstLength": "262144", "MaxConnections": "1", "ErrorRecoveryLevel": "0"}
				out = text.Negotiate(&st.params, pairs, ours, st.discovery)
				if len(pairs) > 0 {
					out = append(out, text.Pair{Key: "MaxRecvDataSegmentLength", Value: "262144"})
				}
			}
			if !st.discovery && !st.sentTPGT {
				out = append(out, text.Pair{Key: "TargetPortalGroupTag", Value: "1"})
				st.sentTPGT = true
			}
			data, err := text.Append(nil, out...)
			if err != nil {
				ft.fail(err)
				return
			}
			resp.Status = status
			if status == LoginSuccess && h.Transit && st.authDone {
				resp.Transit, resp.NSG = true, h.NSG
				if h.NSG == StageFullFeaturePhase {
					resp.TSIH = 0x1234
				}
			}
			if !send(resp, data) {
				return
			}
			if status != LoginSuccess {
				return
			}
			if resp.Transit && resp.NSG == StageFullFeaturePhase {
				st.dig = Digests{Header: st.params.HeaderDigest, Data: st.params.DataDigest}
				rd.Digests = st.dig
			}
		case *TextRequest:
			if !h.Immediate {
				st.expCmdSN = h.CmdSN + 1
			}
			pairs, err := text.Parse(f.Data)
			if err != nil {
				ft.fail(err)
				return
			}
			var out []text.Pair
			for _, p := range pairs {
				if p.Key == "SendTargets" {
					out = append(out, text.Pair{Key: "TargetName", Value: ft.iqn},
						text.Pair{Key: "TargetAddress", Value: ft.addr + ",1"})
				}
			}
			data, _ := text.Append(nil, out...)
			if !send(&TextResponse{Final: true, ITT: h.ITT, TTT: ReservedTag, StatusSNs: sns()}, data) {
				return
			}
		case *SCSICommand:
			if !h.Immediate {
				st.expCmdSN = h.CmdSN + 1
			}
			if !ft.scsi(st, h, send, sns) {
				return
			}
		case *NOPOut:
			if !h.Immediate {
				st.expCmdSN = h.CmdSN + 1
			}
			if h.ITT != ReservedTag {
				if !send(&NOPIn{ITT: h.ITT, TTT: ReservedTag, LUN: h.LUN, StatusSNs: sns()}, f.Data) {
					return
				}
			}
		case *LogoutRequest:
			if !h.Immediate {
				st.expCmdSN = h.CmdSN + 1
			}
			send(&LogoutResponse{ITT: h.ITT, StatusSNs: sns(), Time2Wait: 2, Time2Retain: 20}, nil)
			return
		default:
			ft.fail(fmt.Errorf("unexpected %s", f.Header.Opcode()))
			return
		}
	}
}

// security answers one security-stage Login Request.
func (ft *fakeTarget) security(st *connState, pairs []text.Pair) ([]text.Pair, LoginStatus) {
	var out []text.Pair
	for _, p := range pairs {
		switch p.Key {
		case "AuthMethod":
			mine := "None"
			if ft.user != "" {
				mine = "CHAP"
			}
			a := text.Respond(p, mine, st.discovery)
			out = append(out, text.Pair{Key: p.Key, Value: a.Value})
			if a.Value == "None" {
				st.authDone = true
			}
			if a.Outcome == text.Rejected {
				return out, LoginAuthenticationFailure
			}
		case "CHAP_A":
			ch, ans, err := chap.Begin(p.Value, ft.rnd)
			out = append(out, ans...)
			if err != nil {
				ft.fail(err)
				return out, LoginAuthenticationFailure
			}
			st.ch = ch
		case "CHAP_N":
			lookup := func(n string) ([]byte, bool) { return ft.secret, n == ft.user }
			ans, err := chap.Verify(st.ch, st.offers, chap.Secrets{Lookup: lookup, TargetName: ft.tuser, TargetSecret: ft.tsecret}, nil)
			if err != nil {
				ft.fail(err)
				return out, LoginAuthenticationFailure
			}
			out = append(out, ans...)
			st.authDone = true
		}
	}
	return out, LoginSuccess
}

// scsi answers the few commands the libiscsi tools send.
func (ft *fakeTarget) scsi(st *connState, h *SCSICommand, send func(PDU, []byte) bool, sns func() StatusSNs) bool {
	var data []byte
	switch h.CDB[0] {
	case 0x12: // INQUIRY
		if h.CDB[1]&1 != 0 { // VPD
			switch h.CDB[2] {
			case 0x00:
				data = []byte{0, 0x00, 0, 3, 0x00, 0x80, 0x83}
			case 0x80:
				data = append([]byte{0, 0x80, 0, 8}, "VMSAN001"...)
			case 0x83:
				data = []byte{0, 0x83, 0, 12, 0x01, 0x03, 0, 8, 0x60, 0, 0, 0, 0, 0, 0, 1}
			}
		} else {
			data = make([]byte, 36)
			data[2], data[3], data[4] = 0x06, 0x02, 31 // SPC-4, response data format 2
			data[7] = 0x02                             // CMDQUE
			copy(data[8:], "VMSAN   ")
			copy(data[16:], "codec-capture   ")
			copy(data[32:], "0001")
		}
	case 0x00: // TEST UNIT READY
	case 0x25: // READ CAPACITY (10)
		data = make([]byte, 8)
		binary.BigEndian.PutUint32(data, 2047)
		binary.BigEndian.PutUint32(data[4:], 512)
	case 0x9e: // READ CAPACITY (16)
		data = make([]byte, 32)
		binary.BigEndian.PutUint64(data, 2047)
		binary.BigEndian.PutUint32(data[8:], 512)
	case 0xa0: // REPORT LUNS
		data = make([]byte, 16)
		data[3] = 8
	}
	if data == nil && h.CDB[0] != 0x00 {
		sense := []byte{0x70, 0, 0x05, 0, 0, 0, 0, 10, 0, 0, 0, 0, 0x20, 0x00, 0, 0, 0, 0}
		return send(&SCSIResponse{ITT: h.ITT, Status: StatusCheckCondition, StatusSNs: sns()}, SenseData(sense))
	}
	if len(data) == 0 {
		return send(&SCSIResponse{ITT: h.ITT, Status: StatusGood, StatusSNs: sns()}, nil)
	}
	want := int(h.ExpectedDataTransferLength)
	resid := 0
	if len(data) > want {
		data = data[:want]
	} else {
		resid = want - len(data)
	}
	return send(&DataIn{Final: true, HasStatus: true, Status: StatusGood, ITT: h.ITT, TTT: ReservedTag,
		Underflow: resid > 0, ResidualCount: uint32(resid), StatusSNs: sns()}, data)
}

// capture runs one libiscsi command against a fresh fakeTarget and returns
// the transcript lines and the tool's output.
func capture(t *testing.T, ft *fakeTarget, tool string, args func(addr string) []string) ([]string, string, error) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ft.addr = l.Addr().String()
	if ft.rnd == nil {
		ft.rnd = rand.New(rand.NewSource(7))
	}
	done := make(chan struct{})
	go func() { ft.serve(l); close(done) }()
	out, err := runTool(tool, args(ft.addr)...)
	l.Close()
	<-done
	ft.mu.Lock()
	defer ft.mu.Unlock()
	for _, e := range ft.errs {
		t.Errorf("fake target: %v", e)
	}
	return ft.lines, out, err
}
