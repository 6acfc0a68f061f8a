// Package initiator is a small iSCSI initiator (RFC 7143) built on the
// codec packages pdu, text and chap: login with CHAP (one-way and mutual)
// and operational negotiation, SendTargets discovery, and a normal session
// that pipelines SCSI commands within the target's CmdSN window, with
// immediate and unsolicited data, R2T handling, Data-In reassembly straight
// into the caller's buffer, NOP-In/NOP-Out, and logout. It exists so that
// `vmsan bench iscsi://...` and tests can talk to any iSCSI target (vmsan's
// own and tgt) without an external library.
//
// Simplest use:
//
//	s, err := initiator.Dial(ctx, "127.0.0.1:3260", initiator.Config{TargetName: iqn})
//	lu, err := s.LU(ctx, 1)                // READ CAPACITY(16)
//	_, err = lu.WriteAt(buf, 0)            // WRITE(16)
//	err = lu.Flush()                       // SYNCHRONIZE CACHE(16)
//	err = s.Logout(ctx)                    // also closes the connection
//
//	targets, err := initiator.Discover(ctx, "127.0.0.1:3260", initiator.Config{})
//
// Concurrency: a Session and its LUs are safe for concurrent use by many
// goroutines; every command is sent as soon as the CmdSN window allows, so
// N goroutines keep up to N commands in flight on the one connection. One
// reader goroutine dispatches the target's PDUs by Initiator Task Tag; one
// writer goroutine sends queued PDUs, coalescing them into one writev.
// A command, once sent, runs until its status arrives or the session
// fails: ctx bounds only the wait for a window slot (the target may still
// be moving data into or out of the caller's buffer, so an early return
// would be a data race). Config.NOPInterval detects a dead target and
// fails every outstanding command; Close does the same at once. When a
// command returns, the session no longer touches its buffers, also when
// the session failed under it.
//
// LU methods retry BUSY and TASK SET FULL (bounded backoff) and UNIT
// ATTENTION (a few times), as the Linux sd driver does; Session.Command
// returns every status as it came.
//
// Limits: one connection per session (MaxConnections=1), ErrorRecoveryLevel
// 0 (any protocol error fails the session), no bidirectional commands, no
// task management beyond what Close implies.
package initiator
