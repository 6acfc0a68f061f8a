package export

import "github.com/vmsan/vmsan/internal/ioengine"

// Op is a Request's kind. The kinds are the engine's (named here so a
// front end needs only this package); see ioengine for their semantics,
// the compound ones included.
type Op = ioengine.Op

// Request kinds.
const (
	OpRead         = ioengine.OpRead
	OpWrite        = ioengine.OpWrite
	OpFlush        = ioengine.OpFlush
	OpTrim         = ioengine.OpTrim
	OpWriteZeroes  = ioengine.OpWriteZeroes
	OpCache        = ioengine.OpCache
	OpWriteRepeat  = ioengine.OpWriteRepeat
	OpCompareWrite = ioengine.OpCompareWrite
	OpOrWrite      = ioengine.OpOrWrite
)

// Range is one byte range of a request covering several (Request.Ranges).
type Range = ioengine.Range

// ErrMiscompare fails an OpCompareWrite whose compare instance differs
// from the data read (left in Request.Aux).
var ErrMiscompare = ioengine.ErrMiscompare

// Request is what a front end submits to a Device: the runtime's request
// type. Front ends fill it and get it back through Done; how the runtime
// executes it (an engine, a replication stream) is not theirs to see.
// The fields mean what ioengine.Request's of the same names do.
//
// The submitter owns the Request until Done is called, and the device
// owns it from Submit until Done returns. Done is called exactly once,
// possibly before Submit returns (Inline, or a request refused up front).
// A Request may be reused for the next request once Done has returned.
type Request struct {
	Op     Op
	Offset int64
	Length int64
	Data   []byte
	Aux    []byte  // OpCompareWrite/OpOrWrite read buffer
	Ranges []Range // OpTrim/OpWriteZeroes over several ranges

	FUA, NoHole, FastZero bool

	// Scheduling hints (see ioengine.Request): Inline lets the request run
	// on the submitting goroutine; Idle says the submitter has nothing
	// else queued; More that it holds the next request already.
	Inline, Idle, More bool

	// Err is set before Done is called.
	Err  error
	Done func(*Request)

	// Cookie and Ctx are the submitter's; the runtime never touches them.
	Cookie uint64
	Ctx    any

	// eng is the engine request r travels as (Engine): storage inside
	// the Request, so submitting allocates nothing.
	eng ioengine.Request
}

// Engine returns the engine request r travels as, filled from r; its
// completion sets r.Err and calls r.Done. For devices that execute on an
// engine (the runtime's volume device, test devices): submit the result
// to the engine instead of r. Valid until r's Done returns; every call
// refills it.
func (r *Request) Engine() *ioengine.Request {
	q := &r.eng
	*q = ioengine.Request{Op: r.Op, Offset: r.Offset, Length: r.Length, Data: r.Data, Aux: r.Aux, Ranges: r.Ranges,
		FUA: r.FUA, NoHole: r.NoHole, FastZero: r.FastZero, Inline: r.Inline, Idle: r.Idle, More: r.More,
		Done: engineDone, Ctx: r}
	return q
}

func engineDone(q *ioengine.Request) {
	r := q.Ctx.(*Request)
	r.Err = q.Err
	if r.Done != nil {
		r.Done(r)
	}
}

// Finish completes r with err (a device refusing a request).
func Finish(r *Request, err error) {
	r.Err = err
	if r.Done != nil {
		r.Done(r)
	}
}

// RunSteps executes a compound request as primitive requests handed to
// submit one after another (ioengine.RunSteps, for a device that cannot
// pass a compound request on as one), then completes r.
func RunSteps(r *Request, submit func(*Request)) {
	ioengine.RunSteps(r.Engine(), func(q *ioengine.Request) {
		// Each step travels as a Request of its own through submit.
		s := &Request{Op: q.Op, Offset: q.Offset, Length: q.Length, Data: q.Data, FUA: q.FUA, NoHole: q.NoHole, FastZero: q.FastZero}
		s.Done = func(s *Request) { q.Err = s.Err; q.Done(q) }
		submit(s)
	})
}

// IsCompound reports whether r is a compound request (one request made of
// several backend steps), or a trim/write-zeroes over a list of ranges:
// what a device that forwards requests somewhere other than an Engine must
// either carry as one or run step by step.
func IsCompound(r *Request) bool {
	switch r.Op {
	case OpWriteRepeat, OpCompareWrite, OpOrWrite:
		return true
	case OpTrim, OpWriteZeroes:
		return r.Ranges != nil
	}
	return false
}
