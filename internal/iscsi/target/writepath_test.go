package target

import (
	"bytes"
	"runtime"
	"testing"

	"github.com/vmsan/vmsan/internal/iscsi/pdu"
	"github.com/vmsan/vmsan/internal/scsi"
)

// sendPooled is ini.send through a reused buffer, so that the client side
// of an allocation test allocates (almost) nothing per PDU.
func (i *ini) sendPooled(buf *[]byte, h pdu.PDU, data []byte) {
	i.t.Helper()
	b, err := pdu.AppendPDU((*buf)[:0], h, nil, data, i.dig)
	if err != nil {
		i.t.Fatal(err)
	}
	*buf = b
	if _, err := i.c.Write(b); err != nil {
		i.t.Fatal(err)
	}
}

// writeBurst writes payload at LBA 0 the way libiscsi and open-iscsi do
// with ImmediateData=Yes, InitialR2T=No: immediate data up to the
// target's MaxRecvDataSegmentLength, unsolicited Data-Out up to
// FirstBurstLength, the rest on R2Ts. It returns the number of R2Ts.
func (i *ini) writeBurst(buf *[]byte, itt uint32, payload []byte, mrdsl, firstBurst int) int {
	i.t.Helper()
	n := len(payload)
	imm := min(n, mrdsl, firstBurst)
	unsol := min(n, firstBurst)
	i.sendPooled(buf, &pdu.SCSICommand{Final: unsol == imm, Write: true, ITT: itt, ExpectedDataTransferLength: uint32(n),
		CmdSN: i.cmdSN, CDB: writeCDB(0, uint16(n/512))}, payload[:imm])
	i.cmdSN++
	for off, sn := imm, uint32(0); off < unsol; sn++ {
		m := min(mrdsl, unsol-off)
		i.sendPooled(buf, &pdu.DataOut{Final: off+m == unsol, ITT: itt, TTT: pdu.ReservedTag, DataSN: sn, BufferOffset: uint32(off)}, payload[off:off+m])
		off += m
	}
	r2ts := 0
	for {
		f := i.recv()
		switch h := f.Header.(type) {
		case *pdu.SCSIResponse:
			if h.ITT != itt || h.Status != 0 {
				i.t.Fatalf("write response %+v", h)
			}
			return r2ts
		case *pdu.R2T:
			r2ts++
			for off, sn := uint32(0), uint32(0); off < h.DesiredDataTransferLength; sn++ {
				m := min(uint32(mrdsl), h.DesiredDataTransferLength-off)
				o := h.BufferOffset + off
				i.sendPooled(buf, &pdu.DataOut{Final: off+m == h.DesiredDataTransferLength, ITT: itt, TTT: h.TTT, DataSN: sn, BufferOffset: o}, payload[o:o+m])
				off += m
			}
		case *pdu.NOPIn:
		default:
			i.t.Fatalf("got %T during a write", f.Header)
		}
	}
}

