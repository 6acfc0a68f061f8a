package iscsi

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/vmsan/vmsan/internal/iscsi/chap"
	"github.com/vmsan/vmsan/internal/iscsi/pdu"
	"github.com/vmsan/vmsan/internal/iscsi/text"
)

// raw is a hand-driven initiator connection built from internal/iscsi/pdu,
// for sending what no real initiator sends. Its methods report failures
// through t; those that can race with the target closing the connection
// return errors instead.
type raw struct {
	t     testing.TB
	c     net.Conn
	rd    pdu.Reader
	dig   pdu.Digests
	isid  pdu.ISID
	cmdSN uint32
	itt   uint32
}

// rawCred is the CHAP account of the bad input table's target.
const (
	rawUser   = "bad"
	rawSecret = "badinput-secret1"
	rawIQN    = "iqn.2026-11.test:badinput"
)

var isidSeq atomic.Uint32

func rawDial(t testing.TB, addr string) *raw {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	// A distinct ISID per connection: the same ISID and InitiatorName
	// would reinstate (close) another row's session.
	n := isidSeq.Add(1)
	r := &raw{t: t, c: c, cmdSN: 1, itt: 1, isid: pdu.ISID{0x80, 0x12, 0x34, byte(n >> 16), byte(n >> 8), byte(n)}}
	r.rd = pdu.Reader{R: bufio.NewReader(c), MaxData: 1 << 20}
	return r
}

// encode builds one PDU with the connection's digests.
func (r *raw) encode(h pdu.PDU, data []byte) []byte {
	r.t.Helper()
	b, err := pdu.AppendPDU(nil, h, nil, data, r.dig)
	if err != nil {
		r.t.Fatal(err)
	}
	return b
}

func (r *raw) write(b []byte) error {
	r.c.SetWriteDeadline(time.Now().Add(10 * time.Second))
	_, err := r.c.Write(b)
	return err
}

func (r *raw) send(h pdu.PDU, data []byte) {
	r.t.Helper()
	if err := r.write(r.encode(h, data)); err != nil {
		r.t.Fatalf("send %T: %v", h, err)
	}
}

// recv reads one PDU, skipping the target's NOP-In pings.
func (r *raw) recv(d time.Duration) (pdu.Frame, error) {
	r.c.SetReadDeadline(time.Now().Add(d))
	for {
		f, err := r.rd.Read()
		if err != nil {
			return f, err
		}
		if n, ok := f.Header.(*pdu.NOPIn); ok && n.ITT == pdu.ReservedTag {
			continue
		}
		return f, nil
	}
}

// expectPDU reads the next PDU, which must be a T.
func expectPDU[T pdu.PDU](r *raw) (T, pdu.Frame) {
	r.t.Helper()
	f, err := r.recv(10 * time.Second)
	if err != nil {
		r.t.Fatalf("waiting for %T: %v", *new(T), err)
	}
	h, ok := f.Header.(T)
	if !ok {
		r.t.Fatalf("got %T %+v, want %T", f.Header, f.Header, *new(T))
	}
	return h, f
}

// expectReject reads a Reject with the given reason quoting bhs (nil: any).
func (r *raw) expectReject(reason pdu.RejectReason, bhs []byte) {
	r.t.Helper()
	rj, f := expectPDU[*pdu.Reject](r)
	if rj.Reason != reason {
		r.t.Fatalf("Reject reason %v, want %v", rj.Reason, reason)
	}
	if bhs != nil && (len(f.Data) < pdu.BHSLen || string(f.Data[:pdu.BHSLen]) != string(bhs[:pdu.BHSLen])) {
		r.t.Fatalf("Reject quotes %x, want %x", f.Data, bhs[:pdu.BHSLen])
	}
}

