package bench

import (
	"context"
	"fmt"
	"net/url"

	"github.com/vmsan/vmsan/internal/nbd/client"
	"github.com/vmsan/vmsan/internal/nbd/proto"
)

func init() {
	for _, s := range []string{"nbd", "nbds", "nbd+unix", "nbds+unix"} {
		RegisterScheme(s, openNBD)
	}
}

// nbdTarget benchmarks an NBD export through the pipelined client: the
// runner's QD goroutines each block in ReadAt/WriteAt, so QD requests are
// in flight, spread over the connections when the server allows
// multi-conn.
type nbdTarget struct {
	c    *client.Conn
	info TargetInfo
}

func openNBD(ctx context.Context, u *url.URL, raw string, o TargetOptions) (Target, error) {
	opts := &client.Options{Connections: o.Connections}
	if o.TLSCA != "" || o.TLSCert != "" || o.TLSInsecure {
		a, err := client.ParseURI(raw)
		if err != nil {
			return nil, err
		}
		cfg, err := client.TLSConfigFromDir("", a.Host, o.TLSInsecure)
		if err != nil {
			return nil, err
		}
		if err := addTLSFiles(cfg, o); err != nil {
			return nil, err
		}
		opts.TLSConfig = cfg
	}
	c, err := client.Dial(ctx, raw, opts)
	if err != nil {
		return nil, err
	}
	ex := c.Export()
	t := &nbdTarget{c: c}
	t.info = TargetInfo{
		URI: raw, Kind: "nbd", Size: ex.Size, ReadOnly: o.ReadOnly || ex.Has(proto.FlagReadOnly),
		NBD: &NBDInfo{
			Export: ex.Name, Flags: ex.FlagNames(), Connections: c.Connections(), TLS: ex.TLS,
			StructuredReplies: ex.StructuredReplies, MinBlock: ex.MinBlock, PrefBlock: ex.PrefBlock, MaxBlock: ex.MaxBlock,
		},
	}
	return t, nil
}

func (t *nbdTarget) ReadAt(p []byte, off int64) (int, error)  { return t.c.ReadAt(p, off) }
func (t *nbdTarget) WriteAt(p []byte, off int64) (int, error) { return t.c.WriteAt(p, off) }
func (t *nbdTarget) Flush() error                             { return t.c.Flush() }
func (t *nbdTarget) Size() int64                              { return t.c.Size() }
func (t *nbdTarget) Align() int                               { return int(t.c.Export().MinBlock) }
func (t *nbdTarget) MaxIO() int                               { return int(t.c.Export().MaxBlock) }
func (t *nbdTarget) Info() TargetInfo                         { return t.info }
func (t *nbdTarget) Close() error                             { return t.c.Close() }

// NewQueue lets the runner drive an NBD target like fio's nbd engine: one
// goroutine per job submits QD requests through the client's asynchronous
// Submit and reaps their completions, instead of QD goroutines each
// blocking in ReadAt.
func (t *nbdTarget) NewQueue(depth int) (Queue, error) {
	q := &nbdQueue{c: t.c, reqs: make([]client.Request, depth), done: make(chan int, depth)}
	for i := range q.reqs {
		tag := i
		q.reqs[i].Done = func(*client.Request) { q.done <- tag }
	}
	return q, nil
}

type nbdQueue struct {
	c    *client.Conn
	reqs []client.Request
	done chan int // completed tags; capacity depth, so Done never blocks
}

func (q *nbdQueue) Submit(write bool, p []byte, off int64, tag int) error {
	if tag < 0 || tag >= len(q.reqs) {
		return fmt.Errorf("bench: nbd queue tag %d out of range", tag)
	}
	r := &q.reqs[tag]
	r.Cmd, r.Flags, r.Offset, r.Length, r.Data, r.Err = proto.CmdRead, 0, off, uint32(len(p)), p, nil
	if write {
		r.Cmd = proto.CmdWrite
	}
	q.c.Submit(r)
	return nil
}

func (q *nbdQueue) Reap(min int, out []Completion) (int, error) {
	n := 0
	for n < len(out) {
		var tag int
		if n < min {
			tag = <-q.done
		} else {
			select {
			case tag = <-q.done:
			default:
				return n, nil
			}
		}
		r := &q.reqs[tag]
		out[n] = Completion{Tag: tag, Err: r.Err}
		if r.Err == nil {
			out[n].N = len(r.Data)
		}
		r.Data = nil
		n++
	}
	return n, nil
}

func (q *nbdQueue) Close() error { return nil }
