package iscsi

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/vmsan/vmsan/internal/iscsi/pdu"
	"github.com/vmsan/vmsan/internal/testutil"
	"github.com/vmsan/vmsan/tests/interop/servers"
)

// rawTry sends one SCSI command with its data-out as immediate data and
// waits (up to d) for its status; unlike scsiStatus it returns errors, so
// it can run off the test goroutine and a hang is reported, not fatal.
func (r *raw) rawTry(cdb [16]byte, data []byte, d time.Duration) (pdu.SCSIStatus, []byte, error) {
	c := r.cmd(cdb, false, len(data) > 0, uint32(len(data)))
	b, err := pdu.AppendPDU(nil, c, nil, data, r.dig)
	if err != nil {
		return 0, nil, err
	}
	if err := r.write(b); err != nil {
		return 0, nil, err
	}
	for {
		f, err := r.recv(d)
		if err != nil {
			return 0, nil, fmt.Errorf("waiting for the status of ITT %d: %w", c.ITT, err)
		}
		switch h := f.Header.(type) {
		case *pdu.SCSIResponse:
			var sense []byte
			if len(f.Data) >= 2 {
				n := int(binary.BigEndian.Uint16(f.Data))
				sense = f.Data[2:min(len(f.Data), 2+n)]
			}
			return h.Status, sense, nil
		case *pdu.DataIn:
			if h.HasStatus {
				return h.Status, nil, nil
			}
		default:
			return 0, nil, fmt.Errorf("got %T waiting for a status", f.Header)
		}
	}
}

// quiesceOp is one writing command looped against snapshots: next returns
// its CDB and data-out for iteration i (GOOD is expected).
type quiesceOp struct {
	name string
	next func(i int) ([16]byte, []byte)
	// snaps is how many snapshots to take against it (default 24).
	snaps int
}

func writeSame16(lba uint64, blocks uint32) [16]byte {
	var c [16]byte
	c[0] = 0x93
	binary.BigEndian.PutUint64(c[2:], lba)
	binary.BigEndian.PutUint32(c[10:], blocks)
	return c
}

func quiesceOps() []quiesceOp {
	const bs = 512
	pattern := bytes.Repeat([]byte{0xAB}, bs)
	small := bytes.Repeat([]byte{0xCD}, 8*bs)
	return []quiesceOp{
		{name: "WriteSame16", next: func(i int) ([16]byte, []byte) {
			if i%16 != 0 {
				// Small writes between them keep the engine's measured
				// write service time low, so the first chunk of the next
				// WRITE SAME may run inline on the session's goroutine
				// (the case that hung a snapshot).
				return write10(20000, 8), small
			}
			// 8 MiB of a non-zero pattern: written in 1 MiB chunks.
			return writeSame16(0, 8<<20/bs), pattern
		}, snaps: 100}, // a hang needs a snapshot during an inline first chunk (a lock-based quiesce hung at snapshot 6, 29 and 67 of three runs)
		{name: "Unmap", next: func(i int) ([16]byte, []byte) {
			// Many descriptors: the target trims them one after another.
			const nd = 128
			p := make([]byte, 8+16*nd)
			binary.BigEndian.PutUint16(p[0:], uint16(len(p)-2))
			binary.BigEndian.PutUint16(p[2:], 16*nd)
			for j := range nd {
				binary.BigEndian.PutUint64(p[8+16*j:], uint64(16384+j*64))
				binary.BigEndian.PutUint32(p[8+16*j+8:], 32)
			}
			var c [16]byte
			c[0] = 0x42
			binary.BigEndian.PutUint16(c[7:], uint16(len(p)))
			return c, p
		}},
		{name: "CompareAndWrite", next: func(i int) ([16]byte, []byte) {
			// Block 40000 holds i (zeroes at first): compare it, write
			// i+1. Nothing else writes there, so every one must match.
			d := make([]byte, 2*bs)
			if i > 0 {
				copy(d, bytes.Repeat([]byte{byte(i)}, bs))
			}
			copy(d[bs:], bytes.Repeat([]byte{byte(i + 1)}, bs))
			var c [16]byte
			c[0] = 0x89
			binary.BigEndian.PutUint64(c[2:], 40000)
			c[13] = 1
			return c, d
		}},
		{name: "ORWrite", next: func(i int) ([16]byte, []byte) {
			var c [16]byte
			c[0] = 0x8B
			binary.BigEndian.PutUint64(c[2:], 50000)
			binary.BigEndian.PutUint32(c[10:], 64)
			return c, bytes.Repeat([]byte{byte(1 << (i % 8))}, 64*bs)
		}},
	}
}

