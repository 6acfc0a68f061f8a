package ioengine

import "bytes"

// RunSteps executes a compound request r as a sequence of primitive
// requests (OpRead, OpWrite, OpTrim, OpWriteZeroes) handed to submit one
// at a time, each after the previous one completed, on a goroutine of its
// own (so submit may block and no step is submitted from a Done
// callback), then completes r. It is for a device that cannot pass r on
// as one request (replication mirrors primitive writes only).
//
// The steps are ordered only as separate requests: another request may
// run between two of them. In particular OpCompareWrite and OpOrWrite run
// this way are not atomic against other writers (an Engine executes them
// atomically).
func RunSteps(r *Request, submit func(*Request)) {
	go func() { finish(r, runSteps(r, submit)) }()
}

func runSteps(r *Request, submit func(*Request)) error {
	ch := make(chan struct{}, 1)
	step := func(q *Request) error {
		q.Done = func(*Request) { ch <- struct{}{} }
		submit(q)
		<-ch
		return q.Err
	}
	switch r.Op {
	case OpTrim, OpWriteZeroes:
		for _, x := range r.Ranges {
			q := &Request{Op: r.Op, Offset: x.Offset, Length: x.Length, FUA: r.FUA, NoHole: r.NoHole, FastZero: r.FastZero}
			if err := step(q); err != nil {
				return err
			}
		}
		return nil
	case OpWriteRepeat:
		p := r.Data
		for off, end := r.Offset, r.Offset+r.Length; off < end; {
			n := min(int64(len(p)), end-off)
			if err := step(&Request{Op: OpWrite, Offset: off, Length: n, Data: p[:n], FUA: r.FUA}); err != nil {
				return err
			}
			off += n
		}
		return nil
	case OpCompareWrite, OpOrWrite:
		n := r.Length
		cur := r.Aux[:n]
		if err := step(&Request{Op: OpRead, Offset: r.Offset, Length: n, Data: cur}); err != nil {
			return err
		}
		data := cur
		if r.Op == OpCompareWrite {
			if !bytes.Equal(cur, r.Data[:n]) {
				return ErrMiscompare
			}
			data = r.Data[n : 2*n]
		} else {
			for i, b := range r.Data[:n] {
				cur[i] |= b
			}
		}
		return step(&Request{Op: OpWrite, Offset: r.Offset, Length: n, Data: data, FUA: r.FUA})
	}
	return ErrInvalid
}
