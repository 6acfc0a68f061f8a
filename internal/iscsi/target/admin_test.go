package target

import (
	"net"
	"sync"
	"testing"
	"time"

	"github.com/vmsan/vmsan/internal/iscsi/pdu"
	"github.com/vmsan/vmsan/internal/iscsi/text"
)

// discover runs a discovery login and SendTargets=All, returning the
// target names listed.
func discover(t *testing.T, addr, initiator string) []string {
	t.Helper()
	i := dial(t, addr)
	rsp, _ := i.loginPDU(&pdu.LoginRequest{Transit: true, CSG: 1, NSG: 3}, keys("InitiatorName", initiator, "SessionType", "Discovery"))
	if rsp.Status != 0 {
		t.Fatalf("discovery login: %v", rsp.Status)
	}
	i.send(&pdu.TextRequest{Final: true, ITT: 1, TTT: pdu.ReservedTag, CmdSN: i.cmdSN, Immediate: true}, keys("SendTargets", "All"))
	_, f := expect[*pdu.TextResponse](i)
	ps, err := text.ParseList(f.Data)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range ps {
		if p.Key == "TargetName" {
			names = append(names, p.Value)
		}
	}
	return names
}

// TestOpenTargetRefused: a target with no ACL and no CHAP refuses logins
// (0202) and is not listed by discovery unless AllowAny; with an ACL only
// the listed initiator sees and reaches it; with CHAP only it is listed
// and the login goes on to the CHAP exchange. Refusals are counted by
// reason.
func TestOpenTargetRefused(t *testing.T) {
	open := startServer(t, func(c *Config, tg *Target) { tg.AllowAny = false })
	op := pdu.StageLoginOperationalNegotiation
	i := dial(t, open.addr)
	rsp, _ := i.loginPDU(&pdu.LoginRequest{CSG: op, Transit: true, NSG: pdu.StageFullFeaturePhase},
		keys("InitiatorName", "iqn.2026-11.test:ini", "TargetName", testIQN))
	if rsp.Status != pdu.LoginAuthorizationFailure {
		t.Fatalf("login to a target without ACL/CHAP: %v, want 0202", rsp.Status)
	}
	if n := discover(t, open.addr, "iqn.2026-11.test:ini"); len(n) != 0 {
		t.Fatalf("discovery lists %v for a target without ACL/CHAP", n)
	}
	if st := open.srv.Stats(); st.LoginFailureReasons["authorization"] != 1 || st.LoginFailures != 1 {
		t.Fatalf("failures %d by reason %v, want 1 authorization", st.LoginFailures, st.LoginFailureReasons)
	}

	acl := startServer(t, func(c *Config, tg *Target) { tg.AllowAny, tg.Initiators = false, []string{"iqn.2026-11.test:ini"} })
	if n := discover(t, acl.addr, "iqn.2026-11.test:ini"); len(n) != 1 || n[0] != testIQN {
		t.Fatalf("ACL'd initiator discovers %v", n)
	}
	if n := discover(t, acl.addr, "iqn.2026-11.test:other"); len(n) != 0 {
		t.Fatalf("initiator outside the ACL discovers %v", n)
	}
	dial(t, acl.addr).login()

	ch := startServer(t, func(c *Config, tg *Target) {
		tg.AllowAny, tg.Auth = false, &CHAP{User: "u", Secret: []byte("secret-secret")}
	})
	if n := discover(t, ch.addr, "iqn.2026-11.test:any"); len(n) != 1 {
		t.Fatalf("CHAP target: discovery lists %v", n)
	}
	i = dial(t, ch.addr)
	rsp, m := i.loginPDU(&pdu.LoginRequest{CSG: pdu.StageSecurityNegotiation},
		keys("InitiatorName", "iqn.2026-11.test:any", "TargetName", testIQN, "AuthMethod", "CHAP"))
	if rsp.Status != 0 || m["AuthMethod"] != "CHAP" {
		t.Fatalf("CHAP target: %v %v", rsp.Status, m)
	}
}

