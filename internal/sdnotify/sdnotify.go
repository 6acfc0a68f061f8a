// Package sdnotify tells systemd about the service's state (the sd_notify
// protocol) so that a `Type=notify` unit is "active" only once vmsan accepts
// connections, and shows "deactivating" while a drain runs.
//
// Simplest use:
//
//	sdnotify.Ready("serving 3 volumes") // after every listener is bound
//	sdnotify.Stopping()                 // when the graceful drain starts
//	sdnotify.Reloading("reloading")     // SIGHUP received; Ready when applied
//
// The protocol: newline-separated KEY=VALUE assignments sent as one datagram
// to the AF_UNIX SOCK_DGRAM socket named by $NOTIFY_SOCKET. A name starting
// with '@' is in the Linux abstract namespace (the '@' stands for the
// leading NUL byte). When $NOTIFY_SOCKET is unset (not started by systemd,
// or a unit that is not Type=notify) every call is a no-op returning nil,
// so callers never need to know how they were started.
//
// Concurrency: every function is safe for concurrent use; each call dials,
// sends one datagram and closes (a handful of calls per process lifetime,
// so there is nothing worth caching).
package sdnotify

import (
	"errors"
	"net"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// EnvSocket is the environment variable systemd sets for Type=notify units.
const EnvSocket = "NOTIFY_SOCKET"

// Send sends state (e.g. "READY=1\nSTATUS=serving") to $NOTIFY_SOCKET. It
// returns nil without doing anything when the variable is unset or empty.
func Send(state string) error {
	return SendTo(os.Getenv(EnvSocket), state)
}

// SendTo sends state to the socket named addr ("/run/..." or "@abstract");
// an empty addr is a no-op.
func SendTo(addr, state string) error {
	if addr == "" {
		return nil
	}
	if addr[0] != '/' && addr[0] != '@' {
		// systemd also knows vsock: addresses; vmsan does not need them and
		// a relative path would depend on the working directory.
		return errors.New("sdnotify: " + EnvSocket + " must be an absolute path or an @abstract name, got " + addr)
	}
	// net.UnixAddr maps a leading '@' to the abstract namespace itself.
	c, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: addr, Net: "unixgram"})
	if err != nil {
		return err
	}
	defer c.Close()
	_, err = c.Write([]byte(state))
	return err
}

// Ready says the service is up (READY=1), with an optional STATUS line.
func Ready(status string) error { return Send(withStatus("READY=1", status)) }

// Stopping says the service is shutting down (STOPPING=1).
func Stopping(status string) error { return Send(withStatus("STOPPING=1", status)) }

// Reloading says a configuration reload has started (RELOADING=1, with
// MONOTONIC_USEC: systemd 253's Type=notify-reload needs the timestamp to
// match the reload to its request; older managers ignore the field); call
// Ready when it is done.
func Reloading(status string) error {
	return Send(withStatus("RELOADING=1\nMONOTONIC_USEC="+strconv.FormatInt(monotonicUsec(), 10), status))
}

// monotonicUsec is CLOCK_MONOTONIC in microseconds, the clock systemd
// compares MONOTONIC_USEC against (Go's time package does not expose it).
func monotonicUsec() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return 0
	}
	return ts.Sec*1e6 + ts.Nsec/1e3
}

func withStatus(state, status string) string {
	if status == "" {
		return state
	}
	return state + "\nSTATUS=" + oneLine(status)
}

// oneLine keeps a status from injecting further assignments: the protocol
// is line based, so a newline in a status would start a new KEY=VALUE.
func oneLine(s string) string {
	return strings.NewReplacer("\n", " ", "\r", " ").Replace(s)
}
