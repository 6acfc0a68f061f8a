package client

import (
	"net"
	"sync"
	"testing"
	"time"

	"github.com/vmsan/vmsan/internal/nbd/proto"
)

// FuzzReplies feeds arbitrary bytes as the server's transmission-phase
// replies to a connection with a READ, a WRITE and a BLOCK_STATUS in
// flight (cookies 1, 2, 3). Whatever arrives, the client must not panic,
// must not write outside the request buffers, and must complete every
// request exactly once.
func FuzzReplies(f *testing.F) {
	// Seeds: well-formed answers to each request.
	var ok []byte
	ok = proto.AppendOffsetDataHeader(ok, 0, 1, 0, 16)
	ok = append(ok, make([]byte, 16)...)
	ok = proto.AppendOffsetHole(ok, proto.ReplyFlagDone, 1, 16, 48)
	ok = proto.AppendNoneChunk(ok, 2)
	ok = proto.AppendBlockStatus(ok, proto.ReplyFlagDone, 3, 1, []proto.BlockDescriptor{{Length: 4096, Flags: proto.StateHole | proto.StateZero}})
	f.Add(ok)
	f.Add(proto.AppendSimpleReply(nil, proto.SimpleReply{Error: proto.EIO, Cookie: 2}))
	f.Add(proto.AppendErrorChunk(nil, proto.ReplyFlagDone, 1, proto.EINVAL, "bad"))
	f.Add([]byte("garbage"))
	f.Fuzz(func(t *testing.T, data []byte) {
		cli, srv := net.Pipe()
		ex := &Export{Size: 1 << 20, MaxBlock: 1 << 20, StructuredReplies: true, HasAlloc: true, AllocContext: 1}
		c := newConn(cli, ex, 8)
		go func() {
			// Swallow the requests, then answer with the fuzz input.
			go func() {
				buf := make([]byte, 4096)
				for {
					if _, err := srv.Read(buf); err != nil {
						return
					}
				}
			}()
			srv.Write(data)
			time.Sleep(5 * time.Millisecond)
			srv.Close()
		}()
		var wg sync.WaitGroup
		var mu sync.Mutex
		count := map[*Request]int{}
		done := func(r *Request) {
			mu.Lock()
			count[r]++
			mu.Unlock()
			wg.Done()
		}
		rbuf := make([]byte, 64)
		reqs := []*Request{
			{Cmd: proto.CmdRead, Offset: 0, Length: 64, Data: rbuf, Done: done},
			{Cmd: proto.CmdWrite, Offset: 0, Length: 8, Data: make([]byte, 8), Done: done},
			{Cmd: proto.CmdBlockStatus, Offset: 0, Length: 4096, Done: done},
		}
		wg.Add(len(reqs))
		for _, r := range reqs {
			c.submit(r)
		}
		finished := make(chan struct{})
		go func() { wg.Wait(); close(finished) }()
		select {
		case <-finished:
		case <-time.After(5 * time.Second):
			t.Fatal("requests not completed after the server closed")
		}
		c.close()
		for _, r := range reqs {
			if count[r] != 1 {
				t.Fatalf("%v completed %d times", r.Cmd, count[r])
			}
		}
	})
}
