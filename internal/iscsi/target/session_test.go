package target

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vmsan/vmsan/internal/iscsi/chap"
	"github.com/vmsan/vmsan/internal/iscsi/pdu"
	"github.com/vmsan/vmsan/internal/iscsi/text"
)

// ini is a minimal initiator for protocol tests.
type ini struct {
	t     *testing.T
	c     net.Conn
	rd    pdu.Reader
	cmdSN uint32
	isid  pdu.ISID
	dig   pdu.Digests
	itt   uint32
}

func dial(t *testing.T, addr string) *ini {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	i := &ini{t: t, c: c, cmdSN: 1, isid: pdu.ISID{0x80, 0, 0, 0, 0, 1}}
	i.rd = pdu.Reader{R: bufio.NewReader(c), MaxData: 1 << 20}
	return i
}

func (i *ini) send(h pdu.PDU, data []byte) {
	i.t.Helper()
	b, err := pdu.AppendPDU(nil, h, nil, data, i.dig)
	if err != nil {
		i.t.Fatal(err)
	}
	if _, err := i.c.Write(b); err != nil {
		i.t.Fatal(err)
	}
}

func (i *ini) recv() pdu.Frame {
	i.t.Helper()
	i.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	f, err := i.rd.Read()
	if err != nil {
		i.t.Fatalf("read: %v", err)
	}
	return f
}

func keys(pairs ...string) []byte {
	var ps []text.Pair
	for j := 0; j+1 < len(pairs); j += 2 {
		ps = append(ps, text.Pair{Key: pairs[j], Value: pairs[j+1]})
	}
	b, _ := text.Append(nil, ps...)
	return b
}

// loginPDU sends one Login Request and returns the response and its keys.
func (i *ini) loginPDU(req *pdu.LoginRequest, data []byte) (*pdu.LoginResponse, map[string]string) {
	i.t.Helper()
	req.ISID, req.ITT, req.CmdSN = i.isid, i.itt, i.cmdSN
	i.send(req, data)
	f := i.recv()
	rsp, ok := f.Header.(*pdu.LoginResponse)
	if !ok {
		i.t.Fatalf("got %T, want a Login Response", f.Header)
	}
	ps, err := text.Parse(f.Data)
	if err != nil {
		i.t.Fatalf("login response keys: %v", err)
	}
	m := map[string]string{}
	for _, p := range ps {
		m[p.Key] = p.Value
	}
	return rsp, m
}

// login does an operational-stage-only login to the test target.
func (i *ini) login(extra ...string) *pdu.LoginResponse {
	i.t.Helper()
	kv := append([]string{"InitiatorName", "iqn.2026-11.test:ini", "TargetName", testIQN, "SessionType", "Normal"}, extra...)
	rsp, _ := i.loginPDU(&pdu.LoginRequest{Transit: true, CSG: pdu.StageLoginOperationalNegotiation, NSG: pdu.StageFullFeaturePhase}, keys(kv...))
	if rsp.Status != pdu.LoginSuccess || !rsp.Transit || rsp.TSIH == 0 {
		i.t.Fatalf("login: status %v transit %v tsih %d", rsp.Status, rsp.Transit, rsp.TSIH)
	}
	return rsp
}

func (i *ini) nop(itt uint32) {
	i.t.Helper()
	i.send(&pdu.NOPOut{ITT: itt, TTT: pdu.ReservedTag, CmdSN: i.cmdSN, Immediate: true}, []byte("ping"))
}

// expect reads until a PDU of type T arrives (skipping target NOP-In pings).
func expect[T pdu.PDU](i *ini) (T, pdu.Frame) {
	i.t.Helper()
	for {
		f := i.recv()
		if n, ok := f.Header.(*pdu.NOPIn); ok && n.ITT == pdu.ReservedTag {
			continue
		}
		h, ok := f.Header.(T)
		if !ok {
			var zero T
			i.t.Fatalf("got %T (%+v), want %T", f.Header, f.Header, zero)
		}
		return h, f
	}
}

func readCDB(lba uint32, blocks uint16) [16]byte {
	var c [16]byte
	c[0] = 0x28
	binary.BigEndian.PutUint32(c[2:], lba)
	binary.BigEndian.PutUint16(c[7:], blocks)
	return c
}

func writeCDB(lba uint32, blocks uint16) [16]byte {
	c := readCDB(lba, blocks)
	c[0] = 0x2a
	return c
}

