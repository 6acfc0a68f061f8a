package initiator_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vmsan/vmsan/internal/iscsi/chap"
	"github.com/vmsan/vmsan/internal/iscsi/initiator"
	"github.com/vmsan/vmsan/internal/iscsi/pdu"
	"github.com/vmsan/vmsan/internal/iscsi/text"
)

// fake is a scripted target on one end of a net.Pipe: it logs the
// initiator in with the codec packages, then hands every full feature
// phase PDU to the test's handler. It exists to produce what tgt never
// sends (small windows, odd Data-In splits, bad PDUs).
type fake struct {
	t       *testing.T
	c       net.Conn
	r       pdu.Reader
	dig     pdu.Digests
	ours    map[string]string // operational values for text.Negotiate
	mrdsl   int               // MaxRecvDataSegmentLength the fake declares
	window  uint32            // MaxCmdSN - ExpCmdSN + 1 after login
	user    string
	secret  []byte
	tuser   string
	tsecret []byte
	targets string // SendTargets answer text (key=value\0...)

	mu       sync.Mutex
	statSN   uint32
	expCmdSN uint32
	maxCmdSN uint32
}

func (f *fake) sns(advance bool) pdu.StatusSNs {
	f.mu.Lock()
	defer f.mu.Unlock()
	s := pdu.StatusSNs{StatSN: f.statSN, ExpCmdSN: f.expCmdSN, MaxCmdSN: f.maxCmdSN}
	if advance {
		f.statSN++
	}
	return s
}

func (f *fake) send(h pdu.PDU, data []byte) error {
	b, err := pdu.AppendPDU(nil, h, nil, data, f.dig)
	if err != nil {
		return err
	}
	_, err = f.c.Write(b)
	return err
}

func (f *fake) pairs(p []text.Pair) []byte {
	b, err := text.Append(nil, p...)
	if err != nil {
		f.t.Error(err)
	}
	return b
}

// login serves the login phase; it returns an error on a refused login
// (after sending the refusal).
func (f *fake) login() error {
	var ch chap.Challenge
	stage := pdu.StageSecurityNegotiation
	discovery := false
	for {
		fr, err := f.r.Read()
		if err != nil {
			return err
		}
		req, ok := fr.Header.(*pdu.LoginRequest)
		if !ok {
			return fmt.Errorf("fake: %s during login", fr.Header.Opcode())
		}
		ps, err := text.Parse(fr.Data)
		if err != nil {
			return err
		}
		m := map[string]string{}
		for _, p := range ps {
			m[p.Key] = p.Value
		}
		if m["SessionType"] == "Discovery" {
			discovery = true
		}
		f.mu.Lock()
		f.expCmdSN, f.maxCmdSN = req.CmdSN, req.CmdSN+f.window-1
		f.mu.Unlock()
		resp := &pdu.LoginResponse{ISID: req.ISID, ITT: req.ITT, CSG: req.CSG, StatusSNs: f.sns(true)}
		var out []text.Pair
		refuse := func(st pdu.LoginStatus) error {
			resp.Status = st
			f.send(resp, nil)
			return fmt.Errorf("fake: refused %s", st)
		}
		switch {
		case req.CSG == pdu.StageSecurityNegotiation && m["AuthMethod"] != "":
			want := "None"
			if f.user != "" {
				want = "CHAP"
			}
			if !strings.Contains(m["AuthMethod"], want) {
				return refuse(pdu.LoginAuthenticationFailure)
			}
			out = append(out, text.Pair{Key: "AuthMethod", Value: want})
			if want == "None" && req.Transit {
				resp.Transit, resp.NSG = true, pdu.StageLoginOperationalNegotiation
			}
		case m["CHAP_A"] != "":
			var err error
			ch, out, err = chap.Begin(m["CHAP_A"], rand.Reader)
			if err != nil {
				return refuse(pdu.LoginAuthenticationFailure)
			}
		case m["CHAP_N"] != "":
			mutual, err := chap.Verify(ch, m, chap.Secrets{
				Lookup:     func(n string) ([]byte, bool) { return f.secret, n == f.user },
				TargetName: f.tuser, TargetSecret: f.tsecret}, nil)
			if err != nil {
				return refuse(pdu.LoginAuthenticationFailure)
			}
			out = mutual
			resp.Transit, resp.NSG = true, pdu.StageLoginOperationalNegotiation
		case req.CSG == pdu.StageLoginOperationalNegotiation:
			stage = pdu.StageLoginOperationalNegotiation
			p := text.Defaults()
			out = text.Negotiate(&p, ps, f.ours, discovery)
			out = append(out, text.Pair{Key: "MaxRecvDataSegmentLength", Value: fmt.Sprint(f.mrdsl)})
			resp.Transit, resp.NSG, resp.TSIH = true, pdu.StageFullFeaturePhase, 7
			f.dig = pdu.Digests{Header: p.HeaderDigest, Data: p.DataDigest}
			dig := f.dig
			f.dig = pdu.Digests{}
			if err := f.send(resp, f.pairs(out)); err != nil {
				return err
			}
			f.dig = dig
			f.r.Digests = dig
			f.r.MaxData = f.mrdsl
			return nil
		default:
			return fmt.Errorf("fake: unexpected login request in stage %s: %v", stage, ps)
		}
		if err := f.send(resp, f.pairs(out)); err != nil {
			return err
		}
	}
}

