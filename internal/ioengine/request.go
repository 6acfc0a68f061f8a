package ioengine

// Op is the kind of a Request.
type Op uint8

const (
	OpRead Op = iota + 1
	OpWrite
	OpFlush
	OpTrim
	OpWriteZeroes
	OpCache // read-ahead hint: populate caches, no data returned

	// Compound operations: one request, ordered as one over its whole
	// range (so nothing overlapping runs between their steps: the
	// engine's ordering is the range lock), executed by one worker.

	// OpWriteRepeat writes Data repeated over the range: byte i of the
	// range is Data[i % len(Data)] (a pattern WRITE SAME; a submitter
	// passes a buffer pre-filled with whole copies of the pattern).
	OpWriteRepeat
	// OpCompareWrite is COMPARE AND WRITE: Data is the compare instance
	// followed by the write instance (2 × Length bytes); the range is read
	// into Aux and, if it equals the compare instance, the write instance
	// is written. Otherwise the request fails with ErrMiscompare and Aux
	// holds what was read.
	OpCompareWrite
	// OpOrWrite reads the range into Aux, ORs Data (Length bytes) into it
	// and writes the result (ORWRITE).
	OpOrWrite

	// OpBarrier is the queue barrier of Engine.Barrier; it cannot be
	// submitted.
	OpBarrier
)

// Range is one byte range of a request covering several (Request.Ranges).
type Range struct{ Offset, Length int64 }

func (o Op) String() string {
	switch o {
	case OpRead:
		return "read"
	case OpWrite:
		return "write"
	case OpFlush:
		return "flush"
	case OpTrim:
		return "trim"
	case OpWriteZeroes:
		return "write-zeroes"
	case OpCache:
		return "cache"
	case OpWriteRepeat:
		return "write-repeat"
	case OpCompareWrite:
		return "compare-write"
	case OpOrWrite:
		return "or-write"
	case OpBarrier:
		return "barrier"
	}
	return "unknown"
}

// Request is the engine's request type. Front ends do not use it: they
// submit export.Request to a device, and the runtime's device submits the
// engine request stored inside it (export.Request.Engine); the runtime
// and tests submit Requests directly.
//
// The submitter owns the Request until Done is called, and the engine owns
// it from Submit until Done returns. Done is called exactly once, from an
// engine goroutine (or, for an Inline request, possibly from the submitting
// goroutine before Submit returns); it must not block for long.
type Request struct {
	Op     Op
	Offset int64
	Length int64  // bytes; for OpWrite it equals len(Data)
	Data   []byte // OpWrite payload, or OpRead destination (len == Length); see the compound ops
	// Aux is the read buffer of OpCompareWrite and OpOrWrite (at least
	// Length bytes), owned by the submitter like Data.
	Aux []byte
	// Ranges, for OpTrim and OpWriteZeroes, makes the request cover these
	// ranges only (an UNMAP's descriptor list): each must lie inside
	// [Offset, Offset+Length), which the engine orders as one range. The
	// submitter owns the slice like Data.
	Ranges []Range

	FUA      bool // OpWrite/OpWriteZeroes/OpTrim: durable before Done
	NoHole   bool // OpWriteZeroes: the range must stay allocated
	FastZero bool // OpWriteZeroes: fail with backend.ErrNotFast rather than write slowly

	// Inline lets the engine execute the request on the submitting
	// goroutine and call Done before Submit returns, when that costs no
	// ordering, merging or concurrency (see the package doc). Only for
	// submitters whose Done may run inside Submit and who can afford
	// Submit blocking for one backend call (e.g. an NBD connection reader).
	Inline bool
	// Idle (with Inline) says the submitter has nothing else queued (e.g.
	// no further request is buffered on the connection): it loses no
	// pipelining by blocking, so the engine may inline calls up to
	// Config.InlineIdleLatency instead of InlineMaxLatency.
	Idle bool
	// More says the submitter already holds at least one further request
	// that it will submit right after this one (an NBD connection with
	// another complete request in its read buffer, a replication receiver
	// with more applies queued): a hint for write gathering, which then
	// keeps holding a sequential run past its timed backstop, up to
	// Config.MaxGatherDelay, because the run's next writes are in the
	// submitter's hands already. It never makes a request wait by itself.
	More bool

	// Err is set by the engine before Done is called.
	Err error
	// Done is called once when the request completes (Err says how).
	Done func(*Request)

	// Cookie and Ctx are for the submitter (e.g. the NBD handle and the
	// connection); the engine never touches them.
	Cookie uint64
	Ctx    any
}