func TestLoginStatuses(t *testing.T) {
	ts := startServer(t, func(c *Config, tg *Target) {
		tg.Initiators = []string{"iqn.2026-11.test:ini", "iqn.2026-11.test:chap"}
	})
	ts2 := startServer(t, func(c *Config, tg *Target) {
		tg.Auth = &CHAP{User: "u", Secret: []byte("secret-secret")}
	})
	op := pdu.StageLoginOperationalNegotiation
	cases := []struct {
		name string
		addr string
		req  pdu.LoginRequest
		kv   []string
		want pdu.LoginStatus
	}{
		{"version", ts.addr, pdu.LoginRequest{CSG: op, VersionMin: 3, VersionMax: 3}, []string{"InitiatorName", "iqn.2026-11.test:ini", "TargetName", testIQN}, pdu.LoginUnsupportedVersion},
		{"no initiator name", ts.addr, pdu.LoginRequest{CSG: op}, []string{"TargetName", testIQN}, pdu.LoginMissingParameter},
		{"no target name", ts.addr, pdu.LoginRequest{CSG: op}, []string{"InitiatorName", "iqn.2026-11.test:ini"}, pdu.LoginMissingParameter},
		{"unknown target", ts.addr, pdu.LoginRequest{CSG: op}, []string{"InitiatorName", "iqn.2026-11.test:ini", "TargetName", "iqn.2026-11.test:nope"}, pdu.LoginNotFound},
		{"acl", ts.addr, pdu.LoginRequest{CSG: op}, []string{"InitiatorName", "iqn.2026-11.test:other", "TargetName", testIQN}, pdu.LoginAuthorizationFailure},
		{"session type", ts.addr, pdu.LoginRequest{CSG: op}, []string{"InitiatorName", "iqn.2026-11.test:ini", "SessionType", "Weird"}, pdu.LoginSessionTypeNotSupported},
		{"auth skipped", ts2.addr, pdu.LoginRequest{CSG: op, Transit: true, NSG: pdu.StageFullFeaturePhase}, []string{"InitiatorName", "iqn.2026-11.test:ini", "TargetName", testIQN}, pdu.LoginAuthenticationFailure},
		{"auth none offered", ts2.addr, pdu.LoginRequest{CSG: pdu.StageSecurityNegotiation, Transit: true, NSG: op}, []string{"InitiatorName", "iqn.2026-11.test:ini", "TargetName", testIQN, "AuthMethod", "None"}, pdu.LoginAuthenticationFailure},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			i := dial(t, c.addr)
			rsp, _ := i.loginPDU(&c.req, keys(c.kv...))
			if rsp.Status != c.want {
				t.Fatalf("status %v, want %v", rsp.Status, c.want)
			}
			// The connection is closed after a failed login.
			i.c.SetReadDeadline(time.Now().Add(5 * time.Second))
			if _, err := i.rd.Read(); err == nil {
				t.Fatal("connection still open after a failed login")
			}
		})
	}
	t.Run("overlong value", func(t *testing.T) {
		i := dial(t, ts.addr)
		// Built by hand: text.Append refuses the overlong value.
		data := []byte("InitiatorName=iqn.2026-11.test:" + strings.Repeat("x", 300) + "\x00TargetName=" + testIQN + "\x00")
		rsp, _ := i.loginPDU(&pdu.LoginRequest{CSG: op}, data)
		if rsp.Status != pdu.LoginInitiatorError {
			t.Fatalf("status %v, want initiator error", rsp.Status)
		}
	})
	t.Run("duplicate key", func(t *testing.T) {
		i := dial(t, ts.addr)
		data := append(keys("InitiatorName", "iqn.2026-11.test:ini", "TargetName", testIQN), keys("TargetName", testIQN)...)
		rsp, _ := i.loginPDU(&pdu.LoginRequest{CSG: op}, data)
		if rsp.Status != pdu.LoginInitiatorError {
			t.Fatalf("status %v, want initiator error", rsp.Status)
		}
	})
}

