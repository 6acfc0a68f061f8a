package pdu

import (
	"strings"
	"testing"

	"github.com/vmsan/vmsan/internal/iscsi/chap"
)

// The accounts of tests/iscsiguest that the open-iscsi captures were made
// with (tests/iscsiguest/vmsan_test.go, target_test.go).
const (
	oiInitiator   = "iqn.2026-11.org.vmsan:guest"
	oiUser        = "guest"
	oiSecret      = "vmsan-chap-secret"
	oiDiscUser    = "disc"
	oiDiscSecret  = "vmsan-disc-secret"
	oiDiscTUser   = "vmsan-disc"
	oiDiscTSecret = "vmsan-disc-answer"
	oiWrong       = "-wrong" // the refused logins' secret is the right one plus this
)

// openiscsiVector is one stored connection of open-iscsi's initiator
// (kernel iscsi_tcp + iscsid 2.1.8) in the test guest, against vmsan's
// target or tgt, written by tests/iscsiguest with VMSAN_ISCSI_GOLDEN.
type openiscsiVector struct {
	file  string
	check func(t *testing.T, w *walked)
}

func openiscsiVectors() []openiscsiVector {
	var v []openiscsiVector
	for _, tg := range []string{"vmsan", "tgt"} {
		v = append(v,
			openiscsiVector{"openiscsi-" + tg + "-login-chap-refused.txt", func(t *testing.T, w *walked) {
				oiCHAP(t, w, "Normal", oiUser, oiSecret+oiWrong, oiSecret)
				oiRefused(t, w)
			}},
			openiscsiVector{"openiscsi-" + tg + "-session-chap-login.txt", func(t *testing.T, w *walked) {
				oiCHAP(t, w, "Normal", oiUser, oiSecret, oiSecret+oiWrong)
				oiOperational(t, w, "262144", "262144", "16776192")
				oiLogout(t, w)
			}},
			openiscsiVector{"openiscsi-" + tg + "-session-chap-mutual-small-burst.txt", func(t *testing.T, w *walked) {
				ini := oiCHAP(t, w, "Normal", oiUser, oiSecret, oiSecret+oiWrong)
				oiMutual(t, w, ini, map[string]string{"vmsan": "vmsan-answer", "tgt": "tgt-answer"}[tg],
					map[string]string{"vmsan": "vmsan-mutual-secret", "tgt": "tgt-mutual-secret"}[tg])
				oiOperational(t, w, "512", "512", "512")
				oiSmallBurst(t, w)
				oiLogout(t, w)
			}},
			// After kill -9 and a restart of the target, the kernel's
			// session recovery logs in again on its own: the same ISID
			// as the session had, TSIH 0 (ERL 0: session reinstatement),
			// CHAP again.
			openiscsiVector{"openiscsi-" + tg + "-session-reinstated.txt", func(t *testing.T, w *walked) {
				oiCHAP(t, w, "Normal", oiUser, oiSecret, oiSecret+oiWrong)
				oiOperational(t, w, "262144", "262144", "16776192")
			}},
		)
	}
	return append(v,
		// tgt 1.0.85 has no discovery CHAP: its discovery session is open.
		openiscsiVector{"openiscsi-tgt-discovery.txt", func(t *testing.T, w *walked) {
			keys := oiLogin(t, w, "Discovery")
			if _, ok := keys["AuthMethod"]; ok {
				t.Errorf("open discovery: AuthMethod %q offered", keys["AuthMethod"])
			}
			oiSendTargets(t, w, "iqn.2026-11.org.vmsan.test:tgt")
		}},
		openiscsiVector{"openiscsi-vmsan-discovery-chap-mutual.txt", func(t *testing.T, w *walked) {
			ini := oiCHAP(t, w, "Discovery", oiDiscUser, oiDiscSecret, oiDiscSecret+oiWrong)
			oiMutual(t, w, ini, oiDiscTUser, oiDiscTSecret)
			oiSendTargets(t, w, "iqn.2026-11.org.vmsan:guesttest")
		}},
		openiscsiVector{"openiscsi-vmsan-discovery-chap-mutual-refused.txt", func(t *testing.T, w *walked) {
			oiCHAP(t, w, "Discovery", oiDiscUser, oiDiscSecret+oiWrong, oiDiscSecret)
			oiRefused(t, w)
		}},
	)
}

// TestGoldenOpenISCSI decodes the stored open-iscsi connections (no tool
// needed): every PDU re-encodes byte for byte (walk), and the fields
// that matter hold.
func TestGoldenOpenISCSI(t *testing.T) {
	for _, v := range openiscsiVectors() {
		t.Run(v.file, func(t *testing.T) {
			v.check(t, walk(t, loadTranscript(t, v.file)))
		})
	}
}

