package server

import (
	"context"
	"io"
	"math/rand/v2"
	"net"
	"testing"
	"time"

	"github.com/vmsan/vmsan/internal/nbd/proto"
)

// feed serves one connection over net.Pipe, writes in as the client (while
// draining whatever the server replies), closes the client side and reports
// whether ServeConn returned within 10 s.
func feed(srv *Server, in []byte) bool {
	cc, sc := net.Pipe()
	done := make(chan struct{})
	go func() {
		srv.ServeConn(context.Background(), sc)
		close(done)
	}()
	go io.Copy(io.Discard, cc)
	cc.SetWriteDeadline(time.Now().Add(5 * time.Second))
	cc.Write(in)
	cc.Close()
	select {
	case <-done:
		return true
	case <-time.After(10 * time.Second):
		return false
	}
}

// TestGarbageNeverPanics feeds mutated handshakes and request streams to
// ServeConn over net.Pipe. Whatever the bytes, the server must not panic
// (Stats.Panics stays 0), must not hang once the client goes away, and
// must release every device reference it took.
func TestGarbageNeverPanics(t *testing.T) {
	reg, dev, ro := newTestReg()
	srv := New(Config{Registry: reg, MaxPayload: 64 << 10, HandshakeTimeout: 5 * time.Second})
	rng := rand.New(rand.NewPCG(1, 2))

	// A valid prefix: flags, structured replies, meta context, GO.
	valid := proto.AppendClientFlags(nil, proto.FlagCFixedNewstyle|proto.FlagCNoZeroes)
	valid = proto.AppendOption(valid, proto.OptStructuredReply, nil)
	valid = proto.AppendOption(valid, proto.OptSetMetaContext, proto.AppendMetaContextRequest(nil, "disk", []string{"base:allocation"}))
	valid = proto.AppendOption(valid, proto.OptGo, proto.AppendInfoRequest(nil, "disk", []proto.InfoType{proto.InfoBlockSize}))
	cmds := []proto.Cmd{proto.CmdRead, proto.CmdWrite, proto.CmdFlush, proto.CmdTrim, proto.CmdCache, proto.CmdWriteZeroes, proto.CmdBlockStatus, 9, proto.CmdDisc}

	for i := range 300 {
		var in []byte
		if i%3 == 0 {
			// Mutated handshake.
			in = append([]byte(nil), valid...)
			for range 1 + rng.IntN(4) {
				in[rng.IntN(len(in))] = byte(rng.Uint32())
			}
		} else {
			in = append([]byte(nil), valid...)
			for range 1 + rng.IntN(20) {
				r := proto.Request{
					Type:   cmds[rng.IntN(len(cmds))],
					Flags:  proto.CmdFlag(rng.IntN(64) * rng.IntN(2)),
					Cookie: rng.Uint64(),
					Offset: uint64(rng.IntN(testSize+8192)) &^ uint64(rng.IntN(2)*511),
					Length: uint32(rng.IntN(128<<10)) &^ uint32(rng.IntN(2)*511),
				}
				if rng.IntN(10) == 0 {
					r.Offset = ^uint64(0) - uint64(rng.IntN(4096))
				}
				in = proto.AppendRequest(in, r)
				if r.Type == proto.CmdWrite {
					in = append(in, make([]byte, r.Length)...)
				}
				if rng.IntN(15) == 0 {
					in[len(in)-1-rng.IntN(28)] ^= 0xff // corrupt something
				}
			}
		}
		if !feed(srv, in) {
			t.Fatalf("iteration %d: ServeConn did not return after client close", i)
		}
	}
	if p := srv.Stats().Panics; p != 0 {
		t.Fatalf("%d panics", p)
	}
	if dev.refs.Load() != 0 || ro.refs.Load() != 0 {
		t.Fatalf("leaked device refs: %d %d", dev.refs.Load(), ro.refs.Load())
	}
	if n := srv.Connections("disk"); n != 0 {
		t.Fatalf("Connections = %d", n)
	}
	// The test is only meaningful if many requests got past the handshake.
	var served uint64
	for _, n := range srv.Stats().Requests {
		served += n
	}
	if served < 500 {
		t.Fatalf("only %d requests reached transmission", served)
	}
	t.Logf("%d requests, %d error replies, %d protocol errors", served, srv.Stats().ErrorReplies, srv.Stats().ProtocolErrors)
}

// FuzzServerConn feeds arbitrary client bytes to a connection. The server
// must neither panic nor hang once the client has closed its side.
func FuzzServerConn(f *testing.F) {
	hs := proto.AppendClientFlags(nil, proto.FlagCFixedNewstyle|proto.FlagCNoZeroes)
	hs = proto.AppendOption(hs, proto.OptStructuredReply, nil)
	hs = proto.AppendOption(hs, proto.OptSetMetaContext, proto.AppendMetaContextRequest(nil, "disk", []string{"base:allocation"}))
	f.Add(hs)
	f.Add(proto.AppendOption(proto.AppendClientFlags(nil, 1), proto.OptList, nil))
	goo := proto.AppendOption(append([]byte(nil), hs...), proto.OptGo, proto.AppendInfoRequest(nil, "disk", nil))
	f.Add(proto.AppendRequest(append([]byte(nil), goo...), proto.Request{Type: proto.CmdRead, Length: 4096}))
	f.Add(proto.AppendRequest(append([]byte(nil), goo...), proto.Request{Type: proto.CmdBlockStatus, Length: 1 << 20, Flags: proto.CmdFlagReqOne}))
	w := proto.AppendRequest(append([]byte(nil), goo...), proto.Request{Type: proto.CmdWrite, Offset: 512, Length: 512})
	f.Add(append(w, make([]byte, 512)...))
	reg, _, _ := newTestReg()
	srv := New(Config{Registry: reg, MaxPayload: 64 << 10, HandshakeTimeout: 5 * time.Second})
	f.Fuzz(func(t *testing.T, in []byte) {
		if !feed(srv, in) {
			t.Fatal("ServeConn did not return after client close")
		}
		if p := srv.Stats().Panics; p != 0 {
			t.Fatalf("%d panics", p)
		}
	})
}