// TestCHAPMutual runs a mutual CHAP login and checks the target's answer;
// a wrong response gets 0201.
func TestCHAPMutual(t *testing.T) {
	auth := &CHAP{User: "u", Secret: []byte("initiator-secret"), MutualUser: "tgt", MutualSecret: []byte("target-secret-1")}
	ts := startServer(t, func(c *Config, tg *Target) { tg.Auth = auth })
	for _, wrong := range []bool{false, true} {
		i := dial(t, ts.addr)
		sec := pdu.StageSecurityNegotiation
		rsp, m := i.loginPDU(&pdu.LoginRequest{CSG: sec}, keys("InitiatorName", "iqn.2026-11.test:ini", "TargetName", testIQN, "AuthMethod", "CHAP,None"))
		if rsp.Status != 0 || m["AuthMethod"] != "CHAP" || m["TargetPortalGroupTag"] != "1" {
			t.Fatalf("AuthMethod answer %v %v", rsp.Status, m)
		}
		rsp, m = i.loginPDU(&pdu.LoginRequest{CSG: sec}, keys("CHAP_A", "5"))
		if rsp.Status != 0 || m["CHAP_A"] != "5" {
			t.Fatalf("CHAP_A answer %v %v", rsp.Status, m)
		}
		mutual := chap.Challenge{ID: 7, Value: []byte("0123456789abcdef")}
		secret := auth.Secret
		if wrong {
			secret = []byte("not-the-secret")
		}
		ans, err := chap.Answer(m, "u", secret, &mutual)
		if err != nil {
			t.Fatal(err)
		}
		var kv []string
		for _, p := range ans {
			kv = append(kv, p.Key, p.Value)
		}
		rsp, m = i.loginPDU(&pdu.LoginRequest{CSG: sec, Transit: true, NSG: pdu.StageLoginOperationalNegotiation}, keys(kv...))
		if wrong {
			if rsp.Status != pdu.LoginAuthenticationFailure {
				t.Fatalf("wrong secret: status %v", rsp.Status)
			}
			continue
		}
		if rsp.Status != 0 || !rsp.Transit {
			t.Fatalf("CHAP response: status %v", rsp.Status)
		}
		if err := chap.CheckTarget(mutual, m, "tgt", auth.MutualSecret); err != nil {
			t.Fatalf("target's mutual answer: %v", err)
		}
		rsp, m = i.loginPDU(&pdu.LoginRequest{CSG: pdu.StageLoginOperationalNegotiation, Transit: true, NSG: pdu.StageFullFeaturePhase},
			keys("HeaderDigest", "CRC32C", "DataDigest", "CRC32C", "MaxRecvDataSegmentLength", "4096", "ErrorRecoveryLevel", "2", "MaxConnections", "4"))
		if rsp.Status != 0 || m["HeaderDigest"] != "CRC32C" || m["ErrorRecoveryLevel"] != "0" || m["MaxConnections"] != "1" || m["MaxRecvDataSegmentLength"] == "" {
			t.Fatalf("operational answer %v %v", rsp.Status, m)
		}
		// Digests are on now: a NOP round trip with CRC32C both ways.
		i.dig = pdu.Digests{Header: true, Data: true}
		i.rd.Digests = i.dig
		i.nop(9)
		n, f := expect[*pdu.NOPIn](i)
		if n.ITT != 9 || string(f.Data) != "ping" {
			t.Fatalf("NOP-In %+v %q", n, f.Data)
		}
	}
}

// TestBadInput: each bad PDU gets the RFC's answer and the session (or,
// when the stream cannot be trusted, the server) keeps serving.
func TestBadInput(t *testing.T) {
	ts := startServer(t, func(c *Config, _ *Target) { c.MaxRecvDataSegmentLength = 8192 })
	i := dial(t, ts.addr)
	rsp := i.login("DataDigest", "CRC32C")
	if rsp.MaxCmdSN-rsp.ExpCmdSN+1 < 128 {
		t.Fatalf("CmdSN window %d, want >= 128", rsp.MaxCmdSN-rsp.ExpCmdSN+1)
	}
	i.dig = pdu.Digests{Data: true}
	i.rd.Digests = i.dig

	// Unknown opcode: Reject "command not supported", session continues.
	bhs := make([]byte, pdu.BHSLen)
	bhs[0] = 0x1c
	i.c.Write(bhs)
	rj, f := expect[*pdu.Reject](i)
	if rj.Reason != pdu.RejectCommandNotSupported || !bytes.Equal(f.Data, bhs) {
		t.Fatalf("reject %v, quoted %x", rj.Reason, f.Data)
	}
	// A bad data digest: Reject "data digest error".
	b, _ := pdu.AppendPDU(nil, &pdu.NOPOut{ITT: 5, TTT: pdu.ReservedTag, CmdSN: i.cmdSN, Immediate: true}, nil, []byte("abcd"), i.dig)
	b[len(b)-1] ^= 0xff
	i.c.Write(b)
	if rj, _ := expect[*pdu.Reject](i); rj.Reason != pdu.RejectDataDigestError {
		t.Fatalf("reject %v, want data digest error", rj.Reason)
	}
	// A command outside the CmdSN window is ignored; the next in-window
	// one is served.
	i.send(&pdu.SCSICommand{Final: true, Read: true, ITT: 20, ExpectedDataTransferLength: 512, CmdSN: i.cmdSN + 1000, CDB: readCDB(0, 1)}, nil)
	i.send(&pdu.SCSICommand{Final: true, Read: true, ITT: 21, ExpectedDataTransferLength: 512, CmdSN: i.cmdSN, CDB: readCDB(0, 1)}, nil)
	i.cmdSN++
	if di, _ := expect[*pdu.DataIn](i); di.ITT != 21 || !di.HasStatus {
		t.Fatalf("Data-In %+v, want ITT 21 with status", di)
	}
	// Login in full feature phase: Reject protocol error.
	i.send(&pdu.LoginRequest{CSG: 1, ISID: i.isid}, nil)
	if rj, _ := expect[*pdu.Reject](i); rj.Reason != pdu.RejectProtocolError {
		t.Fatalf("reject %v", rj.Reason)
	}
	i.nop(30)
	if n, _ := expect[*pdu.NOPIn](i); n.ITT != 30 {
		t.Fatalf("NOP-In ITT %d", n.ITT)
	}
	// A data segment over our MaxRecvDataSegmentLength: Reject, then the
	// connection closes (the stream cannot be resynchronised).
	hdr := make([]byte, pdu.BHSLen)
	(&pdu.NOPOut{ITT: 31, TTT: pdu.ReservedTag, Immediate: true, Lengths: pdu.Lengths{DataSegmentLength: 1 << 20}}).Encode(hdr)
	i.c.Write(hdr)
	if rj, _ := expect[*pdu.Reject](i); rj.Reason != pdu.RejectProtocolError {
		t.Fatalf("reject %v", rj.Reason)
	}
	i.c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := i.rd.Read(); !errors.Is(err, io.EOF) {
		t.Fatalf("after an oversized segment: %v, want EOF", err)
	}
	// The server still serves others.
	j := dial(t, ts.addr)
	j.login()
	j.nop(1)
	expect[*pdu.NOPIn](j)
}

