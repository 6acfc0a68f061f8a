package volrt

import (
	"sync"

	"github.com/vmsan/vmsan/internal/ioengine"
)

// mutates reports whether op changes the volume's contents: the requests
// Quiesce holds back.
func mutates(op ioengine.Op) bool {
	return op == ioengine.OpWrite || op == ioengine.OpTrim || op == ioengine.OpWriteZeroes
}

// Quiesce makes the volume's raw file a consistent point-in-time image for
// a snapshot, clone or rollback: it holds every new write (trim, write
// zeroes) at the device, waits for the writes already submitted, and
// flushes the engine and backend (the engine orders a FLUSH after every
// write submitted before it). Reads and flushes keep flowing. Call resume
// (once; later calls do nothing) to let writes in again.
//
// Writes are held in their submitter (a front end's request reader), so
// clients see latency, not errors; callers keep the window short (a
// reflink is instant; a full copy holds writes for its whole duration).
//
// REQUIRES: a request's Done callback never submits a write to the same
// volume synchronously (it would wait for resume while holding the gate
// shared, and Quiesce would wait for it): front ends reply, replication
// queues completions for its loop; neither submits from Done.
//
// INVARIANT: between Quiesce returning and resume, no write reaches the
// backend through a device of this volume: a mutating Submit holds gate
// shared across the engine Submit call, Quiesce holds it exclusively, and
// every write that got in before is complete once the flush is.
func (v *Volume) Quiesce() (resume func(), err error) {
	v.gate.Lock()
	var once sync.Once
	resume = func() { once.Do(v.gate.Unlock) }
	if err := v.eng.Do(&ioengine.Request{Op: ioengine.OpFlush}); err != nil {
		resume()
		return nil, err
	}
	return resume, nil
}
