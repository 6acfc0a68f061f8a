// Package client is vmsan's NBD client: a pipelined implementation of the
// transmission phase over the wire codec in internal/nbd/proto, used by
// `vmsan bench`, by tests, and by replication and multipath work.
//
// Simplest use:
//
//	c, err := client.Dial(ctx, "nbd://127.0.0.1:10809/default", nil)
//	defer c.Close()
//	buf := make([]byte, 4096)
//	_, err = c.ReadAt(buf, 0)
//
// URIs follow the NBD URI format: nbd://host[:port]/export,
// nbds://... (TLS through NBD_OPT_STARTTLS; ?tls-certificates=DIR with
// ca-cert.pem and optionally client-cert.pem/client-key.pem, or
// Options.TLSConfig), and nbd+unix:///export?socket=PATH.
//
// The handshake is fixed newstyle with NO_ZEROES, STRUCTURED_REPLY,
// SET_META_CONTEXT base:allocation and OPT_GO asking for BLOCK_SIZE (falling
// back to EXPORT_NAME for servers without GO).
//
// Concurrency: every method of Conn is safe for concurrent use. Requests
// from all goroutines are pipelined: up to Options.Depth per connection are
// in flight at once, replies are matched to requests by cookie in whatever
// order they arrive, and a Conn opens several connections (4 by default)
// when the server advertises CAN_MULTI_CONN, sending each request on the
// least busy one. Submit is the asynchronous form; ReadAt, WriteAt, Flush,
// Trim, Zero, Cache and BlockStatus block until their reply.
//
// Robustness: every length the server sends is checked against the request
// it answers (or a fixed bound) before any byte is read into memory; a
// reply that breaks the protocol fails that connection with ErrProtocol and
// completes all its requests with the error, never panics.
package client