// TestWriteR2T: with InitialR2T=Yes and no immediate data, a 3 MiB write
// is solicited in MaxBurstLength R2Ts, at most MaxOutstandingR2T at once;
// the data reaches the LU and reads back split by MaxRecvDataSegmentLength.
func TestWriteR2T(t *testing.T) {
	ts := startServer(t, nil)
	i := dial(t, ts.addr)
	i.login("InitialR2T", "Yes", "ImmediateData", "No", "MaxBurstLength", "1048576", "MaxOutstandingR2T", "2", "MaxRecvDataSegmentLength", "65536")
	const n = 3 << 20
	payload := make([]byte, n)
	for k := range payload {
		payload[k] = byte(k * 7)
	}
	i.send(&pdu.SCSICommand{Final: true, Write: true, ITT: 1, ExpectedDataTransferLength: n, CmdSN: i.cmdSN, CDB: writeCDB(0, n/512)}, nil)
	i.cmdSN++
	var r2ts []*pdu.R2T
	for len(r2ts) < 2 {
		r, _ := expect[*pdu.R2T](i)
		r2ts = append(r2ts, r)
	}
	sent := 0
	for len(r2ts) > 0 {
		r := r2ts[0]
		r2ts = r2ts[1:]
		if r.DesiredDataTransferLength > 1<<20 {
			t.Fatalf("R2T for %d bytes > MaxBurstLength", r.DesiredDataTransferLength)
		}
		for off, sn := uint32(0), uint32(0); off < r.DesiredDataTransferLength; sn++ {
			m := min(8192, r.DesiredDataTransferLength-off)
			o := r.BufferOffset + off
			i.send(&pdu.DataOut{Final: off+m == r.DesiredDataTransferLength, ITT: 1, TTT: r.TTT, DataSN: sn, BufferOffset: o}, payload[o:o+m])
			off += m
		}
		sent += int(r.DesiredDataTransferLength)
		if sent < n && len(r2ts) == 0 {
			r, _ := expect[*pdu.R2T](i)
			r2ts = append(r2ts, r)
		}
	}
	if rsp, _ := expect[*pdu.SCSIResponse](i); rsp.Status != 0 || rsp.ITT != 1 {
		t.Fatalf("write response %+v", rsp)
	}
	if !ts.lu.equal(payload) {
		t.Fatal("written data differs")
	}
	i.send(&pdu.SCSICommand{Final: true, Read: true, ITT: 2, ExpectedDataTransferLength: n, CmdSN: i.cmdSN, CDB: readCDB(0, n/512)}, nil)
	i.cmdSN++
	var got []byte
	for {
		di, f := expect[*pdu.DataIn](i)
		if len(f.Data) > 65536 || int(di.BufferOffset) != len(got) {
			t.Fatalf("Data-In of %d bytes at %d", len(f.Data), di.BufferOffset)
		}
		got = append(got, f.Data...)
		if di.HasStatus {
			break
		}
	}
	if !bytes.Equal(got, payload) {
		t.Fatal("read data differs")
	}
}

