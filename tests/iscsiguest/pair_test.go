package iscsiguest_test

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vmsan/vmsan/internal/daemon"
	"github.com/vmsan/vmsan/internal/testutil"
	"github.com/vmsan/vmsan/internal/testutil/faultproxy"
)

// pairSCSIID is the scsi_id both nodes give the volume: the same SCSI
// identity (NAA, serial) on both, so the guest sees one logical unit.
const pairSCSIID = "5f0c2d9e-0b7e-4c55-9a41-2b1f0e9f6c11"

// pairNode is one `vmsan serve` of the replicated pair: volume "disk"
// replicated with protocol C, served over iSCSI in per-volume mode (ALUA
// states follow the volume's replication role) on one portal, the peer's
// portal listed in peer_portals.
type pairNode struct {
	name             string
	dir, data        string
	nbd, repl, iscsi string
	tpgt             int
	cfg              string
	mu               sync.Mutex
	cmd              *exec.Cmd
	exited           chan struct{}
	logPath          string
	restarts         int
	stopOnce         *sync.Once
}

func (n *pairNode) raw() string { return filepath.Join(n.data, "volumes", "disk.raw") }

// errExited is start's error when vmsan exited before it listened (a
// port taken meanwhile: the caller may retry with other ports).
var errExited = errors.New("vmsan exited before it listened")

// start runs vmsan serve and waits until its portal accepts connections.
// It may run outside the test's goroutine (the restart), so it returns
// errors instead of failing the test.
func (n *pairNode) start(t *testing.T, bin string) error {
	if err := os.MkdirAll(n.dir, 0o755); err != nil {
		return err
	}
	cf := filepath.Join(n.dir, "vmsan.yaml")
	if err := os.WriteFile(cf, []byte(n.cfg), 0o600); err != nil {
		return err
	}
	n.logPath = filepath.Join(n.dir, "vmsan.log")
	logf, err := os.OpenFile(n.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	fmt.Fprintf(logf, "--- start %d\n", n.restarts)
	n.restarts++
	cmd := exec.Command(bin, "serve", "--config", cf)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return err
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); logf.Close(); close(exited) }()
	n.mu.Lock()
	n.cmd, n.exited, n.stopOnce = cmd, exited, &sync.Once{}
	n.mu.Unlock()
	deadline := time.Now().Add(30 * time.Second)
	for !dialable(n.iscsi) {
		select {
		case <-exited:
			t.Logf("node %s exited before it listened on %s:\n%s", n.name, n.iscsi, n.logTail(20))
			return errExited
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			n.stop(t)
			return fmt.Errorf("node %s did not listen on %s in 30 s:\n%s", n.name, n.iscsi, n.logTail(40))
		}
	}
	return nil
}

// kill9 kills the node the hard way (SIGKILL: no drain, no cache flush).
func (n *pairNode) kill9() {
	n.mu.Lock()
	cmd, exited := n.cmd, n.exited
	n.mu.Unlock()
	cmd.Process.Signal(syscall.SIGKILL)
	<-exited
}

// stop stops the node gracefully (SIGINT: the drain writes the cache
// back), killing it after 30 s. Idempotent per start.
func (n *pairNode) stop(t *testing.T) {
	n.mu.Lock()
	cmd, exited, once := n.cmd, n.exited, n.stopOnce
	n.mu.Unlock()
	if cmd == nil {
		return
	}
	once.Do(func() {
		cmd.Process.Signal(os.Interrupt)
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			<-exited
			t.Errorf("node %s did not stop on SIGINT within 30 s", n.name)
		}
	})
}

func (n *pairNode) logTail(lines int) string {
	b, _ := os.ReadFile(n.logPath)
	return tail(string(b), lines)
}

// replState is the node's replication status of "disk" ("" fields when
// the daemon does not answer).
type replState struct {
	Role     string `json:"role"`
	Disk     string `json:"disk"`
	Conn     string `json:"connection"`
	PeerDisk string `json:"peer_disk"`
}

func (n *pairNode) status() replState {
	c, err := daemon.Dial(n.data)
	if err != nil {
		return replState{}
	}
	defer c.Close()
	var sts []replState
	if err := c.Do("GET", "/v1/repl", nil, &sts); err != nil || len(sts) == 0 {
		return replState{}
	}
	return sts[0]
}

// waitFor polls cond every 100 ms for up to d.
func waitFor(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(100 * time.Millisecond)
	}
	return true
}

