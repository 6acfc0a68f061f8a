package target

import (
	"io"
	"net"
)

// sendBuf gathers outgoing PDUs for one gathered write (writev on a TCP
// connection): headers and short data segments are copied into an arena,
// long data segments (the Data-In of reads) are referenced where they
// are, so read data reaches the socket without a copy in user space.
// A bufio.Writer would copy every Data-In byte into its buffer first.
//
// INVARIANT: a referenced segment must stay unchanged until the next
// Flush; Refs says whether any is pending (the writer then holds back
// releasing the buffers it wrote from).
type sendBuf struct {
	w     io.Writer
	arena []byte
	mark  int // arena[mark:] is not yet in iov
	iov   net.Buffers
	wv    net.Buffers // WriteTo's receiver (a field: a local would escape)
	n     int         // bytes pending
	refs  int         // referenced segments pending
}

// refMin is the shortest data segment referenced rather than copied:
// below it a copy is cheaper than one more iovec.
const refMin = 16 << 10

// flushAt bounds what the writer gathers before writing it out.
const flushAt = 1 << 20

func newSendBuf(w io.Writer) *sendBuf {
	return &sendBuf{w: w, arena: make([]byte, 0, 64<<10)}
}

// Write copies p into the arena.
func (b *sendBuf) Write(p []byte) (int, error) {
	b.arena = append(b.arena, p...)
	b.n += len(p)
	return len(p), nil
}

// Ref queues p without copying it. REQUIRES: p stays unchanged until the
// next Flush.
func (b *sendBuf) Ref(p []byte) {
	b.cut()
	b.iov = append(b.iov, p)
	b.n += len(p)
	b.refs++
}

// cut moves the arena's tail into iov. An arena that grows later may
// move, which leaves the bytes already queued where they were.
func (b *sendBuf) cut() {
	if len(b.arena) > b.mark {
		b.iov = append(b.iov, b.arena[b.mark:len(b.arena):len(b.arena)])
		b.mark = len(b.arena)
	}
}

// Buffered returns the number of bytes pending.
func (b *sendBuf) Buffered() int { return b.n }

// Refs returns the number of referenced segments pending.
func (b *sendBuf) Refs() int { return b.refs }

// Flush writes everything pending in one gathered write.
func (b *sendBuf) Flush() error {
	if b.n == 0 {
		return nil
	}
	b.cut()
	b.wv = b.iov // WriteTo consumes its receiver; b.iov keeps the backing array
	_, err := b.wv.WriteTo(b.w)
	b.wv = nil
	clear(b.iov) // drop references to released buffers
	b.iov = b.iov[:0]
	b.arena = b.arena[:0]
	b.mark, b.n, b.refs = 0, 0, 0
	return err
}

var _ io.Writer = (*sendBuf)(nil)
