package netutil

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"time"

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

// ListenUnix listens on the Unix socket at path p (of any length). It
// removes a stale socket file (one nobody answers on) before
// binding, so a daemon killed with -9 can be restarted. The socket gets
// exactly mode, independent of the umask: the socket's inode is given the
// mode before bind (Linux creates the file with the socket inode's mode
// minus the umask, so it is never wider than mode, not even for an
// instant), and chmod after bind sets it exactly.
func ListenUnix(p string, mode os.FileMode) (net.Listener, error) {
	if st, err := os.Lstat(p); err == nil {
		if st.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("listen unix:%s: exists and is not a socket", p)
		}
		dial := func(n, a string) (net.Conn, error) { return net.DialTimeout(n, a, time.Second) }
		if c, err := DialUnix("unix", p, dial); err == nil {
			c.Close()
			return nil, fmt.Errorf("listen unix:%s: another process is serving on it", p)
		}
		os.Remove(p)
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return nil, err
	}
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		if err := c.Control(func(fd uintptr) { serr = syscall.Fchmod(int(fd), uint32(mode.Perm())) }); err != nil {
			return err
		}
		return serr
	}}
	var ln net.Listener
	err := WithShortPath(p, func(short string) (err error) {
		ln, err = lc.Listen(context.Background(), "unix", short)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("listen unix:%s: %w", p, err)
	}
	if err := os.Chmod(p, mode.Perm()); err != nil {
		ln.Close()
		return nil, fmt.Errorf("listen unix:%s: %w", p, err)
	}
	return unixListener{ln, p}, nil
}

// unixListener reports the socket's real path as its address even when it
// was bound through a /proc/self/fd alias (see WithShortPath).
type unixListener struct {
	net.Listener
	path string
}

func (l unixListener) Addr() net.Addr { return &net.UnixAddr{Name: l.path, Net: "unix"} }
