package driver

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmsan/vmsan/internal/events"
	"github.com/vmsan/vmsan/internal/ioengine"
	"github.com/vmsan/vmsan/internal/repl"
	"github.com/vmsan/vmsan/internal/testutil/faultproxy"
)

// The node's reason texts (internal/repl: connect.go, tick.go, node.go) must map to their kinds; a reworded
// reason that falls to "other" fails here instead of silently moving the
// metric.
func TestClassifyDisconnect(t *testing.T) {
	for _, c := range []struct {
		reason string
		err    error
		want   string
	}{
		{"administrative disconnect", nil, ReasonAdmin},
		{"ping timeout", nil, ReasonPingTimeout},
		{fmt.Sprintf("peer alive but did not complete write seq %d in %d ticks (ko)", 7, 101), nil, ReasonKoTimeout},
		{fmt.Sprintf("handshake timeout: the peer answers pings but did not complete the handshake in %d ticks (ko)", 31), nil, ReasonKoTimeout},
		{fmt.Sprintf("handshake timeout: the peer answers pings but did not start the resync in %d ticks (ko)", 31), nil, ReasonKoTimeout},
		{"protocol error: repl: RSData while Connected", nil, ReasonProtocolError},
		{repl.SplitBrain.String() + ": split brain: both sides wrote since generation 6101", nil, ReasonSplitBrain},
		{repl.Unrelated.String() + ": no common generation", nil, ReasonHandshakeRefused},
		{repl.Refused.String() + ": volume sizes differ", nil, ReasonHandshakeRefused},
		{"refused: this primary would become sync target (demote it first)", nil, ReasonHandshakeRefused},
		{"replaced by a new connection", nil, ReasonPeerClosed},
		{"something new", nil, ReasonOther},
		{"", fmt.Errorf("read: %w", io.EOF), ReasonPeerClosed},
		{"", fmt.Errorf("read: %w", &net.OpError{Op: "read", Err: syscall.ECONNRESET}), ReasonPeerClosed},
		{"", &net.OpError{Op: "write", Err: syscall.EPIPE}, ReasonPeerClosed},
		{"", &net.OpError{Op: "write", Err: syscall.EHOSTUNREACH}, ReasonIOError},
		{"", fmt.Errorf("x: %w", repl.ErrBadFrame), ReasonProtocolError},
		{"", errors.New("repl: Ping on the wrong connection"), ReasonProtocolError},
	} {
		if got := classifyDisconnect(c.reason, c.err); got != c.want {
			t.Errorf("classify(%q, %v) = %s, want %s", c.reason, c.err, got, c.want)
		}
	}
}

