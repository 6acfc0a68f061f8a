package repl_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/vmsan/vmsan/internal/daemon"
	"github.com/vmsan/vmsan/internal/nbd/client"
	"github.com/vmsan/vmsan/internal/nbd/proto"
	"github.com/vmsan/vmsan/internal/repl/driver"
	"github.com/vmsan/vmsan/internal/testutil/faultproxy"
)

// The fault loop (issue 7): two real `vmsan serve` processes replicating
// one volume (protocol C) through a fault proxy, a verifying writer on the
// current primary's NBD export, and one fault per round. After each round:
//
//   - no acknowledged write lost: every block reads back as the last write
//     the writer saw acknowledged there (or as a write whose outcome the
//     client never learned, when its server was killed under it);
//   - the replicas byte-equal (sha256 of both raw files) once both sides'
//     status says Connected, UpToDate, nothing out of sync;
//   - no client error, except on the client of a killed primary, which
//     carries on against the promoted secondary;
//   - the slowest acknowledged write ≤ ping timeout + 1 s (item 2);
//
// and at the end, SIGTERM drains each process, with the writer running, in
// under 5 s (once after SIGTERM of the secondary, once after kill -9 of
// it). A table of rounds (fault, convergence time, resync bytes, handshake
// decision, writes, slowest write, result) is logged; docs/replication.md
// "Fault loop" holds a recorded run.
//
// Plain `go test` runs ciRotation (10 rounds, every fault at least once at
// full duration, ~2.5 min). `make soak` (VMSAN_SOAK=1) runs 100 rounds of
// soakRotation (~25 min). VMSAN_SOAK_ROUNDS=N overrides the count,
// VMSAN_SOAK_FAULTS=a,b,... the rotation (fault names as in the table),
// VMSAN_SOAK_SEED the seed of the random warm-up before each fault.

// Replication timing for the loop: a tick of 100 ms, pings every 0.5 s, a
// peer silent for 2 s is dropped and so is one that leaves a write
// unacknowledged for 2 s. Short, so rounds are short; the bound on
// the slowest write is ping timeout + 1 s.
const (
	soakTickMs     = 100
	soakPingTicks  = 5
	soakTimeoutTks = 20
	soakPingTO     = soakTimeoutTks * soakTickMs * time.Millisecond
	soakMaxWrite   = soakPingTO + time.Second
	soakDrainMax   = 5 * time.Second
	soakVolSize    = 64 << 20
)

type soakFault struct {
	name  string
	apply func(s *soak) // injects the fault, waits, restores
}

func killSecondary(down time.Duration) soakFault {
	return soakFault{fmt.Sprintf("kill9-secondary-%s", down), func(s *soak) {
		s.sec.kill9()
		s.restarted[s.sec] = true
		s.sleep(down)
		s.sec.start()
	}}
}

func stopSecondary(d time.Duration) soakFault {
	return soakFault{fmt.Sprintf("sigstop-secondary-%s", d), func(s *soak) {
		s.sec.cmd.Process.Signal(syscall.SIGSTOP)
		s.stopped.Store(s.sec)
		s.sleep(d)
		s.sec.cmd.Process.Signal(syscall.SIGCONT)
		s.stopped.Store(nil)
	}}
}

var linkReset = soakFault{"link-reset", func(s *soak) { s.px.Reset() }}

func blackhole(d time.Duration) soakFault {
	return soakFault{fmt.Sprintf("link-blackhole-%s", d), func(s *soak) {
		s.px.Blackhole(true)
		s.sleep(d)
		s.px.Blackhole(false)
	}}
}

// kill -9 of the primary, promote the secondary, move the writer over,
// restart the old primary (it comes back secondary and resyncs); the roles
// stay swapped for the following rounds.
var killPrimaryPromote = soakFault{"kill9-primary-promote", func(s *soak) {
	old, nw := s.pri, s.sec
	s.w.expectFailure()
	old.kill9()
	s.restarted[old] = true
	s.waitFor(fmt.Sprintf("%s notices its primary is gone", nw.name), 15*time.Second, func() (bool, string) {
		st, err := tryStatus(nw)
		return err == nil && st.Conn != "Connected", fmt.Sprintf("%+v %v", st, err)
	})
	s.waitFor(fmt.Sprintf("promote %s", nw.name), 15*time.Second, func() (bool, string) {
		err := nw.admin("promote")
		return err == nil, fmt.Sprint(err)
	})
	c := s.dial(nw)
	s.w.swap(c)
	s.pri, s.sec = nw, old
	old.start()
}}