// expectClosed requires the target to close the connection (EOF or reset)
// within 10 s, with nothing but NOP-In pings before that.
func (r *raw) expectClosed() {
	r.t.Helper()
	f, err := r.recv(10 * time.Second)
	if err == nil {
		r.t.Fatalf("connection still open: got %T %+v", f.Header, f.Header)
	}
	if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, syscall.ECONNRESET) {
		r.t.Fatalf("want the connection closed, got %v", err)
	}
}

// expectSilence requires no PDU (NOP-In pings aside) for d.
func (r *raw) expectSilence(d time.Duration) {
	r.t.Helper()
	f, err := r.recv(d)
	if err == nil {
		r.t.Fatalf("want no answer, got %T %+v", f.Header, f.Header)
	}
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		r.t.Fatalf("want no answer, got %v", err)
	}
}

func kv(pairs ...string) []byte {
	var ps []text.Pair
	for j := 0; j+1 < len(pairs); j += 2 {
		ps = append(ps, text.Pair{Key: pairs[j], Value: pairs[j+1]})
	}
	b, err := text.Append(nil, ps...)
	if err != nil {
		panic(err)
	}
	return b
}

// loginPDU sends one Login Request with data as its text and returns the
// response and its keys.
func (r *raw) loginPDU(req *pdu.LoginRequest, data []byte) (*pdu.LoginResponse, map[string]string) {
	r.t.Helper()
	req.ISID, req.ITT, req.CmdSN = r.isid, r.itt, r.cmdSN
	r.send(req, data)
	f, err := r.recv(10 * time.Second)
	if err != nil {
		r.t.Fatalf("waiting for a Login Response: %v", err)
	}
	rsp, ok := f.Header.(*pdu.LoginResponse)
	if !ok {
		r.t.Fatalf("got %T, want a Login Response", f.Header)
	}
	ps, err := text.Parse(f.Data)
	if err != nil {
		r.t.Fatalf("login response keys: %v", err)
	}
	m := map[string]string{}
	for _, p := range ps {
		m[p.Key] = p.Value
	}
	return rsp, m
}

// chapStart runs the security stage up to the target's challenge and
// returns its keys (CHAP_A, CHAP_I, CHAP_C).
func (r *raw) chapStart() map[string]string {
	r.t.Helper()
	sec := pdu.StageSecurityNegotiation
	rsp, m := r.loginPDU(&pdu.LoginRequest{CSG: sec}, kv("InitiatorName", rawIQN, "TargetName", nodeIQN, "SessionType", "Normal", "AuthMethod", "CHAP"))
	if rsp.Status != pdu.LoginSuccess || m["AuthMethod"] != "CHAP" {
		r.t.Fatalf("AuthMethod: status %v keys %v", rsp.Status, m)
	}
	rsp, m = r.loginPDU(&pdu.LoginRequest{CSG: sec}, kv("CHAP_A", "5"))
	if rsp.Status != pdu.LoginSuccess || m["CHAP_A"] != "5" || m["CHAP_C"] == "" {
		r.t.Fatalf("CHAP_A: status %v keys %v", rsp.Status, m)
	}
	return m
}

// login logs in with CHAP and the extra operational keys, switches on the
// digests the target agreed to and returns the final response.
func (r *raw) login(extra ...string) *pdu.LoginResponse {
	r.t.Helper()
	m := r.chapStart()
	ans, err := chap.Answer(m, rawUser, []byte(rawSecret), nil)
	if err != nil {
		r.t.Fatal(err)
	}
	var pairs []string
	for _, p := range ans {
		pairs = append(pairs, p.Key, p.Value)
	}
	rsp, _ := r.loginPDU(&pdu.LoginRequest{CSG: pdu.StageSecurityNegotiation, Transit: true, NSG: pdu.StageLoginOperationalNegotiation}, kv(pairs...))
	if rsp.Status != pdu.LoginSuccess || !rsp.Transit {
		r.t.Fatalf("CHAP_R: status %v", rsp.Status)
	}
	rsp, m = r.loginPDU(&pdu.LoginRequest{CSG: pdu.StageLoginOperationalNegotiation, Transit: true, NSG: pdu.StageFullFeaturePhase}, kv(extra...))
	if rsp.Status != pdu.LoginSuccess || !rsp.Transit || rsp.TSIH == 0 {
		r.t.Fatalf("operational stage: status %v keys %v", rsp.Status, m)
	}
	r.dig = pdu.Digests{Header: m["HeaderDigest"] == "CRC32C", Data: m["DataDigest"] == "CRC32C"}
	r.rd.Digests = r.dig
	r.itt++
	return rsp
}

