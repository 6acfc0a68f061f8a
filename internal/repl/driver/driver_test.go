package driver

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/vmsan/vmsan/internal/backend"
	"github.com/vmsan/vmsan/internal/backend/backendtest"
	"github.com/vmsan/vmsan/internal/export"
	"github.com/vmsan/vmsan/internal/ioengine"
	"github.com/vmsan/vmsan/internal/repl"
	"github.com/vmsan/vmsan/internal/testutil/faultproxy"
	"github.com/vmsan/vmsan/internal/vfs"
)

// engDev is a minimal export.Device over an engine, as the daemon's.
type engDev struct {
	be  *backend.File
	eng *ioengine.Engine
	// onSubmit, when set, sees every request before the engine does
	// (atomic: a test sets it while the replica runs).
	onSubmit atomic.Pointer[func(*export.Request)]
}

func (d *engDev) Info() export.Info {
	return export.Info{Name: "v", Size: d.be.Size(), CanMultiConn: true, MinBlock: 1, PrefBlock: 4096, MaxBlock: 32 << 20}
}
func (d *engDev) Submit(r *export.Request) {
	if f := d.onSubmit.Load(); f != nil {
		(*f)(r)
	}
	d.eng.Submit(r.Engine())
}
func (d *engDev) Extents(off, l int64) ([]backend.Extent, error) {
	return d.be.Extents(off, l)
}
func (d *engDev) Release() {}

type node struct {
	wrapBE func(backend.Backend) backend.Backend
	t      testing.TB
	dir    string
	path   string
	dev    *engDev
	r      *Replica
	set    Settings
	front  export.Device
	fs     vfs.FS     // metadata filesystem (nil: the real one)
	name   string     // volume name ("" : "v")
	lns    *Listeners // shared listeners (nil: its own)
}

func freeAddr(t testing.TB) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// testSecret is the shared secret of the tests' pairs (newNode gives it
// to settings that name none).
const testSecret = "driver-test-shared-secret"

func newNode(t testing.TB, dir string, size int64, set Settings, wrap func(backend.Backend) backend.Backend) *node {
	t.Helper()
	if set.SharedSecret == "" && set.SharedSecretFile == "" && !set.Insecure {
		set.SharedSecret = testSecret
	}
	return newNodeWith(&node{t: t, dir: dir, path: filepath.Join(dir, "vol.raw"), set: set, wrapBE: wrap}, size)
}

// newNodeWith starts n (with n.name, n.lns as set) on a new or existing
// volume file of size.
func newNodeWith(n *node, size int64) *node {
	t := n.t
	t.Helper()
	if n.set.SharedSecret == "" && n.set.SharedSecretFile == "" && !n.set.Insecure {
		n.set.SharedSecret = testSecret
	}
	if _, err := os.Stat(n.path); err != nil {
		if err := backend.CreateFile(n.path, size); err != nil {
			t.Fatal(err)
		}
	}
	n.start()
	return n
}

