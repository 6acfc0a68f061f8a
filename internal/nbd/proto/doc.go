// Package proto is the NBD wire codec: every constant of the NBD protocol
// (nbd-proto.md) and pure encode/decode functions over byte slices. It does
// no I/O and starts no goroutines; the server and client packages frame the
// stream and call these functions.
//
// Simplest use, a server reading one request header:
//
//	var hdr [proto.RequestSize]byte
//	io.ReadFull(conn, hdr[:])
//	req, err := proto.ParseRequest(hdr[:]) // err wraps proto.ErrBadMagic on garbage
//	...
//	out = proto.AppendSimpleReply(out[:0], proto.SimpleReply{Error: proto.EINVAL, Cookie: req.Cookie})
//
// Encoders are Append* functions (append to a caller-owned buffer, so a hot
// path can reuse one buffer and never allocate); decoders are Parse*
// functions that check magics and bound every length before allocating.
// Errors wrap ErrShort, ErrBadMagic, ErrTooLong or ErrInvalid. NBD error
// values are the Errno type, whose String is the spec name ("NBD_EINVAL").
//
// Concurrency: the package has no mutable state; all functions are safe for
// concurrent use on distinct buffers.
package proto