// oiLogin checks what every open-iscsi login has and returns the merged
// keys of its Login Requests: ISID in OUI format with open-iscsi's OUI
// 00:02:3D and the same qualifier in every request, version 0, CID 0, a
// new session (TSIH 0), the guest's InitiatorName and the session type.
func oiLogin(t *testing.T, w *walked, sessionType string) map[string]string {
	t.Helper()
	s, lr := first[*LoginRequest](w, "C")
	if lr == nil {
		t.Fatal("no Login Request")
	}
	if s.raw[0] != 0x43 {
		t.Errorf("Login Request byte 0 = %#x, want 0x43", s.raw[0])
	}
	if lr.VersionMax != 0 || lr.VersionMin != 0 || lr.TSIH != 0 || lr.CID != 0 {
		t.Errorf("login: version %d..%d TSIH %d CID %d", lr.VersionMin, lr.VersionMax, lr.TSIH, lr.CID)
	}
	// RFC 7143 11.12.5: T (2 bits) 00 = OUI format, then a 22-bit OUI
	// (open-iscsi's 0x00023D) and a 24-bit qualifier (its session number).
	if lr.ISID[0]>>6 != 0 || lr.ISID[0] != 0x00 || lr.ISID[1] != 0x02 || lr.ISID[2] != 0x3d {
		t.Errorf("ISID %x: want OUI format with OUI 00023d", lr.ISID)
	}
	for _, st := range w.steps {
		if l, ok := st.frame.Header.(*LoginRequest); ok && (l.ISID != lr.ISID || l.ITT != lr.ITT) {
			t.Errorf("ISID/ITT changed within the login: %x/%d then %x/%d", lr.ISID, lr.ITT, l.ISID, l.ITT)
		}
		// tgt 1.0.85 answers a failed login with a zero ISID: only
		// successful responses are held to echoing it.
		if l, ok := st.frame.Header.(*LoginResponse); ok && l.Status == LoginSuccess && l.ISID != lr.ISID {
			t.Errorf("Login Response ISID %x, request %x", l.ISID, lr.ISID)
		}
	}
	keys := allKeys[*LoginRequest](w, "C")
	if keys["InitiatorName"] != oiInitiator {
		t.Errorf("InitiatorName = %q", keys["InitiatorName"])
	}
	if keys["SessionType"] != sessionType {
		t.Errorf("SessionType = %q, want %q", keys["SessionType"], sessionType)
	}
	return keys
}

// oiCHAP checks a CHAP security stage: open-iscsi offers AuthMethod
// CHAP (normal sessions without mutual CHAP: "CHAP,None"), CHAP_A=5 (MD5), names user, and
// its CHAP_R verifies with secret and not with other.
func oiCHAP(t *testing.T, w *walked, sessionType, user, secret, other string) map[string]string {
	t.Helper()
	keys := oiLogin(t, w, sessionType)
	// open-iscsi offers None as a fallback only for a normal session
	// without mutual CHAP (it must authenticate the target otherwise).
	wantAuth := "CHAP"
	if _, mutual := keys["CHAP_C"]; sessionType == "Normal" && !mutual {
		wantAuth = "CHAP,None"
	}
	if keys["AuthMethod"] != wantAuth {
		t.Errorf("AuthMethod offer %q, want %q", keys["AuthMethod"], wantAuth)
	}
	if keys["CHAP_A"] != "5" {
		t.Errorf("CHAP_A offer %q, want 5 (MD5)", keys["CHAP_A"])
	}
	tgt := allKeys[*LoginResponse](w, "S")
	id, err := chap.ParseID(tgt["CHAP_I"])
	if err != nil {
		t.Fatal(err)
	}
	c, err := chap.DecodeBinary(tgt["CHAP_C"], chap.MaxBinaryLen)
	if err != nil {
		t.Fatal(err)
	}
	if keys["CHAP_N"] != user {
		t.Errorf("CHAP_N = %q, want %q", keys["CHAP_N"], user)
	}
	r, err := chap.DecodeBinary(keys["CHAP_R"], chap.MaxBinaryLen)
	if err != nil {
		t.Fatal(err)
	}
	if !chap.Check(id, []byte(secret), c, r) {
		t.Errorf("open-iscsi's CHAP_R %x does not verify with %q", r, secret)
	}
	if chap.Check(id, []byte(other), c, r) {
		t.Errorf("CHAP_R verifies with %q too", other)
	}
	return keys
}

