package server

import (
	"encoding/binary"
	"io"
	"testing"

	"github.com/vmsan/vmsan/internal/export/exporttest"
	"github.com/vmsan/vmsan/internal/nbd/proto"
)

// pipelined sends batches of depth 4 KiB requests (pre-encoded, so the
// client side allocates nothing) and reads the simple replies.
func pipelined(tb testing.TB, rc *rawClient, write bool, depth, batches int) {
	var reqs []byte
	payload := make([]byte, 4096)
	for i := range depth {
		r := proto.Request{Type: proto.CmdRead, Cookie: uint64(i), Offset: uint64(i) * 4096 * 7 % (1 << 20), Length: 4096}
		if write {
			r.Type = proto.CmdWrite
		}
		reqs = proto.AppendRequest(reqs, r)
		if write {
			reqs = append(reqs, payload...)
		}
	}
	hdr := make([]byte, proto.SimpleReplySize)
	data := make([]byte, 4096)
	for range batches {
		if _, err := rc.c.Write(reqs); err != nil {
			tb.Fatal(err)
		}
		for range depth {
			if _, err := io.ReadFull(rc.c, hdr); err != nil {
				tb.Fatal(err)
			}
			if binary.BigEndian.Uint32(hdr[4:]) != 0 {
				tb.Fatal("error reply")
			}
			if !write {
				if _, err := io.ReadFull(rc.c, data); err != nil {
					tb.Fatal(err)
				}
			}
		}
	}
}

// TestAllocsPerRequest bounds heap allocations on the request path
// (server, engine and Mem backend together) in steady state.
func TestAllocsPerRequest(t *testing.T) {
	if testing.Short() || raceEnabled {
		t.Skip("short mode or race detector (which defeats sync.Pool)") // skip: race
	}
	for _, write := range []bool{false, true} {
		dev := exporttest.NewMemDevice(t, "disk", 1<<20)
		_, addr := startServer(t, Config{Registry: exporttest.NewRegistry(dev)})
		rc := dialRaw(t, addr)
		rc.negotiate("disk", false)
		const depth = 32
		pipelined(t, rc, write, depth, 20) // warm pools
		allocs := testing.AllocsPerRun(50, func() { pipelined(t, rc, write, depth, 1) })
		perReq := allocs / depth
		t.Logf("write=%v: %.2f allocs per 4 KiB request", write, perReq)
		// Generous bound: catches a per-request buffer or closure sneaking
		// in (a 4 KiB buffer per request would show as >= 1).
		if perReq > 1 {
			t.Errorf("write=%v: %.2f allocs per request", write, perReq)
		}
	}
}