// ciRotation: every fault at least once with its full duration (none is
// shortened for CI), kill -9 and SIGSTOP of the secondary once with each
// node as secondary (rounds 6-8 run with the roles swapped by round 5's
// promotion, round 9 swaps them back), SIGSTOP twice since a frozen
// secondary is the failure mode that matters most. About 2 minutes of faults plus
// convergence; 2-2.5 min in all on the shared 2-core machine.
var ciRotation = []soakFault{
	killSecondary(3 * time.Second),
	linkReset,
	stopSecondary(20 * time.Second),
	blackhole(10 * time.Second),
	killPrimaryPromote,
	killSecondary(30 * time.Second),
	stopSecondary(20 * time.Second),
	linkReset,
	killPrimaryPromote,
	killSecondary(3 * time.Second),
}

var soakRotation = []soakFault{
	killSecondary(3 * time.Second),
	killSecondary(30 * time.Second),
	stopSecondary(20 * time.Second),
	linkReset,
	blackhole(10 * time.Second),
	killPrimaryPromote,
}

type soakRow struct {
	round  int
	fault  string
	conv   time.Duration
	resync int64 // resync data sent (both nodes)
	// resync sent as zero ranges (no payload: holes, all-zero chunks)
	resyncZero int64
	decision   string // the primary's last handshake decision
	writes     int64
	maxWrite   time.Duration
	result     string
}

type soak struct {
	t        *testing.T
	pri, sec *node
	px       *faultproxy.Proxy
	w        *soakWriter
	rng      *rand.Rand
	rows     []soakRow
	// Per round: nodes restarted (their status counters start from 0).
	restarted map[*node]bool
	before    map[*node]driver.Status // counters at the round's start
	stopped   atomic.Pointer[node]    // SIGSTOPped now: SIGCONT in cleanup
}

func TestFaultLoopSoak(t *testing.T) {
	need(t, "qemu-io")
	rotation, rounds := ciRotation, len(ciRotation)
	if os.Getenv("VMSAN_SOAK") != "" {
		rotation, rounds = soakRotation, 100
	}
	if v := os.Getenv("VMSAN_SOAK_FAULTS"); v != "" {
		rotation = nil
		all := append(append([]soakFault{}, soakRotation...), ciRotation...)
		for _, name := range strings.Split(v, ",") {
			found := false
			for _, f := range all {
				if f.name == name {
					rotation, found = append(rotation, f), true
					break
				}
			}
			if !found {
				t.Fatalf("VMSAN_SOAK_FAULTS: unknown fault %q", name)
			}
		}
	}
	if v := os.Getenv("VMSAN_SOAK_ROUNDS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("VMSAN_SOAK_ROUNDS=%q", v)
		}
		rounds = n
	}
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv("VMSAN_SOAK_SEED"); v != "" {
		var err error
		if seed, err = strconv.ParseUint(v, 10, 64); err != nil {
			t.Fatalf("VMSAN_SOAK_SEED=%q", v)
		}
	}
	t.Logf("fault loop: %d rounds, seed %d (VMSAN_SOAK_SEED to repeat the warm-ups), ping timeout %v, slowest write allowed %v",
		rounds, seed, soakPingTO, soakMaxWrite)

	s := newSoak(t, seed)
	defer func() { t.Logf("fault loop results:\n%s", s.table()) }()
	for i := range rounds {
		s.round(i+1, rotation[i%len(rotation)])
	}
	s.drain(false)
	s.drain(true)
}

func newSoak(t *testing.T, seed uint64) *soak {
	base := t.TempDir()
	a := &node{t: t, name: "a", dir: filepath.Join(base, "a"), nbd: freeAddr(t), replAddr: freeAddr(t)}
	b := &node{t: t, name: "b", dir: filepath.Join(base, "b"), nbd: freeAddr(t), replAddr: freeAddr(t)}
	px, err := faultproxy.New("127.0.0.1:0", b.replAddr)
	if err != nil {
		t.Fatal(err)
	}
	s := &soak{t: t, pri: a, sec: b, px: px, rng: rand.New(rand.NewPCG(seed, 7))}
	// Cleanup: never leave a process behind or a wait hanging. SIGCONT a
	// frozen node first; give each SIGTERM 5 s, then SIGKILL (which also
	// fails any NBD request the writer still has in flight, so its
	// goroutines return). On failure, the logs of both processes go into
	// the test log.
	t.Cleanup(func() {
		if n := s.stopped.Load(); n != nil {
			n.cmd.Process.Signal(syscall.SIGCONT)
		}
		for _, n := range []*node{a, b} {
			if n.cmd == nil {
				continue
			}
			n.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-n.exited:
			case <-time.After(soakDrainMax):
				t.Logf("%s: no exit 5 s after SIGTERM in cleanup: SIGKILL", n.name)
				n.cmd.Process.Signal(syscall.SIGKILL)
				<-n.exited
			}
		}
		px.Close()
		if s.w != nil {
			s.w.abort()
		}
		if t.Failed() {
			for _, n := range []*node{a, b} {
				b, _ := os.ReadFile(filepath.Join(n.dir, "serve.log"))
				t.Logf("%s serve.log (last 150 lines):\n%s", n.name, tail(string(b), 150))
			}
		}
	})
	common := []string{"--tick-ms", strconv.Itoa(soakTickMs), "--ping-interval", strconv.Itoa(soakPingTicks),
		"--ping-timeout", strconv.Itoa(soakTimeoutTks), "--ko-ticks", strconv.Itoa(soakTimeoutTks),
		"--al-retire-ticks", "10", "--protocol", "C", "--shared-secret-file", secretFile(t, t.TempDir(), pairSecret)}
	for _, n := range []*node{a, b} {
		os.MkdirAll(n.dir, 0o755)
		n.run("volume", "create", volName, "--size", strconv.Itoa(soakVolSize))
	}
	// a always dials b through the proxy, whatever the roles become.
	a.run(append([]string{"repl", "configure", volName, "--listen", a.replAddr, "--peer", px.Addr(), "--dial", "yes", "--role", "primary"}, common...)...)
	b.run(append([]string{"repl", "configure", volName, "--listen", b.replAddr, "--peer", a.replAddr, "--dial", "no", "--role", "secondary"}, common...)...)
	a.start()
	b.start()
	s.waitSynced(60 * time.Second)
	s.w = newSoakWriter(soakVolSize, 8, seed)
	return s
}