// TestWritePathNoCopy: write data is read straight into the command's
// pooled buffer, so the heap bytes allocated per write (server and this
// client together) stay far below the data written. Reading every data
// segment into a fresh buffer and copying it into another fresh buffer of
// the command's length allocated more than twice the data. A 4 KiB write
// with immediate data needs no R2T, a 1 MiB one exactly one.
func TestWritePathNoCopy(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates") // skip: race
	}
	ts := startServer(t, nil)
	i := dial(t, ts.addr)
	const mrdsl, firstBurst = 65536, 262144
	i.login("MaxRecvDataSegmentLength", "65536", "FirstBurstLength", "262144", "MaxBurstLength", "1048576",
		"InitialR2T", "No", "ImmediateData", "Yes")
	buf := make([]byte, 0, 2<<20)
	for _, n := range []int{4096, 1 << 20} {
		payload := make([]byte, n)
		for k := range payload {
			payload[k] = byte(k*13 + n)
		}
		wantR2T := 0
		if n > firstBurst {
			wantR2T = 1
		}
		if r := i.writeBurst(&buf, 1, payload, mrdsl, firstBurst); r != wantR2T {
			t.Errorf("%d-byte write: %d R2Ts, want %d", n, r, wantR2T)
		}
		if !ts.lu.equal(payload) {
			t.Fatalf("%d-byte write: data differs", n)
		}
		const runs = 50
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		for k := 0; k < runs; k++ {
			i.writeBurst(&buf, uint32(k+2), payload, mrdsl, firstBurst)
		}
		runtime.ReadMemStats(&after)
		perOp := float64(after.TotalAlloc-before.TotalAlloc) / runs
		t.Logf("%d-byte write: %.0f heap bytes, %.1f allocations per command", n,
			perOp, float64(after.Mallocs-before.Mallocs)/runs)
		// Generous: a sync.Pool may be emptied by a GC mid-run (one
		// buffer re-allocated now and then), and small headers remain.
		if limit := max(float64(n)/4, 8192); perOp > limit {
			t.Errorf("%d-byte write: %.0f heap bytes per command, want <= %.0f", n, perOp, limit)
		}
		// Small objects per 4 KiB write, both sides: the headers the
		// readers decode, the task, its done channel and callback, the
		// test LU's result (7 when written; 18 with per-PDU scratch).
		if allocs := float64(after.Mallocs-before.Mallocs) / runs; n == 4096 && allocs > 10 {
			t.Errorf("%d-byte write: %.1f allocations per command, want <= 10", n, allocs)
		}
	}
}

// poisonLU is a ramLU whose results scribble over their data-in when
// released, as a pooled buffer's next user would.
type poisonLU struct{ *ramLU }

func (l poisonLU) Execute(t *scsi.Task, done func(*scsi.Result)) {
	l.ramLU.Execute(t, func(r *scsi.Result) {
		r.SetRelease(func() {
			for k := range r.DataIn {
				r.DataIn[k] = 0xee
			}
		})
		done(r)
	})
}

// TestDataInNotCopiedReleasedAfterWrite: long Data-In segments go to the
// socket from the logical unit's buffer (sendBuf.Ref, no copy), so the
// writer may release a result only once its bytes have been written:
// several reads in flight, each released buffer poisoned, must all
// arrive intact.
func TestDataInNotCopiedReleasedAfterWrite(t *testing.T) {
	var lu poisonLU
	ts := startServer(t, func(_ *Config, tg *Target) {
		lu = poisonLU{tg.LUs.(*ramLU)}
		tg.LUs = lu
	})
	i := dial(t, ts.addr)
	i.login("MaxRecvDataSegmentLength", "65536", "InitialR2T", "No", "ImmediateData", "Yes")
	// Under flushAt each: several results gather in one flush.
	const n = 256 << 10
	payload := make([]byte, n)
	for k := range payload {
		payload[k] = byte(k*31 + 7)
	}
	buf := make([]byte, 0, 2<<20)
	i.writeBurst(&buf, 1, payload, 8192, 65536)
	const reads = 6
	for k := uint32(0); k < reads; k++ {
		i.send(&pdu.SCSICommand{Final: true, Read: true, ITT: 10 + k, ExpectedDataTransferLength: n, CmdSN: i.cmdSN, CDB: readCDB(0, n/512)}, nil)
		i.cmdSN++
	}
	got := map[uint32][]byte{}
	for done := 0; done < reads; {
		di, f := expect[*pdu.DataIn](i)
		if int(di.BufferOffset) != len(got[di.ITT]) {
			t.Fatalf("ITT %d: Data-In at %d after %d bytes", di.ITT, di.BufferOffset, len(got[di.ITT]))
		}
		got[di.ITT] = append(got[di.ITT], f.Data...)
		if di.HasStatus {
			done++
			if !bytes.Equal(got[di.ITT], payload) {
				t.Fatalf("ITT %d: read data differs (released before it was written?)", di.ITT)
			}
		}
	}
}
