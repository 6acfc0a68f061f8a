// Package ioengine is the request queue between the protocol front ends
// (NBD, iSCSI, the replication receiver) and a backend.Backend: it orders,
// merges and executes Requests on a bounded pool of workers.
//
// The simplest use:
//
//	e := ioengine.New(b, ioengine.Config{})   // defaults: 4 workers, 1 MiB runs
//	defer e.Close()
//	err := e.Do(&ioengine.Request{Op: ioengine.OpWrite, Offset: 0, Length: 4096, Data: buf})
//
// Front ends use Submit with a Done callback to keep many requests in
// flight; Do is the synchronous helper.
//
// # Concurrency and ordering guarantees
//
// Submit, Do, Stats and Close are safe for concurrent use. Done callbacks
// run on engine goroutines, never with the engine lock held, and must not
// block on the same engine (a blocked worker cannot complete anything);
// requests rejected up front (invalid, out of range, after Close) complete
// with Done called from the submitting goroutine, and so may requests
// marked Inline (below).
//
//   - Overlapping requests are never reordered: a request waits for every
//     earlier-submitted, unfinished request that overlaps it, unless both
//     are reads. Non-overlapping requests may complete in any order.
//   - A read never returns data older than a write that completed (Done
//     called) before the read was submitted.
//   - A FLUSH completes only after every write, trim and write-zeroes
//     submitted before it has returned from the backend and backend.Sync
//     has returned, so every write completed before the FLUSH was submitted
//     is durable (per cache mode). Requests submitted after a FLUSH do not
//     wait for it.
//   - A barrier (Barrier) holds once every modifying request submitted
//     before it has returned from the backend and backend.Sync has
//     returned; no modifying request submitted after it starts until it
//     is released. Later requests are queued, never blocked in Submit by
//     it (only MaxQueue blocks Submit), so no submitter or Done callback
//     can wait on a barrier. Reads and flushes pass it.
//   - A compound request (OpWriteRepeat, OpCompareWrite, OpOrWrite, a
//     trim or write-zeroes over Ranges) is one request over its whole
//     range: nothing overlapping runs between its steps, whoever
//     submitted it, so COMPARE AND WRITE is atomic against every front
//     end. A command made of several steps is one compound request, not
//     a chain submitted from Done callbacks.
//   - A FUA write (or write-zeroes) is durable when it completes: a merged
//     run containing a FUA write is written with fua for the whole run.
//   - At most Config.Workers backend calls run at once, and at most
//     Config.MaxQueue requests are outstanding: Submit blocks beyond that
//     (backpressure), so memory use is bounded whatever the clients do.
//
// # Merging and write gathering
//
// Ready reads (and ready writes) that are contiguous are issued as one
// vectored ReadvAt (WritevAt) of up to MaxMergeBytes, without copying the
// payloads. Merging only what happens to be queued when a worker frees up
// is not enough for a guest writing sequential 4 KiB blocks at queue depth
// 16-32 onto a fast, page-cached backend: the queue rarely builds, so
// every 4 KiB write would reach the backend alone.
//
// So the engine gathers writes, like an elevator's plug or an NFS server's
// write gathering: a write that lies within 64 KiB of one of the last 32
// writes submitted (a sequential stream, possibly slightly out of order) is
// held back, while the writers have recently had more than one write
// outstanding. A held run is released by what is queued first, and by
// time only as a backstop:
//
//   - its contiguous run reaches MaxMergeBytes;
//   - the writes queued in the engine (outstanding, not yet handed to a
//     worker) reach the writers' queue depth, measured as the most writes
//     outstanding at once in the last 250-500 ms: the clients' queue is
//     full, so nothing more will arrive until something completes, and
//     waiting longer would only add latency;
//   - another request (an overlapping read, a FLUSH) waits for it;
//   - the engine is closing;
//   - the backstop: no write of the stream has arrived for the current
//     hold (not only none that joined this run: a client may send a
//     window out of offset order, QEMU's NBD client does, and the window
//     is then several runs until its gaps fill), or
//     its oldest write has been held MaxGatherDelay (default 10 ×
//     GatherDelay, 3 ms), whichever comes first. While the latest write
//     was submitted with Request.More (its submitter already holds the
//     next request: the NBD server sets it when another request is in its
//     read buffer), only the MaxGatherDelay cap applies.
//
// The hold is twice the largest recent gap between consecutive writes of
// the stream during which the writers had free slots (fewer writes
// outstanding than their queue depth), within [GatherDelay,
// MaxGatherDelay]; it decays by 1/8 per run issued. Why: a queue-full
// release keeps a closed-loop writer's whole window in one backend write,
// but only if the window arrives before the backstop fires. On a quiet
// machine a window arrives within microseconds; on a busy one the client
// (or the server's reader) is descheduled mid-window for a scheduler time
// slice, and a fixed 300 µs backstop cut the window into pieces that then
// complete, and come back, at different times, so the stream stayed
// fragmented (measured: 40-50 KiB mean instead of 128 KiB). Gaps are
// measured only while the writers had free slots, because a gap after a
// full queue is the engine's own service time plus the client's round
// trip, and counting it would make each hold lengthen the next. Time is
// read from Config.Clock, so all of this is tested on a manual clock
// (ioengine/enginetest) with exact figures.
//
// A lone queue-depth-1 stream is never held (its measured queue depth is
// 1), whatever its hints, and random writes far from recent ones are never
// held. The trade-off: a sequential writer at queue depth > 1 may see up
// to the hold (at most MaxGatherDelay) of extra latency per run when its
// queue depth drops (the estimate lags by up to 500 ms), and two
// independent queue-depth-1 writers may wait for each other, in exchange
// for backend writes of queue-depth × request-size bytes instead of one
// syscall (and, under cache=none or writethrough, one device write) per
// 4 KiB. Reads are merged but never held: a reader waits for its data, and
// read-ahead below already batches sequential reads. Set GatherDelay
// negative to disable gathering. Stats.GatherTimeouts counts runs the
// backstop released and Stats.GatherHold shows the current hold.
//
// The backstop must fire when it is due: RealClock's timer is a Linux
// timerfd read through the network poller (an fd event ends epoll_wait at
// once; no thread is held while it waits), not a time.Timer. An otherwise idle
// Go process waits for its next timer in epoll_wait, whose timeout is whole
// milliseconds, so a 300 µs time.Timer fired after about 1.1 ms, and a
// closed-loop client whose window did not fill the queue waited that long
// per held run (QEMU's sequential 4 KiB writes at QD32 ran at a third of
// qemu-nbd's rate; docs/benchmarks.md, "Sequential 4 KiB writes from
// QEMU").
//
// # Inline execution
//
// Handing a request to a worker costs two goroutine switches (wake the
// worker, wake whoever waits for Done); on a page-cached backend that is
// more than the backend call itself. A submitter that can afford to block
// for one backend call marks its requests Inline (the NBD server's
// connection reader does), and the engine then runs such a request
// directly in Submit, calling Done before Submit returns, when all of
// these hold:
//
//   - it is a plain read or write (no FUA, not a FLUSH/TRIM/zero), with no
//     unfinished earlier request it conflicts with;
//   - nothing on the ready list is due to run (writes held for gathering
//     may be there: they wait on purpose), so it overtakes no one and
//     misses no merge;
//   - fewer than Workers backend calls are running (inline calls count);
//   - a write is not part of a sequential stream (near a recent write) that
//     gathering could merge; such writes take the normal path, so sequential
//     merging is unchanged;
//   - the backend's recent service time for its kind (a moving average of
//     single-request calls, weight 1/8) is below Config.InlineMaxLatency
//     (default 30µs): page-cache hits qualify, device reads and throttled
//     writes do not, so a slow backend still gets the submitter's whole
//     pipeline through the workers. A request also marked Idle (the
//     submitter has nothing else queued: queue depth 1, so blocking it
//     loses no pipelining) uses Config.InlineIdleLatency (default 300µs)
//     instead.
//
// The inline request stays on the outstanding list while it runs, so every
// ordering rule above applies to it unchanged.
//
// Measured (docs/benchmarks.md, "Write gathering under load"): fio
// --ioengine=nbd --rw=write --bs=4k --iodepth=32 through vmsan serve
// reaches the page-cached file as >= 64 KiB pwritev calls on average also
// with two busy loops competing for the CPUs; gather_test.go asserts one
// 128 KiB write per QD32 window, also for a submitter descheduled twice
// per window, on a manual clock.
package ioengine