// TestAbortTask: ABORT TASK waits for the task, drops its response and
// answers Function Complete; an unknown task is "does not exist".
func TestAbortTask(t *testing.T) {
	ts := startServer(t, nil)
	ts.lu.block = make(chan struct{})
	i := dial(t, ts.addr)
	i.login()
	i.send(&pdu.SCSICommand{Final: true, Read: true, ITT: 7, ExpectedDataTransferLength: 512, CmdSN: i.cmdSN, CDB: readCDB(0, 1)}, nil)
	i.cmdSN++
	for ts.lu.execs.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	i.send(&pdu.TaskMgmtRequest{Immediate: true, Function: pdu.TMFAbortTask, ITT: 8, ReferencedTaskTag: 7, CmdSN: i.cmdSN, RefCmdSN: i.cmdSN - 1}, nil)
	ts.waitAborted(t, 7) // the TMF is waiting for task 7
	close(ts.lu.block)
	tm, _ := expect[*pdu.TaskMgmtResponse](i)
	if tm.ITT != 8 || tm.Response != pdu.TMFFunctionComplete {
		t.Fatalf("TMF response %+v", tm)
	}
	i.send(&pdu.TaskMgmtRequest{Immediate: true, Function: pdu.TMFAbortTask, ITT: 9, ReferencedTaskTag: 99, CmdSN: i.cmdSN, RefCmdSN: i.cmdSN}, nil)
	if tm, _ := expect[*pdu.TaskMgmtResponse](i); tm.ITT != 9 || tm.Response != pdu.TMFTaskDoesNotExist {
		t.Fatalf("TMF response %+v", tm)
	}
	// ABORT TASK for a task that has completed (its response was sent):
	// "task does not exist" (RefCmdSN is below ExpCmdSN, outside the
	// window), as libiscsi's iSCSITMF.AbortTaskSimpleAsync expects.
	i.send(&pdu.SCSICommand{Final: true, Read: true, ITT: 12, ExpectedDataTransferLength: 512, CmdSN: i.cmdSN, CDB: readCDB(0, 1)}, nil)
	i.cmdSN++
	if di, _ := expect[*pdu.DataIn](i); di.ITT != 12 {
		t.Fatalf("Data-In for ITT %d", di.ITT)
	}
	i.send(&pdu.TaskMgmtRequest{Immediate: true, Function: pdu.TMFAbortTask, ITT: 13, ReferencedTaskTag: 12, CmdSN: i.cmdSN, RefCmdSN: i.cmdSN - 1}, nil)
	if tm, _ := expect[*pdu.TaskMgmtResponse](i); tm.ITT != 13 || tm.Response != pdu.TMFTaskDoesNotExist {
		t.Fatalf("abort of a completed task: %+v", tm)
	}
	// LUN RESET reaches the logical units.
	i.send(&pdu.TaskMgmtRequest{Immediate: true, Function: pdu.TMFLogicalUnitReset, ITT: 10, CmdSN: i.cmdSN}, nil)
	if tm, _ := expect[*pdu.TaskMgmtResponse](i); tm.ITT != 10 || tm.Response != pdu.TMFFunctionComplete || ts.lu.tmfs.Load() != 1 {
		t.Fatalf("LUN reset %+v, LU saw %d TMFs", tm, ts.lu.tmfs.Load())
	}
	i.nop(11)
	if n, _ := expect[*pdu.NOPIn](i); n.ITT != 11 {
		t.Fatalf("after the abort the next PDU is %+v (task 7's response must be dropped)", n)
	}
}

// TestReinstatement: a second login with the same InitiatorName and ISID
// closes the first session (its tasks aborted, the nexus lost) first.
func TestReinstatement(t *testing.T) {
	ts := startServer(t, nil)
	a := dial(t, ts.addr)
	a.login()
	b := dial(t, ts.addr)
	b.login()
	a.c.SetReadDeadline(time.Now().Add(5 * time.Second))
	for {
		f, err := a.rd.Read()
		if err != nil {
			break
		}
		if _, ping := f.Header.(*pdu.NOPIn); !ping {
			t.Fatalf("old session got %T", f.Header)
		}
	}
	if ts.lu.lost.Load() != 1 {
		t.Fatalf("NexusLost called %d times, want 1", ts.lu.lost.Load())
	}
	if st := ts.srv.Stats(); st.Reinstated != 1 || st.Sessions != 1 {
		t.Fatalf("stats %+v", st)
	}
	b.nop(1)
	expect[*pdu.NOPIn](b)
}

