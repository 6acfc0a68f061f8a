package bench

import "sync/atomic"

// countingTarget counts every byte a profile moves, including preparation
// fills and warm-ups that are not result rows, so a result can be checked
// against the server's own counters (bytes written = bytes received).
type countingTarget struct {
	Target
	read, written, reads, writes atomic.Int64
}

func (c *countingTarget) ReadAt(p []byte, off int64) (int, error) {
	n, err := c.Target.ReadAt(p, off)
	c.read.Add(int64(n))
	c.reads.Add(1)
	return n, err
}

func (c *countingTarget) WriteAt(p []byte, off int64) (int, error) {
	n, err := c.Target.WriteAt(p, off)
	c.written.Add(int64(n))
	c.writes.Add(1)
	return n, err
}

// DropCache forwards to the wrapped target when it has one.
func (c *countingTarget) DropCache() error {
	if d, ok := c.Target.(interface{ DropCache() error }); ok {
		return d.DropCache()
	}
	return nil
}

// Totals are the I/O a whole run did, measured or not.
type Totals struct {
	BytesRead    int64 `json:"bytes_read"`
	BytesWritten int64 `json:"bytes_written"`
	Reads        int64 `json:"read_requests"`
	Writes       int64 `json:"write_requests"`
}

func (c *countingTarget) totals() Totals {
	return Totals{BytesRead: c.read.Load(), BytesWritten: c.written.Load(), Reads: c.reads.Load(), Writes: c.writes.Load()}
}

// NewQueue forwards asynchronous I/O, counting completions.
func (c *countingTarget) NewQueue(depth int) (Queue, error) {
	at, ok := c.Target.(AsyncTarget)
	if !ok {
		return nil, ErrNoAsync
	}
	q, err := at.NewQueue(depth)
	if err != nil {
		return nil, err
	}
	return &countingQueue{Queue: q, c: c, write: make([]bool, depth)}, nil
}

type countingQueue struct {
	Queue
	c     *countingTarget
	write []bool
}

func (q *countingQueue) Submit(write bool, p []byte, off int64, tag int) error {
	if tag >= 0 && tag < len(q.write) {
		q.write[tag] = write
	}
	return q.Queue.Submit(write, p, off, tag)
}

func (q *countingQueue) Reap(min int, out []Completion) (int, error) {
	n, err := q.Queue.Reap(min, out)
	for _, c := range out[:n] {
		if c.Tag >= 0 && c.Tag < len(q.write) && q.write[c.Tag] {
			q.c.written.Add(int64(c.N))
			q.c.writes.Add(1)
		} else {
			q.c.read.Add(int64(c.N))
			q.c.reads.Add(1)
		}
	}
	return n, err
}