// oiMutual checks the target's mutual CHAP answer (tuser, computed with
// tsecret) to open-iscsi's challenge (a 16-byte CHAP_C).
func oiMutual(t *testing.T, w *walked, ini map[string]string, tuser, tsecret string) {
	t.Helper()
	id, err := chap.ParseID(ini["CHAP_I"])
	if err != nil {
		t.Fatal(err)
	}
	c, err := chap.DecodeBinary(ini["CHAP_C"], chap.MaxBinaryLen)
	if err != nil {
		t.Fatal(err)
	}
	if len(c) != 16 {
		t.Errorf("open-iscsi's challenge is %d bytes, want 16", len(c))
	}
	tgt := allKeys[*LoginResponse](w, "S")
	want := chap.Response(id, []byte(tsecret), c)
	if tgt["CHAP_N"] != tuser || tgt["CHAP_R"] != chap.EncodeBinary(want[:]) {
		t.Errorf("target's mutual answer N=%q R=%q", tgt["CHAP_N"], tgt["CHAP_R"])
	}
}

// oiRefused: the last Login Response is 0201 (authentication failure)
// and the connection never reaches full feature phase.
func oiRefused(t *testing.T, w *walked) {
	t.Helper()
	var last *LoginResponse
	for _, s := range w.steps {
		if l, ok := s.frame.Header.(*LoginResponse); ok {
			last = l
		}
		if _, ok := s.frame.Header.(*LoginRequest); !ok && s.dir == "C" {
			t.Errorf("%s after a refused login", s.frame.Header.Opcode())
		}
	}
	if last == nil || last.Status != LoginAuthenticationFailure {
		t.Errorf("last Login Response %+v, want status 0201", last)
	}
}

// oiOperational checks open-iscsi's operational offer (its iscsid.conf
// settings: digests off, ERL 0, immediate data) with the given
// FirstBurstLength, MaxBurstLength and the MaxRecvDataSegmentLength it
// declares, and that the login reached full feature phase.
func oiOperational(t *testing.T, w *walked, firstBurst, mrdsl, maxBurst string) {
	t.Helper()
	keys := allKeys[*LoginRequest](w, "C")
	want := map[string]string{
		"HeaderDigest": "None", "DataDigest": "None", "ErrorRecoveryLevel": "0",
		"DefaultTime2Wait": "2", "DefaultTime2Retain": "0", "IFMarker": "No", "OFMarker": "No",
		"InitialR2T": "No", "ImmediateData": "Yes", "MaxOutstandingR2T": "1", "MaxConnections": "1",
		"DataPDUInOrder": "Yes", "DataSequenceInOrder": "Yes",
		"FirstBurstLength": firstBurst, "MaxBurstLength": maxBurst, "MaxRecvDataSegmentLength": mrdsl,
	}
	for k, v := range want {
		if keys[k] != v {
			t.Errorf("open-iscsi offers %s=%q, want %q", k, keys[k], v)
		}
	}
	ffp := false
	for _, s := range w.steps {
		if l, ok := s.frame.Header.(*LoginResponse); ok && l.Transit && l.NSG == StageFullFeaturePhase && l.Status == LoginSuccess {
			ffp = l.TSIH != 0
		}
	}
	if !ffp {
		t.Error("login never reached full feature phase with a TSIH")
	}
}

// oiSendTargets checks the discovery exchange: SendTargets=All, the
// target's name and an address with its portal group tag. iscsiadm then
// closes the connection without a Logout.
func oiSendTargets(t *testing.T, w *walked, iqn string) {
	t.Helper()
	s, tr := first[*TextRequest](w, "C")
	if tr == nil || !tr.Final || tr.TTT != ReservedTag {
		t.Fatalf("Text Request %+v", tr)
	}
	if v, _ := s.key("SendTargets"); v != "All" {
		t.Errorf("SendTargets = %q", v)
	}
	rs, _ := first[*TextResponse](w, "S")
	if v, _ := rs.key("TargetName"); v != iqn {
		t.Errorf("TargetName answer %q, want %q", v, iqn)
	}
	if v, _ := rs.key("TargetAddress"); !strings.Contains(v, ",") {
		t.Errorf("TargetAddress answer %q, want ADDR:PORT,TPGT", v)
	}
	if last := w.steps[len(w.steps)-1]; last.frame.Header.Opcode() != OpTextResp {
		t.Errorf("%s after the SendTargets answer", last.frame.Header.Opcode())
	}
}

func oiLogout(t *testing.T, w *walked) {
	t.Helper()
	if _, lo := first[*LogoutRequest](w, "C"); lo == nil || lo.Reason != LogoutCloseSession {
		t.Errorf("logout %+v", lo)
	}
	if _, lr := first[*LogoutResponse](w, "S"); lr == nil || lr.Response != 0 {
		t.Errorf("logout response %+v", lr)
	}
}