// TestNopTimeout: an initiator that stops answering the target's NOP-In
// pings is disconnected.
func TestNopTimeout(t *testing.T) {
	ts := startServer(t, func(c *Config, _ *Target) {
		c.NopInterval, c.NopTimeout = 100*time.Millisecond, 300*time.Millisecond
	})
	i := dial(t, ts.addr)
	i.login()
	n, _ := func() (*pdu.NOPIn, pdu.Frame) {
		f := i.recv()
		p, ok := f.Header.(*pdu.NOPIn)
		if !ok || p.ITT != pdu.ReservedTag || p.TTT == pdu.ReservedTag {
			t.Fatalf("want a target ping, got %+v", f.Header)
		}
		return p, f
	}()
	_ = n
	// Do not answer: the target closes the connection.
	i.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	for {
		f, err := i.rd.Read()
		if err != nil {
			if !errors.Is(err, io.EOF) {
				t.Fatalf("want EOF, got %v", err)
			}
			break
		}
		if _, ok := f.Header.(*pdu.NOPIn); !ok {
			t.Fatalf("got %T", f.Header)
		}
	}
	if ts.srv.Stats().NopTimeouts != 1 {
		t.Fatal("nop timeout not counted")
	}
}

// TestSendTargetsLong: a SendTargets answer longer than the initiator's
// MaxRecvDataSegmentLength comes in several Text Responses (C bit, TTT).
func TestSendTargetsLong(t *testing.T) {
	var many []Target
	for k := 0; k < 100; k++ {
		many = append(many, Target{Name: testIQN + ":volume-with-a-long-name-" + strconv.Itoa(k), LUs: newRAMLU(4096), AllowAny: true})
	}
	srv := New(Config{Targets: func() []Target { return many }})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln, 3)
	t.Cleanup(srv.Close)
	i := dial(t, ln.Addr().String())
	rsp, _ := i.loginPDU(&pdu.LoginRequest{Transit: true, CSG: 1, NSG: 3}, keys("InitiatorName", "iqn.2026-11.test:ini", "SessionType", "Discovery", "MaxRecvDataSegmentLength", "512"))
	if rsp.Status != 0 {
		t.Fatal(rsp.Status)
	}
	i.send(&pdu.TextRequest{Final: true, ITT: 1, TTT: pdu.ReservedTag, CmdSN: i.cmdSN, Immediate: true}, keys("SendTargets", "All"))
	var all []byte
	for {
		tr, f := expect[*pdu.TextResponse](i)
		if len(f.Data) > 512 {
			t.Fatalf("Text Response of %d bytes > 512", len(f.Data))
		}
		all = append(all, f.Data...)
		if !tr.Continue {
			break
		}
		i.send(&pdu.TextRequest{Final: true, ITT: 1, TTT: tr.TTT, CmdSN: i.cmdSN, Immediate: true}, nil)
	}
	ps, err := text.ParseList(all)
	if err != nil {
		t.Fatal(err)
	}
	names := 0
	for _, p := range ps {
		if p.Key == "TargetName" {
			names++
		} else if p.Key != "TargetAddress" || p.Value != ln.Addr().String()+",3" {
			t.Fatalf("unexpected %v", p)
		}
	}
	if names != 100 {
		t.Fatalf("%d targets listed", names)
	}
}

// TestCmdSNWindow: 128 commands can be in flight at once (they complete
// out of order on the LU's goroutines); a command beyond MaxCmdSN is
// ignored; as commands complete MaxCmdSN advances.
func TestCmdSNWindow(t *testing.T) {
	ts := startServer(t, nil)
	ts.lu.block = make(chan struct{})
	i := dial(t, ts.addr)
	rsp := i.login()
	first, max0 := rsp.ExpCmdSN, rsp.MaxCmdSN
	for k := uint32(0); k < 128; k++ {
		i.send(&pdu.SCSICommand{Final: true, Read: true, ITT: 100 + k, ExpectedDataTransferLength: 512, CmdSN: first + k, CDB: readCDB(k, 1)}, nil)
	}
	// Beyond the window: must not run.
	i.send(&pdu.SCSICommand{Final: true, Read: true, ITT: 999, ExpectedDataTransferLength: 512, CmdSN: max0 + 1, CDB: readCDB(0, 1)}, nil)
	deadline := time.Now().Add(10 * time.Second)
	for ts.lu.execs.Load() < 128 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if n := ts.lu.execs.Load(); n != 128 {
		t.Fatalf("%d commands executing, want 128", n)
	}
	close(ts.lu.block)
	seen := map[uint32]bool{}
	var lastMax uint32
	for len(seen) < 128 {
		di, _ := expect[*pdu.DataIn](i)
		if di.ITT == 999 || seen[di.ITT] {
			t.Fatalf("unexpected response for ITT %d", di.ITT)
		}
		seen[di.ITT] = true
		lastMax = di.MaxCmdSN
	}
	if !pdu.SNGreater(lastMax, max0) {
		t.Fatalf("MaxCmdSN did not advance: %d then %d", max0, lastMax)
	}
	time.Sleep(50 * time.Millisecond)
	if n := ts.lu.execs.Load(); n != 128 {
		t.Fatalf("the command outside the window ran (%d executions)", n)
	}
}

