package server

import (
	"fmt"
	"io"
	"syscall"
	"testing"

	"github.com/vmsan/vmsan/internal/backend"
	"github.com/vmsan/vmsan/internal/ioengine"
	"github.com/vmsan/vmsan/internal/nbd/proto"
)

func TestToErrno(t *testing.T) {
	for _, c := range []struct {
		err  error
		want proto.Errno
	}{
		{fmt.Errorf("wrapped: %w", backend.ErrNotFast), proto.ENOTSUP},
		{backend.ErrOutOfRange, proto.EINVAL},
		{ioengine.ErrInvalid, proto.EINVAL},
		{ioengine.ErrClosed, proto.ESHUTDOWN},
		{fmt.Errorf("pwrite: %w", syscall.ENOSPC), proto.ENOSPC},
		{syscall.EDQUOT, proto.ENOSPC},
		{syscall.EFBIG, proto.ENOSPC},
		{syscall.EROFS, proto.EPERM},
		{proto.EOVERFLOW, proto.EOVERFLOW},
		{io.ErrUnexpectedEOF, proto.EIO},
		{syscall.EIO, proto.EIO},
	} {
		if got := toErrno(c.err); got != c.want {
			t.Errorf("toErrno(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}
