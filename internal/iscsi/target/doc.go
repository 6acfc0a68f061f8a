// Package target is vmsan's iSCSI target session layer (RFC 7143): it
// accepts TCP connections on one or more portals, runs the login phase
// (security stage with CHAP one-way and mutual through package chap,
// operational stage with package text's negotiation rules), serves
// SendTargets discovery, and in full feature phase turns SCSI Command,
// Data-Out, Task Management, NOP-Out, Text and Logout PDUs into calls on a
// LogicalUnits (package scsi's Target in production) and their results into
// Data-In, R2T, SCSI Response, NOP-In and Reject PDUs. It knows nothing of
// SCSI command semantics.
//
// Simplest use:
//
//	srv := target.New(target.Config{Name: "iqn.2026-11.org.vmsan:node",
//		Targets: func() []target.Target { return []target.Target{{Name: iqn, LUs: lus, Initiators: acl}} }})
//	go srv.Serve(ln, 1) // portal group tag 1
//	go srv.ServePort(ln2, 2, 2) // group 2, relative target port 2 (explicit ids)
//	...
//	srv.Shutdown(ctx)
//
// What it implements: ErrorRecoveryLevel 0 and MaxConnections 1 (a
// protocol error ends the session; the initiator logs in again),
// HeaderDigest/DataDigest None and CRC32C, immediate and unsolicited data
// (ImmediateData, InitialR2T, FirstBurstLength), R2T with
// MaxOutstandingR2T and MaxBurstLength, Data-In cut to the initiator's
// MaxRecvDataSegmentLength with the status on the last Data-In when there
// is no sense, a CmdSN window of Config.QueueDepth commands (MaxCmdSN
// advances as commands complete, in any order), target NOP-In pings that
// end a connection whose initiator stopped answering, session
// reinstatement (a login with the ISID and InitiatorName of a live
// session closes that session and aborts its tasks first), and TSIH
// allocation.
//
// Memory per session is bounded: a data segment longer than the declared
// MaxRecvDataSegmentLength is refused before it is read (Reject, then the
// connection closes, since the stream cannot be resynchronised), the
// write data and read data of in-flight commands count against
// Config.SessionBudget (a command that does not fit is answered BUSY
// unless nothing else is in flight), the CmdSN window bounds the number
// of commands, and the reply queue bounds what the reader may queue ahead
// of a slow writer. Over all sessions, Config.Budget (the daemon's,
// shared with other front ends) bounds the same bytes (a command that
// does not fit is answered TASK SET FULL, or BUSY when its session has
// nothing in flight; the reader never waits for memory) and
// Config.MaxSessions the sessions (login status 0302 past it). Commands
// still waiting for write data hold at most Config.AwaitingDataShare of
// Config.Budget together, and one that waits Config.DataOutTimeout for
// its next Data-Out closes its connection (ERL 0), so initiators that
// withhold data cannot pin the budget; commands without write data and
// with a small data-in (INQUIRY, TEST UNIT READY...) take nothing of it.
// Connections still logging in are capped (Config.MaxPendingLogins) and
// bounded in time (Config.LoginTimeout); accept errors are retried
// (netutil.Retry), never the end of a portal.
//
// Data path: the reader reads write data straight into the command's
// pooled buffer (session.dataBuffer), and the writer gathers queued PDUs
// into one writev with long Data-In segments sent from the result's own
// buffer (sendBuf), so neither direction copies or allocates per byte.
//
// Concurrency: one reader goroutine per connection decodes PDUs and
// drives the session's state; one writer goroutine per connection assigns
// StatSN and writes every PDU, so completions may arrive on any goroutine
// (the LogicalUnits' engine) and never block on the socket. Server methods
// are safe for concurrent use.
package target
