// Package volrt is the volume runtime: everything between a protocol front
// end (NBD, iSCSI) and the volume store. It holds the open
// volumes (backend + I/O engine + reference and connection counts + the
// device wrapping chain where replication hooks in) and the helpers every
// front end needs on its data path, so that a new front end is only its
// codec and session logic.
//
// Simplest use (what daemon does for each volume, and a front end for each
// request):
//
//	v, err := volrt.Open(store, meta, ioengine.Config{}, 32<<20)
//	dev, err := v.Acquire(nil)            // export.Device, one reference
//	defer dev.Release()
//
//	var lc volrt.Lifecycle                // one per request in flight
//	r := &export.Request{Op: export.OpRead, Offset: 0, Length: 4096,
//		Data: *volrt.GetBuf(4096), Done: onDone, Inline: true}
//	if lc.Submit(dev, r, false) { /* completed already: reply here */ }
//	// onDone calls lc.Complete(); false means "reply from your writer".
//
// What lives here:
//
//   - Volume (volume.go): an open volume (Open from the store, or New over
//     any backend) and its reference/delete handshake with the daemon's
//     registry; Acquire hands out devices, through the wrapping chain
//     (Wrap) that replication uses. Quiesce (quiesce.go) is an engine
//     barrier: it returns once every earlier write is complete and
//     flushed, and queues later writes in the engine (no lock is held by
//     submitters) until resume, for snapshots, clones and rollbacks of a
//     live volume. The device adds no ordering of its own: every
//     ordering (overlap, flush, barrier, the atomic compound requests a
//     SCSI front end uses for WRITE SAME, UNMAP, COMPARE AND WRITE and
//     ORWRITE) is the engine's, the same for every front end.
//   - Sessions, FrontEndStats (sessions.go): per front end, per volume, per
//     client address (since when) connection tracking, with a watcher
//     (Watch) for connect/disconnect log lines and events, and the
//     statistics every front end reports to daemon status and metrics.
//   - Lifecycle (lifecycle.go): the submit/complete handshake with the
//     engine that decides who replies to a request (the submitter when it
//     completed inline, else the completion path).
//   - Errno (errno.go): engine/backend error -> POSIX errno class; NBD maps
//     it onto its error values, the SCSI logical unit onto sense data.
//   - SplitHoles (holes.go): data/hole pieces of a completed read, for
//     NBD's structured replies (SCSI GET LBA STATUS reads the device's
//     Extents directly).
//   - GetBuf/PutBuf (bufpool.go): the aligned payload pool (alignbuf, shared
//     with the backend's O_DIRECT bounce buffers).
//   - Budget (budget.go): in-flight payload byte budgets, per connection,
//     each reserving from the daemon-wide parent every front end shares.
//   - RateLog (ratelog.go): at most one log line per interval for events a
//     client can trigger at will.
//   - NoSpace (nospace.go): a volume's ENOSPC record (count, last time)
//     fed by its engine, for the daemon's WARN line, status and event;
//     FreeSpace reads the free space of the filesystem under a volume.
//
// Layering: volrt imports the engine, backend, volume store and the export
// seam (export.Device, which replication's driver wraps); it imports no
// front end and not daemon (internal/layering_test.go enforces this).
//
// Concurrency: Volume, Sessions and Budget are safe for concurrent use;
// a Lifecycle is used by one request at a time (its submitter and its
// completion, which the handshake orders); the helpers are pure functions.
package volrt