// nextITT returns a fresh initiator task tag.
func (r *raw) nextITT() uint32 { r.itt++; return r.itt }

// cmd builds a non-immediate SCSI command taking the next CmdSN.
func (r *raw) cmd(cdb [16]byte, read, write bool, edtl uint32) *pdu.SCSICommand {
	c := &pdu.SCSICommand{Final: true, Read: read, Write: write, ITT: r.nextITT(), CmdSN: r.cmdSN,
		ExpectedDataTransferLength: edtl, CDB: cdb}
	r.cmdSN++
	return c
}

// scsiStatus waits for the status of task itt (a SCSI Response or a
// Data-In with status); it returns the status and the sense data.
func (r *raw) scsiStatus(itt uint32) (pdu.SCSIStatus, []byte) {
	r.t.Helper()
	for {
		f, err := r.recv(10 * time.Second)
		if err != nil {
			r.t.Fatalf("waiting for the status of ITT %d: %v", itt, err)
		}
		switch h := f.Header.(type) {
		case *pdu.SCSIResponse:
			if h.ITT != itt {
				r.t.Fatalf("SCSI Response for ITT %d, want %d", h.ITT, itt)
			}
			var sense []byte
			if len(f.Data) >= 2 {
				n := int(binary.BigEndian.Uint16(f.Data))
				sense = f.Data[2:min(len(f.Data), 2+n)]
			}
			return h.Status, sense
		case *pdu.DataIn:
			if h.ITT != itt {
				r.t.Fatalf("Data-In for ITT %d, want %d", h.ITT, itt)
			}
			if h.HasStatus {
				return h.Status, nil
			}
		default:
			r.t.Fatalf("got %T %+v waiting for the status of ITT %d", f.Header, f.Header, itt)
		}
	}
}

// tur sends TEST UNIT READY and requires GOOD (after at most one unit
// attention, as a session's first command gets): the session still works.
func (r *raw) tur() {
	r.t.Helper()
	for try := 0; ; try++ {
		c := r.cmd([16]byte{}, false, false, 0)
		r.send(c, nil)
		st, sense := r.scsiStatus(c.ITT)
		if st == pdu.StatusGood {
			return
		}
		if try > 0 || st != pdu.StatusCheckCondition || !strings.HasPrefix(senseKey(sense), "6/") {
			r.t.Fatalf("TEST UNIT READY: status %v %s", st, senseKey(sense))
		}
	}
}

func cdb10(op byte, lba uint32, blocks uint16) [16]byte {
	var c [16]byte
	c[0] = op
	binary.BigEndian.PutUint32(c[2:], lba)
	binary.BigEndian.PutUint16(c[7:], blocks)
	return c
}

func read10(lba uint32, blocks uint16) [16]byte  { return cdb10(0x28, lba, blocks) }
func write10(lba uint32, blocks uint16) [16]byte { return cdb10(0x2a, lba, blocks) }

// senseKey returns key/ASC/ASCQ of fixed or descriptor sense.
func senseKey(s []byte) string {
	switch {
	case len(s) >= 14 && s[0]&0x7f >= 0x70 && s[0]&0x7f <= 0x71:
		return fmt.Sprintf("%x/%02x/%02x", s[2]&0x0f, s[12], s[13])
	case len(s) >= 4 && s[0]&0x7f >= 0x72:
		return fmt.Sprintf("%x/%02x/%02x", s[1]&0x0f, s[2], s[3])
	}
	return fmt.Sprintf("sense %x", s)
}
