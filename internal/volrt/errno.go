package volrt

import (
	"errors"
	"syscall"

	"github.com/vmsan/vmsan/internal/backend"
)

// Errno classifies an engine or backend error as the POSIX errno a front
// end should report: one of EIO, ENOSPC, EPERM, EINVAL, ENOMEM, ESHUTDOWN,
// EOPNOTSUPP. NBD maps these onto its error values one to one
// (nbd/server); the SCSI logical unit maps them onto sense data
// (scsi.errSense: ENOSPC -> SPACE ALLOCATION FAILED, EPERM -> DATA
// PROTECT, EINVAL -> LBA OUT OF RANGE, ENOMEM -> ABORTED COMMAND (the
// initiator retries), ESHUTDOWN -> NOT READY, else MEDIUM ERROR or
// HARDWARE ERROR).
//
// Errors a front end produces itself (protocol errors with a wire value of
// their own) are for the front end to recognise before calling Errno.
func Errno(err error) syscall.Errno {
	switch {
	case errors.Is(err, backend.ErrNotFast):
		return syscall.EOPNOTSUPP
	case errors.Is(err, backend.ErrOutOfRange):
		// The volume shrank under a connection that still has the old size.
		return syscall.EINVAL
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT), errors.Is(err, syscall.EFBIG):
		return syscall.ENOSPC
	case errors.Is(err, syscall.EPERM), errors.Is(err, syscall.EROFS), errors.Is(err, syscall.EACCES):
		return syscall.EPERM
	case errors.Is(err, syscall.EINVAL):
		return syscall.EINVAL
	case errors.Is(err, syscall.ENOMEM):
		return syscall.ENOMEM
	case errors.Is(err, syscall.ESHUTDOWN):
		return syscall.ESHUTDOWN
	case errors.Is(err, syscall.EOPNOTSUPP):
		return syscall.EOPNOTSUPP
	}
	return syscall.EIO
}
