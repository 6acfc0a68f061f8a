package proto

import (
	"errors"
	"strconv"
)

// Errno is an NBD error value as carried in simple replies and error chunks.
// It implements error, so a server can return it from request handling and a
// client can match it with errors.Is / errors.As.
type Errno uint32

// Error values (nbd-proto.md "Error values").
const (
	EPERM     Errno = 1
	EIO       Errno = 5
	ENOMEM    Errno = 12
	EINVAL    Errno = 22
	ENOSPC    Errno = 28
	EOVERFLOW Errno = 75
	ENOTSUP   Errno = 95
	ESHUTDOWN Errno = 108
)

// String returns the spec name, e.g. "NBD_EINVAL".
func (e Errno) String() string {
	switch e {
	case 0:
		return "NBD_OK"
	case EPERM:
		return "NBD_EPERM"
	case EIO:
		return "NBD_EIO"
	case ENOMEM:
		return "NBD_ENOMEM"
	case EINVAL:
		return "NBD_EINVAL"
	case ENOSPC:
		return "NBD_ENOSPC"
	case EOVERFLOW:
		return "NBD_EOVERFLOW"
	case ENOTSUP:
		return "NBD_ENOTSUP"
	case ESHUTDOWN:
		return "NBD_ESHUTDOWN"
	}
	return "NBD_E" + strconv.FormatUint(uint64(e), 10)
}

func (e Errno) Error() string { return "nbd: " + e.String() }

// Known reports whether e is one of the values the spec defines. A client
// should treat unknown values as EINVAL.
func (e Errno) Known() bool {
	switch e {
	case EPERM, EIO, ENOMEM, EINVAL, ENOSPC, EOVERFLOW, ENOTSUP, ESHUTDOWN:
		return true
	}
	return false
}

// RepError is an option reply error (NBD_REP_ERR_*) as an error value, with
// the optional human-readable message the server sent.
type RepError struct {
	Opt     Opt
	Rep     Rep
	Message string
}

func (e *RepError) Error() string {
	s := "nbd: " + e.Opt.String() + ": " + e.Rep.String()
	if e.Message != "" {
		s += ": " + e.Message
	}
	return s
}

// Codec errors. Parse functions wrap these with detail; match with errors.Is.
var (
	// ErrShort means the buffer is shorter than the structure (or than the
	// lengths inside it claim).
	ErrShort = errors.New("nbd: short buffer")
	// ErrBadMagic means a magic number did not match; the peer is not
	// speaking this protocol (or the stream is out of sync) and the
	// connection should be closed.
	ErrBadMagic = errors.New("nbd: bad magic")
	// ErrTooLong means a length field exceeds the bound the spec or this
	// implementation allows; nothing was allocated for it.
	ErrTooLong = errors.New("nbd: length exceeds limit")
	// ErrInvalid means a structure is well-framed but internally inconsistent.
	ErrInvalid = errors.New("nbd: invalid structure")
)
