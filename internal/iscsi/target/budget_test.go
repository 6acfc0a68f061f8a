package target

import (
	"testing"
	"time"

	"github.com/vmsan/vmsan/internal/iscsi/pdu"
	"github.com/vmsan/vmsan/internal/volrt"
)

// TestDaemonBudgetAndMaxSessions: sessions share Config.Budget: once their
// unsent writes hold it, a command of a session with commands in flight
// gets TASK SET FULL and one of a session with none gets BUSY (the
// reader does not wait); a login past MaxSessions gets 0302 while
// reinstating an existing session still works; a closed session gives its
// part of the budget back.
func TestDaemonBudgetAndMaxSessions(t *testing.T) {
	var global volrt.Budget
	global.Init(1 << 20)
	// The whole budget may wait for data here (the awaiting share is
	// TestAwaitingDataShare's).
	ts := startServer(t, func(c *Config, _ *Target) { c.Budget, c.MaxSessions, c.AwaitingDataShare = &global, 2, 1 })
	write := func(i *ini, itt uint32) {
		i.send(&pdu.SCSICommand{Final: true, Write: true, ITT: itt, ExpectedDataTransferLength: 512 << 10, CmdSN: i.cmdSN, CDB: writeCDB(0, 1024)}, nil)
		i.cmdSN++
	}
	status := func(i *ini, itt uint32) pdu.SCSIStatus {
		t.Helper()
		for {
			if h, ok := i.recv().Header.(*pdu.SCSIResponse); ok {
				if h.ITT != itt {
					t.Fatalf("response for ITT %d, want %d", h.ITT, itt)
				}
				return h.Status
			}
		}
	}
	a := dial(t, ts.addr)
	a.login("InitialR2T", "Yes", "ImmediateData", "No")
	write(a, 1)
	write(a, 2)
	expect[*pdu.R2T](a)
	expect[*pdu.R2T](a)
	if u := global.Used(); u != 1<<20 {
		t.Fatalf("budget used %d, want 1 MiB", u)
	}
	write(a, 3)
	if st := status(a, 3); st != pdu.StatusTaskSetFull {
		t.Fatalf("third write of a session with two in flight: %v, want TASK SET FULL", st)
	}
	b := dial(t, ts.addr)
	b.isid = pdu.ISID{0x80, 0, 0, 0, 0, 2}
	b.login("InitialR2T", "Yes", "ImmediateData", "No")
	write(b, 1)
	if st := status(b, 1); st != pdu.StatusBusy {
		t.Fatalf("write of a session with nothing in flight: %v, want BUSY", st)
	}

	c := dial(t, ts.addr)
	c.isid = pdu.ISID{0x80, 0, 0, 0, 0, 3}
	kv := []string{"InitiatorName", "iqn.2026-11.test:ini", "TargetName", testIQN, "SessionType", "Normal"}
	rsp, _ := c.loginPDU(&pdu.LoginRequest{Transit: true, CSG: pdu.StageLoginOperationalNegotiation, NSG: pdu.StageFullFeaturePhase}, keys(kv...))
	if rsp.Status != pdu.LoginOutOfResources {
		t.Fatalf("third session's login: %v, want out of resources (0302)", rsp.Status)
	}
	if n := ts.srv.Stats().SessionsRefused; n != 1 {
		t.Fatalf("SessionsRefused %d, want 1", n)
	}
	// Reinstating b at the limit is allowed.
	b2 := dial(t, ts.addr)
	b2.isid = b.isid
	b2.login()

	a.c.Close()
	for end := time.Now().Add(10 * time.Second); global.Used() != 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("budget used %d after the session holding it closed", global.Used())
		}
	}
	if st := global.Stats(); st.Refused < 2 {
		t.Fatalf("budget refusals %d, want >= 2", st.Refused)
	}
}

