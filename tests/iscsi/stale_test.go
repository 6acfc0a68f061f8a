package iscsi

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/vmsan/vmsan/internal/testutil"
	"github.com/vmsan/vmsan/internal/testutil/faultproxy"
)

// TestStaleWriteAfterFailover: a write sent on a path that then goes
// silent (blackholed: the network holds it, as TCP retransmission does)
// must never execute once the initiator has failed over and rewritten the
// block on another path. Linux's initiator with the timers `vmsan iscsi
// multipath-conf` prints resends a silent path's I/O after at least 3 s
// (NOP-Out 1 s + 1 s, then fast_io_fail_tmo 2 s, less up to 1 s of ping
// phase), so the target must have closed the old connection before that:
// when the path comes back, its backlog then meets a closed socket.
//
// Session A goes through a fault proxy; the proxy is blackholed, then A
// sends WRITE (pattern X) which stalls in it; after 3 s (the initiator's
// earliest failover) qemu-io writes pattern Y to the same block directly
// (the other path); the blackhole lifts at 8 s, delivering A's backlog.
// The block must read Y.
func TestStaleWriteAfterFailover(t *testing.T) {
	t.Parallel()
	testutil.NeedTool(t, "qemu-io")
	v := startVmsan(t, fmt.Sprintf("    auth: {user: %s, secret: %q}\n", rawUser, rawSecret))
	px, err := faultproxy.New("127.0.0.1:0", v.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer px.Close()
	url := v.url(rawUser+"%"+rawSecret, 0)

	a := ffp(t, px.Addr())
	px.Blackhole(true)
	cut := time.Now()
	x := bytes.Repeat([]byte{'X'}, 4096)
	c := a.cmd(write10(0, 8), false, true, uint32(len(x)))
	if err := a.write(a.encode(c, x)); err != nil {
		t.Fatalf("WRITE on the path being cut: %v", err)
	}

	// A's is the only connection: the target closing it shows in the
	// gauge (the figure docs/iscsi.md quotes).
	const active = `vmsan_frontend_connections_active{frontend="iscsi"}`
	closed := "not within 3 s"
	for time.Now().Before(cut.Add(3 * time.Second)) {
		if m := scrape(t, v.metrics); m[active] == 0 {
			closed = time.Since(cut).Round(10 * time.Millisecond).String()
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("the target closed the silent connection: %s after the cut", closed)
	time.Sleep(time.Until(cut.Add(3 * time.Second)))
	if out, err := run(t, 30*time.Second, "qemu-io", "-f", "raw", url, "-c", "write -P 0x59 0 4k"); err != nil {
		t.Fatalf("write Y on the other path: %v\n%s", err, out)
	}
	time.Sleep(time.Until(cut.Add(8 * time.Second)))
	px.Blackhole(false)
	// The backlog is delivered at once (loopback); give a target that
	// still holds the connection time to execute it.
	time.Sleep(2 * time.Second)

	out, err := run(t, 30*time.Second, "qemu-io", "-f", "raw", url, "-c", "read -P 0x59 0 4k")
	if err != nil || strings.Contains(out, "failed") {
		got, _ := run(t, 30*time.Second, "qemu-io", "-f", "raw", url, "-c", "read -v 0 16")
		t.Fatalf("the stale write from the cut path landed after the newer one (read -P 0x59: %v):\n%s\n%s\n%s", err, out, got, v.logTail())
	}
}