// startFake connects an initiator to a fake target; handler gets every
// full feature phase PDU (nil handler: answer NOP-Out, Text and Logout
// only). The session is closed at cleanup.
func startFake(t *testing.T, f *fake, cfg initiator.Config, handler func(f *fake, fr pdu.Frame) error) (*initiator.Session, chan error) {
	t.Helper()
	f.t = t
	if f.mrdsl == 0 {
		f.mrdsl = 8192
	}
	if f.window == 0 {
		f.window = 64
	}
	cc, tc := net.Pipe()
	f.c = tc
	f.r = pdu.Reader{R: bufio.NewReader(tc)}
	done := make(chan error, 1)
	go func() {
		defer tc.Close()
		if err := f.login(); err != nil {
			done <- err
			return
		}
		for {
			fr, err := f.r.Read()
			if err != nil {
				done <- err
				return
			}
			if err := f.common(fr); err != nil {
				done <- err
				return
			}
			if handler != nil && fr.Header.Opcode() != pdu.OpLogoutReq && fr.Header.Opcode() != pdu.OpTextReq {
				if err := handler(f, fr); err != nil {
					done <- err
					return
				}
			}
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if cfg.TargetName == "" {
		cfg.TargetName = "iqn.2026-11.org.vmsan:fake"
	}
	s, err := initiator.NewSession(ctx, cc, cfg)
	if err != nil {
		cc.Close()
		return nil, done
	}
	t.Cleanup(func() { s.Close() })
	return s, done
}

// common advances ExpCmdSN for non-immediate commands and answers Text
// and Logout requests.
func (f *fake) common(fr pdu.Frame) error {
	var cmdSN uint32
	imm := false
	switch h := fr.Header.(type) {
	case *pdu.SCSICommand:
		cmdSN, imm = h.CmdSN, h.Immediate
	case *pdu.TextRequest:
		cmdSN, imm = h.CmdSN, h.Immediate
	case *pdu.NOPOut:
		cmdSN, imm = h.CmdSN, true
	case *pdu.LogoutRequest:
		cmdSN, imm = h.CmdSN, h.Immediate
	default:
		return nil
	}
	f.mu.Lock()
	if !imm {
		if !pdu.SNInWindow(cmdSN, f.expCmdSN, f.maxCmdSN) {
			f.mu.Unlock()
			return fmt.Errorf("fake: CmdSN %d outside the window %d..%d", cmdSN, f.expCmdSN, f.maxCmdSN)
		}
		if cmdSN == f.expCmdSN {
			f.expCmdSN++
		}
	}
	f.mu.Unlock()
	switch h := fr.Header.(type) {
	case *pdu.TextRequest:
		return f.send(&pdu.TextResponse{Final: true, ITT: h.ITT, TTT: pdu.ReservedTag, StatusSNs: f.sns(true)}, []byte(f.targets))
	case *pdu.LogoutRequest:
		return f.send(&pdu.LogoutResponse{ITT: h.ITT, StatusSNs: f.sns(true)}, nil)
	case *pdu.NOPOut:
		if h.ITT != pdu.ReservedTag {
			return f.send(&pdu.NOPIn{ITT: h.ITT, TTT: pdu.ReservedTag, StatusSNs: f.sns(true)}, fr.Data)
		}
	}
	return nil
}

func (f *fake) openWindow(n uint32) {
	f.mu.Lock()
	f.maxCmdSN = f.expCmdSN + n - 1
	f.mu.Unlock()
}

// TestFakeWindowAndDataIn: with a window of 2 the initiator must hold
// back the other callers' commands (the fake fails the test on a CmdSN
// outside its window) until an unsolicited NOP-In opens it; Data-In comes
// back in reverse order over several PDUs with status on the last.
func TestFakeWindowAndDataIn(t *testing.T) {
	f := &fake{window: 2}
	// pending counts commands received and not yet answered. The fake
	// answers a full window only after a pause, so an initiator that
	// ignored MaxCmdSN would have sent a third command by then.
	var pendingMu sync.Mutex
	var pending []*pdu.SCSICommand
	s, done := startFake(t, f, initiator.Config{}, func(f *fake, fr pdu.Frame) error {
		cmd, ok := fr.Header.(*pdu.SCSICommand)
		if !ok {
			return nil
		}
		pendingMu.Lock()
		defer pendingMu.Unlock()
		pending = append(pending, cmd)
		if len(pending) > 2 {
			return fmt.Errorf("fake: %d commands outstanding in a window of 2", len(pending))
		}
		if len(pending) < 2 {
			return nil
		}
		batch := pending
		go func() {
			time.Sleep(100 * time.Millisecond)
			for _, c := range batch {
				l := int(c.ExpectedDataTransferLength)
				buf := make([]byte, l)
				for i := range buf {
					buf[i] = byte(c.CDB[0]) + byte(i/512)
				}
				// Reverse order, 512-byte PDUs; the last sent (offset
				// 0) carries the status.
				for i, off := 0, l-512; off >= 0; i, off = i+1, off-512 {
					di := &pdu.DataIn{ITT: c.ITT, TTT: pdu.ReservedTag, DataSN: uint32(i), BufferOffset: uint32(off), StatusSNs: f.sns(false)}
					if off == 0 {
						di.Final, di.HasStatus, di.Status, di.StatusSNs = true, true, pdu.StatusGood, f.sns(true)
					}
					if f.send(di, buf[off:off+512]) != nil {
						return
					}
				}
			}
			pendingMu.Lock()
			pending = nil
			pendingMu.Unlock()
			// Open the window for the next two with a NOP-In.
			f.openWindow(2)
			f.send(&pdu.NOPIn{ITT: pdu.ReservedTag, TTT: pdu.ReservedTag, StatusSNs: f.sns(false)}, nil)
		}()
		return nil
	})
	if s == nil {
		t.Fatal(<-done)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 6)
	for i := 0; i < 6; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			buf := make([]byte, 2048)
			cdb := []byte{byte(0x28), 0, 0, 0, 0, 0, 0, 0, 4, 0}
			cdb[0] = 0x28
			r, err := s.Command(context.Background(), 0, cdb, nil, buf)
			if err == nil && (r.Status != pdu.StatusGood || r.DataIn != 2048) {
				err = fmt.Errorf("response %+v", r)
			}
			for j := range buf {
				if err == nil && buf[j] != 0x28+byte(j/512) {
					err = fmt.Errorf("byte %d = %#x", j, buf[j])
				}
			}
			errs <- err
		}(i)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	select {
	case err := <-done:
		t.Fatalf("fake target: %v", err)
	default:
	}
}

// TestFakeR2TAndSense: a write that needs several R2Ts (MaxBurstLength
// 4096, the fake asks in 4 KiB bursts out of order) lands complete; a
// CHECK CONDITION's sense data reaches the caller as a *CheckError; the
// target's NOP-In ping is answered with its TTT and data.
func TestFakeR2TAndSense(t *testing.T) {
	f := &fake{ours: map[string]string{"MaxBurstLength": "4096", "FirstBurstLength": "1024", "InitialR2T": "Yes"}}
	got := make([]byte, 16384)
	pingOK := make(chan bool, 1)
	var ttt uint32 = 100
	s, done := startFake(t, f, initiator.Config{}, func(f *fake, fr pdu.Frame) error {
		switch h := fr.Header.(type) {
		case *pdu.SCSICommand:
			if h.CDB[0] == 0x00 { // TEST UNIT READY: fail with sense
				sense := make([]byte, 18)
				sense[0], sense[2], sense[7], sense[12], sense[13] = 0x70, 0x06, 10, 0x29, 0x00
				return f.send(&pdu.SCSIResponse{ITT: h.ITT, Status: pdu.StatusCheckCondition, StatusSNs: f.sns(true)}, pdu.SenseData(sense))
			}
			copy(got, fr.Data) // immediate data
			if err := f.send(&pdu.NOPIn{ITT: pdu.ReservedTag, TTT: 0x1234, StatusSNs: f.sns(false)}, []byte("ping")); err != nil {
				return err
			}
			imm := len(fr.Data)
			sn := uint32(0)
			for off := 16384 - 4096; off >= imm; off -= 4096 {
				ttt++
				if err := f.send(&pdu.R2T{ITT: h.ITT, TTT: ttt, R2TSN: sn, BufferOffset: uint32(off), DesiredDataTransferLength: 4096, StatusSNs: f.sns(false)}, nil); err != nil {
					return err
				}
				sn++
			}
			if imm < 4096 {
				return f.send(&pdu.R2T{ITT: h.ITT, TTT: 1, R2TSN: sn, BufferOffset: uint32(imm), DesiredDataTransferLength: uint32(4096 - imm), StatusSNs: f.sns(false)}, nil)
			}
		case *pdu.DataOut:
			copy(got[h.BufferOffset:], fr.Data)
			if h.Final && h.BufferOffset+uint32(len(fr.Data)) == 4096 {
				return f.send(&pdu.SCSIResponse{ITT: h.ITT, StatusSNs: f.sns(true)}, nil)
			}
		case *pdu.NOPOut:
			if h.ITT == pdu.ReservedTag {
				pingOK <- h.TTT == 0x1234 && string(fr.Data) == "ping"
			}
		}
		return nil
	})
	if s == nil {
		t.Fatal(<-done)
	}
	p := s.Params()
	if p.MaxBurstLength != 4096 || p.FirstBurstLength != 1024 || !p.InitialR2T {
		t.Fatalf("negotiated %+v", p)
	}
	w := pattern(9, 16384)
	cdb := make([]byte, 16)
	cdb[0] = 0x8a
	r, err := s.Command(context.Background(), 0, cdb, w, nil)
	if err != nil || r.Status != pdu.StatusGood {
		t.Fatalf("write: %+v %v", r, err)
	}
	if !bytes.Equal(got, w) {
		t.Fatal("the target did not receive the written bytes")
	}
	select {
	case ok := <-pingOK:
		if !ok {
			t.Fatal("NOP-Out answer lacks the target's TTT or data")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no answer to the target's NOP-In")
	}
	tur := []byte{0, 0, 0, 0, 0, 0}
	r, err = s.Command(context.Background(), 0, tur, nil, nil)
	err = initiator.Check(tur, r, err)
	var ce *initiator.CheckError
	if !errors.As(err, &ce) {
		t.Fatalf("TEST UNIT READY: %v", err)
	}
	if k, a, q := ce.SenseKey(); k != 6 || a != 0x29 || q != 0 {
		t.Fatalf("sense %x/%x/%x", k, a, q)
	}
}

// TestFakeBadPDUs: a target that sends Data-In beyond the read buffer, a
// data segment over our MaxRecvDataSegmentLength, a Data-In for a task
// that does not exist, or a corrupt data digest fails the session: the
// caller gets ErrSessionFailed (no panic, no write outside its buffer, no
// hang), and later commands fail at once.
func TestFakeBadPDUs(t *testing.T) {
	cases := map[string]func(f *fake, c *pdu.SCSICommand) error{
		"beyond-buffer": func(f *fake, c *pdu.SCSICommand) error {
			// Within MaxRecvDataSegmentLength, but [256,768) overruns the
			// 512-byte buffer into the guard bytes behind it.
			return f.send(&pdu.DataIn{ITT: c.ITT, BufferOffset: 256, Final: true, HasStatus: true, StatusSNs: f.sns(true)}, bytes.Repeat([]byte{1}, 512))
		},
		"over-mrdsl": func(f *fake, c *pdu.SCSICommand) error {
			return f.send(&pdu.DataIn{ITT: c.ITT, Final: true, HasStatus: true, StatusSNs: f.sns(true)}, make([]byte, 600))
		},
		"unknown-itt": func(f *fake, c *pdu.SCSICommand) error {
			return f.send(&pdu.DataIn{ITT: c.ITT + 99, Final: true, HasStatus: true, StatusSNs: f.sns(true)}, make([]byte, 512))
		},
		"data-digest": func(f *fake, c *pdu.SCSICommand) error {
			b, _ := pdu.AppendPDU(nil, &pdu.DataIn{ITT: c.ITT, Final: true, HasStatus: true, StatusSNs: f.sns(true)}, nil, make([]byte, 512), f.dig)
			b[len(b)-1] ^= 1
			_, err := f.c.Write(b)
			return err
		},
		"reject": func(f *fake, c *pdu.SCSICommand) error {
			var bhs [pdu.BHSLen]byte
			c.Encode(bhs[:])
			rj, data := pdu.NewReject(pdu.RejectProtocolError, bhs, f.sns(true))
			return f.send(rj, data)
		},
	}
	for name, bad := range cases {
		t.Run(name, func(t *testing.T) {
			f := &fake{ours: map[string]string{"DataDigest": "CRC32C,None"}}
			s, done := startFake(t, f, initiator.Config{MaxRecvDataSegmentLength: 512, DataDigest: "CRC32C"}, func(f *fake, fr pdu.Frame) error {
				if c, ok := fr.Header.(*pdu.SCSICommand); ok {
					return bad(f, c)
				}
				return nil
			})
			if s == nil {
				t.Fatal(<-done)
			}
			buf := make([]byte, 1024)
			guard := buf[512:]
			cdb := make([]byte, 16)
			cdb[0] = 0x88
			_, err := s.Command(context.Background(), 0, cdb, nil, buf[:512])
			if !errors.Is(err, initiator.ErrSessionFailed) {
				t.Fatalf("command: %v", err)
			}
			for _, b := range guard {
				if b != 0 {
					t.Fatal("the initiator wrote past the read buffer")
				}
			}
			if _, err := s.Command(context.Background(), 0, cdb, nil, buf[:512]); !errors.Is(err, initiator.ErrSessionFailed) {
				t.Fatalf("command after failure: %v", err)
			}
		})
	}
}

// TestFakeDiscoveryCHAP runs a discovery session with mutual CHAP (which
// tgt cannot do) and parses a SendTargets answer with two targets; the
// wrong target secret is refused by the initiator.
func TestFakeDiscoveryCHAP(t *testing.T) {
	targets := "TargetName=iqn.a:one\x00TargetAddress=10.0.0.1:3260,1\x00TargetAddress=[fe80::1]:3261,2\x00TargetName=iqn.a:two\x00TargetAddress=10.0.0.2:3260,1\x00"
	mk := func() *fake {
		return &fake{user: "ini", secret: []byte("initiator-secret"), tuser: "tgt", tsecret: []byte("target-secret!!"), targets: targets}
	}
	cfg := initiator.Config{User: "ini", Secret: "initiator-secret", TargetUser: "tgt", TargetSecret: "target-secret!!"}
	s, done := startFake(t, mk(), cfg, nil)
	if s == nil {
		t.Fatal(<-done)
	}
	ts, err := s.SendTargets(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	want := []initiator.Target{
		{Name: "iqn.a:one", Portals: []initiator.Portal{{"10.0.0.1:3260", 1}, {"[fe80::1]:3261", 2}}},
		{Name: "iqn.a:two", Portals: []initiator.Portal{{"10.0.0.2:3260", 1}}},
	}
	if fmt.Sprint(ts) != fmt.Sprint(want) {
		t.Fatalf("targets %+v", ts)
	}
	if err := s.Logout(context.Background()); err != nil {
		t.Fatal(err)
	}

	bad := cfg
	bad.TargetSecret = "not-the-secret"
	if s, _ := startFake(t, mk(), bad, nil); s != nil {
		t.Fatal("login succeeded with a target that does not know the mutual secret")
	}
	bad = cfg
	bad.Secret = "wrong-initiator-secret"
	if s, _ := startFake(t, mk(), bad, nil); s != nil {
		t.Fatal("login succeeded with the wrong initiator secret")
	}
}

// TestFakeNOPTimeout: a target that stops answering is detected by the
// NOP-Out pinger and the outstanding command fails instead of hanging.
func TestFakeNOPTimeout(t *testing.T) {
	f := &fake{}
	s, done := startFake(t, f, initiator.Config{NOPInterval: 200 * time.Millisecond}, func(f *fake, fr pdu.Frame) error {
		<-t.Context().Done() // never answer anything again
		return nil
	})
	if s == nil {
		t.Fatal(<-done)
	}
	cdb := make([]byte, 16)
	cdb[0] = 0x88
	errc := make(chan error, 1)
	go func() {
		_, err := s.Command(context.Background(), 0, cdb, nil, make([]byte, 512))
		errc <- err
	}()
	select {
	case err := <-errc:
		if !errors.Is(err, initiator.ErrSessionFailed) {
			t.Fatalf("command: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("command still waiting 20 s after the target went silent (NOP interval 200 ms)")
	}
}

// TestFakeCloseDuringRead closes the session while the target is still
// streaming Data-In into a read buffer. When Command returns, the
// initiator must be done with the buffer: the caller overwrites it at
// once, which the race detector flags if the reader goroutine still
// copies payload into it (run with -race).
func TestFakeCloseDuringRead(t *testing.T) {
	f := &fake{}
	s, done := startFake(t, f, initiator.Config{}, func(f *fake, fr pdu.Frame) error {
		c, ok := fr.Header.(*pdu.SCSICommand)
		if !ok {
			return nil
		}
		go func() {
			chunk := make([]byte, 512)
			for i := 0; ; i++ {
				off := uint32(i*512) % c.ExpectedDataTransferLength
				if f.send(&pdu.DataIn{ITT: c.ITT, TTT: pdu.ReservedTag, DataSN: uint32(i), BufferOffset: off, StatusSNs: f.sns(false)}, chunk) != nil {
					return
				}
			}
		}()
		return nil
	})
	if s == nil {
		t.Fatal(<-done)
	}
	buf := make([]byte, 1<<20)
	cdb := make([]byte, 16)
	cdb[0] = 0x88
	go func() {
		time.Sleep(20 * time.Millisecond)
		s.Close()
	}()
	if _, err := s.Command(context.Background(), 0, cdb, nil, buf); !errors.Is(err, initiator.ErrSessionFailed) {
		t.Fatalf("read: %v", err)
	}
	for i := range buf {
		buf[i] = 0xee
	}
}

// TestFakeBusyRetry: a target that answers BUSY and TASK SET FULL (as
// vmsan's does when its in-flight budget is spent) and then a UNIT
// ATTENTION before executing: LU's WriteAt and ReadAt retry and succeed,
// and the command reaches the target once per answer.
func TestFakeBusyRetry(t *testing.T) {
	f := &fake{}
	var mu sync.Mutex
	seen := map[byte]int{}
	s, done := startFake(t, f, initiator.Config{}, func(f *fake, fr pdu.Frame) error {
		c, ok := fr.Header.(*pdu.SCSICommand)
		if !ok {
			return nil
		}
		mu.Lock()
		seen[c.CDB[0]]++
		n := seen[c.CDB[0]]
		mu.Unlock()
		resp := &pdu.SCSIResponse{ITT: c.ITT, StatusSNs: f.sns(true)}
		switch c.CDB[0] {
		case 0x9e: // READ CAPACITY(16): 2048 blocks of 512 bytes
			d := make([]byte, 32)
			d[6], d[7], d[10] = 0x07, 0xff, 0x02
			return f.send(&pdu.DataIn{ITT: c.ITT, Final: true, HasStatus: true, StatusSNs: f.sns(true)}, d)
		case 0x8a, 0x88:
			switch n {
			case 1:
				resp.Status = pdu.StatusBusy
			case 2:
				resp.Status = pdu.StatusTaskSetFull
			case 3:
				sense := make([]byte, 18)
				sense[0], sense[2], sense[7], sense[12] = 0x70, 0x06, 10, 0x2a
				resp.Status = pdu.StatusCheckCondition
				return f.send(resp, pdu.SenseData(sense))
			}
			if c.CDB[0] == 0x88 && n > 3 {
				return f.send(&pdu.DataIn{ITT: c.ITT, Final: true, HasStatus: true, StatusSNs: f.sns(true)}, make([]byte, c.ExpectedDataTransferLength))
			}
		}
		return f.send(resp, nil)
	})
	if s == nil {
		t.Fatal(<-done)
	}
	lu, err := s.LU(context.Background(), 0)
	if err != nil {
		t.Fatal(err)
	}
	if lu.Size() != 2048*512 {
		t.Fatalf("size %d", lu.Size())
	}
	if _, err := lu.WriteAt(make([]byte, 4096), 0); err != nil {
		t.Fatalf("write: %v", err)
	}
	if _, err := lu.ReadAt(make([]byte, 4096), 0); err != nil {
		t.Fatalf("read: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if seen[0x8a] != 4 || seen[0x88] != 4 {
		t.Fatalf("commands seen: %v", seen)
	}
}