// TestDaemonBudgetImmediateData: a WRITE's immediate data is read into its
// EDTL-sized buffer only with room in Config.Budget; that reservation
// becomes the task's (counted once) and is given back when it completes,
// and a refused command leaves nothing held.
func TestDaemonBudgetImmediateData(t *testing.T) {
	var global volrt.Budget
	global.Init(1 << 20)
	ts := startServer(t, func(c *Config, _ *Target) { c.Budget, c.AwaitingDataShare = &global, 1 })
	i := dial(t, ts.addr)
	i.login("InitialR2T", "Yes", "ImmediateData", "Yes")
	data := make([]byte, 512<<10)
	for k := range data {
		data[k] = byte(k)
	}
	cmd := func(itt uint32, imm []byte) {
		i.send(&pdu.SCSICommand{Final: true, Write: true, ITT: itt, ExpectedDataTransferLength: 512 << 10, CmdSN: i.cmdSN, CDB: writeCDB(0, 1024)}, imm)
		i.cmdSN++
	}
	cmd(1, data[:8192])
	cmd(2, data[:8192])
	r1, _ := expect[*pdu.R2T](i)
	expect[*pdu.R2T](i)
	if u := global.Used(); u != 1<<20 {
		t.Fatalf("budget used %d with two 512 KiB writes in flight, want 1 MiB (immediate data counted once)", u)
	}
	cmd(3, data[:8192])
	for {
		if h, ok := i.recv().Header.(*pdu.SCSIResponse); ok {
			if h.ITT != 3 || h.Status != pdu.StatusTaskSetFull {
				t.Fatalf("third write: ITT %d %v, want TASK SET FULL", h.ITT, h.Status)
			}
			break
		}
	}
	if u := global.Used(); u != 1<<20 {
		t.Fatalf("budget used %d after a refused write, want 1 MiB", u)
	}
	// Finish the first write: its part is given back.
	for r := r1; ; {
		if r != nil {
			i.send(&pdu.DataOut{Final: true, ITT: r.ITT, TTT: r.TTT, BufferOffset: r.BufferOffset}, data[r.BufferOffset:r.BufferOffset+r.DesiredDataTransferLength])
		}
		r = nil
		f := i.recv()
		if h, ok := f.Header.(*pdu.R2T); ok && h.ITT == r1.ITT {
			r = h
			continue
		}
		if h, ok := f.Header.(*pdu.SCSIResponse); ok {
			if h.ITT != r1.ITT || h.Status != pdu.StatusGood {
				t.Fatalf("first write: ITT %d %v", h.ITT, h.Status)
			}
			break
		}
	}
	for end := time.Now().Add(10 * time.Second); global.Used() != 512<<10; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("budget used %d after the first write completed, want 512 KiB", global.Used())
		}
	}
}

// TestAwaitingDataShare: commands waiting for their write data hold at
// most AwaitingDataShare of Config.Budget together (a second one past it
// is refused, though the budget has room); a command without write data
// and with a small data-in (INQUIRY) is answered even with the budget
// spent, while a READ is not; a write whose Data-Out does not come within
// DataOutTimeout closes its connection, which gives its budget back.
func TestAwaitingDataShare(t *testing.T) {
	var global volrt.Budget
	global.Init(2 << 20)
	ts := startServer(t, func(c *Config, _ *Target) {
		c.Budget, c.DataOutTimeout, c.NopInterval = &global, 300*time.Millisecond, -1
	})
	status := func(i *ini, itt uint32) pdu.SCSIStatus {
		t.Helper()
		for {
			f := i.recv()
			switch h := f.Header.(type) {
			case *pdu.SCSIResponse:
				if h.ITT == itt {
					return h.Status
				}
			case *pdu.DataIn:
				if h.ITT == itt && h.HasStatus {
					return h.Status
				}
			}
		}
	}
	a := dial(t, ts.addr)
	a.login("InitialR2T", "Yes", "ImmediateData", "No")
	a.send(&pdu.SCSICommand{Final: true, Write: true, ITT: 1, ExpectedDataTransferLength: 1 << 20, CmdSN: a.cmdSN, CDB: writeCDB(0, 2048)}, nil)
	a.cmdSN++
	expect[*pdu.R2T](a)
	a.send(&pdu.SCSICommand{Final: true, Write: true, ITT: 2, ExpectedDataTransferLength: 512 << 10, CmdSN: a.cmdSN, CDB: writeCDB(0, 1024)}, nil)
	a.cmdSN++
	if st := status(a, 2); st != pdu.StatusTaskSetFull {
		t.Fatalf("second waiting write past the awaiting share: %v, want TASK SET FULL", st)
	}
	if u := global.Used(); u != 1<<20 {
		t.Fatalf("budget used %d, want 1 MiB", u)
	}
	// Another front end takes the rest of the budget.
	global.Reserve(1 << 20)
	defer global.Release(1 << 20)
	b := dial(t, ts.addr)
	b.isid = pdu.ISID{0x80, 0, 0, 0, 0, 2}
	b.login()
	inq := [16]byte{0x12, 0, 0, 0, 255}
	b.send(&pdu.SCSICommand{Final: true, Read: true, ITT: 1, ExpectedDataTransferLength: 255, CmdSN: b.cmdSN, CDB: inq}, nil)
	b.cmdSN++
	if st := status(b, 1); st != pdu.StatusGood {
		t.Fatalf("INQUIRY with the budget spent: %v, want GOOD", st)
	}
	b.send(&pdu.SCSICommand{Final: true, Read: true, ITT: 2, ExpectedDataTransferLength: 64 << 10, CmdSN: b.cmdSN, CDB: readCDB(0, 128)}, nil)
	b.cmdSN++
	if st := status(b, 2); st != pdu.StatusBusy {
		t.Fatalf("READ with the budget spent: %v, want BUSY", st)
	}
	// a never sends the Data-Out: closed after DataOutTimeout.
	a.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	for {
		if _, err := a.rd.Read(); err != nil {
			break
		}
	}
	for end := time.Now().Add(10 * time.Second); global.Used() != 1<<20; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("budget used %d after the withholding session closed, want 1 MiB (the other front end's)", global.Used())
		}
	}
	if st := ts.srv.Stats(); st.DataOutTimeouts != 1 || st.AwaitingData != 0 {
		t.Fatalf("DataOutTimeouts %d, AwaitingData %d; want 1, 0", st.DataOutTimeouts, st.AwaitingData)
	}
}
