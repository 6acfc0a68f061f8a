package iscsi

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vmsan/vmsan/internal/iscsi/chap"
	"github.com/vmsan/vmsan/internal/iscsi/pdu"
	"github.com/vmsan/vmsan/internal/testutil"
)

// badRow is one line of the bad input table: a raw connection sends one
// bad thing and the row asserts RFC 7143's answer.
type badRow struct {
	name string
	run  func(t *testing.T, addr string)
}

// Target limits the rows rely on (the daemon's target.Config defaults).
const (
	targetMaxRecv = 262144 // MaxRecvDataSegmentLength the target declares
	firstBurst    = 65536  // FirstBurstLength the rows negotiate down to
)

// ffp logs in a fresh connection with CHAP, unsolicited data allowed,
// FirstBurstLength 64 KiB and the extra keys.
// The first command of a session gets the power-on unit attention
// (29/00); ffp takes it with a TEST UNIT READY so rows see clean status.
func ffp(t *testing.T, addr string, extra ...string) *raw {
	r := rawDial(t, addr)
	keys := []string{"InitialR2T", "No", "ImmediateData", "Yes", "FirstBurstLength", strconv.Itoa(firstBurst),
		"MaxBurstLength", "262144", "MaxRecvDataSegmentLength", "262144"}
	for j := 0; j+1 < len(extra); j += 2 {
		if k := slices.Index(keys, extra[j]); k >= 0 && k%2 == 0 {
			keys[k+1] = extra[j+1]
		} else {
			keys = append(keys, extra[j], extra[j+1])
		}
	}
	r.login(keys...)
	r.tur()
	return r
}

// loginStatus sends one Login Request (the first of a connection) and
// requires the status, then the connection closed.
func loginStatus(t *testing.T, addr string, req pdu.LoginRequest, data []byte, want pdu.LoginStatus) {
	r := rawDial(t, addr)
	rsp, _ := r.loginPDU(&req, data)
	if rsp.Status != want {
		t.Fatalf("login status %v, want %v", rsp.Status, want)
	}
	r.expectClosed()
}

// chapFailure runs CHAP up to the challenge, sends the right CHAP_N and
// CHAP_R as fix alters them and requires 0201 (Authentication failure).
func chapFailure(t *testing.T, addr string, fix func(name, resp string) (string, string)) {
	r := rawDial(t, addr)
	m := r.chapStart()
	// The right answer, then broken by fix.
	ans, err := chap.Answer(m, rawUser, []byte(rawSecret), nil)
	if err != nil || len(ans) != 2 {
		t.Fatalf("CHAP answer %v %v", ans, err)
	}
	name, resp := fix(ans[0].Value, ans[1].Value)
	rsp, _ := r.loginPDU(&pdu.LoginRequest{CSG: pdu.StageSecurityNegotiation, Transit: true, NSG: pdu.StageLoginOperationalNegotiation},
		kv("CHAP_N", name, "CHAP_R", resp))
	if rsp.Status != pdu.LoginAuthenticationFailure {
		t.Fatalf("login status %v, want %v", rsp.Status, pdu.LoginAuthenticationFailure)
	}
	r.expectClosed()
}

