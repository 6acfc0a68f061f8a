package server

import (
	"io"
	"testing"
	"time"

	"github.com/vmsan/vmsan/internal/export/exporttest"
	"github.com/vmsan/vmsan/internal/nbd/proto"
)

// BenchmarkPipelined4K measures the server's request path (codec, op-state
// handshake with the engine, buffer pool, reply batching) end to end over
// loopback TCP against a Mem backend, 32 requests in flight. It is the
// figure to compare before and after changing the hot path; allocs/op is
// per batch of 32 requests and must stay 0 in steady state.
func BenchmarkPipelined4K(b *testing.B) {
	for _, bc := range []struct {
		name  string
		write bool
	}{{"read", false}, {"write", true}} {
		b.Run(bc.name, func(b *testing.B) {
			dev := exporttest.NewMemDevice(b, "disk", 1<<20)
			_, addr := startServer(b, Config{Registry: exporttest.NewRegistry(dev)})
			rc := dialRaw(b, addr)
			rc.negotiate("disk", false)
			rc.c.SetDeadline(time.Time{}) // dialRaw's 20 s bound is for tests
			const depth = 32
			pipelined(b, rc, bc.write, depth, 20) // warm pools
			b.SetBytes(depth * 4096)
			b.ReportAllocs()
			b.ResetTimer()
			// Requests pre-encoded and reply buffers preallocated, so
			// allocs/op counts the server (and engine) only.
			var reqs []byte
			payload := make([]byte, 4096)
			for i := range depth {
				r := proto.Request{Type: proto.CmdRead, Cookie: uint64(i), Offset: uint64(i) * 4096 * 7 % (1 << 20), Length: 4096}
				if bc.write {
					r.Type = proto.CmdWrite
				}
				reqs = proto.AppendRequest(reqs, r)
				if bc.write {
					reqs = append(reqs, payload...)
				}
			}
			replyLen := proto.SimpleReplySize
			if !bc.write {
				replyLen += 4096
			}
			replies := make([]byte, depth*replyLen)
			for b.Loop() {
				if _, err := rc.c.Write(reqs); err != nil {
					b.Fatal(err)
				}
				if _, err := io.ReadFull(rc.c, replies); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