// TestLogoutWithPendingWrite: a logout while a write still waits for its
// Data-Out is answered (the write ends) instead of waiting forever.
func TestLogoutWithPendingWrite(t *testing.T) {
	ts := startServer(t, nil)
	i := dial(t, ts.addr)
	i.login("InitialR2T", "Yes", "ImmediateData", "No")
	i.send(&pdu.SCSICommand{Final: true, Write: true, ITT: 1, ExpectedDataTransferLength: 4096, CmdSN: i.cmdSN, CDB: writeCDB(0, 8)}, nil)
	i.cmdSN++
	expect[*pdu.R2T](i)
	i.send(&pdu.LogoutRequest{Immediate: true, Reason: pdu.LogoutCloseSession, ITT: 2, CmdSN: i.cmdSN}, nil)
	if lr, _ := expect[*pdu.LogoutResponse](i); lr.ITT != 2 || lr.Response != pdu.LogoutClosedSuccessfully {
		t.Fatalf("logout response %+v", lr)
	}
	if ts.lu.execs.Load() != 0 {
		t.Fatal("the write without its data ran")
	}
}

// TestAsyncCapacityChanged: NotifyCapacityChanged reaches the target's
// sessions as an Asynchronous Message carrying 06/2A/09 for the LUN.
func TestAsyncCapacityChanged(t *testing.T) {
	ts := startServer(t, nil)
	i := dial(t, ts.addr)
	i.login()
	if n := ts.srv.NotifyCapacityChanged(testIQN, 300); n != 1 {
		t.Fatalf("told %d sessions", n)
	}
	am, f := expect[*pdu.AsyncMessage](i)
	sense, err := pdu.ParseSenseData(f.Data)
	if err != nil || am.AsyncEvent != pdu.AsyncSCSIEvent || decodeLUN(am.LUN) != 300 ||
		len(sense) < 14 || sense[2]&0xf != 6 || sense[12] != 0x2a || sense[13] != 0x09 {
		t.Fatalf("async message %+v sense %x (%v)", am, sense, err)
	}
	for _, l := range []uint64{0, 1, 255, 256, 16383} {
		if decodeLUN(encodeLUN(l)) != l {
			t.Errorf("LUN %d does not round-trip", l)
		}
	}
}

// TestSessionBudget: write commands whose data has not arrived hold their
// buffers against the session budget; past it the target answers BUSY
// instead of allocating more (a client cannot make it hold unbounded
// memory by announcing writes it never sends).
func TestSessionBudget(t *testing.T) {
	ts := startServer(t, func(c *Config, _ *Target) { c.SessionBudget = 1 << 20 })
	i := dial(t, ts.addr)
	i.login("InitialR2T", "Yes", "ImmediateData", "No")
	for k := uint32(0); k < 3; k++ {
		i.send(&pdu.SCSICommand{Final: true, Write: true, ITT: k, ExpectedDataTransferLength: 512 << 10, CmdSN: i.cmdSN, CDB: writeCDB(0, 1024)}, nil)
		i.cmdSN++
	}
	r2ts, busy := 0, 0
	for r2ts+busy < 3 {
		f := i.recv()
		switch h := f.Header.(type) {
		case *pdu.R2T:
			r2ts++
		case *pdu.SCSIResponse:
			if h.ITT != 2 || h.Status != pdu.StatusBusy {
				t.Fatalf("response %+v", h)
			}
			busy++
		}
	}
	if r2ts != 2 || busy != 1 {
		t.Fatalf("%d R2Ts, %d BUSY; want 2 and 1", r2ts, busy)
	}
}