// sleep is time.Sleep; named so the fault code reads as a schedule.
func (s *soak) sleep(d time.Duration) { time.Sleep(d) }

// waitFor polls f every 50 ms until it holds; on timeout the test fails
// with what and f's last description.
func (s *soak) waitFor(what string, d time.Duration, f func() (bool, string)) {
	s.t.Helper()
	deadline := time.Now().Add(d)
	for {
		ok, desc := f()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("round %d: timed out after %v: %s: %s", len(s.rows)+1, d, what, desc)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// tryStatus is node.status without failing the test (a node may be down),
// bounded in time (a daemon that stopped answering must not hang the test).
func tryStatus(n *node) (driver.Status, error) {
	type res struct {
		st  driver.Status
		err error
	}
	ch := make(chan res, 1)
	go func() {
		c, err := daemon.Dial(n.dir)
		if err != nil {
			ch <- res{err: err}
			return
		}
		defer c.Close()
		var st []driver.Status
		if err := c.Do("GET", "/v1/repl", nil, &st); err != nil {
			ch <- res{err: err}
			return
		}
		if len(st) != 1 {
			ch <- res{err: fmt.Errorf("%d volumes in repl status", len(st))}
			return
		}
		ch <- res{st: st[0]}
	}()
	select {
	case r := <-ch:
		return r.st, r.err
	case <-time.After(10 * time.Second):
		return driver.Status{}, fmt.Errorf("%s: repl status not answered in 10 s", n.name)
	}
}

func synced(st driver.Status) bool {
	return st.Conn == "Connected" && st.Disk == "UpToDate" && st.OutOfSync == 0
}

// converge polls both sides until in sync and returns the time since
// from, or after d a description of where they are stuck.
func (s *soak) converge(from time.Time, d time.Duration) (time.Duration, string) {
	deadline := from.Add(d)
	for {
		sp, errp := tryStatus(s.pri)
		ss, errs := tryStatus(s.sec)
		// In sync again after the fault, not before it registered: the
		// primary has seen its peer go (a link reset is over as soon as
		// it is injected, before the nodes notice it).
		noticed := s.restarted[s.pri] || sp.Disconnects > s.before[s.pri].Disconnects
		if errp == nil && errs == nil && noticed && synced(sp) && synced(ss) {
			return time.Since(from), ""
		}
		if time.Now().After(deadline) {
			return time.Since(from), fmt.Sprintf("not in sync (after a disconnect: %v) %v after the fault ended:\n primary %s=%+v %v\n secondary %s=%+v %v",
				noticed, d, s.pri.name, sp, errp, s.sec.name, ss, errs)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func orNone(s string) string {
	if s == "" {
		return "ok"
	}
	return s
}

func (s *soak) waitSynced(d time.Duration) {
	s.t.Helper()
	s.waitFor("replicas Connected, UpToDate, nothing out of sync", d, func() (bool, string) {
		sp, errp := tryStatus(s.pri)
		ss, errs := tryStatus(s.sec)
		ok := errp == nil && errs == nil && synced(sp) && synced(ss) && sp.Role == "Primary" && ss.Role == "Secondary"
		return ok, fmt.Sprintf("\n primary %s=%+v %v\n secondary %s=%+v %v", s.pri.name, sp, errp, s.sec.name, ss, errs)
	})
}

// dial opens an NBD client on n's export (bounded by the client's dial
// timeout).
func (s *soak) dial(n *node) *client.Conn {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, n.uri(), &client.Options{Connections: 1})
	if err != nil {
		s.t.Fatalf("round %d: NBD client on %s: %v", len(s.rows)+1, n.name, err)
	}
	if !c.Export().Has(proto.FlagSendFUA) {
		s.t.Fatalf("%s does not offer FUA: acknowledged writes would not be durable", n.name)
	}
	return c
}

// bounded runs f, failing the test if it takes longer than d (f's goroutine
// is left behind; cleanup kills the servers, which ends it).
func (s *soak) bounded(what string, d time.Duration, f func() error) {
	s.t.Helper()
	ch := make(chan error, 1)
	go func() { ch <- f() }()
	select {
	case err := <-ch:
		if err != nil {
			s.t.Fatalf("round %d: %s: %v", len(s.rows)+1, what, err)
		}
	case <-time.After(d):
		s.t.Fatalf("round %d: %s: no answer in %v", len(s.rows)+1, what, d)
	}
}

// counters snapshots both nodes' status counters (a node that does not
// answer is left out).
func (s *soak) counters() map[*node]driver.Status {
	m := map[*node]driver.Status{}
	for _, n := range []*node{s.pri, s.sec} {
		if st, err := tryStatus(n); err == nil {
			m[n] = st
		}
	}
	return m
}

// resynced is what both nodes sent as resync (data and zero ranges) since
// the snapshot before; a node restarted since counts from its start.
func (s *soak) resynced(before map[*node]driver.Status) (data, zero int64) {
	for n, st := range s.counters() {
		d, z := st.ResyncBytes, st.ResyncZeroBytes
		if b, ok := before[n]; ok && !s.restarted[n] {
			d, z = d-b.ResyncBytes, z-b.ResyncZeroBytes
		}
		data, zero = data+d, zero+z
	}
	return data, zero
}

func (s *soak) round(i int, f soakFault) {
	t := s.t
	row := soakRow{round: i, fault: f.name}
	s.restarted = map[*node]bool{}
	before := s.counters()
	s.before = before
	c := s.dial(s.pri)
	s.w.start(c)
	// A random warm-up, so the fault lands at a different point of the
	// write stream each round.
	s.sleep(300*time.Millisecond + time.Duration(s.rng.IntN(1200))*time.Millisecond)
	f.apply(s)
	restored := time.Now()
	c = s.w.current() // the promoted primary's, after kill9-primary-promote
	// Convergence is timed with the writer still running: the resync
	// competes with application writes, as it would in production.
	conv, convErr := s.converge(restored, 60*time.Second)
	// Keep writing at least 1 s past the restore (through the resync).
	s.sleep(time.Second - time.Since(restored))
	res := s.w.stop(20 * time.Second)
	row.writes, row.maxWrite, row.conv = res.writes, res.maxLat, conv
	if res.stuck != "" || convErr != "" {
		s.rows = append(s.rows, withResult(row, "FAIL: writes never answered or no convergence"))
		t.Fatalf("round %d (%s): writer: %s\nconvergence: %s", i, f.name, orNone(res.stuck), orNone(convErr))
	}
	s.waitSynced(60 * time.Second)
	row.resync, row.resyncZero = s.resynced(before)
	if st, err := tryStatus(s.pri); err == nil {
		row.decision = st.Decision
	}
	var fails []string
	if res.errors > 0 {
		fails = append(fails, fmt.Sprintf("%d client errors", res.errors))
		t.Errorf("round %d (%s): %d write errors on the client, first: %s", i, f.name, res.errors, res.firstErr)
	}
	if res.maxLat > soakMaxWrite {
		fails = append(fails, fmt.Sprintf("slowest write %v", res.maxLat.Round(time.Millisecond)))
		t.Errorf("round %d (%s): slowest acknowledged write took %v > ping timeout + 1 s = %v (%s)",
			i, f.name, res.maxLat.Round(time.Millisecond), soakMaxWrite, res.maxLatDesc)
	}
	if res.writes == 0 {
		fails = append(fails, "no write acknowledged")
		t.Errorf("round %d (%s): no write was acknowledged", i, f.name)
	}
	// Every write goes out with FUA; the flush only makes sure nothing
	// cached (e.g. a write-back engine) is left out of the raw files.
	s.bounded("flush", 30*time.Second, c.Flush)
	s.waitSynced(30 * time.Second)
	if lost := s.w.verify(s, c); lost != "" {
		fails = append(fails, "acknowledged writes lost")
		t.Errorf("round %d (%s): read back from primary %s: %s", i, f.name, s.pri.name, lost)
	}
	if sp, ss := s.pri.rawSum(), s.sec.rawSum(); sp != ss {
		fails = append(fails, "replicas differ")
		t.Errorf("round %d (%s): in sync by status, but the raw files differ: %s %x, %s %x", i, f.name, s.pri.name, sp[:8], s.sec.name, ss[:8])
	}
	s.w.closeConns()
	row.result = "ok"
	if len(fails) > 0 {
		row.result = "FAIL: " + strings.Join(fails, ", ")
	}
	s.rows = append(s.rows, row)
	t.Logf("round %d %-26s converged in %6.2fs, resync %s + %s zero (%s), %d writes, slowest %v: %s",
		i, f.name, row.conv.Seconds(), mib(row.resync), mib(row.resyncZero), row.decision, row.writes, row.maxWrite.Round(time.Millisecond), row.result)
}

func withResult(r soakRow, res string) soakRow { r.result = res; return r }

// drain: SIGTERM the secondary (or, with kill9, kill -9 it: the primary
// then drains with writes it had pending on a dead peer, item 1), then
// SIGTERM the primary, each with the writer running on the primary; each
// SIGTERM must be done within 5 s. The primary's writes may fail once it
// is told to stop (its client is the one being shut out); then both
// restart and every write acknowledged before is checked.
func (s *soak) drain(kill9 bool) {
	t := s.t
	row := soakRow{round: len(s.rows) + 1, fault: "sigterm-drain"}
	if kill9 {
		row.fault = "kill9-secondary+sigterm-primary"
	}
	s.restarted = map[*node]bool{s.pri: true, s.sec: true}
	c := s.dial(s.pri)
	s.w.start(c)
	s.sleep(500 * time.Millisecond)
	var fails []string
	term := func(n *node) time.Duration {
		start := time.Now()
		n.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-n.exited:
		case <-time.After(30 * time.Second):
			fails = append(fails, n.name+" did not exit in 30 s")
			s.rows = append(s.rows, withResult(row, "FAIL: "+strings.Join(fails, ", ")))
			t.Fatalf("drain: %s (%s) still running 30 s after SIGTERM", n.name, map[bool]string{true: "primary", false: "secondary"}[n == s.pri])
		}
		return time.Since(start)
	}
	var dsec time.Duration
	if kill9 {
		s.sec.kill9()
	} else {
		dsec = term(s.sec)
	}
	s.sleep(500 * time.Millisecond)
	s.w.expectFailure()
	dpri := term(s.pri)
	res := s.w.stop(20 * time.Second)
	row.writes, row.maxWrite = res.writes, res.maxLat
	if kill9 {
		t.Logf("%s: secondary %s killed, primary %s exited %v after SIGTERM (writer running)", row.fault, s.sec.name, s.pri.name, dpri.Round(time.Millisecond))
	} else {
		t.Logf("%s: secondary %s exited %v after SIGTERM, primary %s %v (writer running)", row.fault, s.sec.name, dsec.Round(time.Millisecond), s.pri.name, dpri.Round(time.Millisecond))
	}
	for _, d := range []struct {
		who string
		d   time.Duration
	}{{"secondary", dsec}, {"primary", dpri}} {
		if d.d > soakDrainMax {
			fails = append(fails, fmt.Sprintf("%s drain %v", d.who, d.d.Round(time.Millisecond)))
			t.Errorf("%s: SIGTERM of the %s took %v > %v", row.fault, d.who, d.d.Round(time.Millisecond), soakDrainMax)
		}
	}
	if res.stuck != "" {
		fails = append(fails, "writes never answered")
		s.rows = append(s.rows, withResult(row, "FAIL: "+strings.Join(fails, ", ")))
		t.Fatalf("%s: writes never answered: %s", row.fault, res.stuck)
	}
	if res.errors > 0 {
		fails = append(fails, fmt.Sprintf("%d client errors", res.errors))
		t.Errorf("%s: %d write errors before the primary was stopped, first: %s", row.fault, res.errors, res.firstErr)
	}
	if res.maxLat > soakMaxWrite {
		fails = append(fails, fmt.Sprintf("slowest write %v", res.maxLat.Round(time.Millisecond)))
		t.Errorf("%s: slowest acknowledged write %v > %v (%s)", row.fault, res.maxLat.Round(time.Millisecond), soakMaxWrite, res.maxLatDesc)
	}
	restart := time.Now()
	s.pri.start()
	s.sec.start()
	s.waitSynced(60 * time.Second)
	row.conv = time.Since(restart)
	row.resync, row.resyncZero = s.resynced(nil)
	if st, err := tryStatus(s.pri); err == nil {
		row.decision = st.Decision
	}
	c = s.dial(s.pri)
	if lost := s.w.verify(s, c); lost != "" {
		fails = append(fails, "acknowledged writes lost")
		t.Errorf("%s: after restart, read back from %s: %s", row.fault, s.pri.name, lost)
	}
	if sp, ss := s.pri.rawSum(), s.sec.rawSum(); sp != ss {
		fails = append(fails, "replicas differ")
		t.Errorf("%s: after restart in sync by status, but the raw files differ", row.fault)
	}
	c.Close()
	row.result = fmt.Sprintf("ok (SIGTERM to exit: secondary %.2f s, primary %.2f s)", dsec.Seconds(), dpri.Seconds())
	if kill9 {
		row.result = fmt.Sprintf("ok (SIGTERM to exit: primary %.2f s)", dpri.Seconds())
	}
	if len(fails) > 0 {
		row.result = "FAIL: " + strings.Join(fails, ", ")
	}
	s.rows = append(s.rows, row)
}

func mib(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }

func (s *soak) table() string {
	var b strings.Builder
	fmt.Fprintf(&b, "| round | fault | convergence | resync data | resync zero | decision | writes | slowest write | result |\n")
	fmt.Fprintf(&b, "| ---: | --- | ---: | ---: | ---: | --- | ---: | ---: | --- |\n")
	for _, r := range s.rows {
		conv := "-"
		if r.conv > 0 {
			conv = fmt.Sprintf("%.2f s", r.conv.Seconds())
		}
		fmt.Fprintf(&b, "| %d | %s | %s | %s | %s | %s | %d | %d ms | %s |\n", r.round, r.fault, conv, mib(r.resync), mib(r.resyncZero), r.decision, r.writes, r.maxWrite.Milliseconds(), r.result)
	}
	return b.String()
}

// ---- the verifying writer ----

// Every block of soakBlock bytes written carries a header (magic, block
// index, write sequence number) and a body derived from both, so a read
// tells which write put it there: a lost write reads as an older sequence
// number (or zeroes), a misplaced one as another index, a corrupt one as
// neither.
const (
	soakBlock = 4096
	soakMagic = "VMSOAK01"
)

func fillBlock(b []byte, idx int, seq uint64) {
	copy(b, soakMagic)
	binary.LittleEndian.PutUint64(b[8:], uint64(idx))
	binary.LittleEndian.PutUint64(b[16:], seq)
	x := seq*0x9E3779B97F4A7C15 ^ uint64(idx)<<20 | 1
	for i := 24; i+8 <= len(b); i += 8 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		binary.LittleEndian.PutUint64(b[i:], x)
	}
}

// blockRec is what the writer knows of one block: the sequence number of
// the last acknowledged write (0: never written) and those of later writes
// whose outcome the client never learned (their server died under them):
// the block may hold any of these, nothing else.
type blockRec struct {
	acked uint64
	maybe []uint64
}

type inflight struct {
	idx, n int
	seq    uint64
	start  time.Time
}

type writerResult struct {
	writes     int64
	errors     int64
	firstErr   string
	maxLat     time.Duration
	maxLatDesc string
	stuck      string
}

// soakWriter runs `workers` goroutines, each owning two ranges of blocks
// (one hot, one cold) and keeping one write (1-16 blocks, FUA) in flight at a time, so
// per block writes are ordered and the record above is exact. Eight
// workers: eight writes in flight at any time, so a disconnect always
// finds several pending (item 1 lost every other one).
type soakWriter struct {
	blocks, workers int
	recs            []blockRec // worker w alone touches its range while running
	seq             atomic.Uint64
	seed            uint64

	mu       sync.Mutex
	conn     *client.Conn
	changed  chan struct{} // closed when conn is replaced
	doomed   map[*client.Conn]bool
	conns    []*client.Conn
	res      writerResult
	cur      []inflight // per worker; zero start = idle
	stopc    chan struct{}
	abortc   chan struct{}
	aborted  bool
	wg       sync.WaitGroup
	roundGen uint64
}

func newSoakWriter(size int64, workers int, seed uint64) *soakWriter {
	n := int(size / soakBlock)
	return &soakWriter{blocks: n, workers: workers, recs: make([]blockRec, n), seed: seed,
		cur: make([]inflight, workers), abortc: make(chan struct{}), doomed: map[*client.Conn]bool{}}
}

// start runs the workers on c until stop.
func (w *soakWriter) start(c *client.Conn) {
	w.mu.Lock()
	w.conn, w.changed = c, make(chan struct{})
	w.conns = append(w.conns, c)
	w.res = writerResult{}
	w.stopc = make(chan struct{})
	w.roundGen++
	gen := w.roundGen
	w.mu.Unlock()
	for id := range w.workers {
		w.wg.Add(1)
		go w.work(id, rand.New(rand.NewPCG(w.seed+gen, uint64(id))))
	}
}

// expectFailure: the current connection's server is about to be killed;
// its writes may fail from now on, and the workers wait for swap.
func (w *soakWriter) expectFailure() {
	w.mu.Lock()
	w.doomed[w.conn] = true
	w.mu.Unlock()
}

func (w *soakWriter) current() *client.Conn {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.conn
}

// swap moves the workers to c (the promoted primary).
func (w *soakWriter) swap(c *client.Conn) {
	w.mu.Lock()
	w.conn = c
	w.conns = append(w.conns, c)
	close(w.changed)
	w.changed = make(chan struct{})
	w.mu.Unlock()
}

func (w *soakWriter) work(id int, rng *rand.Rand) {
	defer w.wg.Done()
	// The first quarter of the volume is hot: each worker's share of it is
	// written as a moving window (like a log or a busy file). The rest is
	// cold: each worker's share gets a random write now and then (about
	// one in a thousand). So the dirty bitmap and the activity log of an
	// outage cover part of the volume, and the resync column shows how
	// much of it the resync sends, instead of always the whole volume.
	hotPer := w.blocks / 4 / w.workers
	hotLo := id * hotPer
	coldPer := (w.blocks - w.blocks/4) / w.workers
	coldLo := w.blocks/4 + id*coldPer
	hot := rng.IntN(hotPer - 16)
	for {
		select {
		case <-w.stopc:
			return
		default:
		}
		w.mu.Lock()
		c, changed := w.conn, w.changed
		w.mu.Unlock()
		n := 1
		if rng.IntN(4) == 0 {
			n = 1 + rng.IntN(16)
		}
		var idx int
		if rng.IntN(1000) == 0 {
			idx = coldLo + rng.IntN(coldPer-n+1)
		} else {
			hot = (hot + n) % (hotPer - 16)
			idx = hotLo + hot
		}
		seq := w.seq.Add(1)
		// A fresh buffer per write: an abandoned (never answered)
		// request keeps its buffer.
		buf := make([]byte, n*soakBlock)
		for i := range n {
			fillBlock(buf[i*soakBlock:(i+1)*soakBlock], idx+i, seq)
		}
		done := make(chan error, 1)
		r := &client.Request{Cmd: proto.CmdWrite, Flags: proto.CmdFlagFUA, Offset: int64(idx) * soakBlock,
			Length: uint32(len(buf)), Data: buf, Done: func(r *client.Request) { done <- r.Err }}
		start := time.Now()
		w.mu.Lock()
		w.cur[id] = inflight{idx: idx, n: n, seq: seq, start: start}
		w.mu.Unlock()
		c.Submit(r)
		var err error
		select {
		case err = <-done:
		case <-w.abortc:
			for i := range n { // outcome unknown
				w.recs[idx+i].maybe = append(w.recs[idx+i].maybe, seq)
			}
			return
		}
		lat := time.Since(start)
		w.mu.Lock()
		w.cur[id] = inflight{}
		if err == nil {
			for i := range n {
				w.recs[idx+i] = blockRec{acked: seq}
			}
			w.res.writes++
			if lat > w.res.maxLat {
				w.res.maxLat = lat
				w.res.maxLatDesc = fmt.Sprintf("write #%d of %d KiB at offset %d, started %s",
					seq, n*soakBlock>>10, int64(idx)*soakBlock, start.Format("15:04:05.000"))
			}
			w.mu.Unlock()
			continue
		}
		for i := range n {
			w.recs[idx+i].maybe = append(w.recs[idx+i].maybe, seq)
		}
		if !w.doomed[c] {
			w.res.errors++
			if w.res.firstErr == "" {
				w.res.firstErr = fmt.Sprintf("write #%d at offset %d (%d KiB) after %v: %v", seq, int64(idx)*soakBlock, n*soakBlock>>10, lat.Round(time.Millisecond), err)
			}
			w.mu.Unlock()
			return // this connection is unusable: stop this worker
		}
		w.mu.Unlock()
		select {
		case <-changed:
		case <-w.stopc:
			return
		}
	}
}

// stop asks the workers to finish their current write and waits up to d.
// Workers still waiting then are reported (which write, how old) in
// stuck, and abandoned.
func (w *soakWriter) stop(d time.Duration) writerResult {
	w.mu.Lock()
	close(w.stopc)
	w.mu.Unlock()
	done := make(chan struct{})
	go func() { w.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(d):
		w.mu.Lock()
		var l []string
		for id, f := range w.cur {
			if !f.start.IsZero() {
				l = append(l, fmt.Sprintf("worker %d: write #%d at offset %d (%d KiB) unanswered for %v",
					id, f.seq, int64(f.idx)*soakBlock, f.n*soakBlock>>10, time.Since(f.start).Round(time.Millisecond)))
			}
		}
		w.res.stuck = fmt.Sprintf("%d writes unanswered %v after the writer was told to stop:\n  %s", len(l), d, strings.Join(l, "\n  "))
		w.mu.Unlock()
		w.abort()
		// The workers waiting on a reply return at once now (one stuck
		// inside Submit, on a full socket, stays until cleanup kills the
		// servers; then the record is not used again).
		select {
		case <-done:
		case <-time.After(5 * time.Second):
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.res
}

func (w *soakWriter) abort() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.aborted {
		w.aborted = true
		close(w.abortc)
	}
}

// closeConns closes the round's clients (in the background: Close waits
// for requests in flight, and a dead server's connection has none left).
func (w *soakWriter) closeConns() {
	w.mu.Lock()
	cs := w.conns
	w.conns = nil
	w.mu.Unlock()
	for _, c := range cs {
		go c.Close()
	}
}

// verify reads the whole volume through c and checks every block against
// the record. It returns "" or a description of the first problems.
// REQUIRES: the writer is stopped.
func (w *soakWriter) verify(s *soak, c *client.Conn) string {
	const chunk = 1 << 20
	data := make([]byte, w.blocks*soakBlock)
	for off := 0; off < len(data); off += chunk {
		s.bounded(fmt.Sprintf("read back offset %d", off), 30*time.Second, func() error {
			_, err := c.ReadAt(data[off:off+chunk], int64(off))
			return err
		})
	}
	return w.check(data)
}

// check compares data (the whole volume) with the record.
func (w *soakWriter) check(data []byte) string {
	want := make([]byte, soakBlock)
	var bad []string
	nbad, checked := 0, 0
	for idx := range w.blocks {
		r := w.recs[idx]
		if r.acked == 0 && len(r.maybe) == 0 {
			continue
		}
		checked++
		got := data[idx*soakBlock : (idx+1)*soakBlock]
		ok := false
		for _, seq := range append([]uint64{r.acked}, r.maybe...) {
			if seq == 0 {
				clear(want)
			} else {
				fillBlock(want, idx, seq)
			}
			if string(got) == string(want) {
				ok = true
				break
			}
		}
		if ok {
			continue
		}
		nbad++
		if len(bad) < 10 {
			bad = append(bad, fmt.Sprintf("block at offset %d: acknowledged write #%d (unknown outcome: %v), read %s",
				int64(idx)*soakBlock, r.acked, r.maybe, describeBlock(got, idx)))
		}
	}
	if nbad == 0 {
		return ""
	}
	return fmt.Sprintf("%d of %d written blocks wrong:\n  %s", nbad, checked, strings.Join(bad, "\n  "))
}

func describeBlock(b []byte, idx int) string {
	if string(b[:8]) != soakMagic {
		for _, x := range b {
			if x != 0 {
				return fmt.Sprintf("no header (%x...)", b[:16])
			}
		}
		return "zeroes"
	}
	gi := int(binary.LittleEndian.Uint64(b[8:]))
	seq := binary.LittleEndian.Uint64(b[16:])
	want := make([]byte, len(b))
	fillBlock(want, gi, seq)
	if gi != idx {
		return fmt.Sprintf("write #%d meant for offset %d", seq, int64(gi)*soakBlock)
	}
	if string(want) != string(b) {
		return fmt.Sprintf("write #%d with a corrupt body", seq)
	}
	return fmt.Sprintf("write #%d (stale or never acknowledged)", seq)
}

// The checker itself: each kind of damage the loop is meant to catch is
// reported, and a write of unknown outcome is accepted either way.
func TestFaultLoopChecker(t *testing.T) {
	w := newSoakWriter(64*soakBlock, 1, 1)
	data := make([]byte, 64*soakBlock)
	put := func(idx int, seq uint64) { fillBlock(data[idx*soakBlock:(idx+1)*soakBlock], idx, seq) }
	for idx := range 8 {
		w.recs[idx] = blockRec{acked: uint64(10 + idx)}
		put(idx, uint64(10+idx))
	}
	w.recs[8] = blockRec{acked: 20, maybe: []uint64{30}} // either may be there
	put(8, 30)
	w.recs[9] = blockRec{maybe: []uint64{31}} // never acknowledged, not there
	if got := w.check(data); got != "" {
		t.Fatalf("intact volume reported: %s", got)
	}
	for _, c := range []struct {
		name, want string
		damage     func()
	}{
		{"stale", "read write #5 (stale", func() { put(3, 5) }},
		{"lost", "read zeroes", func() { clear(data[3*soakBlock : 4*soakBlock]) }},
		{"misplaced", "meant for offset 8192", func() { copy(data[3*soakBlock:4*soakBlock], data[2*soakBlock:3*soakBlock]) }},
		{"corrupt", "corrupt body", func() { put(3, 13); data[3*soakBlock+100] ^= 1 }},
		{"garbage", "no header", func() { put(3, 13); data[3*soakBlock] ^= 1 }},
	} {
		put(3, 13)
		c.damage()
		if got := w.check(data); !strings.Contains(got, "offset 12288") || !strings.Contains(got, c.want) {
			t.Errorf("%s: reported %q, want offset 12288 and %q", c.name, got, c.want)
		}
	}
}