// TestWritesVsSnapshot: writing commands the target runs as several
// engine requests (WRITE SAME with a pattern, chunked; UNMAP with many
// descriptors; COMPARE AND WRITE and ORWRITE, read then write) loop on
// one session while `vmsan volume snapshot --copy` runs in a loop against
// the same volume. Every command and every snapshot completes (a hang is
// detected by timeouts), and every COMPARE AND WRITE matches.
func TestWritesVsSnapshot(t *testing.T) {
	for _, op := range quiesceOps() {
		t.Run(op.name, func(t *testing.T) {
			v := startQuiesceVmsan(t)
			r := ffp(t, v.addr)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var wg sync.WaitGroup
			var cmdErr error
			cmds := 0
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; ctx.Err() == nil; i++ {
					cdb, data := op.next(i)
					st, sense, err := r.rawTry(cdb, data, 20*time.Second)
					if err == nil && st != pdu.StatusGood {
						err = fmt.Errorf("status %v %s", st, senseKey(sense))
					}
					if err != nil {
						cmdErr = fmt.Errorf("%s #%d: %w", op.name, i, err)
						cancel()
						return
					}
					cmds++
				}
			}()
			data := filepath.Join(v.proc.dir, "data")
			snaps := op.snaps
			if snaps == 0 {
				snaps = 24
			}
			var snapErr error
			for i := 0; i < snaps && ctx.Err() == nil; i++ {
				sctx, scancel := context.WithTimeout(ctx, 20*time.Second)
				out, err := exec.CommandContext(sctx, vmsanBin, "volume", "snapshot", "disk", fmt.Sprintf("s%d", i), "--copy", "--data-dir", data).CombinedOutput()
				timedOut := sctx.Err() == context.DeadlineExceeded
				scancel()
				if timedOut {
					snapErr = fmt.Errorf("snapshot %d hung (no answer in 20 s)", i)
					break
				}
				if err != nil && ctx.Err() == nil {
					snapErr = fmt.Errorf("snapshot %d: %v\n%s", i, err, out)
					break
				}
			}
			cancel()
			wg.Wait()
			if snapErr != nil || cmdErr != nil {
				t.Fatalf("snapshots: %v; commands (%d done): %v\n%s", snapErr, cmds, cmdErr, v.logTail())
			}
			if cmds == 0 {
				t.Fatal("no command completed while snapshots were taken")
			}
			t.Logf("%d snapshots, %d %s commands", snaps, cmds, op.name)
		})
	}
}

// startQuiesceVmsan serves one volume "disk" (cache writeback: page-cache
// writes are fast enough for the engine to run them inline, the case
// where a multi-step command's first request runs on the session's
// goroutine) over iSCSI with the raw client's CHAP account.
func startQuiesceVmsan(t *testing.T) *vmsan {
	t.Helper()
	dir := testutil.DiskTempDir(t)
	port, err := servers.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	nbdPort, err := servers.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	cfg := fmt.Sprintf(`data_dir: %s
listen: ["127.0.0.1:%d"]
no_default_volume: true
volumes:
  - {name: disk, size: %d, cache: writeback}
iscsi:
    listen: ["%s"]
    node_name: test
    auth: {user: %s, secret: %q}
`, filepath.Join(dir, "data"), nbdPort, volSize, addr, rawUser, rawSecret)
	v := &vmsan{proc: startProc(t, dir, cfg, addr), addr: addr, nbd: fmt.Sprintf("127.0.0.1:%d", nbdPort)}
	t.Cleanup(func() { v.stop(t) })
	return v
}
