package server

import (
	"bytes"
	"math/rand/v2"
	"sync/atomic"
	"testing"

	"github.com/vmsan/vmsan/internal/export"
	"github.com/vmsan/vmsan/internal/export/exporttest"
	"github.com/vmsan/vmsan/internal/nbd/proto"
)

// splitDev sends every third block's requests through a goroutine (so they
// complete on another goroutine, after Submit returned: the writer replies)
// and the rest straight to the engine (inline on the reader: the reader
// replies).
type splitDev struct {
	*exporttest.Device
	async atomic.Int64
}

func (d *splitDev) Submit(r *export.Request) {
	if (r.Offset/4096)%3 == 0 {
		d.async.Add(1)
		go d.Device.Submit(r)
		return
	}
	d.Device.Submit(r)
}

// TestReplyPathsMixed: replies written by the reader (inline completions)
// and by the writer (later completions) share one connection; with
// structured replies and multi-chunk reads (data and hole chunks) every
// reply must arrive whole, exactly once, with the right data.
func TestReplyPathsMixed(t *testing.T) {
	for _, structured := range []bool{false, true} {
		const size = 4 << 20
		d := &splitDev{Device: exporttest.NewMemDevice(t, "disk", size)}
		_, addr := startServer(t, Config{Registry: &testReg{devs: map[string]export.Device{"disk": d}}})
		rc := dialRaw(t, addr)
		rc.negotiate("disk", structured)
		rng := rand.New(rand.NewPCG(1, 2))
		model := make([]byte, size)

		// Phase 1: pipelined writes to every other 64 KiB stripe (the
		// others stay holes, so large reads get hole chunks).
		const stripe = 64 << 10
		cookie := uint64(0)
		pending := map[uint64]bool{}
		for off := 0; off < size; off += 2 * stripe {
			for b := off; b < off+stripe; b += 16 << 10 {
				p := make([]byte, 16<<10)
				for i := range p {
					p[i] = byte(rng.Uint32() | 1) // never all zero
				}
				copy(model[b:], p)
				cookie++
				pending[cookie] = true
				rc.request(proto.Request{Type: proto.CmdWrite, Cookie: cookie, Offset: uint64(b), Length: uint32(len(p))}, p)
			}
		}
		for len(pending) > 0 {
			r, err := rc.readReply(nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			if !pending[r.cookie] || r.errno != 0 {
				t.Fatalf("write reply cookie %d errno %v unexpected", r.cookie, r.errno)
			}
			delete(pending, r.cookie)
		}

		// Phase 2: pipelined reads of mixed sizes, some spanning a data
		// stripe and a hole stripe (several chunks when structured).
		lens, bases := map[uint64]uint32{}, map[uint64]uint64{}
		for i := 0; i < 200; i++ {
			n := uint32(4096)
			if i%4 == 0 {
				n = 2 * stripe
			}
			off := uint64(rng.IntN((size-int(n))/4096)) * 4096
			cookie++
			lens[cookie], bases[cookie] = n, off
			rc.request(proto.Request{Type: proto.CmdRead, Cookie: cookie, Offset: off, Length: n}, nil)
		}
		holes := 0
		for len(lens) > 0 {
			r, err := rc.readReply(lens, bases)
			if err != nil {
				t.Fatal(err)
			}
			n, ok := lens[r.cookie]
			if !ok || r.errno != 0 {
				t.Fatalf("read reply cookie %d (known %v) errno %v", r.cookie, ok, r.errno)
			}
			off := bases[r.cookie]
			if !bytes.Equal(r.data, model[off:off+uint64(n)]) {
				t.Fatalf("structured=%v: read %d+%d returned wrong data", structured, off, n)
			}
			holes += r.holes
			delete(lens, r.cookie)
		}
		st := d.Engine.Stats()
		t.Logf("structured=%v: %d requests, %d inline, %d via another goroutine, %d hole chunks",
			structured, st.Requests.Total(), st.Inlined, d.async.Load(), holes)
		if st.Inlined == 0 || d.async.Load() == 0 {
			t.Fatalf("inline %d, async %d: both reply paths must be exercised", st.Inlined, d.async.Load())
		}
		if structured && holes == 0 {
			t.Fatal("no hole chunk: multi-chunk replies not exercised")
		}
	}
}
