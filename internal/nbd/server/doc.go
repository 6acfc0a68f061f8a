// Package server is vmsan's NBD server: the fixed-newstyle handshake (with
// TLS) and the transmission phase over any net.Conn, serving the devices of
// an export.Registry.
//
// Simplest use:
//
//	srv := server.New(server.Config{Registry: reg})
//	l, _ := net.Listen("tcp", "127.0.0.1:10809") // or net.Listen("unix", path)
//	go srv.Serve(l)
//	...
//	srv.Shutdown(ctx) // stop accepting, finish in-flight requests, close
//
// Each connection runs a reader goroutine (parses requests, submits them to
// the Device without waiting) and a writer goroutine (sends replies in
// completion order, so replies are out of order with respect to requests;
// replies that are ready together go out in one write). In-flight requests
// (Config.MaxInflight) and payload bytes (Config.MaxInflightBytes) per
// connection are bounded; when a bound is reached the reader stops reading,
// which pushes back on the client through TCP instead of growing memory.
// Payload buffers come from the runtime's 4096-aligned size-class pool
// (volrt.GetBuf), so steady-state READ/WRITE handling does not allocate.
//
// This package is the NBD codec and session logic only: the request life
// cycle with the engine (volrt.Lifecycle), error classification
// (volrt.Errno), hole splitting (volrt.SplitHoles) and the in-flight byte
// budget (volrt.Budget) are the volume runtime's, shared with every front
// end. Each connection's budget (Config.MaxInflightBytes) also reserves
// from Config.Budget, the daemon-wide one: when that is spent the
// connection's reader stops reading requests until memory frees.
// Config.MaxConns bounds the open connections. Config.Sessions records
// connected clients for front-end-neutral status.
//
// Concurrency: all Server methods are safe for concurrent use. Serve may be
// called on several listeners at once (TCP and Unix sockets alike).
//
// # Protocol choices
//
// Where nbd-proto.md leaves a choice, this server does the following.
//
//   - Handshake: fixed newstyle with NO_ZEROES. Options EXPORT_NAME, ABORT
//     (ACK then close), LIST, STARTTLS, INFO, GO, STRUCTURED_REPLY,
//     LIST_META_CONTEXT and SET_META_CONTEXT (only "base:allocation", id 1).
//     Anything else, including EXTENDED_HEADERS, gets NBD_REP_ERR_UNSUP and
//     the session continues. Malformed option data gets NBD_REP_ERR_INVALID.
//     Option data longer than 64 KiB gets NBD_REP_ERR_TOO_BIG and a hard
//     disconnect (we will not read it). Unknown client flags or a wrong
//     option magic: disconnect.
//   - INFO/GO always send NBD_INFO_EXPORT and NBD_INFO_BLOCK_SIZE, plus NAME
//     and DESCRIPTION when asked; unknown info requests are ignored.
//   - TLS: TLSOff answers STARTTLS with NBD_REP_ERR_POLICY; TLSRequired
//     answers every option but STARTTLS/ABORT with NBD_REP_ERR_TLS_REQD and
//     disconnects on EXPORT_NAME before TLS; TLSOptional lets the client
//     choose. State negotiated before STARTTLS is discarded by it.
//   - Request checks, in order: unknown command → EINVAL; flag not valid for
//     the command or not negotiated → EINVAL; WRITE/TRIM/WRITE_ZEROES on a
//     read-only export → EPERM; offset+length overflowing 64 bits → EINVAL;
//     past the end → ENOSPC for WRITE/WRITE_ZEROES, EINVAL otherwise; not a
//     multiple of the advertised minimum block size → EINVAL; READ/WRITE
//     longer than the advertised maximum payload → EINVAL (BLOCK_STATUS,
//     TRIM, WRITE_ZEROES and CACHE may be longer, as the spec allows).
//   - An oversized WRITE payload up to max(MaxPayload, 32 MiB) is read and
//     discarded so the stream stays in sync (then EINVAL); a larger one is a
//     hard disconnect, as the spec permits for denial-of-service lengths.
//   - A wrong request magic closes the connection after replying to what is
//     in flight. NBD_CMD_DISC does the same.
//   - Structured READ replies use OFFSET_HOLE for ranges the device reports
//     as zero and that really read as zero (reads of at least
//     Config.StructuredReadHoles bytes); with DF, one OFFSET_DATA chunk.
//     Errors use NBD_REPLY_TYPE_ERROR. Other commands use simple replies.
//   - WRITE_ZEROES with FAST_ZERO fails with ENOTSUP when the backend says
//     backend.ErrNotFast. TRIM with FUA is followed by a FLUSH before the
//     reply.
//   - Backend errors (classified by volrt.Errno) map to ENOSPC (ENOSPC, EDQUOT, EFBIG), EPERM (EPERM,
//     EROFS, EACCES), EINVAL, ENOMEM, ENOTSUP, ESHUTDOWN, else EIO.
//
// Not implemented: oldstyle negotiation, EXTENDED_HEADERS (64-bit
// requests), NBD_CMD_RESIZE, per-export TLS-only policy in TLSOptional
// mode, and metadata contexts other than base:allocation.
package server
