package sdnotify

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// listen opens a unixgram socket at addr (a path or an "@abstract" name)
// and returns a function that reads the next datagram.
func listen(t *testing.T, addr string) func() string {
	t.Helper()
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: addr, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return func() string {
		t.Helper()
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		buf := make([]byte, 4096)
		n, err := c.Read(buf)
		if err != nil {
			t.Fatal(err)
		}
		return string(buf[:n])
	}
}

func TestSendPathAndAbstract(t *testing.T) {
	for _, addr := range []string{
		filepath.Join(t.TempDir(), "notify"),
		fmt.Sprintf("@vmsan-sdnotify-test-%d-%d", os.Getpid(), time.Now().UnixNano()),
	} {
		t.Run(addr[:1], func(t *testing.T) {
			recv := listen(t, addr)
			t.Setenv(EnvSocket, addr)
			for _, c := range []struct {
				send func() error
				want string
			}{
				{func() error { return Ready("") }, "READY=1"},
				{func() error { return Ready("serving 2 volumes") }, "READY=1\nSTATUS=serving 2 volumes"},
				{func() error { return Stopping("draining") }, "STOPPING=1\nSTATUS=draining"},
				// A newline in a status must not smuggle in another assignment.
				{func() error { return Stopping("a\nREADY=1") }, "STOPPING=1\nSTATUS=a READY=1"},
			} {
				if err := c.send(); err != nil {
					t.Fatal(err)
				}
				if got := recv(); got != c.want {
					t.Fatalf("got %q, want %q", got, c.want)
				}
			}
		})
	}
}

func TestUnsetIsNoop(t *testing.T) {
	t.Setenv(EnvSocket, "")
	if err := Ready("x"); err != nil {
		t.Fatal(err)
	}
}

func TestBadAddress(t *testing.T) {
	if err := SendTo("relative/sock", "READY=1"); err == nil || !strings.Contains(err.Error(), "absolute") {
		t.Fatalf("relative path: %v", err)
	}
	// Nobody listening: an error, not a hang.
	if err := SendTo(filepath.Join(t.TempDir(), "none"), "READY=1"); err == nil {
		t.Fatal("no listener: want an error")
	}
}

// TestReloadingMonotonic: RELOADING=1 carries MONOTONIC_USEC on
// CLOCK_MONOTONIC (what systemd's Type=notify-reload checks), between two
// readings of that clock taken around the call.
func TestReloadingMonotonic(t *testing.T) {
	addr := fmt.Sprintf("@vmsan-sdnotify-reload-%d-%d", os.Getpid(), time.Now().UnixNano())
	recv := listen(t, addr)
	t.Setenv(EnvSocket, addr)
	before := monotonicUsec()
	if err := Reloading("reloading"); err != nil {
		t.Fatal(err)
	}
	after := monotonicUsec()
	got := recv()
	var usec int64
	if _, err := fmt.Sscanf(got, "RELOADING=1\nMONOTONIC_USEC=%d\nSTATUS=reloading", &usec); err != nil {
		t.Fatalf("got %q: %v", got, err)
	}
	if usec < before || usec > after || before <= 0 {
		t.Fatalf("MONOTONIC_USEC=%d outside [%d, %d]", usec, before, after)
	}
}
