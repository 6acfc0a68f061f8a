package bench

import (
	"errors"
	"fmt"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// AsyncTarget is a Target that can keep many requests in flight from one
// goroutine, the way fio's libaio engine does: the runner then drives each
// job from a single thread (submit QD requests, reap completions, resubmit)
// instead of QD goroutines blocking in pread. On a small machine that is
// the difference between measuring the disk and measuring thread switches.
type AsyncTarget interface {
	Target
	// NewQueue returns a queue for at most depth requests in flight, or
	// ErrNoAsync when the target cannot do asynchronous I/O.
	NewQueue(depth int) (Queue, error)
}

// Queue is one job's asynchronous submission queue. Not safe for
// concurrent use: one goroutine owns it.
type Queue interface {
	// Submit starts a request; tag is returned with its completion.
	// REQUIRES: fewer than depth requests are in flight; p stays untouched
	// until the completion is reaped.
	Submit(write bool, p []byte, off int64, tag int) error
	// Reap waits until at least min requests completed and stores up to
	// len(out) of them in out.
	Reap(min int, out []Completion) (int, error)
	Close() error
}

// Completion reports one finished request.
type Completion struct {
	Tag int
	N   int
	Err error
}

// ErrNoAsync is returned by NewQueue when asynchronous I/O is unavailable.
var ErrNoAsync = errors.New("bench: target has no asynchronous I/O")

// Linux native AIO (io_setup/io_submit/io_getevents), as fio's libaio
// engine uses. The kernel ABI structs are declared here because x/sys does
// not wrap them.
type iocb struct {
	data      uint64
	key       uint32
	rwFlags   uint32
	opcode    uint16
	reqprio   int16
	fildes    uint32
	buf       uint64
	nbytes    uint64
	offset    int64
	reserved2 uint64
	flags     uint32
	resfd     uint32
}

type ioEvent struct {
	data uint64
	obj  uint64
	res  int64
	res2 int64
}

const (
	iocbCmdPread  = 0
	iocbCmdPwrite = 1
)

type aioQueue struct {
	ctx    uintptr
	fd     int
	cbs    []iocb
	ptrs   []*iocb
	bufs   [][]byte // keeps submitted buffers referenced until reaped
	events []ioEvent
}

// NewQueue implements AsyncTarget for files and block devices.
func (t *fileTarget) NewQueue(depth int) (Queue, error) {
	if !t.info.Direct {
		// Linux AIO on buffered files runs inside io_submit, synchronously:
		// a queue would silently be QD1. Threads give real concurrency.
		return nil, ErrNoAsync
	}
	if depth < 1 {
		depth = 1
	}
	var ctx uintptr
	if _, _, e := unix.Syscall(unix.SYS_IO_SETUP, uintptr(depth), uintptr(unsafe.Pointer(&ctx)), 0); e != 0 {
		return nil, fmt.Errorf("%w: io_setup: %v", ErrNoAsync, e)
	}
	q := &aioQueue{ctx: ctx, fd: int(t.f.Fd()), cbs: make([]iocb, depth), ptrs: make([]*iocb, 1), bufs: make([][]byte, depth), events: make([]ioEvent, depth)}
	return q, nil
}

func (q *aioQueue) Submit(write bool, p []byte, off int64, tag int) error {
	if tag < 0 || tag >= len(q.cbs) {
		return fmt.Errorf("bench: aio tag %d out of range", tag)
	}
	cb := &q.cbs[tag]
	*cb = iocb{data: uint64(tag), opcode: iocbCmdPread, fildes: uint32(q.fd), nbytes: uint64(len(p)), offset: off}
	if write {
		cb.opcode = iocbCmdPwrite
	}
	if len(p) > 0 {
		cb.buf = uint64(uintptr(unsafe.Pointer(&p[0])))
	}
	q.bufs[tag] = p
	q.ptrs[0] = cb
	for {
		n, _, e := unix.Syscall(unix.SYS_IO_SUBMIT, q.ctx, 1, uintptr(unsafe.Pointer(&q.ptrs[0])))
		if e == syscall.EINTR || e == syscall.EAGAIN {
			continue
		}
		if e != 0 {
			q.bufs[tag] = nil
			return fmt.Errorf("io_submit: %w", e)
		}
		if n != 1 {
			return fmt.Errorf("io_submit accepted %d of 1", n)
		}
		return nil
	}
}

func (q *aioQueue) Reap(min int, out []Completion) (int, error) {
	max := len(out)
	if max > len(q.events) {
		max = len(q.events)
	}
	for {
		n, _, e := unix.Syscall6(unix.SYS_IO_GETEVENTS, q.ctx, uintptr(min), uintptr(max), uintptr(unsafe.Pointer(&q.events[0])), 0, 0)
		if e == syscall.EINTR {
			continue
		}
		if e != 0 {
			return 0, fmt.Errorf("io_getevents: %w", e)
		}
		for i := 0; i < int(n); i++ {
			ev := q.events[i]
			tag := int(ev.data)
			c := Completion{Tag: tag}
			switch {
			case ev.res < 0:
				c.Err = syscall.Errno(-ev.res)
			case tag >= 0 && tag < len(q.bufs) && int(ev.res) != len(q.bufs[tag]):
				c.N = int(ev.res)
				c.Err = fmt.Errorf("short transfer: %d of %d bytes", ev.res, len(q.bufs[tag]))
			default:
				c.N = int(ev.res)
			}
			if tag >= 0 && tag < len(q.bufs) {
				q.bufs[tag] = nil
			}
			out[i] = c
		}
		return int(n), nil
	}
}

// Close waits for nothing: the caller reaps every request first.
func (q *aioQueue) Close() error {
	if _, _, e := unix.Syscall(unix.SYS_IO_DESTROY, q.ctx, 0, 0); e != 0 {
		return e
	}
	return nil
}