// The metrics snapshot of a primary across a peer outage: ack latency is
// measured while connected, out-of-sync grows while the peer is away and
// returns to 0 after the resync, peer fields go Unknown, and the
// disconnect is counted under a bounded reason.
func TestReplicaMetricsAcrossOutage(t *testing.T) {
	var px *faultproxy.Proxy
	a, b := pairWith(t, 16<<20, Settings{Protocol: "C", Tick: msD(20), PingInterval: msD(100), PingTimeout: msD(2000), KoTimeout: msD(10000)},
		func(target string) string {
			var err error
			if px, err = faultproxy.New("127.0.0.1:0", target); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { px.Close() })
			return px.Addr()
		}, nil)
	waitFor(t, "connect", 10*time.Second, connected(a))
	waitFor(t, "connect", 10*time.Second, connected(b))
	for i := 0; i < 16; i++ {
		if err := a.write(int64(i)*65536, pattern(byte(i), 4096)); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "no pending writes", 5*time.Second, func() bool { return a.r.Metrics().PendingWrites == 0 })
	m := a.r.Metrics()
	if m.AckLatency.Count < 16 || m.AckLatency.Sum <= 0 {
		t.Fatalf("ack latency after 16 protocol C writes: count %d sum %d", m.AckLatency.Count, m.AckLatency.Sum)
	}
	if m.PeerRole != "Secondary" || m.PeerDisk != "UpToDate" || m.OutOfSync != 0 || m.PendingWrites != 0 {
		t.Fatalf("connected snapshot: %+v", m)
	}
	var before uint64
	for _, n := range m.Disconnects {
		before += n
	}
	if len(m.Disconnects) != len(DisconnectReasons) {
		t.Fatalf("disconnect reasons %v, want all of %v", m.Disconnects, DisconnectReasons)
	}

	// The link is reset: both sides see their connection fail.
	px.Reset()
	waitFor(t, "a notices", 10*time.Second, func() bool { return a.r.Status().Conn != "Connected" })
	px.Blackhole(true) // keep it down while we write
	for i := 0; i < 4; i++ {
		if err := a.write(int64(8<<20)+int64(i)*65536, pattern(byte(i+1), 4096)); err != nil {
			t.Fatal(err)
		}
	}
	m = a.r.Metrics()
	if m.OutOfSync != 4*65536 {
		t.Fatalf("out of sync while the peer is away: %d, want %d", m.OutOfSync, 4*65536)
	}
	if m.Conn == "Connected" || m.PeerRole != "Unknown" || m.PeerDisk != "Unknown" {
		t.Fatalf("peer fields while disconnected: conn %s peer %s/%s", m.Conn, m.PeerRole, m.PeerDisk)
	}
	var after uint64
	for k, n := range m.Disconnects {
		after += n
		if n > 0 && k != ReasonPeerClosed && k != ReasonIOError && k != ReasonPingTimeout {
			t.Errorf("link reset counted as %s", k)
		}
	}
	if after <= before {
		t.Fatalf("disconnects %v: not counted", m.Disconnects)
	}

	px.Blackhole(false)
	waitFor(t, "resync", 30*time.Second, func() bool {
		m := a.r.Metrics()
		return m.Conn == "Connected" && m.OutOfSync == 0
	})
	m = a.r.Metrics()
	if m.ResyncBytes+m.ResyncZeroBytes == 0 || m.PeerDisk != "UpToDate" {
		t.Fatalf("after resync: %+v", m)
	}
	_ = ioengine.OpWrite
}

// The transition log, fed a scripted sequence of node statuses: every
// line an operator greps for appears once, with its fields.
func TestObserveLogLines(t *testing.T) {
	var buf bytes.Buffer
	r := &Replica{log: slog.New(slog.NewTextHandler(&buf, nil)), set: Settings{Peer: "10.0.0.2:7789", SplitBrain: "disconnect"}}
	t0 := time.Unix(1000, 0)
	st := func(role repl.Role, disk repl.DiskState, c repl.ConnState, pr repl.Role, pd repl.DiskState, oos int64) repl.Status {
		return repl.Status{Role: role, Disk: disk, Conn: c, PeerRole: pr, PeerDisk: pd, OutOfSync: oos}
	}
	seq := []repl.Status{
		st(repl.Secondary, repl.UpToDate, repl.Connecting, repl.RoleUnknown, repl.DiskUnknown, 0),
		st(repl.Primary, repl.UpToDate, repl.Connecting, repl.RoleUnknown, repl.DiskUnknown, 1<<20),
		st(repl.Primary, repl.UpToDate, repl.SyncSource, repl.Secondary, repl.Inconsistent, 1<<20),
		st(repl.Primary, repl.UpToDate, repl.SyncSource, repl.Secondary, repl.Inconsistent, 1<<19),
		st(repl.Primary, repl.UpToDate, repl.Connected, repl.Secondary, repl.UpToDate, 0),
		st(repl.Primary, repl.UpToDate, repl.Connected, repl.Primary, repl.UpToDate, 0),
		st(repl.Primary, repl.UpToDate, repl.SyncSource, repl.Secondary, repl.Inconsistent, 2<<20),
		st(repl.Primary, repl.UpToDate, repl.Connecting, repl.RoleUnknown, repl.DiskUnknown, 1<<20),
		st(repl.Primary, repl.UpToDate, repl.StandAlone, repl.RoleUnknown, repl.DiskUnknown, 1<<20),
	}
	seq[2].ResyncTotal = 1 << 20
	seq[2].LastDecision = repl.Decision{Kind: repl.BitmapSource, Rule: 60}
	seq[8].LastError = repl.SplitBrain.String() + ": split brain: both sides wrote since generation 6101"
	for i, s := range seq {
		r.observe(s, t0.Add(time.Duration(i)*time.Second))
	}
	out := buf.String()
	for _, want := range []string{
		`level=INFO msg="replication role changed" from=Secondary to=Primary`,
		`level=INFO msg="replication established" peer=10.0.0.2:7789 peer_role=Secondary peer_disk=Inconsistent decision=bitmap-source out_of_sync_bytes=1048576`,
		`level=INFO msg="resync started" direction="to peer (SyncSource)" bytes=1048576 peer=10.0.0.2:7789`,
		`level=INFO msg="resync finished" direction="to peer (SyncSource)" bytes=1048576 seconds=2 bytes_per_sec=524288`,
		`level=INFO msg="replication peer role changed" from=Secondary to=Primary`,
		`level=INFO msg="resync started" direction="to peer (SyncSource)" bytes=2097152 peer=10.0.0.2:7789`,
		`level=WARN msg="resync interrupted" direction="to peer (SyncSource)" bytes_left=1048576 seconds=1 now=Connecting`,
		`level=ERROR msg="split brain detected: replication stopped (StandAlone) until resolved by hand; see docs/replication.md" reason="split-brain: split brain: both sides wrote since generation 6101"`,
	} {
		if strings.Count(out, want) != 1 {
			t.Errorf("want once: %s", want)
		}
	}
	if t.Failed() {
		t.Logf("log:\n%s", out)
	}
	// The first status (at start) logs nothing; peer role going Unknown
	// at a disconnect is not a "peer role change".
	if strings.Contains(out, "to=Unknown") || strings.Contains(out, "from=Unknown") {
		t.Errorf("unknown peer role logged as a change:\n%s", out)
	}
}

