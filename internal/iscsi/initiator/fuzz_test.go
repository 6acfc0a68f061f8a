package initiator_test

import (
	"context"
	"testing"
	"time"

	"github.com/vmsan/vmsan/internal/iscsi/initiator"
	"github.com/vmsan/vmsan/internal/iscsi/pdu"
)

// FuzzTargetBytes logs in to the scripted target, sends one 512-byte read,
// and lets the target answer it with arbitrary bytes, then hang up. The
// initiator must neither panic nor hang, must return from Command, and
// must write nothing outside the read buffer.
func FuzzTargetBytes(f *testing.F) {
	enc := func(h pdu.PDU, data []byte) []byte {
		b, err := pdu.AppendPDU(nil, h, nil, data, pdu.Digests{})
		if err != nil {
			f.Fatal(err)
		}
		return b
	}
	// The first command of a session gets ITT 1.
	f.Add(enc(&pdu.DataIn{ITT: 1, Final: true, HasStatus: true}, make([]byte, 512)))
	f.Add(enc(&pdu.DataIn{ITT: 1, BufferOffset: 256}, make([]byte, 512)))
	f.Add(enc(&pdu.SCSIResponse{ITT: 1, Status: pdu.StatusCheckCondition}, pdu.SenseData([]byte{0x70, 0, 6})))
	f.Add(enc(&pdu.R2T{ITT: 1, DesiredDataTransferLength: 512}, nil))
	f.Add(enc(&pdu.NOPIn{ITT: pdu.ReservedTag, TTT: 5}, []byte("x")))
	f.Add(enc(&pdu.AsyncMessage{AsyncEvent: pdu.AsyncLogoutRequest}, nil))
	f.Add([]byte{0xff, 0xff, 0xff})
	// Regressions: a SCSI Response whose sense length overruns its data
	// segment, and a Task Management Response naming the SCSI task's ITT,
	// each left the command waiting forever (the task was dropped from
	// the table before the session failed).
	f.Add(enc(&pdu.SCSIResponse{ITT: 1, Status: pdu.StatusCheckCondition}, []byte{0, 9, 0x70}))
	f.Add(enc(&pdu.TaskMgmtResponse{ITT: 1}, nil))
	f.Fuzz(func(t *testing.T, data []byte) {
		ft := &fake{}
		s, done := startFake(t, ft, initiator.Config{}, func(ft *fake, fr pdu.Frame) error {
			if _, ok := fr.Header.(*pdu.SCSICommand); ok {
				ft.c.Write(data)
				ft.c.Close()
			}
			return nil
		})
		if s == nil {
			t.Fatal(<-done)
		}
		buf := make([]byte, 1024)
		cdb := make([]byte, 16)
		cdb[0] = 0x88
		ret := make(chan struct{})
		go func() {
			s.Command(context.Background(), 0, cdb, nil, buf[:512])
			close(ret)
		}()
		select {
		case <-ret:
		case <-time.After(10 * time.Second):
			t.Fatal("Command did not return after the target hung up")
		}
		for _, b := range buf[512:] {
			if b != 0 {
				t.Fatal("written past the read buffer")
			}
		}
	})
}