// TestDataDigestErrors: at ErrorRecoveryLevel 0 a Data-Out whose data
// fails the digest gets Reject 02 and its task ends, once the rest of
// its data is in, with CHECK CONDITION 0B/47/05 without reaching the
// logical unit (RFC 7143 7.8); a command whose immediate data fails it is
// not taken, and the same CmdSN resent is (11.17.1).
func TestDataDigestErrors(t *testing.T) {
	ts := startServer(t, nil)
	i := dial(t, ts.addr)
	i.login("DataDigest", "CRC32C", "InitialR2T", "No")
	i.dig = pdu.Digests{Data: true}
	i.rd.Digests = i.dig
	execs := ts.lu.execs.Load()
	i.send(&pdu.SCSICommand{Write: true, ITT: 2, ExpectedDataTransferLength: 8192, CmdSN: i.cmdSN, CDB: writeCDB(0, 16)}, nil)
	i.cmdSN++
	b, _ := pdu.AppendPDU(nil, &pdu.DataOut{ITT: 2, TTT: pdu.ReservedTag}, nil, make([]byte, 4096), i.dig)
	b[len(b)-1] ^= 0xff
	i.c.Write(b)
	if rj, _ := expect[*pdu.Reject](i); rj.Reason != pdu.RejectDataDigestError {
		t.Fatalf("reject %v", rj.Reason)
	}
	i.send(&pdu.DataOut{Final: true, ITT: 2, TTT: pdu.ReservedTag, DataSN: 1, BufferOffset: 4096}, make([]byte, 4096))
	rsp, f := expect[*pdu.SCSIResponse](i)
	if rsp.ITT != 2 || rsp.Status != pdu.StatusCheckCondition || len(f.Data) < 16 || f.Data[2+2]&0x0f != 0x0b || f.Data[2+12] != 0x47 || f.Data[2+13] != 0x05 {
		t.Fatalf("response %+v sense %x, want CHECK CONDITION 0B/47/05", rsp, f.Data)
	}
	if ts.lu.execs.Load() != execs {
		t.Fatal("a write with corrupt data reached the logical unit")
	}
	// Bad immediate data: the command is dropped, its CmdSN still expected.
	cmd := &pdu.SCSICommand{Final: true, Write: true, ITT: 3, ExpectedDataTransferLength: 512, CmdSN: i.cmdSN, CDB: writeCDB(0, 1)}
	b, _ = pdu.AppendPDU(nil, cmd, nil, make([]byte, 512), i.dig)
	b[len(b)-1] ^= 0xff
	i.c.Write(b)
	if rj, _ := expect[*pdu.Reject](i); rj.Reason != pdu.RejectDataDigestError {
		t.Fatalf("reject %v", rj.Reason)
	}
	i.send(cmd, make([]byte, 512))
	i.cmdSN++
	if rsp, _ := expect[*pdu.SCSIResponse](i); rsp.ITT != 3 || rsp.Status != pdu.StatusGood {
		t.Fatalf("resent command: %+v", rsp)
	}
}

// TestTextContinued: a Text Request continued over two PDUs (C bit) gets
// an empty F=0 answer with a TTT, which the second part carries; the
// SendTargets answer then ends the exchange (F=1, TTT reserved).
func TestTextContinued(t *testing.T) {
	ts := startServer(t, nil)
	i := dial(t, ts.addr)
	i.login()
	i.send(&pdu.TextRequest{Continue: true, Immediate: true, ITT: 5, TTT: pdu.ReservedTag, CmdSN: i.cmdSN}, []byte("SendTar"))
	tr, f := expect[*pdu.TextResponse](i)
	if tr.Final || tr.Continue || tr.TTT == pdu.ReservedTag || len(f.Data) != 0 {
		t.Fatalf("answer to the first part: %+v %q", tr, f.Data)
	}
	i.send(&pdu.TextRequest{Final: true, Immediate: true, ITT: 5, TTT: tr.TTT, CmdSN: i.cmdSN}, []byte("gets=All\x00"))
	tr, f = expect[*pdu.TextResponse](i)
	if !tr.Final || tr.TTT != pdu.ReservedTag || !bytes.Contains(f.Data, []byte("TargetName="+testIQN)) {
		t.Fatalf("SendTargets answer: %+v %q", tr, f.Data)
	}
	// A TTT the target did not give: Reject.
	i.send(&pdu.TextRequest{Final: true, Immediate: true, ITT: 6, TTT: 0x1234, CmdSN: i.cmdSN}, []byte("SendTargets=All\x00"))
	if rj, _ := expect[*pdu.Reject](i); rj.Reason != pdu.RejectInvalidPDUField {
		t.Fatalf("reject %v", rj.Reason)
	}
}