func badRows() []badRow {
	op := pdu.StageLoginOperationalNegotiation
	sec := pdu.StageSecurityNegotiation
	first := func(extra ...string) []byte {
		return kv(append([]string{"InitiatorName", rawIQN, "TargetName", nodeIQN, "SessionType", "Normal", "AuthMethod", "CHAP"}, extra...)...)
	}
	return []badRow{
		// Login phase.
		{"login/version", func(t *testing.T, a string) {
			// Our version-min is 0x00 (RFC 7143), so no version-max is
			// below it: an initiator whose range starts above it.
			loginStatus(t, a, pdu.LoginRequest{CSG: sec, VersionMin: 2, VersionMax: 2}, first(), pdu.LoginUnsupportedVersion)
		}},
		{"login/no InitiatorName", func(t *testing.T, a string) {
			loginStatus(t, a, pdu.LoginRequest{CSG: sec}, kv("TargetName", nodeIQN, "AuthMethod", "CHAP"), pdu.LoginMissingParameter)
		}},
		{"login/duplicate key", func(t *testing.T, a string) {
			loginStatus(t, a, pdu.LoginRequest{CSG: sec}, append(first(), kv("TargetName", nodeIQN)...), pdu.LoginInitiatorError)
		}},
		{"login/key over 63 bytes", func(t *testing.T, a string) {
			loginStatus(t, a, pdu.LoginRequest{CSG: sec}, append(first(), []byte("X-"+strings.Repeat("k", 62)+"=v\x00")...), pdu.LoginInitiatorError)
		}},
		{"login/value over 255 bytes", func(t *testing.T, a string) {
			loginStatus(t, a, pdu.LoginRequest{CSG: sec}, append(first(), []byte("X-vmsan-test="+strings.Repeat("v", 256)+"\x00")...), pdu.LoginInitiatorError)
		}},
		{"login/no '='", func(t *testing.T, a string) {
			loginStatus(t, a, pdu.LoginRequest{CSG: sec}, append(first(), []byte("HeaderDigest\x00")...), pdu.LoginInitiatorError)
		}},
		{"login/auth skipped", func(t *testing.T, a string) {
			loginStatus(t, a, pdu.LoginRequest{CSG: op, Transit: true, NSG: pdu.StageFullFeaturePhase},
				kv("InitiatorName", rawIQN, "TargetName", nodeIQN), pdu.LoginAuthenticationFailure)
		}},
		{"login/CHAP wrong response", func(t *testing.T, a string) {
			chapFailure(t, a, func(n, r string) (string, string) { return n, flipHex(r) })
		}},
		{"login/CHAP wrong user", func(t *testing.T, a string) {
			chapFailure(t, a, func(n, r string) (string, string) { return "someone-else", r })
		}},
		{"login/CHAP malformed CHAP_R", func(t *testing.T, a string) {
			chapFailure(t, a, func(n, r string) (string, string) { return n, "0xZZ" + r[4:] })
		}},
		{"login/CHAP_R too short", func(t *testing.T, a string) {
			chapFailure(t, a, func(n, r string) (string, string) { return n, "0x00" })
		}},
		{"login/not a Login Request", func(t *testing.T, a string) {
			r := rawDial(t, a)
			r.send(&pdu.NOPOut{ITT: 1, TTT: pdu.ReservedTag, Immediate: true}, nil)
			r.expectClosed()
		}},
		{"login/segment over 8192", func(t *testing.T, a string) {
			// Login runs at the default MaxRecvDataSegmentLength (8192):
			// only the BHS is sent; the target must not wait for the rest.
			r := rawDial(t, a)
			b := make([]byte, pdu.BHSLen)
			(&pdu.LoginRequest{CSG: sec, ISID: r.isid, Lengths: pdu.Lengths{DataSegmentLength: 8193}}).Encode(b)
			r.write(b)
			r.expectClosed()
		}},

		// Full feature phase: opcodes.
		{"ffp/unknown opcode", func(t *testing.T, a string) {
			r := ffp(t, a)
			bhs := make([]byte, pdu.BHSLen)
			bhs[0] = 0x1c
			r.write(bhs)
			r.expectReject(pdu.RejectCommandNotSupported, bhs)
			// With a data segment: the target skips it (the lengths are
			// where every opcode has them) and stays in step.
			bhs[7] = 101
			r.write(append(bhs, make([]byte, 104)...))
			r.expectReject(pdu.RejectCommandNotSupported, bhs)
			r.tur()
		}},
		{"ffp/target opcode", func(t *testing.T, a string) {
			r := ffp(t, a)
			b := r.encode(&pdu.NOPIn{ITT: 7, TTT: pdu.ReservedTag}, nil)
			r.write(b)
			r.expectReject(pdu.RejectProtocolError, b)
			r.tur()
		}},
		{"ffp/Login Request", func(t *testing.T, a string) {
			r := ffp(t, a)
			b := r.encode(&pdu.LoginRequest{CSG: op, ISID: r.isid}, nil)
			r.write(b)
			r.expectReject(pdu.RejectProtocolError, b)
			r.tur()
		}},
		{"ffp/SNACK at ERL 0", func(t *testing.T, a string) {
			r := ffp(t, a)
			b := r.encode(&pdu.SNACKRequest{ITT: 3, TTT: pdu.ReservedTag}, nil)
			r.write(b)
			r.expectReject(pdu.RejectProtocolError, b)
			r.tur()
		}},

		// Lengths.
		{"ffp/segment over MaxRecvDataSegmentLength", func(t *testing.T, a string) {
			r := ffp(t, a)
			b := make([]byte, pdu.BHSLen)
			(&pdu.NOPOut{ITT: 9, TTT: pdu.ReservedTag, Immediate: true, Lengths: pdu.Lengths{DataSegmentLength: targetMaxRecv + 4}}).Encode(b)
			r.write(b)
			r.expectReject(pdu.RejectProtocolError, b)
			r.expectClosed()
		}},
		{"ffp/16 MiB segment declared", func(t *testing.T, a string) {
			// Only the header goes out: a target that tried to read (or
			// allocate) the declared 16 MiB would not answer.
			r := ffp(t, a)
			b := make([]byte, pdu.BHSLen)
			c := r.cmd(write10(0, 8), false, true, 4096)
			c.Lengths.DataSegmentLength = pdu.MaxDataSegmentLength
			c.Encode(b)
			r.write(b)
			r.expectReject(pdu.RejectProtocolError, b)
			r.expectClosed()
		}},
		{"ffp/Text over MaxRecvDataSegmentLength", func(t *testing.T, a string) {
			r := ffp(t, a)
			b := r.encode(&pdu.TextRequest{Final: true, ITT: r.nextITT(), TTT: pdu.ReservedTag, CmdSN: r.cmdSN},
				append([]byte("X-vmsan-test="), bytes.Repeat([]byte("v"), targetMaxRecv)...))
			r.write(b[:pdu.BHSLen])
			r.expectReject(pdu.RejectProtocolError, b)
			r.expectClosed()
		}},
		{"ffp/Text continued past 64 KiB", func(t *testing.T, a string) {
			r := ffp(t, a)
			itt := r.nextITT()
			chunk := append([]byte("X-vmsan-test="), bytes.Repeat([]byte("v"), 40000)...)
			var ttt uint32 = pdu.ReservedTag
			for k := 0; ; k++ {
				// The first PDU of the exchange opens it (TTT reserved),
				// the next answer the target's empty response (its TTT).
				b := r.encode(&pdu.TextRequest{Continue: true, ITT: itt, TTT: ttt, CmdSN: r.cmdSN, Immediate: true}, chunk)
				r.write(b)
				if k == 1 {
					r.expectReject(pdu.RejectProtocolError, b)
					break
				}
				tr, f := expectPDU[*pdu.TextResponse](r)
				if tr.ITT != itt || tr.TTT == pdu.ReservedTag || len(f.Data) != 0 || tr.Final {
					t.Fatalf("answer to a continued Text Request: %+v %q", tr, f.Data)
				}
				ttt = tr.TTT
			}
			r.tur()
		}},
		{"ffp/Text duplicate keys", func(t *testing.T, a string) {
			r := ffp(t, a)
			b := r.encode(&pdu.TextRequest{Final: true, ITT: r.nextITT(), TTT: pdu.ReservedTag, CmdSN: r.cmdSN, Immediate: true},
				kv("SendTargets", "All", "SendTargets", "All"))
			// text.Append refuses nothing here: Parse on the target does.
			r.write(b)
			r.expectReject(pdu.RejectProtocolError, b)
			r.tur()
		}},

		{"ffp/Text key over 63 bytes", func(t *testing.T, a string) {
			r := ffp(t, a)
			b := r.encode(&pdu.TextRequest{Final: true, ITT: r.nextITT(), TTT: pdu.ReservedTag, CmdSN: r.cmdSN, Immediate: true},
				[]byte("X-"+strings.Repeat("k", 62)+"=v\x00"))
			r.write(b)
			r.expectReject(pdu.RejectProtocolError, b)
			r.tur()
		}},

		// CmdSN.
		{"ffp/CmdSN outside the window", func(t *testing.T, a string) {
			r := ffp(t, a)
			ahead := r.cmd(read10(0, 1), true, false, 512)
			ahead.CmdSN += 1000
			behind := r.cmd(read10(0, 1), true, false, 512)
			behind.CmdSN -= 100
			r.cmdSN -= 2
			r.send(ahead, nil)
			r.send(behind, nil)
			r.tur() // its status is the first answer: both were ignored
			r.expectSilence(300 * time.Millisecond)
		}},

		// Digests.
		{"ffp/header digest error", func(t *testing.T, a string) {
			r := ffp(t, a, "HeaderDigest", "CRC32C")
			if !r.dig.Header {
				t.Fatal("HeaderDigest=CRC32C not agreed")
			}
			b := r.encode(&pdu.NOPOut{ITT: r.nextITT(), TTT: pdu.ReservedTag, Immediate: true}, nil)
			b[pdu.BHSLen] ^= 0xff
			r.write(b)
			r.expectClosed()
		}},
		{"ffp/data digest error on NOP-Out", func(t *testing.T, a string) {
			r := ffp(t, a, "DataDigest", "CRC32C")
			b := r.encode(&pdu.NOPOut{ITT: r.nextITT(), TTT: pdu.ReservedTag, Immediate: true}, []byte("ping"))
			b[len(b)-1] ^= 0xff
			r.write(b)
			r.expectReject(pdu.RejectDataDigestError, b)
			r.tur()
		}},
		{"ffp/data digest error on immediate data", func(t *testing.T, a string) {
			r := ffp(t, a, "DataDigest", "CRC32C")
			c := r.cmd(write10(0, 8), false, true, 4096)
			data := bytes.Repeat([]byte{0x5a}, 4096)
			b := r.encode(c, data)
			b[len(b)-1] ^= 0xff
			r.write(b)
			r.expectReject(pdu.RejectDataDigestError, b)
			// The rejected command's CmdSN is a gap the initiator plugs by
			// sending the command again (RFC 7143 11.17.1).
			r.send(c, data)
			if st, sense := r.scsiStatus(c.ITT); st != pdu.StatusGood {
				t.Fatalf("resent WRITE: %v %s", st, senseKey(sense))
			}
			r.tur()
		}},
		{"ffp/data digest error on Data-Out", func(t *testing.T, a string) {
			// RFC 7143 7.8 at ErrorRecoveryLevel 0 (no recovery R2T):
			// Reject, then once all the data is in, CHECK CONDITION with
			// "protocol service CRC error".
			r := ffp(t, a, "DataDigest", "CRC32C")
			c := r.cmd(write10(0, 16), false, true, 8192)
			c.Final = false
			r.send(c, nil)
			d1 := r.encode(&pdu.DataOut{ITT: c.ITT, TTT: pdu.ReservedTag, DataSN: 0, BufferOffset: 0}, make([]byte, 4096))
			d1[len(d1)-1] ^= 0xff
			r.write(d1)
			r.expectReject(pdu.RejectDataDigestError, d1)
			r.send(&pdu.DataOut{Final: true, ITT: c.ITT, TTT: pdu.ReservedTag, DataSN: 1, BufferOffset: 4096}, make([]byte, 4096))
			st, sense := r.scsiStatus(c.ITT)
			if st != pdu.StatusCheckCondition || senseKey(sense) != "b/47/05" {
				t.Fatalf("WRITE after a Data-Out digest error: %v %s, want CHECK CONDITION b/47/05", st, senseKey(sense))
			}
			r.tur()
		}},

		{"ffp/data digest error on a solicited Data-Out", func(t *testing.T, a string) {
			r := ffp(t, a, "DataDigest", "CRC32C", "InitialR2T", "Yes")
			c := r.cmd(write10(0, 16), false, true, 8192)
			r.send(c, nil)
			r2t, _ := expectPDU[*pdu.R2T](r)
			if r2t.DesiredDataTransferLength != 8192 {
				t.Fatalf("R2T %+v", r2t)
			}
			d1 := r.encode(&pdu.DataOut{ITT: c.ITT, TTT: r2t.TTT, DataSN: 0, BufferOffset: 0}, make([]byte, 4096))
			d1[len(d1)-2] ^= 0xff
			r.write(d1)
			r.expectReject(pdu.RejectDataDigestError, d1)
			r.send(&pdu.DataOut{Final: true, ITT: c.ITT, TTT: r2t.TTT, DataSN: 1, BufferOffset: 4096}, make([]byte, 4096))
			st, sense := r.scsiStatus(c.ITT)
			if st != pdu.StatusCheckCondition || senseKey(sense) != "b/47/05" {
				t.Fatalf("WRITE after a Data-Out digest error: %v %s, want CHECK CONDITION b/47/05", st, senseKey(sense))
			}
			r.tur()
		}},

		// Data transfer.
		{"ffp/immediate data over FirstBurstLength", func(t *testing.T, a string) {
			r := ffp(t, a)
			c := r.cmd(write10(0, 256), false, true, 128<<10)
			b := r.encode(c, make([]byte, firstBurst+4096))
			r.write(b)
			r.expectReject(pdu.RejectProtocolError, b)
			r.tur()
		}},
		{"ffp/Data-Out for an unknown task", func(t *testing.T, a string) {
			// Discarded, as for an aborted task (RFC 7143 4.2.3.4).
			r := ffp(t, a)
			r.send(&pdu.DataOut{Final: true, ITT: 0x7777, TTT: pdu.ReservedTag}, make([]byte, 512))
			r.tur()
			r.expectSilence(200 * time.Millisecond)
		}},
		{"ffp/Data-Out with an unknown TTT", func(t *testing.T, a string) {
			r := ffp(t, a, "InitialR2T", "Yes")
			c := r.cmd(write10(0, 8), false, true, 4096)
			r.send(c, nil)
			r2t, _ := expectPDU[*pdu.R2T](r)
			b := r.encode(&pdu.DataOut{Final: true, ITT: c.ITT, TTT: r2t.TTT + 1000}, make([]byte, 4096))
			r.write(b)
			r.expectReject(pdu.RejectProtocolError, b)
			r.expectClosed()
		}},
		{"ffp/Data-Out beyond the expected length", func(t *testing.T, a string) {
			r := ffp(t, a)
			c := r.cmd(write10(0, 8), false, true, 4096)
			c.Final = false
			r.send(c, nil)
			b := r.encode(&pdu.DataOut{Final: true, ITT: c.ITT, TTT: pdu.ReservedTag}, make([]byte, 8192))
			r.write(b)
			r.expectReject(pdu.RejectProtocolError, b)
			r.expectClosed()
		}},
		{"ffp/Data-Out beyond the R2T", func(t *testing.T, a string) {
			r := ffp(t, a, "InitialR2T", "Yes")
			c := r.cmd(write10(0, 8), false, true, 4096)
			r.send(c, nil)
			r2t, _ := expectPDU[*pdu.R2T](r)
			b := r.encode(&pdu.DataOut{Final: true, ITT: c.ITT, TTT: r2t.TTT, BufferOffset: 2048}, make([]byte, 4096))
			r.write(b)
			r.expectReject(pdu.RejectProtocolError, b)
			r.expectClosed()
		}},
		{"ffp/transfer over MaxTransfer", func(t *testing.T, a string) {
			// 4 GiB declared: CHECK CONDITION 05/24/00, nothing allocated.
			r := ffp(t, a)
			c := r.cmd(write10(0, 0xffff), false, true, 0xffffffff)
			r.send(c, nil)
			if st, sense := r.scsiStatus(c.ITT); st != pdu.StatusCheckCondition || senseKey(sense) != "5/24/00" {
				t.Fatalf("status %v %s", st, senseKey(sense))
			}
			r.tur()
		}},

		// Task management and logout.
		{"ffp/ABORT TASK of an unknown task", func(t *testing.T, a string) {
			r := ffp(t, a)
			r.send(&pdu.TaskMgmtRequest{Immediate: true, Function: pdu.TMFAbortTask, ITT: r.nextITT(), ReferencedTaskTag: 0x5555,
				CmdSN: r.cmdSN, RefCmdSN: r.cmdSN - 50}, nil)
			if rsp, _ := expectPDU[*pdu.TaskMgmtResponse](r); rsp.Response != pdu.TMFTaskDoesNotExist {
				t.Fatalf("TMF response %v, want task does not exist", rsp.Response)
			}
			r.tur()
		}},
		{"ffp/unknown TMF function", func(t *testing.T, a string) {
			r := ffp(t, a)
			r.send(&pdu.TaskMgmtRequest{Immediate: true, Function: 0x33, ITT: r.nextITT(), ReferencedTaskTag: pdu.ReservedTag, CmdSN: r.cmdSN}, nil)
			if rsp, _ := expectPDU[*pdu.TaskMgmtResponse](r); rsp.Response != pdu.TMFFunctionRejected {
				t.Fatalf("TMF response %v, want function rejected", rsp.Response)
			}
			r.tur()
		}},
		{"ffp/Logout with commands outstanding", func(t *testing.T, a string) {
			// A WRITE waiting for its R2T's data ends unanswered; a READ
			// is answered; then the Logout Response, then the close.
			r := ffp(t, a, "InitialR2T", "Yes")
			w := r.cmd(write10(0, 8), false, true, 4096)
			r.send(w, nil)
			expectPDU[*pdu.R2T](r)
			rd := r.cmd(read10(0, 8), true, false, 4096)
			r.send(rd, nil)
			lo := &pdu.LogoutRequest{ITT: r.nextITT(), CmdSN: r.cmdSN, Reason: pdu.LogoutCloseSession}
			r.cmdSN++
			r.send(lo, nil)
			var gotRead, gotLogout bool
			for !gotLogout {
				f, err := r.recv(10 * time.Second)
				if err != nil {
					t.Fatalf("before the Logout Response: %v", err)
				}
				switch h := f.Header.(type) {
				case *pdu.DataIn:
					if h.ITT != rd.ITT {
						t.Fatalf("Data-In for ITT %d", h.ITT)
					}
					gotRead = gotRead || h.HasStatus
				case *pdu.LogoutResponse:
					if h.ITT != lo.ITT || h.Response != 0 {
						t.Fatalf("Logout Response %+v", h)
					}
					gotLogout = true
				default:
					t.Fatalf("got %T %+v", f.Header, f.Header)
				}
			}
			if !gotRead {
				t.Fatal("Logout Response before the READ's status")
			}
			r.expectClosed()
		}},
	}
}