// oiSmallBurst checks the small-burst session's data transfers: a 2 KiB
// WRITE(10) with 512 bytes of immediate data, then one R2T of 512 bytes
// at a time (MaxOutstandingR2T 1) each answered by one final Data-Out
// with its TTT and offset; a 2 KiB READ(10) answered by four Data-In of
// 512 bytes (open-iscsi's MaxRecvDataSegmentLength), the last with
// status; NOP-Out pings answered by NOP-In with the same ITT; a LUN
// RESET (immediate, the disk's LUN) completed; and a SYNCHRONIZE CACHE
// before logout.
func oiSmallBurst(t *testing.T, w *walked) {
	t.Helper()
	var (
		write         *SCSICommand
		r2ts, outs    int
		lastR2T       *R2T
		read          *SCSICommand
		dataIn        int
		pings, pongs  int
		pingITT       = map[uint32]bool{}
		syncCache     bool
		reset         *TaskMgmtRequest
		resetDone     bool
		nextOffset    uint32
		readOffset    uint32
		readHasStatus bool
	)
	for _, s := range w.steps {
		switch h := s.frame.Header.(type) {
		case *SCSICommand:
			switch {
			case h.CDB[0] == 0x2a && h.ExpectedDataTransferLength == 2048 && write == nil:
				write = h
				if !h.Write || !h.Final || h.DataSegmentLength != 512 {
					t.Errorf("WRITE(10) %+v: want W, F and 512 bytes of immediate data", h)
				}
				nextOffset = 512
			case h.CDB[0] == 0x28 && h.ExpectedDataTransferLength == 2048 && read == nil:
				read = h
			case h.CDB[0] == 0x35:
				syncCache = true
			}
		case *R2T:
			if write == nil || h.ITT != write.ITT {
				t.Errorf("R2T %+v for no write", h)
				continue
			}
			if h.BufferOffset != nextOffset || h.DesiredDataTransferLength != 512 || h.R2TSN != uint32(r2ts) {
				t.Errorf("R2T %d: offset %d length %d R2TSN %d, want offset %d length 512", r2ts, h.BufferOffset, h.DesiredDataTransferLength, h.R2TSN, nextOffset)
			}
			lastR2T = h
			r2ts++
		case *DataOut:
			if lastR2T == nil || h.ITT != lastR2T.ITT || h.TTT != lastR2T.TTT || h.BufferOffset != lastR2T.BufferOffset ||
				!h.Final || h.DataSegmentLength != 512 || h.DataSN != 0 {
				t.Errorf("Data-Out %+v does not answer R2T %+v", h, lastR2T)
				continue
			}
			nextOffset += 512
			outs++
		case *DataIn:
			if read == nil || h.ITT != read.ITT {
				continue
			}
			if h.BufferOffset != readOffset || h.DataSegmentLength != 512 || h.DataSN != uint32(dataIn) {
				t.Errorf("Data-In %d: offset %d length %d DataSN %d", dataIn, h.BufferOffset, h.DataSegmentLength, h.DataSN)
			}
			readOffset += 512
			dataIn++
			readHasStatus = h.HasStatus && h.Status == 0
		case *TaskMgmtRequest:
			reset = h
		case *TaskMgmtResponse:
			resetDone = reset != nil && h.ITT == reset.ITT && h.Response == TMFFunctionComplete
		case *NOPOut:
			if h.ITT != ReservedTag && h.TTT == ReservedTag {
				pings++
				pingITT[h.ITT] = true
			}
		case *NOPIn:
			if pingITT[h.ITT] && h.TTT == ReservedTag {
				pongs++
			}
		}
	}
	if write == nil || r2ts != 3 || outs != 3 || nextOffset != 2048 {
		t.Errorf("2 KiB write: %d R2T, %d Data-Out, %d bytes sent; want 3, 3, 2048", r2ts, outs, nextOffset)
	}
	if read == nil || dataIn != 4 || !readHasStatus {
		t.Errorf("2 KiB read: %d Data-In (last with status: %v); want 4, true", dataIn, readHasStatus)
	}
	if pings == 0 || pongs != pings {
		t.Errorf("%d NOP-Out pings, %d answered", pings, pongs)
	}
	if reset == nil || reset.Function != TMFLogicalUnitReset || !reset.Immediate || reset.ReferencedTaskTag != ReservedTag ||
		write == nil || reset.LUN != write.LUN || !resetDone {
		t.Errorf("LUN RESET %+v, completed: %v", reset, resetDone)
	}
	if !syncCache {
		t.Error("no SYNCHRONIZE CACHE(10)")
	}
}
