package netutil

import (
	"fmt"
	"net"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// MaxSunPath is the longest path a Unix socket address can hold (sun_path is
// 108 bytes including the terminating NUL).
const MaxSunPath = 107

// WithShortPath calls fn with a name for path that fits in sun_path. Paths
// that are too long (deep data directories) are reached through
// /proc/self/fd/N/<base>, where N is a descriptor of the parent directory:
// the kernel resolves it to the same file, so the socket keeps its real
// location and permissions. Daemon and client both use this, so a data
// directory of any length has a working control socket.
func WithShortPath(path string, fn func(short string) error) error {
	if len(path) <= MaxSunPath {
		return fn(path)
	}
	dir, base := filepath.Split(path)
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("socket directory %s: %w", dir, err)
	}
	defer unix.Close(fd)
	short := fmt.Sprintf("/proc/self/fd/%d/%s", fd, base)
	if len(short) > MaxSunPath {
		return fmt.Errorf("socket name %s is too long even via /proc (%d bytes)", base, len(short))
	}
	return fn(short)
}

// DialUnix connects to a Unix socket at path of any length.
func DialUnix(network, path string, dial func(network, addr string) (net.Conn, error)) (c net.Conn, err error) {
	err = WithShortPath(path, func(short string) error {
		c, err = dial(network, short)
		return err
	})
	return c, err
}