// startPair starts nodes a (primary) and b (secondary) of a replicated
// volume of size bytes and waits until they are connected and UpToDate.
func startPair(t *testing.T, bin string, size int64) (a, b *pairNode) {
	t.Helper()
	base := testutil.DiskTempDir(t)
	for attempt := 0; ; attempt++ {
		a = &pairNode{name: "a", dir: filepath.Join(base, fmt.Sprintf("a%d", attempt)), tpgt: 1}
		b = &pairNode{name: "b", dir: filepath.Join(base, fmt.Sprintf("b%d", attempt)), tpgt: 2}
		for _, n := range []*pairNode{a, b} {
			n.data = filepath.Join(n.dir, "data")
			n.nbd, n.repl, n.iscsi = fmt.Sprintf("127.0.0.1:%d", pickPort()), fmt.Sprintf("127.0.0.1:%d", pickPort()), fmt.Sprintf("127.0.0.1:%d", pickPort())
		}
		conf := func(n, peer *pairNode, role string) string {
			return fmt.Sprintf(`data_dir: %s
listen: [%q]
no_default_volume: true
volumes:
  - name: disk
    size: %d
    replication:
      listen: %s
      peer: %s
      role: %s
      protocol: C
      ping_interval: 100ms
      ping_timeout: 1s
      shared_secret: "test-pair-shared-secret-0123"
iscsi:
    mode: per-volume
    node_name: %s
    allow_any: true
    listen: [{addr: %q, tpgt: %d, relative_port: %d}]
    peer_portals: [{addr: %q, tpgt: %d, relative_port: %d}]
    targets: [{volume: disk, scsi_id: %s}]
`, n.data, n.nbd, size, n.repl, peer.repl, role, vmsanNode, n.iscsi, n.tpgt, n.tpgt, peer.iscsi, peer.tpgt, peer.tpgt, pairSCSIID)
		}
		a.cfg, b.cfg = conf(a, b, "primary"), conf(b, a, "secondary")
		err := a.start(t, bin)
		if err == nil {
			err = b.start(t, bin)
		}
		if err == nil {
			break
		}
		a.stop(t)
		b.stop(t)
		if !errors.Is(err, errExited) {
			t.Fatal(err)
		}
		if attempt == 2 {
			t.Fatal("the pair could not bind its ports in 3 attempts")
		}
	}
	t.Cleanup(func() {
		a.stop(t)
		b.stop(t)
		if t.Failed() {
			t.Logf("node a log:\n%s", a.logTail(60))
			t.Logf("node b log:\n%s", b.logTail(60))
		}
	})
	if !waitFor(60*time.Second, func() bool {
		sa, sb := a.status(), b.status()
		return sa.Role == "Primary" && sb.Role == "Secondary" && sa.Conn == "Connected" && sb.Conn == "Connected" &&
			sa.Disk == "UpToDate" && sb.Disk == "UpToDate"
	}) {
		t.Fatalf("the pair did not connect UpToDate in 60 s: a %+v, b %+v", a.status(), b.status())
	}
	return a, b
}

// recommendedHostSettings runs `vmsan iscsi multipath-conf` and returns
// its devices section (for the guest's multipath.conf, as printed) and
// the open-iscsi settings its comments recommend (REPLACEMENT_TIMEOUT,
// NOOP_INTERVAL, NOOP_TIMEOUT for the guest's iscsid.conf), so that the
// guest runs with exactly what vmsan tells users to configure.
func recommendedHostSettings(t *testing.T, bin string) map[string]string {
	t.Helper()
	out, err := exec.Command(bin, "iscsi", "multipath-conf").CombinedOutput()
	if err != nil {
		t.Fatalf("vmsan iscsi multipath-conf: %v\n%s", err, out)
	}
	env := map[string]string{"MP_DEVICES": string(out)}
	for key, name := range map[string]string{
		"node.session.timeo.replacement_timeout": "REPLACEMENT_TIMEOUT",
		"node.conn[0].timeo.noop_out_interval":   "NOOP_INTERVAL",
		"node.conn[0].timeo.noop_out_timeout":    "NOOP_TIMEOUT",
	} {
		m := regexp.MustCompile(`(?m)^#\s+` + regexp.QuoteMeta(key) + ` = (\d+)$`).FindSubmatch(out)
		if m == nil {
			t.Fatalf("vmsan iscsi multipath-conf does not recommend %s:\n%s", key, out)
		}
		env[name] = string(m[1])
	}
	m := regexp.MustCompile(`(?m)^\s+fast_io_fail_tmo (\d+)$`).FindSubmatch(out)
	if m == nil {
		t.Fatalf("vmsan iscsi multipath-conf has no fast_io_fail_tmo:\n%s", out)
	}
	env["MP_FAST_IO_FAIL_TMO"] = string(m[1])
	return env
}