func (n *node) start() {
	n.t.Helper()
	be, err := backend.OpenFile(n.path, backend.CacheWriteback, false)
	if err != nil {
		n.t.Fatal(err)
	}
	var eb backend.Backend = be
	if n.wrapBE != nil {
		eb = n.wrapBE(be)
	}
	n.dev = &engDev{be: be, eng: ioengine.New(eb, ioengine.Config{})}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if testing.Verbose() {
		log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	name := n.name
	if name == "" {
		name = "v"
	}
	n.r, err = Start(Options{Name: name, Dir: filepath.Join(n.dir, "repl"), Device: n.dev, Settings: n.set, Logger: log, FS: n.fs, Listeners: n.lns})
	if err != nil {
		n.t.Fatal(err)
	}
	n.front = n.r.Wrap(n.dev)
}

func (n *node) stop() {
	n.r.Close()
	n.dev.eng.Close()
	n.dev.be.Close()
}

func (n *node) do(op ioengine.Op, off int64, data []byte, length int64) error {
	done := make(chan error, 1)
	n.front.Submit(&export.Request{Op: op, Offset: off, Length: length, Data: data, Done: func(r *export.Request) { done <- r.Err }})
	return <-done
}

func (n *node) write(off int64, data []byte) error {
	return n.do(export.OpWrite, off, data, int64(len(data)))
}

func (n *node) sum() [32]byte {
	b, err := os.ReadFile(n.path)
	if err != nil {
		n.t.Fatal(err)
	}
	return sha256.Sum256(b)
}

func waitFor(t testing.TB, what string, d time.Duration, f func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !f() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func pair(t *testing.T, size int64, proto string) (a, b *node) {
	return pairWith(t, size, Settings{Protocol: proto, Tick: msD(20), PingInterval: msD(100), PingTimeout: msD(2000), KoTimeout: msD(10000)}, nil, nil)
}

// pairWith starts primary a and secondary b; a dials b through via(bAddr)
// when via is set (a fault proxy), else directly.
func pairWith(t testing.TB, size int64, common Settings, via func(target string) string, wrapB func(backend.Backend) backend.Backend) (a, b *node) {
	aAddr, bAddr := freeAddr(t), freeAddr(t)
	base := t.TempDir()
	os.MkdirAll(filepath.Join(base, "a"), 0o755)
	os.MkdirAll(filepath.Join(base, "b"), 0o755)
	sa, sb := common, common
	sa.Listen, sa.Peer, sa.NodeID, sa.Role, sa.Dial = aAddr, bAddr, 1, "primary", "yes"
	sb.Listen, sb.Peer, sb.NodeID, sb.Role, sb.Dial = bAddr, aAddr, 2, "secondary", "no"
	if via != nil {
		sa.Peer = via(bAddr)
	}
	a = newNode(t, filepath.Join(base, "a"), size, sa, nil)
	b = newNode(t, filepath.Join(base, "b"), size, sb, wrapB)
	t.Cleanup(func() { a.stop(); b.stop() })
	return a, b
}

func connected(n *node) func() bool {
	return func() bool { c := n.r.Status().Conn; return c == "Connected" }
}

func pattern(seed byte, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed + byte(i*7)
	}
	return b
}

func TestReplicateProtocolC(t *testing.T) {
	a, b := pair(t, 16<<20, "C")
	waitFor(t, "connect", 10*time.Second, connected(a))
	waitFor(t, "connect", 10*time.Second, connected(b))
	for i := 0; i < 64; i++ {
		if err := a.write(int64(i)*12288, pattern(byte(i), 8192)); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.do(export.OpFlush, 0, nil, 0); err != nil {
		t.Fatal(err)
	}
	// Under protocol C a released FLUSH means both sides have applied
	// everything before it: the files are equal right now.
	if a.sum() != b.sum() {
		t.Fatal("replicas differ after a protocol C flush")
	}
	// The secondary refuses writes and exports read-only.
	if err := b.write(0, []byte{1}); err == nil {
		t.Fatal("secondary accepted a write")
	}
	if !b.front.Info().ReadOnly {
		t.Fatal("secondary not exported read-only")
	}
}

// The secondary must apply a stream of sequential 4 KiB writes
// as large merged writes. The engine's counters prove it.
func TestSecondaryMergesSequentialWrites(t *testing.T) {
	a, b := pair(t, 64<<20, "A")
	var more atomic.Int64
	count := func(r *export.Request) {
		if r.Op == export.OpWrite && r.More {
			more.Add(1)
		}
	}
	b.dev.onSubmit.Store(&count)
	waitFor(t, "connect", 10*time.Second, connected(a))
	const n = 2048
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		d := pattern(byte(i), 4096)
		off := int64(i) * 4096
		a.front.Submit(&export.Request{Op: export.OpWrite, Offset: off, Length: 4096, Data: d, Done: func(r *export.Request) { errs <- r.Err }})
	}
	for i := 0; i < n; i++ {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "secondary applied", 20*time.Second, func() bool {
		return b.dev.eng.Stats().Requests.Write >= n
	})
	st := b.dev.eng.Stats()
	t.Logf("secondary: %d write requests (%d with More), %d backend writes, merged %d, mean write %.0f bytes",
		st.Requests.Write, more.Load(), st.BackendOps.Write, st.Merged, st.MeanWriteSize())
	if st.BackendOps.Write*4 > st.Requests.Write {
		t.Fatalf("secondary did %d backend writes for %d requests: less than 4x merging", st.BackendOps.Write, st.Requests.Write)
	}
	// The secondary holds the stream's window: the applies it submits
	// while others are queued behind them say so (Request.More), so the
	// engine gathers by what is queued, not only by its timed backstop.
	// 2048 writes sent at once cannot all arrive one per batch.
	if more.Load() == 0 {
		t.Fatalf("none of the secondary's %d writes was submitted with More", st.Requests.Write)
	}
	waitFor(t, "equal", 10*time.Second, func() bool { return a.sum() == b.sum() })
}

func TestDisconnectResyncAndRestart(t *testing.T) {
	a, b := pair(t, 32<<20, "C")
	waitFor(t, "connect", 10*time.Second, connected(a))
	if err := a.write(0, pattern(1, 1<<20)); err != nil {
		t.Fatal(err)
	}
	// Link down (admin), writes while disconnected go to the bitmap.
	if err := b.r.Disconnect(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a notices", 10*time.Second, func() bool { return a.r.Status().Conn == "Connecting" })
	for i := 0; i < 8; i++ {
		if err := a.write(int64(4<<20)+int64(i)*(1<<20), pattern(byte(i+9), 64<<10)); err != nil {
			t.Fatal(err)
		}
	}
	oos := a.r.Status().OutOfSync
	if oos != 8*64<<10 {
		t.Fatalf("out of sync %d, want %d", oos, 8*64<<10)
	}
	// Restart the secondary (clean stop) and reconnect.
	b.stop()
	b.start()
	b.r.Connect()
	waitFor(t, "resync", 20*time.Second, func() bool { return connected(a)() && a.r.Status().OutOfSync == 0 })
	st := a.r.Status()
	t.Logf("resent %d bytes for %d out of sync", st.ResyncBytes, oos)
	if st.ResyncBytes > oos*11/10 {
		t.Fatalf("resent %d bytes, more than 1.1x the %d written while disconnected", st.ResyncBytes, oos)
	}
	a.do(export.OpFlush, 0, nil, 0)
	waitFor(t, "equal", 10*time.Second, func() bool { return a.sum() == b.sum() })
	if b.r.Status().Disk != "UpToDate" {
		t.Fatalf("secondary disk %s", b.r.Status().Disk)
	}
}

func TestPromoteRefusedWhilePeerPrimary(t *testing.T) {
	a, b := pair(t, 4<<20, "C")
	waitFor(t, "connect", 10*time.Second, connected(b))
	waitFor(t, "peer role", 10*time.Second, func() bool { return b.r.Status().PeerRole == "Primary" })
	if err := b.r.Promote(false); err == nil {
		t.Fatal("promotion allowed while the peer is primary and connected")
	}
	a.front.Release() // the test's client lets go of a first
	if err := a.r.Demote(false); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "peer demoted", 10*time.Second, func() bool { return b.r.Status().PeerRole == "Secondary" })
	if err := b.r.Promote(false); err != nil {
		t.Fatal(err)
	}
	if err := b.write(4096, bytes.Repeat([]byte{5}, 4096)); err != nil {
		t.Fatal(err)
	}
	b.do(export.OpFlush, 0, nil, 0)
	if a.sum() != b.sum() {
		t.Fatal(fmt.Sprintf("replicas differ after role switch"))
	}
	_ = repl.ChunkSize
}

// The second half of the replicated small-write case: a secondary whose disk is slow and whose data
// link is saturated must still answer pings (they travel on the control
// connection), so the pair never disconnects spuriously. The ping timeout
// here is 200 ms while the data backlog is seconds long.
func TestHeartbeatsUnderLoad(t *testing.T) {
	var px *faultproxy.Proxy
	via := func(target string) string {
		var err error
		px, err = faultproxy.New("127.0.0.1:0", target)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { px.Close() })
		return px.Addr()
	}
	slow := func(b backend.Backend) backend.Backend {
		return backendtest.NewDelay(b, 15*time.Millisecond, 15*time.Millisecond)
	}
	set := Settings{Protocol: "C", Tick: msD(10), PingInterval: msD(50), PingTimeout: msD(300), KoTimeout: msD(30000)}
	a, b := pairWith(t, 64<<20, set, via, slow)
	waitFor(t, "connect", 10*time.Second, connected(a))
	// 512 KiB/s per connection with 1 MiB writes: one data frame takes ~2 s
	// to cross, far longer than the 300 ms ping timeout, so only a ping on
	// its own connection keeps the pair together.
	px.SetBandwidth(512 << 10)

	errs := make(chan error, 64)
	inflight := 0
	var off int64
	deadline := time.Now().Add(4 * time.Second)
	for time.Now().Before(deadline) {
		for inflight < 4 {
			d := pattern(byte(off>>20), 1<<20)
			a.front.Submit(&export.Request{Op: export.OpWrite, Offset: off % (60 << 20), Length: int64(len(d)), Data: d, Done: func(r *export.Request) { errs <- r.Err }})
			off += 1 << 20
			inflight++
		}
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
		inflight--
	}
	for ; inflight > 0; inflight-- {
		<-errs
	}
	sa, sb := a.r.Status(), b.r.Status()
	t.Logf("wrote %d KiB under load; disconnects a=%d b=%d, last errors %q %q", off>>10, sa.Disconnects, sb.Disconnects, sa.LastError, sb.LastError)
	if sa.Disconnects != 0 || sb.Disconnects != 0 || sa.Conn != "Connected" {
		t.Fatalf("spurious disconnect under load: a=%+v", sa)
	}
	if off < 1<<20 {
		t.Fatalf("only %d bytes written: the load did not run", off)
	}
}

