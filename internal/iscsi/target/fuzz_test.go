package target

import (
	"bytes"
	"encoding/hex"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmsan/vmsan/internal/iscsi/pdu"
)

func fuzzPDU(h pdu.PDU, data []byte) []byte {
	b, _ := pdu.AppendPDU(nil, h, nil, data, pdu.Digests{})
	return b
}

func fuzzPDUDig(h pdu.PDU, data []byte) []byte {
	b, _ := pdu.AppendPDU(nil, h, nil, data, pdu.Digests{Header: true, Data: true})
	return b
}

func cat(bs ...[]byte) []byte {
	var out []byte
	for _, b := range bs {
		out = append(out, b...)
	}
	return out
}

// bhsOnly is a PDU header declaring a data segment that never follows.
func bhsOnly(h pdu.PDU) []byte {
	b := make([]byte, pdu.BHSLen)
	h.Encode(b)
	return b
}

// FuzzSession logs in, then feeds arbitrary bytes as the rest of the
// initiator's stream: the session must neither panic nor hang (serve
// returns once the initiator closes), whatever the PDUs say. The seeds
// include the bad input table of tests/iscsi.
func FuzzSession(f *testing.F) {
	f.Add(fuzzPDU(&pdu.NOPOut{ITT: 1, TTT: pdu.ReservedTag, CmdSN: 1}, []byte("ping")))
	f.Add(fuzzPDU(&pdu.SCSICommand{Final: true, Read: true, ITT: 2, ExpectedDataTransferLength: 4096, CmdSN: 1, CDB: readCDB(0, 8)}, nil))
	f.Add(append(fuzzPDU(&pdu.SCSICommand{Write: true, ITT: 3, ExpectedDataTransferLength: 2048, CmdSN: 1, CDB: writeCDB(0, 4)}, make([]byte, 512)),
		fuzzPDU(&pdu.DataOut{Final: true, ITT: 3, TTT: pdu.ReservedTag, BufferOffset: 512}, make([]byte, 1536))...))
	// Immediate data, and a solicited Data-Out (the first R2T's TTT is 1),
	// both read into the command's buffer.
	f.Add(fuzzPDU(&pdu.SCSICommand{Final: true, Write: true, ITT: 8, ExpectedDataTransferLength: 4096, CmdSN: 1, CDB: writeCDB(0, 8)}, make([]byte, 4096)))
	f.Add(append(fuzzPDU(&pdu.SCSICommand{Final: true, Write: true, ITT: 9, ExpectedDataTransferLength: 4096, CmdSN: 1, CDB: writeCDB(0, 8)}, make([]byte, 1024)),
		fuzzPDU(&pdu.DataOut{Final: true, ITT: 9, TTT: 1, BufferOffset: 1024}, make([]byte, 3072))...))
	f.Add(fuzzPDU(&pdu.TaskMgmtRequest{Immediate: true, Function: pdu.TMFAbortTask, ITT: 4, ReferencedTaskTag: 2, CmdSN: 1}, nil))
	f.Add(fuzzPDU(&pdu.TextRequest{Final: true, ITT: 5, TTT: pdu.ReservedTag, CmdSN: 1}, keys("SendTargets", "All")))
	f.Add(fuzzPDU(&pdu.LogoutRequest{ITT: 6, CmdSN: 1}, nil))
	f.Add(fuzzPDU(&pdu.SNACKRequest{ITT: 7}, nil))
	// The bad input table.
	unknown := make([]byte, pdu.BHSLen)
	unknown[0] = 0x1c
	f.Add(unknown)
	f.Add(fuzzPDU(&pdu.NOPIn{ITT: 7, TTT: pdu.ReservedTag}, nil))
	f.Add(fuzzPDU(&pdu.LoginRequest{CSG: 1, ISID: pdu.ISID{0x80}}, nil))
	f.Add(bhsOnly(&pdu.NOPOut{ITT: 9, TTT: pdu.ReservedTag, Immediate: true, Lengths: pdu.Lengths{DataSegmentLength: 262148}}))
	f.Add(bhsOnly(&pdu.SCSICommand{Final: true, Write: true, ITT: 2, CmdSN: 1, ExpectedDataTransferLength: 4096, CDB: writeCDB(0, 8),
		Lengths: pdu.Lengths{DataSegmentLength: pdu.MaxDataSegmentLength}}))
	f.Add(cat(fuzzPDU(&pdu.SCSICommand{Final: true, Read: true, ITT: 2, ExpectedDataTransferLength: 512, CmdSN: 1001, CDB: readCDB(0, 1)}, nil),
		fuzzPDU(&pdu.SCSICommand{Final: true, Read: true, ITT: 3, ExpectedDataTransferLength: 512, CmdSN: 1, CDB: readCDB(0, 1)}, nil)))
	long := append([]byte("X-vmsan-test="), bytes.Repeat([]byte("v"), 40000)...)
	f.Add(cat(fuzzPDU(&pdu.TextRequest{Continue: true, Immediate: true, ITT: 5, TTT: pdu.ReservedTag, CmdSN: 1}, long),
		fuzzPDU(&pdu.TextRequest{Continue: true, Immediate: true, ITT: 5, TTT: 1, CmdSN: 1}, long)))
	f.Add(cat(fuzzPDU(&pdu.TextRequest{Continue: true, Immediate: true, ITT: 5, TTT: pdu.ReservedTag, CmdSN: 1}, []byte("SendTar")),
		fuzzPDU(&pdu.TextRequest{Final: true, Immediate: true, ITT: 5, TTT: 1, CmdSN: 1}, []byte("gets=All\x00"))))
	f.Add(fuzzPDU(&pdu.TextRequest{Final: true, Immediate: true, ITT: 5, TTT: pdu.ReservedTag, CmdSN: 1}, append(keys("SendTargets", "All"), keys("SendTargets", "All")...)))
	f.Add(fuzzPDU(&pdu.SCSICommand{Final: true, Write: true, ITT: 2, ExpectedDataTransferLength: 128 << 10, CmdSN: 1, CDB: writeCDB(0, 256)}, make([]byte, 65536+4096)))
	f.Add(fuzzPDU(&pdu.DataOut{Final: true, ITT: 0x7777, TTT: pdu.ReservedTag}, make([]byte, 512)))
	f.Add(cat(fuzzPDU(&pdu.SCSICommand{Final: true, Write: true, ITT: 2, ExpectedDataTransferLength: 4096, CmdSN: 1, CDB: writeCDB(0, 8)}, nil),
		fuzzPDU(&pdu.DataOut{Final: true, ITT: 2, TTT: 1001}, make([]byte, 4096))))
	f.Add(cat(fuzzPDU(&pdu.SCSICommand{Final: true, Write: true, ITT: 2, ExpectedDataTransferLength: 4096, CmdSN: 1, CDB: writeCDB(0, 8)}, nil),
		fuzzPDU(&pdu.DataOut{Final: true, ITT: 2, TTT: 1, BufferOffset: 2048}, make([]byte, 4096))))
	f.Add(fuzzPDU(&pdu.SCSICommand{Final: true, Write: true, ITT: 2, ExpectedDataTransferLength: 0xffffffff, CmdSN: 1, CDB: writeCDB(0, 0xffff)}, nil))
	f.Add(fuzzPDU(&pdu.TaskMgmtRequest{Immediate: true, Function: 0x33, ITT: 4, ReferencedTaskTag: pdu.ReservedTag, CmdSN: 1}, nil))
	f.Add(cat(fuzzPDU(&pdu.SCSICommand{Final: true, Write: true, ITT: 2, ExpectedDataTransferLength: 4096, CmdSN: 1, CDB: writeCDB(0, 8)}, nil),
		fuzzPDU(&pdu.SCSICommand{Final: true, Read: true, ITT: 3, ExpectedDataTransferLength: 4096, CmdSN: 2, CDB: readCDB(0, 8)}, nil),
		fuzzPDU(&pdu.LogoutRequest{ITT: 6, CmdSN: 3}, nil)))
	// What open-iscsi sent in full feature phase of a real session
	// (internal/iscsi/pdu's golden vectors): its SCSI scan, a write with
	// immediate data and Data-Outs for R2Ts, a read, NOP-Out pings,
	// SYNCHRONIZE CACHE, logout. Its CmdSNs and TTTs are those of the
	// captured session, so the target also meets stale numbers.
	if s, err := openiscsiStream(filepath.Join("..", "pdu", "testdata", "openiscsi-vmsan-session-chap-mutual-small-burst.txt")); err != nil {
		f.Fatal(err)
	} else {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, stream []byte) {
		fuzzSession(t, keys("InitiatorName", "iqn.2026-11.test:fuzz", "TargetName", testIQN), stream)
	})
}