// parseRTPG reads the guest's "RTPG <node> id:state ..." line into port
// group -> ALUA state (0 active/optimized, 2 standby).
func parseRTPG(line string) map[int]int {
	groups := map[int]int{}
	for _, f := range strings.Fields(line) {
		id, st, ok := strings.Cut(f, ":")
		if !ok {
			continue
		}
		i, err1 := strconv.ParseInt(id, 0, 32)
		s, err2 := strconv.ParseInt(st, 0, 32)
		if err1 == nil && err2 == nil {
			groups[int(i)] = int(s)
		}
	}
	return groups
}

// TestGuestPairFailover: a replicated pair (two `vmsan serve`, protocol
// C) presents one logical unit to a guest with dm-multipath, one path per
// node (each through a host-side fault proxy, as in TestGuestMultipath),
// and the guest keeps writing while the primary is killed.
//
// The guest (testdata/pair.sh) logs in on both paths; multipathd must
// build one map with node a's path up in the active group (prio 50, from
// multipath-tools' alua prioritizer) and node b's a ghost (the tur
// checker's reading of NOT READY 04/0B) with prio 1; REPORT TARGET PORT
// GROUPS (sg_rtpg) on both paths must give group 1 (a) active/optimized
// and group 2 (b) standby. The guest's multipath.conf device section and
// open-iscsi timers are what `vmsan iscsi multipath-conf` prints. An
// O_DIRECT writer fills fresh 256 KiB slots and reports each
// acknowledged one; after a few, the test kill -9's node a, waits for b
// to notice (replication ping) and VMSAN_GUEST_PROMOTE_DELAY (default 3
// s, a cluster manager's reaction), and runs `vmsan repl promote` on b.
// The guest must see a's path fail and b's become active/ready/50, with
// no write error (no_path_retry queues the I/O while only the standby path
// is left). The test then restarts a on its data dir: it comes back
// secondary and resyncs, and the guest must see its path return as a
// ghost. Afterwards every acknowledged slot must verify in the guest
// (through the map) and in b's raw file, both raw files must be equal
// (sha256) after a graceful stop, RTPG must show the groups swapped, and
// the failover times are logged: kill -> a's path failed, -> promote, ->
// first write completed on b; the longest writer stall.
func TestGuestPairFailover(t *testing.T) {
	if k := os.Getenv("VMSAN_ISCSI_TARGET"); k != "" && k != "vmsan" {
		t.Skipf("VMSAN_ISCSI_TARGET=%s: the pair test runs two vmsan nodes", k) // skip: variant
	}
	guest := buildGuest(t)
	bin := buildVmsan(t)
	const slotKB, size = 256, 256 * MiB
	promoteDelay := 3 * time.Second
	if v := os.Getenv("VMSAN_GUEST_PROMOTE_DELAY"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("VMSAN_GUEST_PROMOTE_DELAY: %v", err)
		}
		promoteDelay = d
	}
	a, b := startPair(t, bin, size)
	var proxies [2]*faultproxy.Proxy
	for i, n := range []*pairNode{a, b} {
		p, err := faultproxy.New("127.0.0.1:0", n.iscsi)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		// While its node is down, the path refuses connections as the
		// node's host would: an accepted and reset connection can wedge
		// open-iscsi's reconnect of the session for good (the restarted
		// node's path then never comes back; see docs/iscsi.md).
		p.FollowTarget(true)
		p.SetLog(func(f string, args ...any) {
			t.Logf("%s "+f, append([]any{time.Now().Format("15:04:05.000")}, args...)...)
		})
		proxies[i] = p
	}
	env := recommendedHostSettings(t, bin)
	// VMSAN_GUEST_ISCSID_DEBUG: iscsid's debug level (its log is printed
	// when a path does not come back).
	if d := os.Getenv("VMSAN_GUEST_ISCSID_DEBUG"); d != "" {
		env["ISCSID_DEBUG"] = d
	}
	for k, v := range map[string]string{
		"PORTAL": guestPortal(proxies[0].Addr()), "PORTAL2": guestPortal(proxies[1].Addr()),
		"IQN":   "iqn.2026-11.org.vmsan:" + vmsanNode + ":disk",
		"SLOTS": strconv.Itoa(size / (slotKB << 10)), "SLOT_KB": strconv.Itoa(slotKB), "WAIT": envOr("VMSAN_GUEST_WAIT", "60"),
	} {
		env[k] = v
	}

	var (
		mu                           sync.Mutex
		acks                         []time.Time // host time each "A n" line arrived
		killAt, noticedAt, promoteAt time.Time
		pathFailedAt, restartAt      time.Time
		promoteErr, restartErr       error
		bg                           sync.WaitGroup
	)
	res := bootGuest(t, guest, guestRun{
		Script:  "pair.sh",
		Timeout: 4 * time.Minute,
		Env:     env,
		Quiet:   func(l string) bool { return strings.HasPrefix(l, "A ") },
		OnLine: func(l string) {
			now := time.Now()
			mu.Lock()
			defer mu.Unlock()
			switch {
			case strings.HasPrefix(l, "A "):
				acks = append(acks, now)
			case strings.HasPrefix(l, "WRITER-RUNNING"):
				// The console reader must keep reading: kill and
				// promote in the background.
				bg.Add(1)
				go func() {
					defer bg.Done()
					a.kill9()
					k := time.Now()
					waitFor(30*time.Second, func() bool { c := b.status().Conn; return c != "Connected" && c != "" })
					nt := time.Now()
					time.Sleep(promoteDelay - nt.Sub(k))
					out, err := exec.Command(bin, "repl", "promote", "disk", "--data-dir", b.data).CombinedOutput()
					if err != nil {
						err = fmt.Errorf("%v: %s", err, out)
					}
					mu.Lock()
					killAt, noticedAt, promoteAt, promoteErr = k, nt, time.Now(), err
					mu.Unlock()
				}()
			case strings.HasPrefix(l, "PATH-FAILED"):
				pathFailedAt = now
			case strings.HasPrefix(l, "IO-CONTINUES"):
				bg.Add(1)
				go func() {
					defer bg.Done()
					err := a.start(t, bin)
					mu.Lock()
					restartAt, restartErr = time.Now(), err
					mu.Unlock()
				}()
			}
		},
	})
	bg.Wait()
	mu.Lock()
	defer mu.Unlock()
	if promoteErr != nil {
		t.Fatalf("vmsan repl promote on b: %v", promoteErr)
	}
	if restartErr != nil {
		t.Fatal(restartErr)
	}
	for _, want := range []string{"MAP ", "GROUPS ", "RTPG a", "RTPG b", "WRITER-RUNNING", "PATH-FAILED", "PATH-ACTIVE",
		"IO-CONTINUES", "PATH-GHOST", "GROUPS-AFTER", "RTPG-AFTER a", "RTPG-AFTER b", "VERIFY-OK", "MAX-STALL"} {
		if !res.has(want) {
			t.Fatalf("guest did not report %s; its lines:\n  %s", want, strings.Join(res.Lines, "\n  "))
		}
	}

	// One map, two path groups: a's (active/optimized, prio 50) carrying
	// the I/O, b's (standby, prio 1) waiting; afterwards the reverse.
	if l := res.line("MAP "); !strings.Contains(l, " maps=1 ") || !strings.Contains(l, " groups=2 ") {
		t.Errorf("guest map: %q, want one map with two path groups", l)
	}
	if l := res.line("GROUPS "); !strings.HasPrefix(l, "GROUPS prio=50:active prio=1:enabled") {
		t.Errorf("guest path groups before the kill: %q, want prio 50 active, then prio 1", l)
	}
	if l := res.line("GROUPS-AFTER"); !strings.HasPrefix(l, "GROUPS-AFTER prio=50:active prio=1:enabled") {
		t.Errorf("guest path groups after the failover: %q, want prio 50 active (b), then prio 1 (a)", l)
	}
	for _, c := range []struct {
		prefix       string
		want1, want2 int
	}{
		{"RTPG a", 0, 2}, {"RTPG b", 0, 2}, // a primary: group 1 active/optimized, group 2 standby
		{"RTPG-AFTER a", 2, 0}, {"RTPG-AFTER b", 2, 0}, // b promoted, a back as secondary
	} {
		g := parseRTPG(strings.TrimPrefix(res.line(c.prefix), c.prefix))
		if len(g) != 2 || g[1] != c.want1 || g[2] != c.want2 {
			t.Errorf("guest %q: port groups %v, want 1:%#x 2:%#x", res.line(c.prefix), g, c.want1, c.want2)
		}
	}

	// Failover times, all on the host's clock (the guest's lines reach it
	// over the serial console within milliseconds).
	var firstAfter time.Time
	var maxGap time.Duration
	acksBeforeKill := 0
	for i, at := range acks {
		if at.Before(killAt) {
			acksBeforeKill++
		}
		if firstAfter.IsZero() && at.After(promoteAt) {
			firstAfter = at
		}
		if i > 0 && at.Sub(acks[i-1]) > maxGap {
			maxGap = at.Sub(acks[i-1])
		}
	}
	if firstAfter.IsZero() {
		t.Fatalf("no write acknowledged after the promote (%d acks)", len(acks))
	}
	t.Logf("node failover: kill -9 -> b notices %.2fs, -> a's path failed in the guest %.2fs, -> promote done %.2fs, -> first write on b %.2fs (promote -> first write %.2fs); longest writer stall %.2fs (guest: %s); %d slots acknowledged, %d before the kill; a restarted %.1fs after the kill",
		noticedAt.Sub(killAt).Seconds(), pathFailedAt.Sub(killAt).Seconds(), promoteAt.Sub(killAt).Seconds(),
		firstAfter.Sub(killAt).Seconds(), firstAfter.Sub(promoteAt).Seconds(), maxGap.Seconds(),
		strings.TrimPrefix(res.line("MAX-STALL"), "MAX-STALL "), len(acks), acksBeforeKill, restartAt.Sub(killAt).Seconds())
	if acksBeforeKill < 4 {
		t.Errorf("only %d slots acknowledged before the kill", acksBeforeKill)
	}
	// The target: the guest writes again within 10 s of the promote (the
	// path checker finds the promoted path up and the queued I/O is
	// resent); 5 s of slack for a loaded machine.
	if d := firstAfter.Sub(promoteAt); d > 15*time.Second {
		t.Errorf("first write on b %.1fs after the promote, want at most 15 s (target 10 s, 5 s slack)", d.Seconds())
	}

	// The promote went through the ALUA transitioning state (secondary
	// -> changing -> primary: 04/0A while it lasted; a few milliseconds,
	// too short for the guest to see it) before active/optimized.
	if log := b.logTail(200); !regexp.MustCompile(`(?s)role=changing was=secondary.*role=primary was=changing`).MatchString(log) {
		t.Errorf("node b's log lacks the promote's role steps (secondary -> changing -> primary):\n%s", log)
	}

	// The old primary, crashed while primary, must come back secondary
	// from its first moment: a restart that served as primary even
	// briefly would give the guest a second active path to stale data.
	if log, _ := os.ReadFile(a.logPath); !bytes.Contains(log, []byte("--- start 1")) {
		t.Errorf("node a's log does not show its restart")
	} else if _, after, _ := bytes.Cut(log, []byte("--- start 1")); bytes.Contains(after, []byte("role=primary")) {
		t.Errorf("the restarted old primary took the primary role:\n%s", tail(string(after), 40))
	}

	// Resync: a (restarted, secondary) and b (primary) UpToDate and
	// connected; then both stop gracefully and their raw files are equal.
	if !waitFor(60*time.Second, func() bool {
		sa, sb := a.status(), b.status()
		return sa.Role == "Secondary" && sb.Role == "Primary" && sa.Conn == "Connected" && sb.Conn == "Connected" &&
			sa.Disk == "UpToDate" && sb.Disk == "UpToDate" && sb.PeerDisk == "UpToDate"
	}) {
		t.Fatalf("the pair did not resync in 60 s: a %+v, b %+v", a.status(), b.status())
	}
	b.stop(t)
	a.stop(t)
	ha, hb := fileSHA256(t, a.raw()), fileSHA256(t, b.raw())
	if !bytes.Equal(ha, hb) {
		t.Errorf("raw files differ after the resync: a %x, b %x", ha, hb)
	}
	pattern := readPattern(t, guest)
	img, err := os.ReadFile(b.raw())
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, f := range strings.Fields(res.line("VERIFY-OK")) {
		if v, ok := strings.CutPrefix(f, "slots="); ok {
			n, _ = strconv.Atoi(v)
		}
	}
	if n != len(acks) || n == 0 {
		t.Fatalf("guest verified %d slots (%q), the host saw %d acknowledged", n, res.line("VERIFY-OK"), len(acks))
	}
	slot := int64(slotKB) << 10
	slices := int64(4*MiB) / slot
	bad := 0
	for k := int64(0); k < int64(n); k++ {
		want := pattern[(k%slices)*slot : (k%slices+1)*slot]
		if !bytes.Equal(img[k*slot:(k+1)*slot], want) {
			bad++
			if bad <= 5 {
				t.Errorf("b's raw file: acknowledged slot %d (at %d KiB) is not its pattern slice", k, k*slot>>10)
			}
		}
	}
	if bad > 0 {
		t.Errorf("%d of %d acknowledged slots lost in b's raw file", bad, n)
	}
	if !allZero(img[int64(n)*slot:]) {
		t.Errorf("b's raw file has data past the last slot written")
	}
}

func fileSHA256(t *testing.T, path string) []byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return h.Sum(nil)
}