// TestObserveEvents: the same kind of scripted statuses produce the
// `vmsan events` lines: a replication change per state change, and resync
// create/change/destroy with progress.
func TestObserveEvents(t *testing.T) {
	bus := events.NewBus()
	sub := bus.Subscribe(100)
	defer sub.Close()
	r := &Replica{name: "vm1", bus: bus, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	t0 := time.Unix(1000, 0)
	st := func(role repl.Role, disk repl.DiskState, c repl.ConnState, pr repl.Role, pd repl.DiskState, oos int64) repl.Status {
		return repl.Status{Role: role, Disk: disk, Conn: c, PeerRole: pr, PeerDisk: pd, OutOfSync: oos, ResyncTotal: 4 << 20, ResyncLeft: oos}
	}
	seq := []repl.Status{
		st(repl.Primary, repl.UpToDate, repl.Connecting, repl.RoleUnknown, repl.DiskUnknown, 4<<20),
		st(repl.Primary, repl.UpToDate, repl.SyncSource, repl.Secondary, repl.Inconsistent, 4<<20),
		st(repl.Primary, repl.UpToDate, repl.SyncSource, repl.Secondary, repl.Inconsistent, 3<<20), // +0.5s: too soon
		st(repl.Primary, repl.UpToDate, repl.SyncSource, repl.Secondary, repl.Inconsistent, 1<<20), // +1s
		st(repl.Primary, repl.UpToDate, repl.Connected, repl.Secondary, repl.UpToDate, 0),
	}
	at := []time.Duration{0, time.Second, 1500 * time.Millisecond, 2 * time.Second, 3 * time.Second}
	for i, s := range seq {
		r.observe(s, t0.Add(at[i]))
	}
	var got []string
	for len(sub.C()) > 0 {
		got = append(got, (<-sub.C()).String())
	}
	want := []string{
		"change replication volume:vm1 role:Primary disk:UpToDate connection:SyncSource peer_role:Secondary peer_disk:Inconsistent out_of_sync_bytes:4194304",
		"create resync volume:vm1 direction:SyncSource left_bytes:4194304 percent:0.0",
		"change resync volume:vm1 direction:SyncSource left_bytes:1048576 percent:75.0",
		"change replication volume:vm1 role:Primary disk:UpToDate connection:Connected peer_role:Secondary peer_disk:UpToDate out_of_sync_bytes:0",
		"destroy resync volume:vm1 connection:Connected left_bytes:0",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("events:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
