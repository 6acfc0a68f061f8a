package target

import (
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

// FuzzSession logs in, then feeds arbitrary bytes as the rest of the
// initiator's stream: the session must neither panic nor hang (serve
// returns once the initiator closes), whatever the PDUs say.
func FuzzSession(f *testing.F) {
	f.Add(fuzzPDU(&pdu.NOPOut{ITT: 1, TTT: pdu.ReservedTag, CmdSN: 1}, []byte("ping")))
	f.Add(fuzzPDU(&pdu.SCSICommand{Final: true, Read: true, ITT: 2, ExpectedDataTransferLength: 4096, CmdSN: 1, CDB: readCDB(0, 8)}, nil))
	f.Add(append(fuzzPDU(&pdu.SCSICommand{Write: true, ITT: 3, ExpectedDataTransferLength: 2048, CmdSN: 1, CDB: writeCDB(0, 4)}, make([]byte, 512)),
		fuzzPDU(&pdu.DataOut{Final: true, ITT: 3, TTT: pdu.ReservedTag, BufferOffset: 512}, make([]byte, 1536))...))
	f.Add(fuzzPDU(&pdu.TaskMgmtRequest{Immediate: true, Function: pdu.TMFAbortTask, ITT: 4, ReferencedTaskTag: 2, CmdSN: 1}, nil))
	f.Add(fuzzPDU(&pdu.TextRequest{Final: true, ITT: 5, TTT: pdu.ReservedTag, CmdSN: 1}, keys("SendTargets", "All")))
	f.Add(fuzzPDU(&pdu.LogoutRequest{ITT: 6, CmdSN: 1}, nil))
	f.Add(fuzzPDU(&pdu.SNACKRequest{ITT: 7}, nil))
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
		lu := newRAMLU(1 << 20)
		srv := New(Config{
			Targets:       func() []Target { return []Target{{Name: testIQN, LUs: lu}} },
			NopInterval:   -1,
			MaxTransfer:   1 << 20,
			SessionBudget: 2 << 20,
		})
		cs, ss := net.Pipe()
		c := newConn(srv, ss, 1, 1)
		done := make(chan struct{})
		go func() { c.serve(); close(done) }()
		go io.Copy(io.Discard, cs)
		login := fuzzPDU(&pdu.LoginRequest{Transit: true, CSG: 1, NSG: 3, ISID: pdu.ISID{0x80}, CmdSN: 1},
			keys("InitiatorName", "iqn.2026-11.test:fuzz", "TargetName", testIQN))
		cs.SetWriteDeadline(time.Now().Add(5 * time.Second))
		cs.Write(login)
		cs.Write(stream)
		cs.Close()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("session did not end after the initiator closed")
		}
	})
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