// FuzzSessionDigests is FuzzSession with CRC32C header and data digests
// and unsolicited data (InitialR2T=No): the seeds are the digest rows of
// the bad input table (a corrupt header digest, data digests failing on
// a NOP-Out, on immediate data and on an unsolicited Data-Out).
func FuzzSessionDigests(f *testing.F) {
	corrupt := func(b []byte, at int) []byte { b[at] ^= 0xff; return b }
	nop := fuzzPDUDig(&pdu.NOPOut{ITT: 1, TTT: pdu.ReservedTag, Immediate: true}, []byte("ping"))
	f.Add(nop)
	f.Add(corrupt(fuzzPDUDig(&pdu.NOPOut{ITT: 1, TTT: pdu.ReservedTag, Immediate: true}, nil), pdu.BHSLen))
	f.Add(corrupt(fuzzPDUDig(&pdu.NOPOut{ITT: 1, TTT: pdu.ReservedTag, Immediate: true}, []byte("ping")), len(nop)-1))
	w := &pdu.SCSICommand{Final: true, Write: true, ITT: 2, ExpectedDataTransferLength: 4096, CmdSN: 1, CDB: writeCDB(0, 8)}
	imm := fuzzPDUDig(w, make([]byte, 4096))
	f.Add(cat(corrupt(fuzzPDUDig(w, make([]byte, 4096)), len(imm)-1), imm))
	w2 := &pdu.SCSICommand{Write: true, ITT: 3, ExpectedDataTransferLength: 8192, CmdSN: 1, CDB: writeCDB(0, 16)}
	d1 := fuzzPDUDig(&pdu.DataOut{ITT: 3, TTT: pdu.ReservedTag}, make([]byte, 4096))
	f.Add(cat(fuzzPDUDig(w2, nil), corrupt(d1, len(d1)-1),
		fuzzPDUDig(&pdu.DataOut{Final: true, ITT: 3, TTT: pdu.ReservedTag, DataSN: 1, BufferOffset: 4096}, make([]byte, 4096))))
	f.Fuzz(func(t *testing.T, stream []byte) {
		fuzzSession(t, keys("InitiatorName", "iqn.2026-11.test:fuzz", "TargetName", testIQN, "HeaderDigest", "CRC32C", "DataDigest", "CRC32C",
			"InitialR2T", "No", "FirstBurstLength", "65536"), stream)
	})
}