// TestSessionsAndDropRevoked: Sessions describes a logged-in session with
// its negotiated values; after the ACL changes, DropRevoked closes the
// session of the initiator that lost access and keeps the other.
func TestSessionsAndDropRevoked(t *testing.T) {
	var mu sync.Mutex
	acl := []string{"iqn.2026-11.test:ini", "iqn.2026-11.test:two"}
	lu := newRAMLU(1 << 20)
	srv := New(Config{Targets: func() []Target {
		mu.Lock()
		defer mu.Unlock()
		return []Target{{Name: testIQN, LUs: lu, Initiators: append([]string(nil), acl...)}}
	}})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln, 7)
	t.Cleanup(srv.Close)
	a := dial(t, ln.Addr().String())
	a.login("HeaderDigest", "CRC32C", "MaxBurstLength", "65536", "FirstBurstLength", "8192", "ImmediateData", "No")
	b := dial(t, ln.Addr().String())
	b.isid = pdu.ISID{0x80, 0, 0, 0, 0, 9}
	kv := []string{"InitiatorName", "iqn.2026-11.test:two", "TargetName", testIQN}
	if rsp, _ := b.loginPDU(&pdu.LoginRequest{Transit: true, CSG: 1, NSG: 3}, keys(kv...)); rsp.Status != 0 {
		t.Fatal(rsp.Status)
	}
	ss := srv.Sessions()
	if len(ss) != 2 {
		t.Fatalf("%d sessions, want 2", len(ss))
	}
	s := ss[0]
	if s.Initiator != "iqn.2026-11.test:ini" || s.ISID != "800000000001" || s.TSIH == 0 || s.Target != testIQN ||
		s.PortalGroup != 7 || s.Portal != ln.Addr().String() || s.Connections != 1 || s.Auth != "None" ||
		s.HeaderDigest != "CRC32C" || s.DataDigest != "None" || s.MaxBurstLength != 65536 || s.FirstBurstLength != 8192 ||
		s.ImmediateData || !s.InitialR2T || s.TargetMaxRecvDataSegmentLength != 262144 || s.InitiatorMaxRecvDataSegmentLength != 8192 {
		t.Fatalf("session info %+v", s)
	}
	mu.Lock()
	acl = []string{"iqn.2026-11.test:two"}
	mu.Unlock()
	dropped := srv.DropRevoked()
	if len(dropped) != 1 || dropped[0].Session.Initiator != "iqn.2026-11.test:ini" {
		t.Fatalf("dropped %+v", dropped)
	}
	a.c.SetReadDeadline(time.Now().Add(5 * time.Second))
	for {
		if _, err := a.rd.Read(); err != nil {
			break // closed (NOP-Ins may come first)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for len(srv.Sessions()) != 1 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if ss := srv.Sessions(); len(ss) != 1 || ss[0].Initiator != "iqn.2026-11.test:two" {
		t.Fatalf("sessions after the drop: %+v", ss)
	}
}

// TestSessionsCommandsInFlight: Sessions counts the commands a session
// has received and not answered.
func TestSessionsCommandsInFlight(t *testing.T) {
	ts := startServer(t, nil)
	ts.lu.block = make(chan struct{})
	i := dial(t, ts.addr)
	rsp := i.login()
	for k := uint32(0); k < 3; k++ {
		i.send(&pdu.SCSICommand{Final: true, Read: true, ITT: 10 + k, ExpectedDataTransferLength: 512, CmdSN: rsp.ExpCmdSN + k, CDB: readCDB(k, 1)}, nil)
	}
	deadline := time.Now().Add(10 * time.Second)
	for ts.lu.execs.Load() < 3 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if ss := ts.srv.Sessions(); len(ss) != 1 || ss[0].CommandsInFlight != 3 {
		t.Fatalf("sessions %+v, want one with 3 commands in flight", ss)
	}
	close(ts.lu.block)
	for range 3 {
		expect[*pdu.DataIn](i)
	}
	deadline = time.Now().Add(10 * time.Second)
	for ts.srv.Sessions()[0].CommandsInFlight != 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if n := ts.srv.Sessions()[0].CommandsInFlight; n != 0 {
		t.Fatalf("%d commands in flight after their answers", n)
	}
}
