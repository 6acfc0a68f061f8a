package volrt

// Quiesce makes the volume's raw file a consistent point-in-time image for
// a snapshot, clone or rollback: it queues an engine barrier
// (ioengine.Engine.Barrier) and returns once every write (trim, write
// zeroes, compound write) submitted before it has completed and the
// backend was synced. Writes submitted after it wait in the engine's queue
// behind the barrier until resume is called (once; later calls do
// nothing); reads and flushes keep flowing.
//
// Held writes are queued, not blocked in their submitter: a front end's
// reader keeps reading (up to the engine's queue bound and its own
// budgets), and a completion callback that submits can never wait for
// resume, so nothing a front end does can deadlock a quiesce. Clients see
// latency, not errors; callers keep the window short (a reflink is
// instant; a full copy holds writes for its whole duration).
//
// INVARIANT: between Quiesce returning and resume, no write submitted
// through a device of this volume reaches the backend: the barrier is
// ordered before every later modifying request and after every earlier
// one, whoever submitted it (NBD, iSCSI, replication).
func (v *Volume) Quiesce() (resume func(), err error) {
	return v.eng.Barrier()
}