func pairB(b *testing.B, size int64) (*node, *node) {
	proto := os.Getenv("REPL_PROTO")
	if proto == "" {
		proto = "C"
	}
	a, s := pairWith(b, size, Settings{Protocol: proto, Tick: msD(20), PingInterval: msD(100), PingTimeout: msD(2000), KoTimeout: msD(10000)}, nil, nil)
	waitFor(b, "connect", 20*time.Second, connected(a))
	return a, s
}

// Resync rate control and progress: with a 4 MiB/s resync rate, 8 MiB out
// of sync takes about two seconds, during which status shows SyncSource
// with a percentage, a measured rate and an ETA.
func TestResyncRateAndProgress(t *testing.T) {
	a, b := pairWith(t, 32<<20, Settings{Protocol: "C", Tick: msD(20), PingInterval: msD(100), PingTimeout: msD(2000), KoTimeout: msD(10000), ResyncRate: 4 << 20}, nil, nil)
	// Wait for the initial sync to have finished on both sides (a's
	// out-of-sync count is also 0 just before the handshake decides).
	waitFor(t, "connect", 10*time.Second, func() bool {
		return connected(a)() && a.r.Status().OutOfSync == 0 && b.r.Status().Disk == "UpToDate" && a.r.Status().PeerDisk == "UpToDate"
	})
	if err := b.r.Disconnect(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a notices", 10*time.Second, func() bool { return a.r.Status().Conn == "Connecting" })
	for i := 0; i < 8; i++ {
		if err := a.write(int64(i)<<20, pattern(byte(i), 1<<20)); err != nil {
			t.Fatal(err)
		}
	}
	b.r.Connect()
	start := time.Now()
	var seen Status
	waitFor(t, "resync", 30*time.Second, func() bool {
		st := a.r.Status()
		if st.Conn == "SyncSource" && st.ETASeconds > 0 && seen.ETASeconds == 0 {
			seen = st
		}
		return st.Conn == "Connected" && st.OutOfSync == 0
	})
	took := time.Since(start)
	t.Logf("8 MiB resynced in %v at 4 MiB/s; mid-resync status: %.0f%% done, %.1f MB/s, ETA %.1fs", took, seen.SyncPct, seen.SyncRate/1e6, seen.ETASeconds)
	if seen.ETASeconds == 0 || seen.SyncPct <= 0 || seen.SyncTotal != 8<<20 {
		t.Fatalf("no progress/ETA seen during resync: %+v", seen)
	}
	// A lower bound only: the rate limit must have slowed it down.
	if took < 1200*time.Millisecond {
		t.Fatalf("8 MiB resynced in %v despite a 4 MiB/s limit", took)
	}
	a.do(export.OpFlush, 0, nil, 0)
	waitFor(t, "equal", 10*time.Second, func() bool { return a.sum() == b.sum() })
}

// A secondary that already holds data at its first start is not assumed
// equal to the primary: the handshake refuses (unrelated data) instead.
func TestSecondaryWithDataIsNotAssumedFresh(t *testing.T) {
	aAddr, bAddr := freeAddr(t), freeAddr(t)
	base := t.TempDir()
	for _, d := range []string{"a", "b"} {
		os.MkdirAll(filepath.Join(base, d), 0o755)
	}
	bPath := filepath.Join(base, "b", "vol.raw")
	if err := backend.CreateFile(bPath, 8<<20); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(bPath, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteAt(pattern(3, 4096), 1<<20)
	f.Close()
	common := Settings{Protocol: "C", Tick: msD(20), PingInterval: msD(100), PingTimeout: msD(2000), KoTimeout: msD(10000)}
	sa, sb := common, common
	sa.Listen, sa.Peer, sa.NodeID, sa.Role, sa.Dial = aAddr, bAddr, 1, "primary", "yes"
	sb.Listen, sb.Peer, sb.NodeID, sb.Role, sb.Dial = bAddr, aAddr, 2, "secondary", "no"
	a := newNode(t, filepath.Join(base, "a"), 8<<20, sa, nil)
	b := newNode(t, filepath.Join(base, "b"), 8<<20, sb, nil)
	t.Cleanup(func() { a.stop(); b.stop() })
	waitFor(t, "refusal", 30*time.Second, func() bool {
		return a.r.Status().Conn == "StandAlone" && b.r.Status().Conn == "StandAlone"
	})
	if d := b.r.Status().Decision; d != "unrelated" {
		t.Fatalf("decision %q, want unrelated", d)
	}
}

// Protocol A answers a write once it is locally durable, possibly before
// the payload is on the socket. Front ends recycle a write's buffer once
// it is answered (the NBD server pools them), so the stream must not send
// the client's buffer: here every buffer is scribbled over the moment its
// write is answered, and the secondary must still end up with the data
// that was written.
func TestProtocolABufferReuseAfterReply(t *testing.T) {
	a, b := pair(t, 64<<20, "A")
	waitFor(t, "connect", 10*time.Second, connected(a))
	const n, qd, size = 48, 8, 1 << 20
	errs := make(chan error, n)
	sem := make(chan struct{}, qd)
	for i := 0; i < n; i++ {
		sem <- struct{}{}
		buf := pattern(byte(i+1), size)
		a.front.Submit(&export.Request{Op: export.OpWrite, Offset: int64(i) * size, Length: size, Data: buf,
			Done: func(r *export.Request) {
				for j := range r.Data {
					r.Data[j] = 0xEE // what a recycled buffer's next user writes
				}
				errs <- r.Err
				<-sem
			}})
	}
	for i := 0; i < n; i++ {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if err := a.do(export.OpFlush, 0, nil, 0); err != nil {
		t.Fatal(err)
	}
	// Protocol A: the secondary catches up asynchronously.
	deadline := time.Now().Add(15 * time.Second)
	for a.sum() != b.sum() {
		if time.Now().After(deadline) {
			t.Fatal("secondary differs from primary: it received recycled buffers, not the data written")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A client held back by protocol A's send budget toward a peer that reads
// nothing (frozen) must go as soon as the link is dropped, not after the
// drain timeout: its write then goes local-only.
func TestSendBudgetWaiterFreedOnDrop(t *testing.T) {
	c1, c2 := net.Pipe() // c2 never read: every write blocks, like a frozen peer
	defer c1.Close()
	defer c2.Close()
	s := newSender(c1, func(error) {})
	s.push(repl.Message{Type: repl.MsgData, Op: repl.OpWrite, Length: 1 << 20, Data: make([]byte, 1<<20)})
	s.push(repl.Message{Type: repl.MsgData, Op: repl.OpWrite, Length: 1 << 20, Data: make([]byte, 1<<20)})
	done := make(chan struct{})
	go func() { s.waitBelow(1 << 10); close(done) }()
	select {
	case <-done:
		t.Fatal("waitBelow returned with the budget exceeded")
	case <-time.After(100 * time.Millisecond):
	}
	s.drainClose() // what link.close does first
	select {
	case <-done:
	case <-time.After(time.Second):
		t.Fatal("client still waiting for a dropped link's queue to drain")
	}
	s.close()
}

// Demote is refused while a client holds the volume open (a wrapped
// device not released), like DRBD's "Device is held open"; force demotes
// anyway and the client's next write fails.
func TestDemoteRefusedWhileHeldOpen(t *testing.T) {
	a, _ := pair(t, 8<<20, "C")
	waitFor(t, "connected", 10*time.Second, connected(a))
	a.front.Release()     // the harness's own client; use one of our own
	cl := a.r.Wrap(a.dev) // what the NBD server holds per connection
	if err := a.r.Demote(false); !errors.Is(err, ErrHeldOpen) {
		t.Fatalf("demote with a client holding the volume: %v, want ErrHeldOpen", err)
	}
	if a.r.Status().Role != "Primary" {
		t.Fatal("demoted although refused")
	}
	cl.Release()
	cl.Release() // a second release must not count twice
	if n := a.r.Opens(); n != 0 {
		t.Fatalf("opens %d after release", n)
	}
	if err := a.r.Demote(false); err != nil {
		t.Fatalf("demote without clients: %v", err)
	}
	if err := a.r.Promote(false); err != nil {
		t.Fatal(err)
	}
	cl = a.r.Wrap(a.dev)
	defer cl.Release()
	if err := a.r.Demote(true); err != nil {
		t.Fatalf("forced demote: %v", err)
	}
	done := make(chan error, 1)
	cl.Submit(&export.Request{Op: export.OpWrite, Offset: 0, Length: 4096, Data: make([]byte, 4096),
		Done: func(q *export.Request) { done <- q.Err }})
	if err := <-done; !errors.Is(err, syscall.EROFS) {
		t.Fatalf("write after forced demote: %v, want EROFS", err)
	}
}

// A holder that follows roles (an ALUA-aware iSCSI logical unit, which the
// daemon drains before the demote) does not block Demote; a plain client
// (NBD) next to it still does.
func TestDemoteWithRoleFollowingHolder(t *testing.T) {
	a, _ := pair(t, 8<<20, "C")
	waitFor(t, "connected", 10*time.Second, connected(a))
	a.front.Release()
	lu := a.r.Wrap(a.dev)
	defer lu.Release()
	lu.(export.RoleFollower).FollowRoles()
	lu.(export.RoleFollower).FollowRoles() // idempotent
	nbd := a.r.Wrap(a.dev)
	if err := a.r.Demote(false); !errors.Is(err, ErrHeldOpen) {
		t.Fatalf("demote with an NBD-like client: %v, want ErrHeldOpen", err)
	}
	nbd.Release()
	if n := a.r.Opens(); n != 0 {
		t.Fatalf("opens %d with only a role follower", n)
	}
	if err := a.r.Demote(false); err != nil {
		t.Fatalf("demote with only a role-following holder: %v", err)
	}
	lu.Release() // after FollowRoles: must not count again
	if n := a.r.Opens(); n != 0 {
		t.Fatalf("opens %d after the follower's release", n)
	}
}