// fuzzSession logs in with the login keys, then writes stream and closes:
// serve must return (no hang) without panicking.
func fuzzSession(t *testing.T, login []byte, stream []byte) {
	lu := newRAMLU(1 << 20)
	srv := New(Config{
		Targets:       func() []Target { return []Target{{Name: testIQN, LUs: lu, AllowAny: true}} },
		NopInterval:   -1,
		MaxTransfer:   1 << 20,
		SessionBudget: 2 << 20,
	})
	cs, ss := net.Pipe()
	c := newConn(srv, ss, 1, 1)
	done := make(chan struct{})
	go func() { c.serve(); close(done) }()
	go io.Copy(io.Discard, cs)
	req := fuzzPDU(&pdu.LoginRequest{Transit: true, CSG: 1, NSG: 3, ISID: pdu.ISID{0x80}, CmdSN: 1}, login)
	cs.SetWriteDeadline(time.Now().Add(5 * time.Second))
	cs.Write(req)
	cs.Write(stream)
	cs.Close()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("session did not end after the initiator closed")
	}
}

// openiscsiStream returns the initiator's PDUs after its last Login
// Request in a stored capture ("C hex" lines), concatenated.
func openiscsiStream(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var stream []byte
	for _, l := range strings.Split(string(b), "\n") {
		dir, h, ok := strings.Cut(l, " ")
		if !ok || dir != "C" {
			continue
		}
		p, err := hex.DecodeString(h)
		if err != nil {
			return nil, err
		}
		if len(p) > 0 && pdu.Opcode(p[0]&0x3f) == pdu.OpLoginReq {
			stream = stream[:0]
			continue
		}
		stream = append(stream, p...)
	}
	return stream, nil
}