func flipHex(s string) string {
	b := []byte(s)
	last := len(b) - 1
	if b[last] == '0' {
		b[last] = '1'
	} else {
		b[last] = '0'
	}
	return string(b)
}

// TestBadInputTable runs the bad input table against one `vmsan serve`:
// after every row a real initiator (libiscsi's iscsi-inq) still works and
// the daemon's log has no panic; then the rows that hold memory or
// connections the longest run 1000 more times and the daemon's RSS and
// open descriptors must come back to their baseline.
func TestBadInputTable(t *testing.T) {
	t.Parallel()
	testutil.NeedTool(t, "iscsi-inq")
	v := startVmsan(t, fmt.Sprintf("    auth: {user: %s, secret: %q}\n", rawUser, rawSecret))
	inq := func(t *testing.T) {
		t.Helper()
		if out, err := run(t, 30*time.Second, "iscsi-inq", v.url(rawUser+"%"+rawSecret, 0)); err != nil || !strings.Contains(out, "VMSAN") {
			t.Fatalf("iscsi-inq after the row: %v\n%s", err, out)
		}
	}
	inq(t)
	pid := v.cmd.Process.Pid
	fds0 := fdCount(t, pid)
	noPanic := func(t *testing.T) {
		t.Helper()
		b, _ := os.ReadFile(v.log.Name())
		if bytes.Contains(b, []byte("panic")) || bytes.Contains(b, []byte("goroutine ")) {
			t.Fatalf("the daemon's log has a panic or goroutine dump:\n%s", v.logTail())
		}
	}
	rows := badRows()
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			row.run(t, v.addr)
			inq(t)
			noPanic(t)
		})
	}
	if t.Failed() {
		return
	}

	// Repetitions of the rows that make the target hold the most: a
	// declared 16 MiB segment, a 32 MiB WRITE whose data never comes,
	// a failed CHAP login, a Data-Out digest error.
	worst := map[string]bool{"ffp/16 MiB segment declared": true, "login/CHAP wrong response": true, "ffp/data digest error on Data-Out": true}
	var reps []badRow
	for _, row := range rows {
		if worst[row.name] {
			reps = append(reps, row)
		}
	}
	reps = append(reps, badRow{"ffp/32 MiB WRITE, no data, dropped", func(t *testing.T, a string) {
		r := ffp(t, a, "InitialR2T", "Yes")
		c := r.cmd(write10(0, 0xffff), false, true, 32<<20)
		r.send(c, nil)
		expectPDU[*pdu.R2T](r)
		r.c.Close()
	}})
	// A warm-up first: the daemon's heap settles at a few of the 32 MiB
	// write buffers (the garbage collector's high-water mark, 65-100 MiB
	// above the idle RSS, one buffer more or less from run to run), so
	// the baseline is the peak RSS of the warm-up and a leak per
	// connection shows as RSS above it after the next 1000.
	rssIdle := procStatusKiB(t, pid, "VmRSS")
	for k := 0; k < 100; k++ {
		row := reps[k%len(reps)]
		t.Run("warm-up/"+row.name, func(t *testing.T) { row.run(t, v.addr) })
		if t.Failed() {
			return
		}
	}
	rss0 := procStatusKiB(t, pid, "VmHWM")
	t.Logf("RSS idle %d KiB, peak during the warm-up %d KiB", rssIdle, rss0)
	n := 1000
	if s := os.Getenv("VMSAN_BADIN_REPS"); s != "" {
		n, _ = strconv.Atoi(s)
	}
	start := time.Now()
	for k := 0; k < n; k++ {
		row := reps[k%len(reps)]
		t.Run(fmt.Sprintf("rep/%s", row.name), func(t *testing.T) { row.run(t, v.addr) })
		if t.Failed() {
			return
		}
	}
	inq(t)
	noPanic(t)
	rss1, hwm1 := procStatusKiB(t, pid, "VmRSS"), procStatusKiB(t, pid, "VmHWM")
	t.Logf("%d bad connections in %v; RSS %d KiB (%+d KiB from the warm-up's peak), peak %d KiB",
		n, time.Since(start).Round(time.Millisecond), rss1, rss1-rss0, hwm1)
	if rss1-rss0 > 64<<10 {
		t.Errorf("RSS %d KiB over the warm-up's peak after %d bad connections, want < 64 MiB", rss1-rss0, n)
	}
	// Every bad connection's descriptor is closed: back to the baseline
	// (connections close asynchronously, so wait a little).
	deadline := time.Now().Add(10 * time.Second)
	for fdCount(t, pid) > fds0 && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	if got := fdCount(t, pid); got > fds0 {
		t.Errorf("open descriptors %d, baseline %d", got, fds0)
	}
}

func fdCount(t *testing.T, pid int) int {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join("/proc", strconv.Itoa(pid), "fd"))
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// procStatusKiB reads a kB field of /proc/PID/status (VmRSS, VmHWM).
func procStatusKiB(t *testing.T, pid int, field string) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "status"))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == field+":" {
			n, err := strconv.Atoi(f[1])
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}
